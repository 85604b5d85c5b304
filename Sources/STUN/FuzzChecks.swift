/// Runs every decoder of this library on arbitrary bytes and checks the
/// invariants that must hold for any input. For fuzz targets and tests: it
/// traps (on purpose) when an invariant breaks, so that a fuzzer reports it.
public enum FuzzChecks {
    private static let server = BindingServer(configuration: .init(
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
                out.withUnsafeMutableBytes { server.handle(b, from: TransportAddress(ip: .v4(1), port: 1), arrivedOn: origin, into: $0) }
            }
            precondition(outcome != .drop(.noRoom), "responseCapacity was too small")
            if let reply = server.handle(bytes, from: TransportAddress(ip: .v6(high: 1, low: 2), port: 9), arrivedOn: origin) {
                guard let m = try? Message(decoding: reply.response) else { preconditionFailure("server reply does not decode") }
                precondition(m.checkFingerprint() == .valid, "server reply has a bad FINGERPRINT")
            }
        }
        _ = PacketKind.classify(bytes)
        TURNFuzz.exercise(bytes)
        exerciseTURNClient(bytes)
    }
}

/// The TURN server core under fuzzing: one authenticating server (unsigned
/// input can only earn challenges and small errors) and one anonymous server
/// with a live allocation, channel and permission, so that fuzzed requests,
/// indications and ChannelData reach the allocation paths.
enum TURNFuzz {
    final class Ports: TURNRelayPorts {
        var next: UInt16 = 1
        func serves(family: UInt8) -> Bool { true }
        func openRelay(family: UInt8, even: Bool, reserveNext: Bool, dontFragment: Bool) -> (relay: TransportAddress, reserved: TransportAddress?)? {
            next = next &+ 2
            let ip: IPAddress = family == 0x01 ? .v4(0x0A00_0001) : .v6(high: 1, low: 1)
            return (TransportAddress(ip: ip, port: next), reserveNext ? TransportAddress(ip: ip, port: next &+ 1) : nil)
        }
        func openReserved(_ address: TransportAddress, dontFragment: Bool) -> Bool { true }
        func attach(_ relay: TransportAddress, to allocation: TURNAllocation) {}
        func closeRelay(_ address: TransportAddress) {}
    }

    static let tuple = FiveTuple(client: TransportAddress(ip: .v4(0xCB00_7105), port: 4000), server: TransportAddress(ip: .v4(0xC633_6401), port: 3478), transport: .udp)
    static let peer = TransportAddress(ip: .v4(0xCB00_7163), port: 5000)

    nonisolated(unsafe) static var authenticating: TURNServer = {
        var c = TURNServerConfiguration(realm: "example.org")
        try? c.credentials.addUser("alice", password: "wonderland")
        c.challengeRate = 0  // no rate limit: every input is judged alike
        return TURNServer(configuration: c, relayPorts: Ports())
    }()

    nonisolated(unsafe) static var anonymous: TURNServer = makeAnonymous()

    static func makeAnonymous() -> TURNServer {
        var c = TURNServerConfiguration(realm: "example.org")
        c.anonymous = true
        c.peerFilter = .permitAll
        let server = TURNServer(configuration: c, relayPorts: Ports())
        _ = server.handleClient(Message(type: MessageType(method: .allocate, class: .request), attributes: [.requestedTransport(17)]).encode(), from: tuple, now: .zero)
        _ = server.handleClient(Message(type: MessageType(method: .channelBind, class: .request), attributes: [.channelNumber(0x4000), .xorPeerAddress(peer)]).encode(), from: tuple, now: .zero)
        return server
    }

    static func exercise(_ bytes: [UInt8]) {
        switch authenticating.handleClient(bytes, from: tuple, now: .seconds(1)) {
        case .reply(let r):
            guard let m = try? Message(decoding: r) else { preconditionFailure("TURN reply does not decode") }
            let code: Int? = if case .errorCode(let e)? = try? m.value(.errorCode) { e.code } else { nil }
            // Without valid credentials only a challenge may outgrow its request.
            precondition(r.count <= bytes.count || code == 401 || code == 438, "unauthenticated answer larger than its request")
        case .relay:
            preconditionFailure("relayed without an allocation")
        case .drop: break
        }
        if anonymous.allocation(for: tuple) == nil { anonymous = makeAnonymous() }
        switch anonymous.handleClient(bytes, from: tuple, now: .seconds(1)) {
        case .reply(let r): precondition((try? Message(decoding: r)) != nil, "TURN reply does not decode")
        case .relay(_, _, let range): precondition(range.lowerBound >= 0 && range.upperBound <= bytes.count, "relay range outside the input")
        case .drop: break
        }
        if let a = anonymous.allocation(for: tuple) {
            switch anonymous.handlePeer(bytes, from: peer, allocation: a, now: .seconds(1)) {
            case .indication(let r, _): precondition((try? Message(decoding: r)) != nil, "Data indication does not decode")
            case .channel, .drop: break
            }
        }
    }
}
