import STUN
import TusaBase

/// The TURN cores under fuzzing, beside STUN's `FuzzChecks`: it traps (on purpose)
/// when an invariant breaks, so that a fuzzer reports it.
public enum TURNFuzzChecks {
    /// Feeds the bytes to the TURN server core (authenticating and anonymous),
    /// to a TURN client with live state, and to the authenticating server as a
    /// script (``TURNServerFuzzChecks``).
    public static func exercise(_ bytes: [UInt8]) {
        TURNFuzz.exercise(bytes)
        exerciseTURNClient(bytes)
        TURNServerFuzzChecks.exercise(bytes)
    }

    /// A TURN client with an allocation, a channel bound to `peer` and a
    /// CreatePermission waiting for its answer (transaction `pending`), built
    /// by talking to a hand-made server.
    struct TURNFixture {
        var client: TURNClient
        var pending: TransactionID
        var peer: TransportAddress
        var permitted: IPAddress
    }

    static let turnFixture: TURNFixture? = {
        let peer = TransportAddress(ip: .v4(0xC000_0209), port: 7000)
        let permitted = IPAddress.v4(0xC000_020A)
        guard var client = try? TURNClient(configuration: .init(username: "alice", password: "pw")),
            let key = try? IntegrityKey.longTerm(username: "alice", realm: "fuzz", password: "pw")
        else { return nil }
        func answer(_ cls: MessageClass, _ attributes: [Attribute], key: IntegrityKey?) -> Bool {
            guard let bytes = client.pollTransmit(), let request = try? Message(decoding: bytes) else { return false }
            let response = Message(
                type: MessageType(method: request.type.method, class: cls), transactionID: request.transactionID,
                attributes: attributes)
            _ = client.receive(response.encode(integrity: key), now: .zero)
            return true
        }
        guard (try? client.allocate(now: .zero)) != nil,
            answer(.errorResponse, [.errorCode(ErrorCodeValue(code: 401, reason: "")), .realm("fuzz"), .nonce("n")], key: nil),
            answer(
                .successResponse, [.xorRelayedAddress(TransportAddress(ip: .v4(0xC000_0201), port: 1)), .lifetime(600)], key: key),
            (try? client.bindChannel(to: peer, now: .zero)) != nil,
            answer(.successResponse, [], key: key),
            (try? client.createPermission(for: [permitted], now: .zero)) != nil,
            let bytes = client.pollTransmit(), let request = try? Message(decoding: bytes),
            client.channel(for: peer) != nil
        else { return nil }
        return TURNFixture(client: client, pending: request.transactionID, peer: peer, permitted: permitted)
    }()

    /// Feeds the bytes to the TURN client as they are, and as an answer to its
    /// waiting request (the transaction ID patched in), then runs its timers.
    /// Whatever it unwraps comes from a peer it has a permission for, and
    /// whatever it sends decodes.
    static func exerciseTURNClient(_ bytes: [UInt8]) {
        guard let fixture = turnFixture else { preconditionFailure("the TURN fixture did not build") }
        var inputs = [bytes]
        if bytes.count >= Message.headerSize {
            var patched = bytes
            patched.replaceSubrange(8..<20, with: fixture.pending.bytes)
            inputs.append(patched)
        }
        for input in inputs {
            var client = fixture.client
            if let datagram = client.receive(input, now: .zero) {
                precondition(
                    datagram.peer == fixture.peer || datagram.peer.ip == fixture.permitted,
                    "unwrapped data from a peer without a permission")
            }
            client.handleTimeout(now: Timestamp.zero + .seconds(1000))
            while let out = client.pollTransmit() {
                precondition(Message.isSTUN(out), "the TURN client sent something that is not STUN")
            }
            while client.pollEvent() != nil {}
        }
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
        func openRelay(family: UInt8, even: Bool, reserveNext: Bool, dontFragment: Bool) -> (
            relay: TransportAddress, reserved: TransportAddress?
        )? {
            next = next &+ 2
            let ip: IPAddress = family == 0x01 ? .v4(0x0A00_0001) : .v6(high: 1, low: 1)
            return (TransportAddress(ip: ip, port: next), reserveNext ? TransportAddress(ip: ip, port: next &+ 1) : nil)
        }
        func openReserved(_ address: TransportAddress, dontFragment: Bool) -> Bool { true }
        func attach(_ relay: TransportAddress, to allocation: TURNAllocation) {}
        func closeRelay(_ address: TransportAddress) {}
    }

    static let tuple = FiveTuple(
        client: TransportAddress(ip: .v4(0xCB00_7105), port: 4000), server: TransportAddress(ip: .v4(0xC633_6401), port: 3478),
        transport: .udp)
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
        _ = server.handleClient(
            Message(type: MessageType(method: .allocate, class: .request), attributes: [.requestedTransport(17)]).encode(),
            from: tuple, now: .zero)
        _ = server.handleClient(
            Message(
                type: MessageType(method: .channelBind, class: .request),
                attributes: [.channelNumber(0x4000), .xorPeerAddress(peer)]
            ).encode(), from: tuple, now: .zero)
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
        case .relay(_, _, let range):
            precondition(range.lowerBound >= 0 && range.upperBound <= bytes.count, "relay range outside the input")
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
