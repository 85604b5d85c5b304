import Dispatch
import Foundation
import Logging
import NIOPosix
import Relay
import Rendezvous
import STUN
import Secure
import ServiceLifecycle
import Testing
import Transport
import TusaBase

// The rendezvous over real loopback TCP: the service in process with the NIO
// client, raw sockets for bad input, and `tusa relay --rendezvous-port` whose
// TURN grants the relay's own TURN service accepts.

private let quiet: Logger = {
    var logger = Logger(label: "tusa.test.rendezvous")
    logger.logLevel = .warning
    return logger
}()

private func withRendezvous(
    _ configuration: RendezvousServerConfiguration = .init(),
    _ body: (TransportAddress) async throws -> Void
) async throws {
    try await withRendezvousService(configuration) { _, address in try await body(address) }
}

private func withRendezvousService(
    _ configuration: RendezvousServerConfiguration = .init(),
    _ body: (RendezvousService, TransportAddress) async throws -> Void
) async throws {
    let service = RendezvousService(
        address: TransportAddress(ip: .v4(0x7F00_0001), port: 0), configuration: configuration, logger: quiet)
    let group = ServiceGroup(configuration: .init(services: [service], logger: quiet))
    let running = Task { try await group.run() }
    defer { running.cancel() }
    let address = try await service.boundAddress()
    do { try await body(service, address) } catch {
        await group.triggerGracefulShutdown()
        throw error
    }
    await group.triggerGracefulShutdown()
    _ = try? await running.value
}

/// The next payload from `connection`, within 20 s.
private func next(_ connection: RendezvousConnection) async -> (from: PublicKey, payload: [UInt8])? {
    await next(connection.incoming, within: .seconds(20))
}

@Suite("Rendezvous over loopback TCP", .serialized)
struct RendezvousServiceTests {
    @Test("one IP address cannot hold more than its share of connections; another still registers")
    func perSourceConnectionCap() async throws {
        var configuration = RendezvousServerConfiguration()
        configuration.maximumConnectionsPerSource = 2
        try await withRendezvousService(configuration) { service, server in
            let held = try await Harness.offPool {
                try (0..<2).map { _ in try TestSocket.tcp(connectingTo: server, from: .v4(0x7F00_0001)) }
            }
            let refused = try await Harness.offPool { try TestSocket.tcp(connectingTo: server, from: .v4(0x7F00_0001)) }
            #expect(try await Harness.offPool { refused.waitForClose(timeout: 10) })
            #expect(service.refusedPerSource == 1)
            // From 127.0.0.2 a connection is admitted: it stays open (registration gets 10 s).
            let other = try await Harness.offPool { try TestSocket.tcp(connectingTo: server, from: .v4(0x7F00_0002)) }
            #expect(try await Harness.offPool { other.waitForClose(timeout: 1) } == false)
            #expect(service.refusedPerSource == 1)
            _ = held
        }
    }

