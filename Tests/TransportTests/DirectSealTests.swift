import Foundation
import NIOCore
import Secure
import Synchronization
import Testing
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#endif

// A driver that writes its own datagrams (the party relay: a frame's copies in one
// sendmmsg) seals them with `sealOnLoop` and sends them on a duplicate of the
// endpoint's socket, over real loopback sockets.
@Suite("Media sealed for a driver that writes it itself")
struct DirectSealTests {
    private final class Received: Sendable {
        let payloads = Mutex<[[UInt8]]>([])
        var all: [[UInt8]] { payloads.withLock { $0 } }
        func handler() -> SecureUDPEndpoint.MediaHandler {
            { _, _, payload in self.payloads.withLock { $0.append(Array(payload)) } }
        }
    }

    private func eventually(_ condition: () -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            if condition() { return true }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return condition()
    }

    /// A UDP socket bound to 127.0.0.1 on any port.
    private func loopbackSocket() throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        try #require(fd >= 0)
        var sin = sockaddr_in()
        sin.sin_family = sa_family_t(AF_INET)
        sin.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let bound = withUnsafePointer(to: &sin) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        try #require(bound == 0)
        return fd
    }

    private func send(_ bytes: ArraySlice<UInt8>, on fd: Int32, to address: TransportAddress) -> Bool {
        var sin = sockaddr_in()
        sin.sin_family = sa_family_t(AF_INET)
        sin.sin_port = address.port.bigEndian
        sin.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        return bytes.withUnsafeBytes { raw in
            withUnsafePointer(to: &sin) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(fd, raw.baseAddress, raw.count, 0, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == raw.count
                }
            }
        }
    }

    @Test func mediaSealedForTheDriverReadsAtThePeerAndOtherPathsAreSentTheEndpointsWay() async throws {
        var accepting = SecureConfiguration()
        accepting.acceptUnknownPeers = true
        let atServer = Received()
        let server = try await SecureUDPEndpoint.bind(
            host: "127.0.0.1", identity: .generate(), configuration: accepting, mediaHandler: atServer.handler())
        _ = try await server.listenForStreams(host: "127.0.0.1", port: Int(server.localAddress.port))

        // The driver binds the socket, hands it to the endpoint and writes on a duplicate.
        let fd = try loopbackSocket()
        let own = dup(fd)
        try #require(own >= 0)
        let client = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate(), boundSocket: fd)
        let peer = try await client.connect(to: server.publicKey, at: server.localAddress)

        let payload = Array("sealed for the driver".utf8)
        let (sealed, bytes) = try await client.eventLoop.submit {
            var out = [UInt8](repeating: 0, count: 2048)
            let sealed = out.withUnsafeMutableBytes {
                client.sealOnLoop(payload, to: peer, payloadType: 111, timestamp: 160, into: $0)
            }
            return (sealed, out)
        }.get()
        guard case .sealed(let length, let to) = sealed else {
            Issue.record("a peer on the socket is sealed for the driver: \(sealed)")
            return
        }
        #expect(to == server.localAddress)
        #expect(length == 12 + payload.count + 16)
        #expect(send(bytes[..<length], on: own, to: to))
        #expect(await eventually { atServer.all.contains(payload) }, "the peer opens what the driver wrote")

        // The driver writes a burst's datagrams when the burst has been read: the server hears of each burst's end.
        let bursts = Mutex(0)
        await server.setReadBurstEndHandler { bursts.withLock { $0 += 1 } }
        client.send(Array("a burst".utf8), to: peer, payloadType: 111, timestamp: 320)
        #expect(await eventually { bursts.withLock { $0 } >= 1 }, "no read burst ended at the server")

        // A peer reached over a TCP stream: sealed and sent the endpoint's way, not handed back.
        let streamClient = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate())
        try await streamClient.useStream(to: server.localAddress)
        let streamPeer = try await streamClient.connect(to: server.publicKey, at: server.localAddress)
        let overStream = Array("over the stream".utf8)
        let viaStream = try await streamClient.eventLoop.submit {
            var out = [UInt8](repeating: 0, count: 2048)
            return out.withUnsafeMutableBytes {
                streamClient.sealOnLoop(overStream, to: streamPeer, payloadType: 111, timestamp: 0, into: $0)
            }
        }.get()
        #expect(viaStream == .sentOtherwise)
        #expect(await eventually { atServer.all.contains(overStream) }, "the endpoint sent it on its stream")

        // Too small a buffer, or a closed endpoint: nothing sealed.
        let small = try await client.eventLoop.submit {
            var out = [UInt8](repeating: 0, count: 16)
            return out.withUnsafeMutableBytes { client.sealOnLoop(payload, to: peer, payloadType: 111, timestamp: 0, into: $0) }
        }.get()
        #expect(small == .unsent)
        await streamClient.close()
        await client.close()
        await server.close()
        close(own)
    }

    /// A frame's copies for several peers in one call (the party relay's fan-out):
    /// each copy for the socket is handed over in turn, sealed under its own peer's
    /// keys; a peer on a stream is sent the endpoint's way; an unknown peer is counted.
    @Test func copiesForManyPeersAreHandedOverOneByOneEachUnderItsOwnKeys() async throws {
        var accepting = SecureConfiguration()
        accepting.acceptUnknownPeers = true
        let heard = [Received(), Received(), Received()]
        var servers: [SecureUDPEndpoint] = []
        for h in heard {
            servers.append(
                try await SecureUDPEndpoint.bind(
                    host: "127.0.0.1", identity: .generate(), configuration: accepting, mediaHandler: h.handler()))
        }
        _ = try await servers[2].listenForStreams(host: "127.0.0.1", port: Int(servers[2].localAddress.port))

        let fd = try loopbackSocket()
        let own = dup(fd)
        try #require(own >= 0)
        let client = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate(), boundSocket: fd)
        try await client.useStream(to: servers[2].localAddress)
        var peers: [PeerID] = []
        for server in servers { peers.append(try await client.connect(to: server.publicKey, at: server.localAddress)) }
        // One the endpoint never had.
        peers.append(PeerID(rawValue: peers.map(\.rawValue).reduce(0, max) + 100))

        let payload = Array("one frame, four members".utf8)
        let targets = peers
        let (counts, copies) = try await client.eventLoop.submit {
            var out = [UInt8](repeating: 0, count: 2048)
            var copies: [([UInt8], TransportAddress)] = []
            let counts = out.withUnsafeMutableBytes { out in
                client.sealOnLoop(payload, toEach: targets, payloadType: 111, timestamp: 160, into: out) { sealed, to in
                    copies.append((Array(sealed), to))
                }
            }
            return (counts, copies)
        }.get()
        var expected = SecureUDPEndpoint.DirectSeals()
        expected.sealed = 2
        expected.sentOtherwise = 1
        expected.unsent = 1
        #expect(counts == expected)
        #expect(copies.map(\.1) == [servers[0].localAddress, servers[1].localAddress])
        #expect(copies.allSatisfy { $0.0.count == 12 + payload.count + 16 })
        #expect(copies.count == 2 && copies[0].0[12...] != copies[1].0[12...], "each copy is sealed under its own peer's keys")
        for (bytes, to) in copies { #expect(send(bytes[...], on: own, to: to)) }
        for (i, h) in heard.enumerated() {
            #expect(await eventually { h.all.contains(payload) }, "peer \(i) opens its copy")
        }
        for server in servers { await server.close() }
        await client.close()
        close(own)
    }
}
