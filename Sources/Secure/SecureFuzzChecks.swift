import TusaBase

/// What the SecureFuzz target (and the pinned crash inputs' test) runs on
/// each input: every parser and opener that sees network bytes, with fixed
/// keys. Raw inputs must never trap; valid packets and handshake messages
/// with the input XORed in must never authenticate.
public enum SecureFuzzChecks {
    private static let key = (try? SecretKey(bytes: [UInt8](repeating: 0x11, count: 32))) ?? .random()
    private static let responderStatic = (try? PrivateKey(bytes: [UInt8](repeating: 0x22, count: 32))) ?? .generate()
    private static let initiatorStatic = (try? PrivateKey(bytes: [UInt8](repeating: 0x33, count: 32))) ?? .generate()
    private static let initiatorEphemeral = (try? PrivateKey(bytes: [UInt8](repeating: 0x44, count: 32))) ?? .generate()

    public static func exercise(_ bytes: [UInt8]) {
        let cipher = MediaCipher(key: key)
        rawInput(bytes, cipher)
        mutatedMedia(bytes, cipher)
        mutatedControl(bytes, cipher)
        handshake(bytes)
        endpoint(bytes)
        initiation(bytes)
        cookieReply(bytes)
        SecureSessionFuzzChecks.exercise(bytes)
    }

    private static let responderAddress = TransportAddress(ip: .v4(0x0A00_0002), port: 4000)
    private static let initiatorAddress = TransportAddress(ip: .v4(0x0A00_0001), port: 5000)

    private static func responderEndpoint(handshakeBurst: Double? = nil) -> SecureEndpoint {
        var config = SecureConfiguration()
        config.acceptUnknownPeers = true
        if let handshakeBurst { config.handshakeBurst = handshakeBurst }
        return SecureEndpoint(identity: Identity(privateKey: responderStatic), configuration: config, now: .seconds(1))
    }

    /// What `endpoint` asks to send, drained.
    private static func sent(by endpoint: SecureEndpoint) -> [[UInt8]] {
        var out: [[UInt8]] = []
        while let action = endpoint.pollAction() { if case .send(let bytes, _) = action { out.append(bytes) } }
        return out
    }

    /// A genuine initiation (mac1 right, Noise message 1 sealed to the responder) whose
    /// sealed payload (timestamp and SSRC) is the input's first 16 bytes, its sender
    /// index the next 4 and its mac2 the 16 after: what anyone may send a relay that
    /// takes unknown peers, past every check that needs no key. It is answered once
    /// with a response the initiator reads, and refused as a replay the second time.
    private static func initiation(_ bytes: [UInt8]) {
        func field(_ range: Range<Int>) -> [UInt8] {
            (range).map { $0 < bytes.count ? bytes[$0] : 0 }
        }
        guard
            let noise = try? NoiseHandshake(
                pattern: .IK, hash: .blake2b, initiator: true, prologue: HandshakeWire.prologue,
                localStatic: initiatorStatic, remoteStatic: responderStatic.publicKey, localEphemeral: initiatorEphemeral),
            let m1 = try? noise.writeMessage(payload: field(0..<16)), m1.count == HandshakeWire.initiationNoise.count
        else { preconditionFailure("building an initiation failed") }
        var m = [UInt8](repeating: 0, count: HandshakeWire.initiationLength)
        m[0] = HandshakeWire.initiation
        m.replaceSubrange(4..<8, with: field(16..<20))
        m.replaceSubrange(HandshakeWire.initiationNoise, with: m1)
        m.replaceSubrange(
            HandshakeWire.initiationMAC1,
            with: MAC.mac(m[..<HandshakeWire.initiationMAC1.lowerBound], key: MAC.mac1Key(for: responderStatic.publicKey)))
        m.replaceSubrange(HandshakeWire.initiationMAC2, with: field(20..<36))
        let e = responderEndpoint()
        var first = m
        _ = e.receive(&first, from: initiatorAddress, now: .seconds(2))
        let answers = sent(by: e)
        guard answers.count == 1, let response = answers.first, response.count == HandshakeWire.responseLength,
            response[0] == HandshakeWire.response, Array(response[8..<12]) == field(16..<20)
        else { preconditionFailure("a genuine initiation was not answered once: \(answers.map(\.count))") }
        let mac = MAC.mac(response[..<HandshakeWire.responseMAC1.lowerBound], key: MAC.mac1Key(for: initiatorStatic.publicKey))
        precondition(MAC.equal(response[HandshakeWire.responseMAC1], mac), "the response's mac1 does not verify")
        guard let payload = try? noise.readMessage(Array(response[HandshakeWire.responseNoise])), payload.count == 4 else {
            preconditionFailure("the initiator cannot read the response")
        }
        var again = m
        _ = e.receive(&again, from: initiatorAddress, now: .seconds(3))
        precondition(sent(by: e).isEmpty, "a replayed initiation was answered")
        e.handleTimeout(now: .seconds(200))
        _ = sent(by: e)
    }