    @Test func peersRegisterLookUpAndExchangeSealedOffers() async throws {
        try await withRendezvous { server in
            let alice = PrivateKey.generate()
            let bob = PrivateKey.generate()
            let a = try await RendezvousConnection.connect(to: server, identity: alice, timeout: .seconds(30))
            let b = try await RendezvousConnection.connect(to: server, identity: bob, timeout: .seconds(30))
            #expect(a.turn == nil)  // no TURN secret configured here
            #expect(try await a.lookup(bob.publicKey))
            #expect(try await !a.lookup(PrivateKey.generate().publicKey))
            let offer = Array("{\"ufrag\":\"x\",\"candidates\":[]}".utf8)
            try await a.send(offer, to: bob.publicKey)
            let got = await next(b)
            #expect(got?.from == alice.publicKey && got?.payload == offer)
            try await b.send([7, 7, 7], to: alice.publicKey)
            #expect(await next(a)?.payload == [7, 7, 7])

            // Offline and unknown callees are told apart.
            await b.close()
            // Until the server has seen bob's connection close.
            #expect(try await eventually(within: .seconds(10), poll: .milliseconds(100)) { try await !a.lookup(bob.publicKey) })
            await #expect(throws: RendezvousConnectionError.refused(.offline, "\(bob.publicKey) is offline")) {
                try await a.send([1], to: bob.publicKey)
            }
            let stranger = PrivateKey.generate().publicKey
            await #expect(throws: RendezvousConnectionError.refused(.unknownPeer, "no peer registered under \(stranger)")) {
                try await a.send([1], to: stranger)
            }
            // A second registration of alice's key replaces the first connection.
            let again = try await RendezvousConnection.connect(to: server, identity: alice, timeout: .seconds(30))
            // The old connection is closed by the server (within seconds on a loaded machine).
            let closed = try await eventually(within: .seconds(20), poll: .milliseconds(250)) {
                // Closed, or (its refusal read before a write found it reset) told why.
                do { _ = try await a.lookup(bob.publicKey) } catch let e as RendezvousConnectionError {
                    switch e {
                    case .closed, .refused(.replaced, _): return true
                    default: break
                    }
                }
                return false
            }
            #expect(closed)
            #expect(try await !again.lookup(bob.publicKey))
            await again.close()
        }
    }

    /// A registered client that stops reading what it is sent (here: its event loop
    /// held up) while others send to it: the server closes its connection once a
    /// megabyte waits for it, instead of queueing all that is sent to it.
    static let bobsLoop = MultiThreadedEventLoopGroup(numberOfThreads: 1)

    @Test func aClientThatDoesNotReadIsClosedNotQueuedFor() async throws {
        var configuration = RendezvousServerConfiguration()
        configuration.requestsPerSecond = 100_000
        configuration.requestBurst = 100_000
        try await withRendezvous(configuration) { server in
            let bob = PrivateKey.generate()
            // Bob on a loop of his own (kept for the process), which the test holds up.
            let group = Self.bobsLoop
            let b = try await RendezvousConnection.connect(to: server, identity: bob, timeout: .seconds(30), group: group)
            let a = try await RendezvousConnection.connect(to: server, identity: .generate(), timeout: .seconds(30))
            // Bob's loop is held (it reads nothing) until the sending below is over.
            let release = DispatchSemaphore(value: 0)
            let held = group.next().submit { _ = release.wait(timeout: .now() + 60) }
            // Up to 40 MB toward bob while his loop reads nothing.
            let payload = [UInt8](repeating: 0x42, count: 8_000)
            var sent = 0
            do {
                while sent < 5_000 {
                    try await a.send(payload, to: bob.publicKey)
                    sent += 1
                }
            } catch {}
            release.signal()
            try await held.get()
            // Bob's connection was closed: what reached him ends, short of all that was sent.
            var received = 0
            while await next(b) != nil { received += 1 }
            #expect(sent < 5_000, "the server took all \(sent) messages for a client that read none")
            #expect(received < sent)
            #expect(try await eventually(within: .seconds(10), poll: .milliseconds(100)) { try await !a.lookup(bob.publicKey) })
            await a.close()
        }
    }

    @Test func aFloodingClientIsCutOffAndItsRequestsFailPromptly() async throws {
        try await withRendezvous { server in
            let clock = ContinuousClock()
            let connecting = clock.now
            let a = try await RendezvousConnection.connect(to: server, identity: .generate(), timeout: .seconds(30))
            let key = PrivateKey.generate().publicKey
            let start = clock.now
            var answered = 0
            var closed = 0
            var other: [String] = []
            await withTaskGroup(of: Result<Bool, any Error>.self) { group in
                for _ in 0..<150 {
                    group.addTask { do { return .success(try await a.lookup(key)) } catch { return .failure(error) } }
                }
                for await r in group {
                    switch r {
                    case .success: answered += 1
                    // Closed, or (when its refusal was read before a write found the
                    // connection reset) told why.
                    case .failure(RendezvousConnectionError.closed),
                        .failure(RendezvousConnectionError.refused(.rateLimited, _)):
                        closed += 1
                    case .failure(let e): other.append("\(e)")
                    }
                }
            }
            // The bucket holds 100 requests (the registration took one) and refills
            // at 20 a second from the moment the connection opened: a slow machine
            // earns a few more answers, never 150.
            let took = connecting.duration(to: clock.now)
            let refilled = Double(took.components.seconds) + Double(took.components.attoseconds) / 1e18
            let allowed = 99 + Int((refilled * 20).rounded(.up))
            #expect(
                answered <= allowed && closed > 0,
                "answered \(answered) (allowed \(allowed) in \(took)), closed \(closed), other \(other)")
            #expect(other.isEmpty, "\(other)")
            #expect(
                start.duration(to: clock.now) < .seconds(9), "requests waited for the timeout instead of failing on the close")
        }
    }

    @Test func badInputGetsATypedErrorAndTheConnectionCloses() async throws {
        try await withRendezvous { server in
            let cases: [([UInt8], RendezvousErrorCode)] = [
                ([0, 8] + Array("not json".utf8), .malformed),
                ([0xFF, 0xFF, 0x7B], .tooLarge),
                (RendezvousFrame.frame(.send(id: 1, to: PrivateKey.generate().publicKey, sealed: [1])), .notRegistered),
            ]
            for (bytes, code) in cases {
                let reply = try await Harness.offPool { () -> ([RendezvousMessage], Bool) in
                    let socket = try TestSocket.tcp(connectingTo: server)
                    guard let hello = try socket.readLengthPrefixed(timeout: 5) else { return ([], false) }
                    try socket.sendAll(bytes)
                    var messages = [try RendezvousMessage(decoding: hello)]
                    while let frame = try socket.readLengthPrefixed(timeout: 10) {
                        messages.append(try RendezvousMessage(decoding: frame))
                    }
                    let eof = socket.waitForClose(timeout: 10)
                    return (messages, eof)
                }
                guard case .hello = reply.0.first else {
                    Issue.record("no hello: \(reply.0)")
                    continue
                }
                guard case .error(let got, _, _)? = reply.0.dropFirst().first else {
                    Issue.record("\(code): \(reply.0)")
                    continue
                }
                #expect(got == code)
                #expect(reply.1)
            }
            // A rendezvous that is not there is a typed error, not a hang.
            await #expect(throws: RendezvousConnectionError.self) {
                _ = try await RendezvousConnection.connect(
                    to: TransportAddress(ip: .v4(0x7F00_0001), port: 9), identity: .generate(), timeout: .seconds(1))
            }
        }
    }

    @Test(.enabled(if: Harness.tusa != nil, "needs .build/debug/tusa"))
    func tusaRelayServesTheRendezvousAndItsTURNGrantsWork() async throws {
        let (relay, port) = try #require(
            try await Harness.startRelay([
                "--listen", "127.0.0.1:0", "--use-auth-secret", "--static-auth-secret", "s3cret",
                "--allow-loopback-peers", "--rendezvous-port", "0",
            ]))
        defer { relay.kill() }
        let line = try #require(
            await relay.waitForMatch(#"rendezvous tcp 127\.0\.0\.1:[0-9]+"#), "\(relay.stdout) \(relay.stderr)")
        let rendezvousPort = try #require(line.split(separator: ":").last.flatMap { UInt16($0) })
        let alice = PrivateKey.generate()
        let a = try await RendezvousConnection.connect(
            to: TransportAddress(ip: .v4(0x7F00_0001), port: rendezvousPort), identity: alice, timeout: .seconds(30))
        let grant = try #require(a.turn)
        #expect(grant.uris.contains("turn:127.0.0.1:\(port)?transport=udp"), "\(grant.uris)")
        // The relay's own TURN service takes the grant.
        let tusa = try #require(Harness.tusa)
        let peer = try TestSocket.udp(bindingTo: .v4(0x7F00_0001))
        let run = try await Harness.run(
            tusa,
            [
                "turn", "127.0.0.1:\(port)", "--user", "\(grant.username):\(grant.password)",
                "--peer", "127.0.0.1:\(peer.localAddress.port)", "--count", "3", "--timeout", "3",
            ], timeout: 20)
        #expect(run.stdout.contains("relayed address: 127.0.0.1:"), "\(run.stdout) \(run.stderr)")
        // A forged password is refused.
        let bad = try await Harness.run(
            tusa,
            [
                "turn", "127.0.0.1:\(port)", "--user", "\(grant.username):AAAA", "--peer", "127.0.0.1:9", "--count", "1",
                "--timeout", "3",
            ], timeout: 20)
        #expect(bad.status != 0 && !bad.stdout.contains("relayed address"), "\(bad.stdout) \(bad.stderr)")
        await a.close()
        #expect(await relay.stop() == 0, "\(relay.stderr)")
    }
}
