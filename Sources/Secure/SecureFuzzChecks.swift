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
    }

    /// The input as a datagram to a whole `SecureEndpoint` (a responder that
    /// accepts anyone), as is and with each first byte the endpoint owns:
    /// nothing traps, nothing unauthenticated comes out as media.
    private static func endpoint(_ bytes: [UInt8]) {
        let now = Timestamp.seconds(1)
        var config = SecureConfiguration()
        config.acceptUnknownPeers = true
        let e = SecureEndpoint(identity: Identity(privateKey: responderStatic), configuration: config, now: now)
        let from = TransportAddress(ip: .v4(0x0A00_0001), port: 5000)
        for first in [nil, 4, 5, 6, 0x80] as [UInt8?] {
            var d = bytes
            if let first, !d.isEmpty { d[0] = first }
            if case .media = e.receive(&d, from: from, now: now) { preconditionFailure("unauthenticated media accepted") }
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
