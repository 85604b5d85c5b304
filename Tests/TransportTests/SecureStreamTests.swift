import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import Secure
import Synchronization
import TestSupport
import Testing
import Transport
import TusaBase

// The secure session over TCP (RFC 4571 framing) for networks that block UDP,
// over real loopback sockets: the same handshake and media as over UDP, and the
// move back to UDP once a probe shows UDP passes.
@Suite("The secure session over a TCP stream")
struct SecureStreamTests {
    private final class Received: Sendable {
        let payloads = Mutex<[[UInt8]]>([])
        var all: [[UInt8]] { payloads.withLock { $0 } }
        func handler() -> SecureUDPEndpoint.MediaHandler {
            { _, _, payload in self.payloads.withLock { $0.append(Array(payload)) } }
        }
    }

    /// A loop for a client the test holds up (kept for the process, as the singleton is).
    static let clientLoop = MultiThreadedEventLoopGroup(numberOfThreads: 1)

    /// A moment noted from another thread.
    private final class Moment: Sendable {
        let value = Mutex<Duration?>(nil)
    }

    private func eventually(_ condition: () async -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            if await condition() { return true }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return await condition()
    }

    /// An endpoint that takes any key on loopback UDP, and what media reached it.
    private func acceptingServer() async throws -> (SecureUDPEndpoint, Received) {
        var accepting = SecureConfiguration()
        accepting.acceptUnknownPeers = true
        let received = Received()
        let server = try await SecureUDPEndpoint.bind(
            host: "127.0.0.1", identity: .generate(), configuration: accepting, mediaHandler: received.handler())
        return (server, received)
    }

    /// An accepting server that also listens for streams on its UDP port, and a client
    /// with what reached it; both closed when `body` returns.
    private func withStreamServerAndClient(
        clientGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        _ body: (SecureUDPEndpoint, Received, SecureUDPEndpoint, Received) async throws -> Void
    ) async throws {
        // The stream listens on the UDP socket's port number, which the kernel picked
        // for UDP: another test may hold it for TCP. Then a new server, a new port.
        var bound: (SecureUDPEndpoint, Received)?
        for _ in 0..<10 where bound == nil {
            let (candidate, received) = try await acceptingServer()
            do {
                let tcp = try await candidate.listenForStreams(host: "127.0.0.1", port: Int(candidate.localAddress.port))
                #expect(tcp.port == candidate.localAddress.port)
                bound = (candidate, received)
            } catch {
                await candidate.close()
            }
        }
        let (server, atServer) = try #require(bound, "no UDP port whose number was free for TCP in 10 tries")
        let atClient = Received()
        let client = try await SecureUDPEndpoint.bind(
            host: "127.0.0.1", identity: .generate(), mediaHandler: atClient.handler(), group: clientGroup)
        defer {
            Task {
                await client.close()
                await server.close()
            }
        }
        try await body(server, atServer, client, atClient)
    }

