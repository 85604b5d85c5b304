import NIOCore
import NIOPosix
import STUN
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// What RFC 5780 behaviour discovery found against one server.
public struct NATBehaviorDiscoveryResult: Hashable, Sendable {
    /// The mapped address of test I (primary address and port).
    public var mapped: TransportAddress
    /// The server's OTHER-ADDRESS (its alternate IP and port).
    public var other: TransportAddress
    /// Mapping (RFC 5780 §4.3) and filtering (§4.4) behaviour.
    public var behavior: NATBehavior

    public init(mapped: TransportAddress, other: TransportAddress, behavior: NATBehavior) {
        self.mapped = mapped
        self.other = other
        self.behavior = behavior
    }
}

/// Why RFC 5780 behaviour discovery stopped, with what it had learnt by then.
public struct NATBehaviorDiscoveryError: Error, Sendable, CustomStringConvertible {
    public enum Reason: Sendable {
        /// Test I's answer carried no OTHER-ADDRESS: the server has no alternate address.
        case noOtherAddress
        /// The mapping tests could not tell the mapping apart.
        case mappingUnanswered
        /// A Binding request failed (timeout, unreachable, error response).
        case stun(STUNClientError)
        /// A client socket could not be opened, or failed; the system's error is the cause.
        case socket(ErrorCause)
    }

    public var reason: Reason
    /// The server asked.
    public var server: TransportAddress
    /// Test I's mapped address, when it answered.
    public var mapped: TransportAddress?
    /// The server's OTHER-ADDRESS, when test I named one.
    public var other: TransportAddress?

    public init(_ reason: Reason, server: TransportAddress, mapped: TransportAddress? = nil, other: TransportAddress? = nil) {
        self.reason = reason
        self.server = server
        self.mapped = mapped
        self.other = other
    }

    public var description: String {
        switch reason {
        case .noOtherAddress:
            "\(server) does not support RFC 5780 behaviour discovery (no OTHER-ADDRESS); run it with an alternate address"
        case .mappingUnanswered:
            "mapping tests gave no answer"
        case .stun(let error):
            error.message
        case .socket(let cause):
            "\(server): \(cause)"
        }
    }
}

