import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
import STUN
import Transport
import TusaBase

/// `tusa stun HOST[:PORT]`: ask a STUN server for this host's mapped address,
/// and with `--behavior` classify the NAT with RFC 5780's tests.
struct Stun: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the mapped (server-reflexive) address a STUN server sees.",
        discussion: "With --behavior, run the RFC 5780 mapping and filtering tests (the server needs an alternate address) and name the NAT type."
    )

    @Argument(help: "The STUN server, HOST[:PORT] (default port 3478; IPv6 as [ADDR]:PORT).")
    var server: String

    @Flag(help: "Run RFC 5780 behaviour discovery and name the NAT type.")
    var behavior = false

    @Option(help: "Seconds to wait for each answer.")
    var timeout: Double = 5

    @Option(help: "Local address to send from, IP[:PORT].")
    var local: String?

    func run() async throws {
        guard timeout > 0, timeout <= 600 else { Self.fail("--timeout must be between 0 and 600 seconds") }
        let serverAddress = Self.resolve(server)
        let wait = Duration.milliseconds(Int64(timeout * 1000))
        let localAddress: SocketAddress
        if let local {
            guard let a = TransportAddress(local, defaultPort: 0) else { Self.fail("--local '\(local)' is not IP[:PORT]") }
            localAddress = SocketAddress(a)
        } else {
            localAddress = Self.sourceAddress(toward: serverAddress)
        }
        do {
            if behavior {
                try await discover(serverAddress, local: localAddress, wait: wait)
            } else {
                let client = try await STUNClient.open(local: localAddress, connectedTo: SocketAddress(serverAddress))
                defer { Task { await client.close() } }
                let result = try await client.binding(to: serverAddress, timeout: wait)
                print(result.mapped)
            }
        } catch let error as STUNClientError {
            Self.fail(error.message)
        } catch {
            Self.fail("\(serverAddress): \(error)")
        }
    }

    func discover(_ server: TransportAddress, local: SocketAddress, wait: Duration) async throws {
        let client = try await STUNClient.open(local: local)
        defer { Task { await client.close() } }
        // Test I.
        let first = try await client.binding(to: server, timeout: wait)
        print("mapped address: \(first.mapped)")
        guard let other = first.otherAddress else {
            Self.fail("\(server) does not support RFC 5780 behaviour discovery (no OTHER-ADDRESS); run it with an alternate address")
        }
        print("other address: \(other)")
        let ownAddress = client.localAddress.flatMap { $0.ip == .v4(0) ? nil : $0 }
        // Mapping: tests II and III, unless the server sees our own address.
        var mapping: MappingBehavior? = .noNAT
        if ownAddress != first.mapped {
            let second = try await client.binding(to: TransportAddress(ip: other.ip, port: server.port), timeout: wait)
            mapping = MappingBehavior.classify(local: ownAddress, x1: first.mapped, x2: second.mapped, x3: nil)
            if mapping == nil {
                let third = try await client.binding(to: other, timeout: wait)
                mapping = MappingBehavior.classify(local: ownAddress, x1: first.mapped, x2: second.mapped, x3: third.mapped)
            }
        }
        // Filtering: test II (change IP and port), test III (change port), on a
        // fresh socket: the mapping tests above sent to the alternate IP, which
        // an address-dependent filter would now let through.
        await client.close()
        let filterClient = try await STUNClient.open(local: local)
        defer { Task { await filterClient.close() } }
        _ = try await filterClient.binding(to: server, timeout: wait)
        let filterWait = min(wait, .seconds(3))
        let changedBoth = try await answered {
            try await filterClient.binding(to: server, change: [.changeIP, .changePort], timeout: filterWait)
        }
        let changedPort = try await changedBoth ? true : answered {
            try await filterClient.binding(to: server, change: [.changePort], timeout: filterWait)
        }
        let filtering = FilteringBehavior.classify(changedIPAndPortAnswered: changedBoth, changedPortAnswered: changedPort)
        guard let mapping else { Self.fail("mapping tests gave no answer") }
        let nat = NATBehavior(mapping: mapping, filtering: filtering)
        print("mapping: \(mapping.rawValue)")
        print("filtering: \(filtering.rawValue)")
        print("NAT type: \(nat.classicName)")
    }

    /// Whether a request got an answer: a timeout means "no"; any other error
    /// (an error response, an unreachable server) propagates.
    func answered(_ body: () async throws -> BindingResult) async throws -> Bool {
        do {
            _ = try await body()
            return true
        } catch let error as STUNClientError where error.code == .timeout {
            return false
        }
    }

    /// HOST[:PORT] → an address, resolving names; a clear error otherwise.
    static func resolve(_ text: String) -> TransportAddress {
        if let a = TransportAddress(text, defaultPort: 3478) { return a }
        var host = text
        var port: UInt16 = 3478
        if let colon = text.lastIndex(of: ":"), !text.contains("]"), text.filter({ $0 == ":" }).count == 1 {
            guard let p = UInt16(text[text.index(after: colon)...]) else { fail("'\(text)': bad port") }
            host = String(text[..<colon])
            port = p
        }
        guard let resolved = try? SocketAddress.makeAddressResolvingHost(host, port: Int(port)),
            let address = TransportAddress(resolved)
        else { fail("cannot resolve '\(host)'") }
        return address
    }

    /// The local IP the kernel would use toward `server` (a connected UDP
    /// socket's own address), so that "no NAT" can be recognised.
    static func sourceAddress(toward server: TransportAddress) -> SocketAddress {
        let fallback = SocketAddress(TransportAddress(ip: server.ip.isIPv4 ? .v4(0) : .v6(high: 0, low: 0), port: 0))
        let fd = socket(server.ip.isIPv4 ? AF_INET : AF_INET6, Int32(SOCK_DGRAM.rawValue), 0)
        guard fd >= 0 else { return fallback }
        defer { close(fd) }
        let target = SocketAddress(server)
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let connected = target.withSockAddr { sa, len in Glibc.connect(fd, sa, socklen_t(len)) } == 0
        let named = withUnsafeMutablePointer(to: &storage) {
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

    static func fail(_ message: String) -> Never {
        FileHandle.standardError.write(Data("tusa stun: \(message)\n".utf8))
        Foundation.exit(1)
    }
}