    @Test func aSessionOverAStreamCarriesMediaAndMovesBackToUDPWhenAProbeIsAnswered() async throws {
        try await withStreamServerAndClient { server, atServer, client, atClient in
            try await client.useStream(to: server.localAddress)
            let peer = try await client.connect(to: server.publicKey, at: server.localAddress)
            #expect(await client.usesStream(to: server.localAddress))
            client.send(Array("over tcp".utf8), to: peer, payloadType: 111, timestamp: 0)
            #expect(await eventually { atServer.all.contains(Array("over tcp".utf8)) })
            // The server saw the member at a stand-in address in 100::/64, not its UDP port.
            let serverPeer = try await server.waitForPeer(client.publicKey)
            let member = try #require(try await server.describe(serverPeer)?.address)
            if case .v6(let high, _) = member.ip { #expect(high == 0x0100_0000_0000_0000) } else { Issue.record("\(member)") }

            // A probe over UDP: the server moves the member to its UDP address and answers
            // there; the client, answered over UDP, leaves the stream.
            client.probeUDP(to: server.localAddress)
            client.send(Array("probe".utf8), to: peer, payloadType: 111, timestamp: 160)
            #expect(await eventually { atServer.all.contains(Array("probe".utf8)) })
            #expect(try await server.describe(serverPeer)?.address == client.localAddress)
            server.send(Array("over udp".utf8), to: serverPeer, payloadType: 111, timestamp: 0)
            #expect(await eventually { atClient.all.contains(Array("over udp".utf8)) })
            #expect(await eventually { !(await client.usesStream(to: server.localAddress)) })
            #expect(await client.streamsLeftForUDP() == 1)
            client.send(Array("udp again".utf8), to: peer, payloadType: 111, timestamp: 320)
            #expect(await eventually { atServer.all.contains(Array("udp again".utf8)) })
        }
    }

    /// A member over TCP whose side stops reading (here: its event loop held up) costs
    /// the sender what a stream's write water mark allows, not all that is sent to it:
    /// past that, datagrams for it are dropped as lost UDP ones would be. When it reads
    /// again, what is sent then arrives.
    @Test func aStreamWhosePeerDoesNotReadDropsRatherThanQueues() async throws {
        // The client on a loop of its own: the test holds it up, and the server's must run.
        try await withStreamServerAndClient(clientGroup: Self.clientLoop) { server, _, client, atClient in
            try await client.useStream(to: server.localAddress)
            let peer = try await client.connect(to: server.publicKey, at: server.localAddress)
            client.send([0], to: peer, payloadType: 111, timestamp: 0)
            let member = try await server.waitForPeer(client.publicKey)

            // The client's loop is held, reading nothing, until the sending is over.
            let release = DispatchSemaphore(value: 0)
            let held = client.eventLoop.submit { _ = release.wait(timeout: .now() + 60) }
            // 24 MB toward it: more than the kernel's buffers on both sides hold. (The
            // count is read on the server's loop after every send queued there.)
            let frame = [UInt8](repeating: 0x5A, count: 1000)
            for i in 0..<24_000 { server.send(frame, to: member, payloadType: 111, timestamp: UInt32(i)) }
            let dropped = await server.droppedOnFullStreams()
            release.signal()
            #expect(dropped > 5_000, "\(dropped) dropped")
            try await held.get()
            // Reading again: what is sent now arrives.
            #expect(
                await eventually {
                    server.send(Array("after".utf8), to: member, payloadType: 111, timestamp: 0)
                    try? await Task.sleep(for: .milliseconds(50))
                    return atClient.all.contains(Array("after".utf8))
                })
            #expect(atClient.all.count < 24_000 - 5_000)
        }
    }