    /// A responder under load answers an initiation without a valid mac2 with a
    /// cookie reply; the initiator retries at once with mac2, which the responder
    /// answers. The input XORed into the reply first: a changed reply is not taken,
    /// so no retry of the initiator's is answered.
    private static func cookieReply(_ bytes: [UInt8]) {
        let initiator = SecureEndpoint(identity: Identity(privateKey: initiatorStatic), now: .seconds(1))
        let id = initiator.addPeer(responderStatic.publicKey, address: responderAddress)
        initiator.handle(.connect(id), now: .seconds(1))
        guard var m = sent(by: initiator).first(where: { $0.first == HandshakeWire.initiation }) else {
            preconditionFailure("the initiator sent no initiation")
        }
        // A budget of one: another key's initiation spends it, the next needs a cookie.
        let e = responderEndpoint(handshakeBurst: 1)
        let other = SecureEndpoint(identity: Identity(privateKey: initiatorEphemeral), now: .seconds(1))
        other.handle(.connect(other.addPeer(responderStatic.publicKey, address: responderAddress)), now: .seconds(1))
        guard var spend = sent(by: other).first(where: { $0.first == HandshakeWire.initiation }) else {
            preconditionFailure("the other initiator sent no initiation")
        }
        _ = e.receive(&spend, from: TransportAddress(ip: .v4(0x0A00_0009), port: 9), now: .seconds(1))
        _ = sent(by: e)
        _ = e.receive(&m, from: initiatorAddress, now: .seconds(1))
        guard let reply = sent(by: e).first(where: { $0.first == HandshakeWire.cookieReply }),
            reply.count == HandshakeWire.cookieReplyLength
        else { preconditionFailure("a responder under load sent no cookie reply") }
        var changed = reply
        _ = mutate(&changed, with: bytes)
        // (The input's bytes 64 apart cancel out: what counts is whether the reply changed.)
        let different = changed != reply
        _ = initiator.receive(&changed, from: responderAddress, now: .seconds(1))
        var answered = false
        for var retry in sent(by: initiator) where retry.first == HandshakeWire.initiation {
            _ = e.receive(&retry, from: initiatorAddress, now: .seconds(1))
            answered = answered || sent(by: e).contains { $0.first == HandshakeWire.response }
        }
        precondition(answered != different, different ? "a changed cookie reply was taken" : "a cookie reply was not taken")
        initiator.handleTimeout(now: .seconds(10))
        _ = sent(by: initiator)
    }

    /// The input as a datagram to a whole `SecureEndpoint` (a responder that
    /// accepts anyone), as is and with each first byte the endpoint owns:
    /// nothing traps, nothing unauthenticated comes out as media.
    private static func endpoint(_ bytes: [UInt8]) {
        let now = Timestamp.seconds(1)
        let e = responderEndpoint()
        for first in [nil, 4, 5, 6, 0x80] as [UInt8?] {
            var d = bytes
            if let first, !d.isEmpty { d[0] = first }
            if case .media = e.receive(&d, from: initiatorAddress, now: now) {
                preconditionFailure("unauthenticated media accepted")
            }
            while e.pollAction() != nil {}
        }
        e.handleTimeout(now: now + .seconds(60))
        while e.pollAction() != nil {}
    }

