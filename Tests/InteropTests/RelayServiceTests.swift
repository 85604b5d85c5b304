import Dispatch
import Foundation
import Logging
import NIOCore
import Relay
import STUN
import ServiceLifecycle
import TURN
import Testing
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

// The binding service over real loopback sockets, in process and as the
// `tusa relay` binary. Every wait is bounded; every socket is loopback.

private let loopbackV4 = IPAddress.v4(0x7F00_0001)
private let loopbackV6 = IPAddress.v6(high: 0, low: 1)
private let secondLoopbackV4 = IPAddress.v4(0x7F00_0002)

private let ipv6LoopbackAvailable: Bool = (try? TestSocket.udp(bindingTo: loopbackV6)) != nil

private let quietLogger: Logger = {
    var logger = Logger(label: "tusa.test.relay")
    logger.logLevel = .warning
    return logger
}()

@Suite("RelayService: the binding service on loopback sockets", .serialized)
struct RelayServiceTests {
    // MARK: UDP and TCP answers

    @Test("UDP and TCP over IPv4 answer with the client's own address")
    func bindingOverIPv4() async throws {
        try await checkBinding(on: loopbackV4)
    }

    @Test(
        "UDP and TCP over IPv6 answer with the client's own address",
        .enabled(if: ipv6LoopbackAvailable, "::1 is unavailable: IPv6 binding test skipped"))
    func bindingOverIPv6() async throws {
        try await checkBinding(on: loopbackV6)
    }