    @Test func aStreamToNothingIsATypedError() async throws {
        let client = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate())
        defer { Task { await client.close() } }
        // Port 9 (discard) on loopback: nothing listens there.
        let nowhere = TransportAddress(ip: .v4(0x7F00_0001), port: 9)
        do {
            try await client.useStream(to: nowhere, timeout: .seconds(2))
            Issue.record("a stream to a closed port opened")
        } catch {
            guard case .stream(_, let cause?) = error else {
                Issue.record("\(error)")
                return
            }
            #expect((cause.error as? IOError)?.errnoCode == ECONNREFUSED || "\(cause)".contains("refused"), "\(cause)")
        }
    }

    /// A server context for a fresh self-signed certificate (what `tusa relay --cert` loads).
    private func serverTLS() throws -> NIOSSLContext {
        let certificate = try TestCertificate.make()
        let chain = try NIOSSLCertificate.fromPEMFile(certificate.certificateFile)
        let key = try NIOSSLPrivateKey(file: certificate.privateKeyFile, format: .pem)
        return try NIOSSLContext(
            configuration: .makeServerConfiguration(
                certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key)))
    }

    /// Networks that pass only TLS (port 443): the same session inside TLS, media
    /// both ways; the client takes the self-signed certificate (the Noise key proves
    /// the server). A TLS client at a plain TCP listener is told there was no TLS
    /// handshake; a plain one at the TLS listener never gets a session. Every
    /// listener (TCP and TLS) closes with the endpoint. With `onAnotherLoop`, the
    /// TLS listener and its connections live on a loop of their own (as a relay's
    /// party port keeps handshakes off its media loop): frames hop to the
    /// endpoint's loop, replies back through the connection.
    @Test(arguments: [false, true])
    func aSessionInsideTLSCarriesMediaAndEveryListenerClosesWithTheEndpoint(onAnotherLoop: Bool) async throws {
        let (server, atServer) = try await acceptingServer()
        let atClient = Received()
        let handshakes = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { handshakes.shutdownGracefully { _ in } }  // (a failure's way out; shut down below otherwise)
        let plain = try await server.listenForStreams(host: "127.0.0.1", port: 0)
        let tls = try await server.listenForStreams(
            host: "127.0.0.1", port: 0, tls: try serverTLS(), streamLoop: onAnotherLoop ? handshakes.next() : nil)
        let client = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate(), mediaHandler: atClient.handler())
        defer { Task { await client.close() } }

        try await client.useStream(to: tls, tls: true)
        let peer = try await client.connect(to: server.publicKey, at: tls)
        #expect(await client.usesStream(to: tls))
        client.send(Array("inside tls".utf8), to: peer, payloadType: 111, timestamp: 0)
        #expect(await eventually { atServer.all.contains(Array("inside tls".utf8)) })
        let serverPeer = try await server.waitForPeer(client.publicKey)
        server.send(Array("back inside tls".utf8), to: serverPeer, payloadType: 111, timestamp: 0)
        #expect(await eventually { atClient.all.contains(Array("back inside tls".utf8)) })

        let other = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate())
        defer { Task { await other.close() } }
        do {
            try await other.useStream(to: plain, tls: true, timeout: .seconds(2))
            Issue.record("a TLS stream to a plain TCP listener opened")
        } catch {
            guard case .stream(let what, _) = error else {
                Issue.record("\(error)")
                return
            }
            #expect(what.contains("no TLS handshake"), "\(error)")
        }
        try await other.useStream(to: tls)
        do {
            _ = try await other.connect(to: server.publicKey, at: tls, timeout: .seconds(1))
            Issue.record("a session without TLS on the TLS listener")
        } catch {
            #expect(error == .timeout, "\(error)")
        }

        await server.close()
        for address in [plain, tls] {
            await #expect(throws: (any Error).self, "\(address) still listens") {
                try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                    .connect(host: "127.0.0.1", port: Int(address.port)).get().close()
            }
        }
        try await handshakes.shutdownGracefully()
    }

    /// Streams over their admission's per-source limit are closed on accept (before
    /// any TLS work), the others stay; one closed frees its slot.
    /// The same with the connections on another loop than the endpoint's.
    @Test(arguments: [false, true])
    func streamsPastTheirSourcesLimitAreClosedOnAccept(onAnotherLoop: Bool) async throws {
        let (server, _) = try await acceptingServer()
        let other = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { other.shutdownGracefully { _ in } }  // (a failure's way out; shut down below otherwise)
        let admission = ConnectionAdmission(limits: .init(total: 100, perSource: 2))
        let address = try await server.listenForStreams(
            host: "127.0.0.1", port: 0, admission: admission, streamLoop: onAnotherLoop ? other.next() : nil)
        func open() async throws -> any Channel {
            try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connect(host: "127.0.0.1", port: Int(address.port)).get()
        }
        let kept = [try await open(), try await open()]
        let refused = try await open()
        #expect(await eventually { !refused.isActive }, "the third from one source is closed")
        #expect(kept.allSatisfy { $0.isActive })
        #expect(admission.refused[.perSource] == 1)
        try await kept[0].close()
        #expect(await eventually { admission.open.connections == 1 })
        let again = try await open()
        #expect(await eventually { admission.open.connections == 2 }, "a freed slot takes the next")
        #expect(admission.refused[.perSource] == 1 && again.isActive)
        for c in [kept[1], again] { try? await c.close() }
        #expect(await eventually { admission.open.connections == 0 })
        await server.close()
        try await other.shutdownGracefully()
    }

    /// Slowloris on a party stream: bytes trickled into a frame that never completes do
    /// not keep the connection alive (it is closed `readTimeout` after it opened), while
    /// whole frames do.
    @Test(arguments: [false, true])
    func aStreamTricklingAFrameIsClosedAtItsReadTimeout(onAnotherLoop: Bool) async throws {
        let (server, _) = try await acceptingServer()
        let other = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { other.shutdownGracefully { _ in } }
        let address = try await server.listenForStreams(
            host: "127.0.0.1", port: 0, streamLoop: onAnotherLoop ? other.next() : nil, readTimeout: .seconds(3))
        func open() async throws -> any Channel {
            try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connect(host: "127.0.0.1", port: Int(address.port)).get()
        }
        let opened = ContinuousClock.now
        let trickle = try await open()
        // When the close happened, taken on the channel's loop as it closes (the loop
        // below only looks every 200 ms, and its sleeps overshoot on a loaded machine).
        let closed = Moment()
        trickle.closeFuture.whenComplete { _ in closed.value.withLock { $0 = ContinuousClock.now - opened } }
        let frames = try await open()
        // A frame announced at 100 bytes, then a byte every 200 ms; beside it, a whole
        // 3-byte frame every 200 ms (a datagram the endpoint drops: not a session's).
        // (On a loaded machine the stream may already be at its timeout here: the write
        // then fails, and the close is still timed from `opened` below.)
        try? await trickle.writeAndFlush(ByteBuffer(bytes: [0x00, 0x64])).get()
        for _ in 0..<35 {
            try await Task.sleep(for: .milliseconds(200))
            if trickle.isActive { try? await trickle.writeAndFlush(ByteBuffer(bytes: [0x61])).get() }
            try? await frames.writeAndFlush(ByteBuffer(bytes: [0x00, 0x03, 0xFF, 0xFF, 0xFF])).get()
        }
        let closedAt = try #require(closed.value.withLock { $0 }, "a trickled frame kept its stream open for 7 s")
        #expect(closedAt >= .milliseconds(2900) && closedAt < .milliseconds(6000), "closed after \(closedAt)")
        #expect(frames.isActive, "whole frames did not keep their stream open")
        try? await frames.close()
        await server.close()
        try await other.shutdownGracefully()
    }

    /// A client writing faster than a busy endpoint's loop takes its frames: the
    /// connection (on a loop of its own) stops reading, TCP holds the client back, and
    /// reading resumes once the frames are taken; every frame arrives, in order.
    @Test func aStreamOnAnotherLoopStopsReadingWhileTheEndpointIsBusyAndLosesNothing() async throws {
        // Each side on loops of its own: the test holds up the endpoint's, and the client's
        // 5,000 writes stay off the loops other tests share.
        let media = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let other = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let clientLoop = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer {
            for group in [media, other, clientLoop] { group.shutdownGracefully { _ in } }
        }
        var accepting = SecureConfiguration()
        accepting.acceptUnknownPeers = true
        let atServer = Received()
        let server = try await SecureUDPEndpoint.bind(
            host: "127.0.0.1", identity: .generate(), configuration: accepting, mediaHandler: atServer.handler(), group: media)
        let address = try await server.listenForStreams(host: "127.0.0.1", port: 0, streamLoop: other.next())
        let client = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate(), group: clientLoop)
        try await client.useStream(to: address)
        let peer = try await client.connect(to: server.publicKey, at: address)

        // The endpoint's loop busy while the client writes 5,000 frames (over 200 KiB): until
        // the connection stops reading (or 10 s: then the expectation below fails), and 300 ms
        // more, in which a connection that went on reading would pile up the rest.
        let busy = server.eventLoop.submit {
            let deadline = ContinuousClock.now + .seconds(10)
            while server.streamReadsHeld == 0, ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.002) }
            Thread.sleep(forTimeInterval: 0.3)
        }
        let count = 5_000
        for i in 0..<count {
            client.send(withUnsafeBytes(of: UInt32(i).bigEndian, Array.init), to: peer, payloadType: 111, timestamp: 0)
        }
        try await busy.get()
        #expect(server.streamReadsHeld > 0, "the connection never stopped reading")
        // What waited for the endpoint's loop: 64 KiB and the read that crossed it, at most.
        #expect(server.streamBacklogPeakBytes >= 64 * 1024)
        #expect(server.streamBacklogPeakBytes <= 80 * 1024, "\(server.streamBacklogPeakBytes) bytes waited")
        // Reading resumed: everything comes in.
        let arrived = await eventually { atServer.payloads.withLock { $0.count } >= count }
        #expect(arrived, "\(atServer.all.count) of \(count) frames arrived")
        let order = atServer.all.map { $0.withUnsafeBytes { $0.loadUnaligned(as: UInt32.self).bigEndian } }
        let outOfPlace = order.indices.first { order[$0] != UInt32($0) }
        #expect(outOfPlace == nil, "frame \(outOfPlace ?? 0) out of order")
        await client.close()
        await server.close()
        for group in [other, clientLoop, media] { try await group.shutdownGracefully() }
    }
}