    /// The input as it would come off the socket.
    private static func rawInput(_ bytes: [UInt8], _ cipher: MediaCipher) {
        _ = try? RTPHeader.parse(bytes)
        _ = try? ControlReport.decode(bytes)
        var copy = bytes
        copy.withUnsafeMutableBytes { p in
            _ = SecurePacketKind.classify(UnsafeRawBufferPointer(p))
            _ = try? ControlPacket.peek(UnsafeRawBufferPointer(p))
            var media = MediaReceiver()
            if case .success(let got) = media.receive(p, with: cipher, orElse: MediaCipher(key: .random())) {
                precondition(got.payload.lowerBound >= 12 && got.payload.upperBound + 16 == p.count)
            }
        }
        var control = ControlReceiver()
        _ = control.receive(bytes, with: cipher)
    }

    /// XORs the input into `packet`, cyclically; whether anything changed.
    private static func mutate(_ packet: inout [UInt8], with bytes: [UInt8]) -> Bool {
        guard !packet.isEmpty else { return false }
        var changed = false
        for (i, b) in bytes.enumerated() where b != 0 {
            packet[i % packet.count] ^= b
            changed = true
        }
        // XORs that cancel out leave the packet as it was.
        return changed
    }

    private static func mutatedMedia(_ bytes: [UInt8], _ cipher: MediaCipher) {
        let header = RTPHeader(payloadType: 111, sequenceNumber: 0xFFF0, timestamp: 1, ssrc: 7)
        guard let valid = try? cipher.sealMedia(header: header, payload: Array(bytes.prefix(160)), extendedSequence: 0xFFF0)
        else { preconditionFailure("sealing a media packet failed") }
        var packet = valid
        _ = mutate(&packet, with: bytes)
        var receiver = MediaReceiver()
        let outcome = receiver.receive(packet, with: cipher)
        if packet == valid {
            guard case .success(let got) = outcome else { preconditionFailure("a valid media packet was refused") }
            precondition(got.payload == Array(bytes.prefix(160)), "media payload changed in transit")
        } else if case .success = outcome {
            preconditionFailure("a modified media packet authenticated")
        }
    }

    private static func mutatedControl(_ bytes: [UInt8], _ cipher: MediaCipher) {
        let report = ControlReport(highestSequence: UInt64(bytes.count), jitter: 3, lossHint: 7)
        guard let valid = try? cipher.sealControl(report, ssrc: 9, index: 12) else {
            preconditionFailure("sealing a control packet failed")
        }
        var packet = valid
        _ = mutate(&packet, with: bytes)
        var receiver = ControlReceiver()
        let outcome = receiver.receive(packet, with: cipher)
        if packet == valid {
            guard case .success(let got) = outcome, got.report == report else {
                preconditionFailure("a valid control packet was refused")
            }
        } else if case .success = outcome {
            preconditionFailure("a modified control packet authenticated")
        }
    }

    /// The IK responder on the input as message 1, and a genuine message 1
    /// with the input XORed in.
    private static func handshake(_ bytes: [UInt8]) {
        func responder() -> NoiseHandshake? {
            try? NoiseHandshake(
                pattern: .IK, initiator: false, prologue: [], localStatic: responderStatic,
                remoteStatic: nil)
        }
        if let r = responder(), (try? r.readMessage(bytes)) != nil {
            _ = try? r.writeMessage(payload: [])
        }
        guard
            let i = try? NoiseHandshake(
                pattern: .IK, initiator: true, prologue: [], localStatic: initiatorStatic,
                remoteStatic: responderStatic.publicKey, localEphemeral: initiatorEphemeral),
            let valid = try? i.writeMessage(payload: Array(bytes.prefix(32))), let r = responder()
        else { preconditionFailure("building IK message 1 failed") }
        var message = valid
        _ = mutate(&message, with: bytes)
        let payload = try? r.readMessage(message)
        if message == valid {
            precondition(payload == Array(bytes.prefix(32)), "a genuine IK message 1 was refused")
        } else {
            precondition(payload == nil, "a modified IK message 1 was accepted")
        }
    }
}
