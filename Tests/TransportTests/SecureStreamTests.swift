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

    @Test func aSessionOverAStreamCarriesMediaAndMovesBackToUDPWhenAProbeIsAnswered() async throws {
        let (server, atServer) = try await acceptingServer()
        let atClient = Received()
        let tcp = try await server.listenForStreams(host: "127.0.0.1", port: Int(server.localAddress.port))
        #expect(tcp.port == server.localAddress.port)
        let client = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate(), mediaHandler: atClient.handler())
        defer {
            Task {
                await client.close()
                await server.close()
            }
        }

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
    /// listener (TCP and TLS) closes with the endpoint.
    @Test func aSessionInsideTLSCarriesMediaAndEveryListenerClosesWithTheEndpoint() async throws {
        let (server, atServer) = try await acceptingServer()
        let atClient = Received()
        let plain = try await server.listenForStreams(host: "127.0.0.1", port: 0)
        let tls = try await server.listenForStreams(host: "127.0.0.1", port: 0, tls: try serverTLS())
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
    }

    /// Streams over their admission's per-source limit are closed on accept (before
    /// any TLS work), the others stay; one closed frees its slot.
    @Test func streamsPastTheirSourcesLimitAreClosedOnAccept() async throws {
        let (server, _) = try await acceptingServer()
        defer { Task { await server.close() } }
        let admission = ConnectionAdmission(limits: .init(total: 100, perSource: 2))
        let address = try await server.listenForStreams(host: "127.0.0.1", port: 0, admission: admission)
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
    }
}
