import Testing

@testable import Secure

/// The cacophony Noise vectors (../shared/vectors): every handshake message
/// byte-exact from both sides, the handshake hash, then the transport
/// messages that follow with the split keys. BLAKE2s is not in libsodium:
/// those vectors are skipped (listed by `blake2sVectorsAreTheOnlySkips`).
@Suite(.enabled(if: SharedVectors.noisePresent, SharedVectors.noiseAbsent))
struct NoiseVectorTests {
    static func parse(_ name: String) -> (NoisePattern, NoiseHash)? {
        let parts = name.split(separator: "_")
        guard parts.count == 5, parts[0] == "Noise", parts[2] == "25519", parts[3] == "ChaChaPoly",
            let pattern = NoisePattern(rawValue: String(parts[1])),
            let hash = NoiseHash.allCases.first(where: { $0.name == parts[4] })
        else { return nil }
        return (pattern, hash)
    }

    static let supported = SharedVectors.noiseVectors.filter { parse($0.protocol_name) != nil }

    @Test func blake2sVectorsAreTheOnlySkips() {
        let skipped = SharedVectors.noiseVectors.filter { Self.parse($0.protocol_name) == nil }.map(\.protocol_name)
        #expect(skipped.allSatisfy { $0.hasSuffix("_BLAKE2s") }, "unexpected skipped vectors: \(skipped)")
        #expect(Self.supported.count == 12)
        // IK with each libsodium hash is present and run.
        for hash in ["BLAKE2b", "SHA256", "SHA512"] {
            #expect(Self.supported.contains { $0.protocol_name == "Noise_IK_25519_ChaChaPoly_\(hash)" })
        }
    }

    @Test(arguments: supported)
    func vector(_ v: SharedVectors.NoiseVector) throws {
        let (pattern, hash) = try #require(Self.parse(v.protocol_name))
        let initiator = try NoiseHandshake(
            pattern: pattern, hash: hash, initiator: true, prologue: hex(v.init_prologue),
            localStatic: try v.init_static.map { try PrivateKey(bytes: hex($0)) },
            remoteStatic: try v.init_remote_static.map { try PublicKey(bytes: hex($0)) },
            localEphemeral: try PrivateKey(bytes: hex(v.init_ephemeral)),
            psk: try v.init_psks?.first.map { try SecretKey(bytes: hex($0)) })
        let responder = try NoiseHandshake(
            pattern: pattern, hash: hash, initiator: false, prologue: hex(v.resp_prologue),
            localStatic: try v.resp_static.map { try PrivateKey(bytes: hex($0)) },
            remoteStatic: nil,
            localEphemeral: try PrivateKey(bytes: hex(v.resp_ephemeral)),
            psk: try v.resp_psks?.first.map { try SecretKey(bytes: hex($0)) })
        #expect(initiator.protocolName == v.protocol_name)

        var index = 0
        while !initiator.isComplete {
            let m = v.messages[index]
            let (writer, reader) = index % 2 == 0 ? (initiator, responder) : (responder, initiator)
            let wire = try writer.writeMessage(payload: hex(m.payload))
            #expect(Hex.encode(wire) == m.ciphertext, "handshake message \(index)")
            #expect(try reader.readMessage(wire) == hex(m.payload), "handshake payload \(index)")
            index += 1
        }
        #expect(responder.isComplete)
        #expect(Hex.encode(initiator.handshakeHash) == v.handshake_hash)
        #expect(Hex.encode(responder.handshakeHash) == v.handshake_hash)
        if let s = v.init_static, pattern != .NK {
            #expect(try responder.remoteStaticKey == PrivateKey(bytes: hex(s)).publicKey)
        }

        let ik = try initiator.split()
        let rk = try responder.split()
        #expect(ik.send == rk.receive && ik.receive == rk.send)
        let initiatorSend = NoiseCipherState(key: ik.send)
        let initiatorReceive = NoiseCipherState(key: ik.receive)
        let responderSend = NoiseCipherState(key: rk.send)
        let responderReceive = NoiseCipherState(key: rk.receive)
        // Transport messages keep alternating: even index from the initiator.
        for i in index..<v.messages.count {
            let m = v.messages[i]
            let (send, receive) = i % 2 == 0 ? (initiatorSend, responderReceive) : (responderSend, initiatorReceive)
            let wire = try send.encrypt(plaintext: hex(m.payload))
            #expect(Hex.encode(wire) == m.ciphertext, "transport message \(i)")
            #expect(try receive.decrypt(ciphertext: wire) == hex(m.payload))
        }
        #expect(index < v.messages.count, "the vector has transport messages")
    }
}