/// RFC 5780 NAT behaviour discovery (§4.3 mapping, §4.4 filtering) with
/// ``STUNClient``s, against a server that has an alternate address. Which
/// answers mean which behaviour is STUN's ``MappingBehavior/classify(local:x1:x2:x3:)``
/// and ``FilteringBehavior/classify(changedIPAndPortAnswered:changedPortAnswered:)``;
/// this runs the tests they need.
public enum NATBehaviorDiscovery {
    /// Runs the tests: test I, then the mapping tests II and III (unless the server
    /// sees the client's own address, or test II already tells), then on a fresh
    /// socket the filtering tests (change IP and port, then change port).
    ///
    /// - Parameters:
    ///   - server: the STUN server's primary address.
    ///   - local: the address to send from; give a specific IP (see
    ///     ``sourceAddress(toward:)``) so that "no NAT" can be recognised.
    ///   - timeout: how long to wait for each answer; the filtering tests, whose
    ///     silence is an answer, wait at most 3 s.
    public static func run(
        server: TransportAddress, local: SocketAddress, timeout: Duration
    ) async throws(NATBehaviorDiscoveryError) -> NATBehaviorDiscoveryResult {
        var mapped: TransportAddress?
        var other: TransportAddress?
        func failure(_ reason: NATBehaviorDiscoveryError.Reason) -> NATBehaviorDiscoveryError {
            NATBehaviorDiscoveryError(reason, server: server, mapped: mapped, other: other)
        }
        let client = try await open(local: local, server: server)
        // Each socket is closed before this returns or throws (awaited, not left to a task).
        var filterClient: STUNClient?
        let outcome: Result<NATBehaviorDiscoveryResult, NATBehaviorDiscoveryError>
        do {
            // Test I.
            let first = try await client.binding(to: server, timeout: timeout)
            mapped = first.mapped
            guard let alternate = first.otherAddress else { throw failure(.noOtherAddress) }
            other = alternate
            let ownAddress = client.localAddress.flatMap { $0.ip == .v4(0) ? nil : $0 }
            // Mapping: tests II and III, unless the server sees our own address.
            var mapping: MappingBehavior? = .noNAT
            if ownAddress != first.mapped {
                let second = try await client.binding(to: TransportAddress(ip: alternate.ip, port: server.port), timeout: timeout)
                mapping = MappingBehavior.classify(local: ownAddress, x1: first.mapped, x2: second.mapped, x3: nil)
                if mapping == nil {
                    let third = try await client.binding(to: alternate, timeout: timeout)
                    mapping = MappingBehavior.classify(local: ownAddress, x1: first.mapped, x2: second.mapped, x3: third.mapped)
                }
            }
            // Filtering: test II (change IP and port), test III (change port), on a
            // fresh socket: the mapping tests above sent to the alternate IP, which
            // an address-dependent filter would now let through.
            await client.close()
            let filter = try await STUNClient.open(local: local)
            filterClient = filter
            _ = try await filter.binding(to: server, timeout: timeout)
            let filterWait = min(timeout, .seconds(3))
            let changedBoth = try await answered { () async throws(STUNClientError) in
                try await filter.binding(to: server, change: [.changeIP, .changePort], timeout: filterWait)
            }
            let changedPort =
                try await changedBoth
                ? true
                : answered { () async throws(STUNClientError) in
                    try await filter.binding(to: server, change: [.changePort], timeout: filterWait)
                }
            let filtering = FilteringBehavior.classify(changedIPAndPortAnswered: changedBoth, changedPortAnswered: changedPort)
            guard let mapping else { throw failure(.mappingUnanswered) }
            outcome = .success(
                NATBehaviorDiscoveryResult(
                    mapped: first.mapped, other: alternate, behavior: NATBehavior(mapping: mapping, filtering: filtering)))
        } catch let error as NATBehaviorDiscoveryError {
            outcome = .failure(error)
        } catch let error as STUNClientError {
            outcome = .failure(failure(.stun(error)))
        } catch {
            outcome = .failure(failure(.socket(ErrorCause(error))))
        }
        await client.close()
        await filterClient?.close()
        return try outcome.get()
    }

    /// The local address (port 0) the kernel would send from toward `server`: a
    /// connected UDP socket's own address, so that "no NAT" can be recognised.
    /// The wildcard address of the server's family when the kernel does not say.
    public static func sourceAddress(toward server: TransportAddress) -> SocketAddress {
        let fallback = SocketAddress(TransportAddress(ip: server.ip.isIPv4 ? .v4(0) : .v6(high: 0, low: 0), port: 0))
        let fd = socket(server.ip.isIPv4 ? AF_INET : AF_INET6, Int32(SOCK_DGRAM.rawValue), 0)
        guard fd >= 0 else { return fallback }
        defer { close(fd) }
        let target = SocketAddress(server)
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let connected = target.withSockAddr { sa, len in connect(fd, sa, socklen_t(len)) } == 0
        let named =
            withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
            } == 0
        guard connected, named else { return fallback }
        let own: SocketAddress
        switch Int32(storage.ss_family) {
        case AF_INET:
            own = withUnsafeBytes(of: storage) { SocketAddress($0.load(as: sockaddr_in.self), host: "") }
        case AF_INET6:
            own = withUnsafeBytes(of: storage) { SocketAddress($0.load(as: sockaddr_in6.self), host: "") }
        default:
            return fallback
        }
        guard var address = TransportAddress(own) else { return fallback }
        address.port = 0
        return SocketAddress(address)
    }

    private static func open(local: SocketAddress, server: TransportAddress) async throws(NATBehaviorDiscoveryError) -> STUNClient
    {
        do {
            return try await STUNClient.open(local: local)
        } catch {
            throw NATBehaviorDiscoveryError(.socket(ErrorCause(error)), server: server)
        }
    }

    /// Whether a request got an answer: a timeout means "no"; any other error
    /// (an error response, an unreachable server) propagates.
    private static func answered(_ body: () async throws(STUNClientError) -> BindingResult) async throws(STUNClientError) -> Bool
    {
        do throws(STUNClientError) {
            _ = try await body()
            return true
        } catch  where error.code == .timeout {
            return false
        }
    }
}