    private func checkBinding(on ip: IPAddress) async throws {
        let configuration = RelayService.Configuration(
            listenAddresses: [TransportAddress(ip: ip, port: 0)], software: "tusa-test")
        try await withBindingService(configuration) { service, sockets in
            #expect(sockets.map(\.kind) == [.udp, .tcp])
            let udp = try #require(sockets.first { $0.kind == .udp }).address
            let tcp = try #require(sockets.first { $0.kind == .tcp }).address
            #expect(udp.ip == ip && udp.port != 0)
            #expect(tcp.ip == ip && tcp.port != 0)

            let client = try TestSocket.udp(bindingTo: ip)
            let request = Message(type: .bindingRequest)
            let (bytes, from) = try await Harness.offPool { try client.exchange(request.encode(), with: udp) }
            #expect(from == udp)
            let response = try Message(decoding: bytes)
            #expect(response.type == .bindingSuccess)
            #expect(response.transactionID == request.transactionID)
            #expect(try address(in: response, .xorMappedAddress) == client.localAddress)
            #expect(try response.value(.software) == .software("tusa-test"))

            let connection = try await Harness.offPool { try TestSocket.tcp(connectingTo: tcp) }
            let tcpRequest = Message(type: .bindingRequest)
            let tcpResponse = try await Harness.offPool { () throws -> [UInt8]? in
                try connection.sendAll(tcpRequest.encode())
                return try connection.readFrame(timeout: 10)
            }
            let decoded = try Message(decoding: try #require(tcpResponse, "no TCP answer"))
            #expect(decoded.transactionID == tcpRequest.transactionID)
            #expect(try address(in: decoded, .xorMappedAddress) == connection.localAddress)

            // Garbage on UDP is counted, not answered: the first answer after it is the
            // one to a request sent behind it on the same socket.
            try client.sendDatagram(Array("hello, not STUN".utf8), to: udp)
            let sentinel = Message(type: .bindingRequest)
            try client.sendDatagram(sentinel.encode(), to: udp)
            let answer = try #require(try await Harness.offPool { try client.receive(timeout: 10) }, "no answer to the sentinel")
            #expect(try Message(decoding: answer.0).transactionID == sentinel.transactionID, "the garbage was answered")
            try await eventually { service.statistics.drops[.notSTUN] == 1 && service.statistics.responses == 3 }
        }
    }

    @Test("TCP: two requests split at odd boundaries get both answers")
    func tcpReassemblesSplitRequests() async throws {
        let configuration = RelayService.Configuration(
            listenAddresses: [TransportAddress(ip: loopbackV4, port: 0)], udp: false)
        try await withBindingService(configuration) { _, sockets in
            let server = try #require(sockets.first { $0.kind == .tcp }).address
            let first = Message(type: .bindingRequest)
            var second = Message(type: .bindingRequest)
            second.append(.padding([UInt8](repeating: 0, count: 12)))
            let stream = first.encode() + second.encode()
            let connection = try await Harness.offPool { try TestSocket.tcp(connectingTo: server) }
            let answers = try await Harness.offPool { () throws -> [[UInt8]] in
                var offset = 0
                for cut in [1, 3, 7, 2, 11, 19, 5] where offset < stream.count {
                    let end = min(stream.count, offset + cut)
                    try connection.sendAll(Array(stream[offset..<end]))
                    offset = end
                    usleep(5_000)  // pacing, not a wait: each piece leaves in its own segment (off the pool)
                }
                try connection.sendAll(Array(stream[offset...]))
                var answers: [[UInt8]] = []
                while answers.count < 2, let frame = try connection.readFrame(timeout: 10) { answers.append(frame) }
                return answers
            }
            #expect(answers.count == 2)
            let decoded = try answers.map { try Message(decoding: $0) }
            #expect(decoded.map(\.transactionID) == [first.transactionID, second.transactionID])
            #expect(decoded.allSatisfy { $0.type == .bindingSuccess })
            #expect(try decoded.allSatisfy { try address(in: $0, .xorMappedAddress) == connection.localAddress })
        }
    }

    @Test(
        "TCP: a stream that is neither STUN nor ChannelData is closed",
        arguments: [
            [UInt8](repeating: 0xFF, count: 24),
            // A STUN header without the magic cookie.
            [0x00, 0x01, 0x00, 0x00, 0xDE, 0xAD, 0xBE, 0xEF] + [UInt8](repeating: 7, count: 12),
        ])
    func tcpGarbageIsClosed(_ garbage: [UInt8]) async throws {
        let configuration = RelayService.Configuration(
            listenAddresses: [TransportAddress(ip: loopbackV4, port: 0)], udp: false)
        try await withBindingService(configuration) { service, sockets in
            let server = try #require(sockets.first { $0.kind == .tcp }).address
            let connection = try await Harness.offPool { try TestSocket.tcp(connectingTo: server) }
            let closed = try await Harness.offPool { () throws -> Bool in
                try connection.sendAll(garbage)
                return connection.waitForClose(timeout: 10)
            }
            #expect(closed, "the server kept a garbage stream open")
            try await eventually { service.statistics.badStreams >= 1 }
        }
    }

    @Test("TCP: a silent connection is closed after the idle timeout")
    func tcpIdleConnectionIsClosed() async throws {
        let configuration = RelayService.Configuration(
            listenAddresses: [TransportAddress(ip: loopbackV4, port: 0)], udp: false,
            tcpIdleTimeout: .milliseconds(300))
        try await withBindingService(configuration) { service, sockets in
            let server = try #require(sockets.first { $0.kind == .tcp }).address
            let connection = try await Harness.offPool { try TestSocket.tcp(connectingTo: server) }
            let clock = ContinuousClock()
            let start = clock.now
            #expect(try await Harness.offPool { connection.waitForClose(timeout: 3) })
            #expect(start.duration(to: clock.now) < .seconds(10))
            try await eventually { service.statistics.idleTimeouts == 1 }
        }
    }

    @Test("TCP: a frame dribbled a byte at a time is cut off after the timeout (slowloris)")
    func tcpSlowFrameIsClosed() async throws {
        var configuration = RelayService.Configuration(
            listenAddresses: [TransportAddress(ip: loopbackV4, port: 0)], udp: false,
            tcpIdleTimeout: .milliseconds(600))
        configuration.maxTCPConnections = 4
        try await withBindingService(configuration) { service, sockets in
            let server = try #require(sockets.first { $0.kind == .tcp }).address
            let connection = try await Harness.offPool { try TestSocket.tcp(connectingTo: server) }
            let request = Message(type: .bindingRequest).encode()
            // One byte every 200 ms never lets the idle timer fire, but the frame never completes in time.
            var closed = false
            for byte in request.prefix(15) where !closed {
                try? await Harness.offPool { try connection.sendAll([byte]) }
                closed = try await Harness.offPool { connection.waitForClose(timeout: 0.2) }
            }
            #expect(closed, "a frame dribbled over 3 s was not cut off")
            try await eventually { service.statistics.idleTimeouts == 1 }
        }
    }

    /// A client that sends requests and never reads its answers: the server stops
    /// reading from it once its answers fill the connection's write water mark (the
    /// client's sends then block), instead of queueing answers without end; when the
    /// client reads again, the server goes on.
    @Test("TCP: a client that does not read its answers is not read either")
    func tcpClientThatDoesNotReadIsNotRead() async throws {
        let configuration = RelayService.Configuration(
            listenAddresses: [TransportAddress(ip: loopbackV4, port: 0)], udp: false)
        try await withBindingService(configuration) { service, sockets in
            let server = try #require(sockets.first { $0.kind == .tcp }).address
            let connection = try await Harness.offPool { try TestSocket.tcp(connectingTo: server) }
            let request = Message(type: .bindingRequest, transactionID: TransactionID(high: 1, low: 2)).encode()
            let chunk = [UInt8]((0..<3000).flatMap { _ in request })
            // Send without reading until the sends stop going through for a second (or 60 MB).
            let sent = try await Harness.offPool { () throws -> Int in
                _ = fcntl(connection.fd, F_SETFL, fcntl(connection.fd, F_GETFL) | O_NONBLOCK)
                var sent = 0
                var stuckSince: ContinuousClock.Instant?
                while sent < 60_000_000 {
                    let n = chunk.withUnsafeBytes { send(connection.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                    if n > 0 {
                        sent += n
                        stuckSince = nil
                    } else if errno == EAGAIN || errno == EWOULDBLOCK {
                        let since = stuckSince ?? .now
                        stuckSince = since
                        if since.duration(to: .now) > .seconds(1) { break }
                        usleep(5_000)
                    } else {
                        throw TestSocketError.failed("send")
                    }
                }
                return sent
            }
            // What the kernel's buffers hold both ways, and no more: not everything sent.
            #expect(sent < 40_000_000, "the server read \(sent) bytes from a client that reads nothing")
            let answered = service.statistics.responses
            #expect(answered < sent / request.count)
            // Reading again, the client gets answers and the server reads on.
            let read = try await Harness.offPool { () -> Int in
                var buffer = [UInt8](repeating: 0, count: 65536)
                var total = 0
                let deadline = ContinuousClock.now + .seconds(5)
                while ContinuousClock.now < deadline, total < 2_000_000 {
                    let n = buffer.withUnsafeMutableBytes { recv(connection.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                    if n > 0 { total += n } else { usleep(2_000) }
                }
                return total
            }
            #expect(read >= 2_000_000)
            try await eventually { service.statistics.responses > answered }
        }
    }

    @Test("TCP: connections over the limit are closed on accept and counted")
    func tcpConnectionLimit() async throws {
        var configuration = RelayService.Configuration(
            listenAddresses: [TransportAddress(ip: loopbackV4, port: 0)], udp: false)
        configuration.maxTCPConnections = 2
        try await withBindingService(configuration) { service, sockets in
            let server = try #require(sockets.first { $0.kind == .tcp }).address
            let first = try await Harness.offPool { try TestSocket.tcp(connectingTo: server) }
            let second = try await Harness.offPool { try TestSocket.tcp(connectingTo: server) }
            let third = try await Harness.offPool { try TestSocket.tcp(connectingTo: server) }
            #expect(try await Harness.offPool { third.waitForClose(timeout: 10) })
            // The admitted ones still answer.
            try await Harness.offPool { try first.sendAll(Message(type: .bindingRequest).encode()) }
            #expect(try await Harness.offPool { try first.readFrame(timeout: 10) } != nil)
            try await eventually { service.statistics.refusedConnections == 1 }
            _ = second
        }
    }

    @Test("TCP: one source's connections over its share are closed on accept; another source is still admitted")
    func tcpPerSourceLimit() async throws {
        var configuration = RelayService.Configuration(
            listenAddresses: [TransportAddress(ip: loopbackV4, port: 0)], udp: false)
        configuration.maxTCPConnectionsPerSource = 2
        try await withBindingService(configuration) { service, sockets in
            let server = try #require(sockets.first { $0.kind == .tcp }).address
            let held = try await Harness.offPool {
                try (0..<2).map { _ in try TestSocket.tcp(connectingTo: server, from: loopbackV4) }
            }
            let refused = try await Harness.offPool { try TestSocket.tcp(connectingTo: server, from: loopbackV4) }
            #expect(try await Harness.offPool { refused.waitForClose(timeout: 10) })
            // From another address (127.0.0.2), a client is served while the first holds its share.
            let other = try await Harness.offPool { try TestSocket.tcp(connectingTo: server, from: secondLoopbackV4) }
            try await Harness.offPool { try other.sendAll(Message(type: .bindingRequest).encode()) }
            #expect(try await Harness.offPool { try other.readFrame(timeout: 10) } != nil)
            try await eventually { service.statistics.refusedConnections == 1 && service.statistics.refusedPerSource == 1 }
            _ = held
        }
    }

    // MARK: RFC 5780

    /// With TURN on, the primary socket is read by the TURN lane (`ListenerSocket`), not by a NIO pipeline.
    static let relaying: TURNServerConfiguration = {
        var turn = TURNServerConfiguration(realm: "test")
        turn.anonymous = true
        return turn
    }()

    @Test(
        "RFC 5780: CHANGE-REQUEST is answered from the asked-for address (Binding-only, and relaying)",
        arguments: [false, true])
    func changeRequestIsAnsweredFromTheOtherAddress(relaying: Bool) async throws {
        let (primaryPort, alternatePort) = try freeUDPPorts()
        let primary = TransportAddress(ip: loopbackV4, port: primaryPort)
        let alternate = TransportAddress(ip: secondLoopbackV4, port: alternatePort)
        let configuration = RelayService.Configuration(
            listenAddresses: [primary], alternateAddress: alternate, turn: relaying ? Self.relaying : nil)
        try await withBindingService(configuration) { service, sockets in
            #expect(
                sockets.filter { $0.kind == .udp }.map(\.address) == [
                    primary, TransportAddress(ip: loopbackV4, port: alternatePort),
                    TransportAddress(ip: secondLoopbackV4, port: primaryPort), alternate,
                ])
            #expect(sockets.filter { $0.kind == .tcp }.map(\.address) == [primary])

            let client = try TestSocket.udp(bindingTo: loopbackV4)
            let cases: [(ChangeRequest, TransportAddress)] = [
                ([.changeIP, .changePort], alternate),
                ([.changePort], TransportAddress(ip: loopbackV4, port: alternatePort)),
                ([.changeIP], TransportAddress(ip: secondLoopbackV4, port: primaryPort)),
                ([], primary),
            ]
            for (change, expectedSource) in cases {
                let request = Message(type: .bindingRequest, attributes: [.changeRequest(change)])
                let (bytes, from) = try await Harness.offPool { try client.exchange(request.encode(), with: primary) }
                #expect(from == expectedSource, "CHANGE-REQUEST \(change.rawValue)")
                let response = try Message(decoding: bytes)
                #expect(response.type == .bindingSuccess)
                #expect(try address(in: response, .xorMappedAddress) == client.localAddress)
                #expect(try address(in: response, .responseOrigin) == expectedSource)
                #expect(try address(in: response, .otherAddress) == alternate)
            }
            try await eventually { service.statistics.responses == cases.count }
        }
    }

    @Test("RFC 5780 works with ephemeral ports and several threads too (Binding-only, and relaying)", arguments: [false, true])
    func behaviorDiscoveryOnEphemeralPorts(relaying: Bool) async throws {
        let configuration = RelayService.Configuration(
            listenAddresses: [TransportAddress(ip: loopbackV4, port: 0)],
            alternateAddress: TransportAddress(ip: secondLoopbackV4, port: 0), tcp: false, threads: 2,
            turn: relaying ? Self.relaying : nil)
        try await withBindingService(configuration) { _, sockets in
            #expect(sockets.count == 4)
            let addresses = Dictionary(uniqueKeysWithValues: sockets.map { ($0.origin, $0.address) })
            let primary = try #require(addresses[.primary])
            let alternate = try #require(addresses[BindingServer.Origin(alternateIP: true, alternatePort: true)])
            #expect(primary.port != 0 && alternate.port != 0 && primary.port != alternate.port)
            let client = try TestSocket.udp(bindingTo: loopbackV4)
            let request = Message(type: .bindingRequest, attributes: [.changeRequest([.changeIP, .changePort])])
            let (bytes, from) = try await Harness.offPool { try client.exchange(request.encode(), with: primary) }
            #expect(from == alternate)
            #expect(try address(in: try Message(decoding: bytes), .otherAddress) == alternate)
        }
    }

    @Test(
        "datagrams longer than 2048 bytes are dropped as too large, not cut short and counted malformed (Binding-only, and relaying)",
        arguments: [false, true])
    func oversizedDatagrams(relaying: Bool) async throws {
        let configuration = RelayService.Configuration(
            listenAddresses: [TransportAddress(ip: loopbackV4, port: 0)], tcp: false, turn: relaying ? Self.relaying : nil)
        try await withBindingService(configuration) { service, sockets in
            let server = try #require(sockets.first).address
            let client = try TestSocket.udp(bindingTo: loopbackV4)
            // A request of exactly the largest size is answered.
            let largest = Message(type: .bindingRequest, attributes: [.padding([UInt8](repeating: 0, count: 2048 - 24))])
            #expect(largest.encode().count == BindingServer.largestRequest)
            try client.sendDatagram(largest.encode(), to: server)
            let answer = try #require(try await Harness.offPool { try client.receive(timeout: 10, capacity: 4096) }, "no answer")
            #expect(try Message(decoding: answer.0).transactionID == largest.transactionID)
            // Valid requests longer than that are not: one just over (whole in every buffer), one of 60,000 bytes.
            for size in [2052, 60_000] {
                let request = Message(type: .bindingRequest, attributes: [.padding([UInt8](repeating: 0, count: size - 24))])
                #expect(request.encode().count == size)
                try client.sendDatagram(request.encode(), to: server)
            }
            let sentinel = Message(type: .bindingRequest)
            try client.sendDatagram(sentinel.encode(), to: server)
            let reply = try #require(try await Harness.offPool { try client.receive(timeout: 10) }, "no answer to the sentinel")
            #expect(try Message(decoding: reply.0).transactionID == sentinel.transactionID, "an oversized request was answered")
            try await eventually { service.statistics.responses == 2 }
            #expect(service.statistics.drops[.tooLarge] == 2)
            #expect(service.statistics.drops[.malformed] == nil)
        }
    }

    // MARK: lifecycle and configuration

    @Test("several threads: the reuse-port sockets answer (Binding-only, and relaying)", arguments: [false, true])
    func severalThreads(relaying: Bool) async throws {
        let configuration = RelayService.Configuration(
            listenAddresses: [TransportAddress(ip: loopbackV4, port: 0)], tcp: false, threads: 2,
            turn: relaying ? Self.relaying : nil)
        try await withBindingService(configuration) { service, sockets in
            #expect(sockets.count == 1)
            let server = try #require(sockets.first).address
            let clients = try (0..<8).map { _ in try TestSocket.udp(bindingTo: loopbackV4) }
            for client in clients {
                let (bytes, _) = try await Harness.offPool {
                    try client.exchange(Message(type: .bindingRequest).encode(), with: server)
                }
                #expect(try address(in: try Message(decoding: bytes), .xorMappedAddress) == client.localAddress)
            }
            try await eventually { service.statistics.responses == clients.count }
        }
    }

    @Test("graceful shutdown closes open connections and returns promptly")
    func gracefulShutdownWithOpenConnection() async throws {
        let configuration = RelayService.Configuration(listenAddresses: [TransportAddress(ip: loopbackV4, port: 0)])
        var connection: TestSocket?
        try await withBindingService(configuration) { _, sockets in
            let server = try #require(sockets.first { $0.kind == .tcp }).address
            connection = try await Harness.offPool { try TestSocket.tcp(connectingTo: server) }
        }
        let open = try #require(connection)
        #expect(try await Harness.offPool { open.waitForClose(timeout: 10) })
    }

    @Test("a port in use is a bind error, for run() and boundSockets() alike")
    func portInUse() async throws {
        let taken = try TestSocket.udp(bindingTo: loopbackV4)
        let service = RelayService(
            configuration: .init(listenAddresses: [taken.localAddress], tcp: false), logger: quietLogger)
        async let bound = service.boundSockets()
        await #expect(throws: RelayServiceError.self) { try await withDeadline(.seconds(5)) { try await service.run() } }
        do {
            _ = try await bound
            Issue.record("boundSockets() returned for a service that could not bind")
        } catch let error as RelayServiceError {
            #expect(error.code == .bindFailed)
            #expect(error.message.contains("\(taken.localAddress)"))
        }
    }

    @Test(
        "configurations that cannot be served say why",
        arguments: [
            RelayService.Configuration(listenAddresses: []),
            RelayService.Configuration(udp: false, tcp: false),
            RelayService.Configuration(threads: 0),
            RelayService.Configuration(
                listenAddresses: [TransportAddress(ip: loopbackV6, port: 3478)],
                alternateAddress: TransportAddress(ip: secondLoopbackV4, port: 3479)),
            RelayService.Configuration(
                listenAddresses: [TransportAddress(ip: .v4(0), port: 3478)],
                alternateAddress: TransportAddress(ip: secondLoopbackV4, port: 3479)),
            RelayService.Configuration(
                listenAddresses: [TransportAddress(ip: loopbackV4, port: 3478)],
                alternateAddress: TransportAddress(ip: loopbackV4, port: 3479)),
            RelayService.Configuration(
                listenAddresses: [TransportAddress(ip: loopbackV4, port: 3478)],
                alternateAddress: TransportAddress(ip: secondLoopbackV4, port: 3479), udp: false),
        ])
    func invalidConfiguration(_ configuration: RelayService.Configuration) throws {
        #expect(throws: RelayServiceError.self) { try configuration.validate() }
        #expect(RelayService.Configuration().listenAddresses.map(\.description) == ["0.0.0.0:3478", "[::]:3478"])
    }

    // MARK: the binary

    @Test(
        "tusa relay prints its ports, answers, and exits 0 on SIGTERM",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func binaryAnswersAndStopsOnSIGTERM() async throws {
        let binary = try #require(Harness.tusa)
        let relay = try Harness.Background(binary, ["relay", "--listen", "127.0.0.1:0", "--no-tcp"])
        defer { relay.kill() }
        let line = try #require(await relay.waitForMatch(#"listening udp 127\.0\.0\.1:[0-9]+"#), "no output from tusa relay")
        let server = try #require(TransportAddress(String(line.dropFirst("listening udp ".count))))

        let client = try TestSocket.udp(bindingTo: loopbackV4)
        let (bytes, _) = try await Harness.offPool { try client.exchange(Message(type: .bindingRequest).encode(), with: server) }
        #expect(try address(in: try Message(decoding: bytes), .xorMappedAddress) == client.localAddress)

        let status = await relay.stop()
        #expect(status == 0, "tusa relay did not exit 0 after SIGTERM")
        #expect(relay.stdout.contains("stopped: responses 1"), "\(relay.stdout)")
    }

    /// Out of file descriptors (`prlimit --nofile`): connections the relay cannot
    /// accept are closed as they come (with a spare descriptor given up for each),
    /// instead of waiting in the kernel's queue while the relay spun on `accept` (70 %
    /// of a core, for as long as they waited); the log names the limit. UDP Binding goes on.
    @Test(
        "tusa relay out of file descriptors closes what it cannot accept and says which limit",
        .enabled(if: Harness.tusa != nil && Harness.which("prlimit") != nil, "needs the tusa binary and util-linux's prlimit"))
    func binaryOutOfDescriptorsClosesWhatItCannotAccept() async throws {
        let binary = try #require(Harness.tusa)
        let prlimit = try #require(Harness.which("prlimit"))
        let relay = try Harness.Background(
            prlimit,
            ["--nofile=48:48", "--", binary, "relay", "--listen", "127.0.0.1:0", "-u", "alice:wonderland", "-r", "example.org"])
        defer { relay.kill() }
        let line = try #require(
            await relay.waitForMatch(#"listening tcp 127\.0\.0\.1:[0-9]+"#), "\(relay.stdout) \(relay.stderr)")
        let server = try #require(TransportAddress(String(line.dropFirst("listening tcp ".count))))
        // More connections than descriptors left: the rest wait in the accept queue.
        var held: [TestSocket] = []
        for _ in 0..<60 { held.append(try TestSocket.tcp(connectingTo: server)) }
        defer { held.removeAll() }
        #expect(
            await relay.waitFor(timeout: 10) { _, err in err.contains("cannot accept connections: too many open files") },
            "\(relay.stderr.suffix(1500))")
        #expect(relay.stderr.contains("ulimit -n 48"), "\(relay.stderr.suffix(1500))")
        // Busy time over two seconds while they wait.
        let pid = try #require(relay.pid)
        let before = try #require(Self.cpuTicks(pid))
        try await Task.sleep(for: .seconds(2))
        let after = try #require(Self.cpuTicks(pid))
        let share = Double(after - before) / Double(sysconf(Int32(_SC_CLK_TCK))) / 2
        #expect(share < 0.2, "the relay used \(share) of a core while it could not accept")
        // UDP Binding still answered.
        let client = try TestSocket.udp(bindingTo: loopbackV4)
        let (bytes, _) = try await Harness.offPool { try client.exchange(Message(type: .bindingRequest).encode(), with: server) }
        #expect(try Message(decoding: bytes).type == MessageType(method: .binding, class: .successResponse))
    }

    /// utime + stime of a process, in clock ticks.
    static func cpuTicks(_ pid: Int32) -> Int? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let end = stat.lastIndex(of: ")")
        else { return nil }
        let fields = stat[stat.index(after: end)...].split(separator: " ")
        guard fields.count > 13, let user = Int(fields[11]), let system = Int(fields[12]) else { return nil }
        return user + system
    }

    @Test(
        "tusa relay refuses bad flags with one line and status 1",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"),
        arguments: [
            ["--listen", "127.0.0.1:notaport"],
            ["--listen", "[::1]:0", "--alt-address", "127.0.0.2:3479"],
            ["--listen", "127.0.0.1:0", "--alt-address", "localhost"],
            ["--listen", "127.0.0.1:0", "--no-udp", "--no-tcp"],
        ])
    func binaryRefusesBadFlags(_ flags: [String]) async throws {
        let binary = try #require(Harness.tusa)
        let r = try await Harness.run(binary, ["relay"] + flags, timeout: 10)
        #expect(r.status == 1)
        #expect(r.stderr.hasPrefix("tusa relay: error: "), "\(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "\(r.stderr)")
    }

    @Test(
        "tusa relay reports a port in use and exits 1",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func binaryReportsPortInUse() async throws {
        let binary = try #require(Harness.tusa)
        let taken = try TestSocket.udp(bindingTo: loopbackV4)
        let r = try await Harness.run(
            binary, ["relay", "--listen", "\(taken.localAddress)", "--no-tcp", "--log-level", "critical"], timeout: 10)
        #expect(r.status == 1)
        #expect(r.stderr.contains("cannot listen on udp \(taken.localAddress)"), "\(r.stderr)")
    }

    /// A --relay-ip this machine does not have made every Allocate fail (508) with
    /// nothing said; the relay now refuses to start.
    @Test(
        "tusa relay refuses a --relay-ip that is not this machine's",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func binaryRefusesARelayIPItDoesNotHave() async throws {
        let binary = try #require(Harness.tusa)
        // TEST-NET-2: documentation only, on no interface.
        let r = try await Harness.run(
            binary,
            ["relay", "--listen", "127.0.0.1:0", "-u", "a:b", "--relay-ip", "198.51.100.77", "--log-level", "critical"],
            timeout: 10)
        #expect(r.status == 1)
        #expect(
            r.stderr.contains("cannot bind relay sockets on 198.51.100.77: Cannot assign requested address"), "\(r.stderr)")
    }
}

// MARK: - Running the service

/// Runs `configuration` in a ServiceGroup, hands the bound sockets to `body`,
/// then shuts the group down gracefully and expects it to be done well before
/// the 30 s TCP idle timeout could have closed anything (10 s: a bound that
/// tells "closes its connections" from "waits for them", not a speed test;
/// under a loaded CI machine shutdown has taken 3 s). The hard timeouts around
/// start and stop are wider (20 s) so that a stalled machine reads as a failed
/// expectation with its duration, not as a bare "timed out".
private func withBindingService(
    _ configuration: RelayService.Configuration,
    _ body: (RelayService, [BoundSocket]) async throws -> Void
) async throws {
    let service = RelayService(configuration: configuration, logger: quietLogger)
    let group = ServiceGroup(configuration: .init(services: [service], logger: quietLogger))
    let running = Task { try await group.run() }
    do {
        let sockets = try await withDeadline(.seconds(20)) { try await service.boundSockets() }
        try await body(service, sockets)
    } catch {
        running.cancel()
        _ = try? await withDeadline(.seconds(5)) { try await running.value }
        throw error
    }
    let clock = ContinuousClock()
    let start = clock.now
    await group.triggerGracefulShutdown()
    try await withDeadline(.seconds(20)) { try await running.value }
    #expect(start.duration(to: clock.now) < .seconds(10), "graceful shutdown took too long")
}

/// Polls `condition` for up to 10 s (the service adds its counts after each read batch).
private func eventually(_ condition: @Sendable () -> Bool) async throws {
    if !(await eventually(within: .seconds(10), condition)) { Issue.record("condition not met within 10 s") }
}

private func address(in message: Message, _ type: AttributeType) throws -> TransportAddress? {
    switch try message.value(type) {
    case .xorMappedAddress(let a), .responseOrigin(let a), .otherAddress(let a), .mappedAddress(let a): a
    default: nil
    }
}

/// Two UDP ports free on both 127.0.0.1 and 127.0.0.2 right now, the first free for a TCP listener on 127.0.0.1 too.
private func freeUDPPorts() throws -> (UInt16, UInt16) {
    for _ in 0..<20 {
        let a = try TestSocket.udp(bindingTo: loopbackV4)
        let b = try TestSocket.udp(bindingTo: loopbackV4)
        let ports = (a.localAddress.port, b.localAddress.port)
        let onSecond = [ports.0, ports.1].allSatisfy { port in
            (try? TestSocket.udp(bindingTo: secondLoopbackV4, port: port)) != nil
        }
        // The service listens on TCP at the primary port too (once CI's parallel run had
        // a connection there: "cannot listen on tcp 127.0.0.1:…: Address already in use").
        if onSecond, TestSocket.tcpListenerCouldBind(TransportAddress(ip: loopbackV4, port: ports.0)) { return ports }
    }
    throw TestSocketError("no two free UDP ports on 127.0.0.1 and 127.0.0.2 (the first free for TCP too)")
}
