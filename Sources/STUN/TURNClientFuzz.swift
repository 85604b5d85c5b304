extension FuzzChecks {
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
            answer(.successResponse, [.xorRelayedAddress(TransportAddress(ip: .v4(0xC000_0201), port: 1)), .lifetime(600)], key: key),
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
