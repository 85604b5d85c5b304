import TusaBase

/// Runs every decoder of this library (the TURN cores have `TURNFuzzChecks`) on arbitrary bytes and checks the
/// invariants that must hold for any input. For fuzz targets and tests: it
/// traps (on purpose) when an invariant breaks, so that a fuzzer reports it.
public enum FuzzChecks {
    private static let server = BindingServer(
        configuration: .init(
            primary: TransportAddress(ip: .v4(0x7F00_0001), port: 3478),
            alternate: TransportAddress(ip: .v4(0x7F00_0002), port: 3479),
            software: "tusa fuzz"))

    public static func exercise(_ bytes: [UInt8]) {
        // Messages: a decoded message must round-trip, and typing its
        // attributes must either work or throw.
        if let m = try? Message(decoding: bytes) {
            precondition(m.roundTrips() == true, "decoded message does not round-trip")
            _ = try? m.typedAttributes()
            _ = m.checkFingerprint()
            _ = m.checkMessageIntegrity(key: IntegrityKey(bytes: [1, 2, 3]))
            _ = m.checkMessageIntegritySHA256(key: IntegrityKey(bytes: [1, 2, 3]))
            if let again = try? Message(decoding: m.encode()) {
                precondition(again == m, "re-decoded message differs")
            } else {
                preconditionFailure("re-encoded message does not decode")
            }
        }
        if let c = try? ChannelData(decoding: bytes) {
            precondition((try? ChannelData(decoding: c.encode(padded: true))) == c, "ChannelData does not round-trip")
        }
        // Streams: cut at an arbitrary point; every frame must be whole.
        var framer = StreamFramer()
        let cut = bytes.isEmpty ? 0 : Int(bytes[0]) % (bytes.count + 1)
        framer.append(bytes[..<cut])
        var consumed = 0
        var failed = false
        func drain() {
            while !failed {
                do {
                    guard let frame = try framer.next() else { return }
                    switch frame {
                    case .stun(let f), .channelData(let f): consumed += f.count
                    }
                } catch {
                    failed = true
                }
            }
        }
        drain()
        framer.append(bytes[cut...])
        drain()
        precondition(consumed <= bytes.count, "framer produced more bytes than it was given")
        // The Binding server: any answer it gives is a valid STUN message
        // with a valid FINGERPRINT.
        for origin in BindingServer.Origin.all {
            var out = [UInt8](repeating: 0, count: server.responseCapacity(requestLength: bytes.count))
            let outcome = bytes.withUnsafeBytes { b in
                out.withUnsafeMutableBytes {
                    server.handle(b, from: TransportAddress(ip: .v4(1), port: 1), arrivedOn: origin, into: $0)
                }
            }
            precondition(outcome != .drop(.noRoom), "responseCapacity was too small")
            if let reply = server.handle(bytes, from: TransportAddress(ip: .v6(high: 1, low: 2), port: 9), arrivedOn: origin) {
                guard let m = try? Message(decoding: reply.response) else { preconditionFailure("server reply does not decode") }
                precondition(m.checkFingerprint() == .valid, "server reply has a bad FINGERPRINT")
            }
        }
        _ = PacketKind.classify(bytes)
    }
}
