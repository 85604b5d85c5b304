import Testing
import TusaBase

@testable import Secure

/// The endpoint's one random source: seeded, a virtual-clock run repeats byte for byte.
@Suite struct SecureRandomTests {
    static func identity(_ fill: UInt8) throws -> Identity {
        Identity(privateKey: try PrivateKey(bytes: [UInt8](repeating: fill, count: 32)))
    }

    /// A handshake, a second of media both ways, reports, keepalives, a rekey and a
    /// flood answered with cookies, on a virtual clock: every datagram on the wire.
    static func run(seeds: (UInt64, UInt64)) throws -> [[UInt8]] {
        var config = SecureConfiguration()
        config.rekeyAfter = .seconds(4)
        config.handshakeRate = 1
        config.handshakeBurst = 1
        let net = SimulatedNetwork()
        let a = net.addNode(try identity(1), port: 1000, configuration: config, random: SeededRandom(seed: seeds.0))
        let b = net.addNode(try identity(2), port: 2000, configuration: config, random: SeededRandom(seed: seeds.1))
        let bAtA = a.endpoint.addPeer(b.endpoint.identity.publicKey, address: b.address)
        let aAtB = b.endpoint.addPeer(a.endpoint.identity.publicKey)
        a.endpoint.handle(.connect(bAtA), now: net.now)
        net.flush(a)
        net.run(for: .seconds(1))
        for i in 0..<300 {
            _ = try? net.sendMedia(a, to: bAtA, payload: [UInt8](repeating: UInt8(truncatingIfNeeded: i), count: 40))
            _ = try? net.sendMedia(b, to: aAtB, payload: [UInt8](repeating: 7, count: 40))
            net.run(for: .milliseconds(20))
        }
        // Replayed initiations from many sources: B answers with cookie replies (secret and nonces drawn too).
        let initiation = try #require(net.wire.first { $0.bytes.first == HandshakeWire.initiation })
        for i in 0..<5 {
            net.send(initiation.bytes, from: TransportAddress(ip: .v4(0x0A00_0000 | UInt32(i)), port: 9), to: b.address)
        }
        net.run(for: .seconds(12))
        return net.wire.map(\.bytes)
    }

    @Test func aSeededRunRepeatsByteForByte() throws {
        let first = try Self.run(seeds: (1, 2))
        let second = try Self.run(seeds: (1, 2))
        #expect(first.count > 600)
        #expect(first.contains { $0.first == HandshakeWire.cookieReply }, "the flood met cookies")
        #expect(first.filter { $0.first == HandshakeWire.initiation }.count >= 3, "rekeyed")
        #expect(first == second, "same seeds, same bytes")
        let other = try Self.run(seeds: (1, 3))
        #expect(other != first, "another seed, other bytes")
    }

    @Test func seededStreamsRepeatAndSystemStreamsDoNot() {
        var x: any SecureRandom = SeededRandom(seed: 9)
        var y: any SecureRandom = SeededRandom(seed: 9)
        let (bx, by) = (x.bytes(37), y.bytes(37))
        #expect(bx == by)
        let (ux, uy, nz) = (x.uint32(), y.uint32(), x.nonZeroUInt32())
        #expect(ux == uy && nz != 0)
        _ = y.nonZeroUInt32()
        let (kx, ky) = (x.privateKey().publicKey, y.privateKey().publicKey)
        #expect(kx == ky)
        var s: any SecureRandom = SystemRandom()
        var t: any SecureRandom = SystemRandom()
        let (bs, bt) = (s.bytes(32), t.bytes(32))
        #expect(bs != bt)
    }
}
