import STUN
import TusaBase

/// The TURN server core with authentication on, driven through its sans-IO
/// contract by a script the input writes (see ``run(_:)``): four clients on UDP,
/// TCP and TLS, signed with a static user's key or a REST username's (one of them
/// lapses while the script runs), their requests made or read from the input and
/// signed, ChannelData, peers' datagrams to any relay address, closed connections
/// and time. A model kept from the server's own answers says what it granted; the
/// server may relay only what that allows:
///
/// - toward a peer only from the sender's live allocation, on one of its relay
///   addresses, to a peer whose permission is in force (and through a channel,
///   only to the channel's peer while the binding is in force);
/// - toward a client only on the 5-tuple whose allocation owns the relay address
///   the datagram reached, from a peer with a permission in force, as ChannelData
///   of that peer's channel or a Data indication that names the peer;
/// - every answer decodes, a success is signed with the client's key, a closed
///   stream's allocation is gone, quotas hold, and after an hour and more of
///   silence nothing is left: no allocation, relay port, reservation or quota count.
public enum TURNServerFuzzChecks {
    /// What a script did: for tests, to see that it reached the paths it meant to.
    public struct Summary: Equatable, Sendable {
        /// What broke, in words; empty when every check held.
        public var violations: [String] = []
        public var allocations = 0
        public var permissions = 0
        public var channels = 0
        public var toPeer = 0
        public var toClient = 0
        public var signedAnswers = 0
        /// Far jumps after which everything was checked to be gone.
        public var emptied = 0
    }

    /// The first byte of an input that is a script (for the STUNFuzz target, whose
    /// other inputs are STUN messages: no STUN message or ChannelData starts so).
    public static let marker: UInt8 = 0xEA

    /// Runs an input that starts with ``marker`` as a script (the rest are left to
    /// the decoders' checks: a script costs far more than a decode) and traps when a
    /// check broke, so that a fuzzer reports it.
    public static func exercise(_ bytes: [UInt8]) {
        guard bytes.first == marker else { return }
        let summary = run(Array(bytes.dropFirst()))
        if let first = summary.violations.first { preconditionFailure("TURN server script: \(first)") }
    }

    /// Scripts shaped like real sessions, a fuzzer's first corpus (each starts with
    /// ``marker``; ``run(_:)`` takes them without it): each client
    /// allocates, permits, binds a channel and relays both ways; then a refresh to
    /// 0, a reservation taken up, a stream closed, and the lapse of everything.
    public static func seeds() -> [[UInt8]] {
        var session: [UInt8] = []
        for t: UInt8 in 0..<4 {
            let tuple = t << 3
            session += [0x00 | tuple, 0x00]  // Allocate
            session += [0x00 | tuple | 2 << 5, 0x01]  // CreatePermission for peer 0
            session += [0x00 | tuple | 3 << 5, 0x04]  // ChannelBind 0x4000 to peer 1
            session += [0x02 | tuple, 40]  // ChannelData on 0x4000
            session += [0x00 | tuple | 4 << 5, 0x50]  // Send indication to peer 0
            session += [0x03 | 1 << 5, t, 30, 0x03 | 0 << 5, t, 30]  // peers 1 and 0 answer on relay t
        }
        let lapse = session + [0x05 | 5 << 5, 0x03 | 1 << 5, 0, 20, 0x05 | 6 << 5, 0x03 | 0 << 5, 1, 20, 0x07]
        // alice holds a port beside her allocation (EVEN-PORT with R: both slots of her
        // quota), redeems it from her TCP connection, refreshes to 0; bob allocates twice.
        let refreshAndReserve: [UInt8] = [
            0x00, 0x18, 0x00 | 2 << 3, 0x20, 0x00 | 1 << 5, 0x00, 0x00 | 2 << 3 | 1 << 5, 0x00, 0x00 | 1 << 3, 0x00,
            0x00 | 1 << 3 | 6 << 5, 0x00, 0x05 | 3 << 5, 0x00 | 1 << 3 | 7 << 5, 0x00, 0x07,
        ]
        let closeStreams: [UInt8] = [0x00 | 2 << 3, 0x00, 0x00 | 3 << 3, 0x40, 0x04 | 2 << 3, 0x04 | 3 << 3, 0x06, 0x07]
        var signed = Message(type: MessageType(method: .allocate, class: .request), transactionID: TransactionID(high: 7, low: 7))
        signed.append(.requestedTransport(17))
        signed.append(.lifetime(3600))
        let allocate = signed.encode()
        let readAndSigned: [UInt8] =
            [0x01 | 1 << 3, UInt8(allocate.count)] + allocate + [0x01 | 1 << 3 | 1 << 5, UInt8(allocate.count)] + allocate
            + [0x01 | 1 << 3 | 4 << 5, UInt8(allocate.count)] + allocate + [0x07]
        return [session, lapse, refreshAndReserve, closeStreams, readAndSigned].map { [marker] + $0 }
    }

    static let realm = "fuzz.example"
    static let restSecret = "fuzz-rest-secret"
    static let unixTimeAtZero: UInt64 = 1_800_000_000
    static let server = TransportAddress(ip: .v4(0xC633_6401), port: 3478)
    static let server6 = TransportAddress(ip: .v6(high: 0x2001_0DB8_0000_0000, low: 1), port: 3478)

    /// The four clients: alice (static) on UDP and TCP, bob (REST, valid for a
    /// day) on UDP, carol (REST, lapses 700 s in) on TLS over IPv6.
    static let tuples: [FiveTuple] = [
        FiveTuple(client: TransportAddress(ip: .v4(0xCB00_7105), port: 4000), server: server, transport: .udp),
        FiveTuple(client: TransportAddress(ip: .v4(0xCB00_7106), port: 4001), server: server, transport: .udp),
        FiveTuple(client: TransportAddress(ip: .v4(0xCB00_7105), port: 4002), server: server, transport: .tcp),
        FiveTuple(
            client: TransportAddress(ip: .v6(high: 0x2001_0DB8_0000_0000, low: 5), port: 4003), server: server6,
            transport: .tls),
    ]
    static let identities: [(username: String, password: String)] = [
        ("alice", "wonderland"),
        RESTCredentials.make(secret: restSecret, user: "bob", expiry: unixTimeAtZero + 86_400),
        ("alice", "wonderland"),
        RESTCredentials.make(secret: restSecret, user: "carol", expiry: unixTimeAtZero + 700),
    ]
    /// Peers: two ports of one IPv4 host, an IPv6 host, and the IPv4 host as an
    /// IPv4-mapped IPv6 address.
    static let peers: [TransportAddress] = [
        TransportAddress(ip: .v4(0xCB00_7163), port: 5000),
        TransportAddress(ip: .v4(0xCB00_7163), port: 5001),
        TransportAddress(ip: .v6(high: 0x2001_0DB8_0000_0000, low: 0x99), port: 5002),
        TransportAddress(ip: .v6(high: 0, low: 0x0000_FFFF_CB00_7163), port: 5003),
    ]
    static let userQuota = 2
    /// Each client's keys, MD5 and SHA-256 (made once: a key costs a SASLprep).
    static let keys: [[IntegrityKey?]] = identities.map { id in
        [PasswordAlgorithm.md5, .sha256].map {
            try? IntegrityKey.longTerm(username: id.username, realm: realm, password: id.password, algorithm: $0)
        }
    }

    /// Relay ports that remember what is open and what is held.
    final class Ports: TURNRelayPorts {
        var next: UInt16 = 10_000
        var open: Set<TransportAddress> = []
        var held: Set<TransportAddress> = []
        var everOpened: [TransportAddress] = []

        func serves(family: UInt8) -> Bool { family == 0x01 || family == 0x02 }
        func openRelay(family: UInt8, even: Bool, reserveNext: Bool, dontFragment: Bool) -> (
            relay: TransportAddress, reserved: TransportAddress?
        )? {
            next = next &+ 2
            let ip: IPAddress = family == 0x01 ? .v4(0x0A00_0001) : .v6(high: 0xFD00_0000_0000_0000, low: 1)
            let relay = TransportAddress(ip: ip, port: next)
            open.insert(relay)
            everOpened.append(relay)
            guard reserveNext else { return (relay, nil) }
            let reserved = TransportAddress(ip: ip, port: next &+ 1)
            held.insert(reserved)
            return (relay, reserved)
        }
        func openReserved(_ address: TransportAddress, dontFragment: Bool) -> Bool {
            guard held.remove(address) != nil else { return false }
            open.insert(address)
            everOpened.append(address)
            return true
        }
        func attach(_ relay: TransportAddress, to allocation: TURNAllocation) {}
        func closeRelay(_ address: TransportAddress) {
            open.remove(address)
            held.remove(address)
        }
    }

    /// What the server granted, read from its answers.
    struct Granted {
        var relays: [TransportAddress]
        var expiry: Timestamp
        var permissions: [IPAddress: Timestamp] = [:]
        var channels: [UInt16: (peer: TransportAddress, expiry: Timestamp)] = [:]

        func permits(_ peer: TransportAddress, now: Timestamp) -> Bool {
            let until = permissions[peer.ip] ?? peer.ip.embeddedIPv4.flatMap { permissions[$0] }
            return until.map { $0 > now } ?? false
        }
    }

    /// A request sent: from which client, signed with which keys (a
    /// retransmitted Allocate is answered as the first was signed).
    struct Sent {
        var tuple: Int
        var request: Message
        var keys: [IntegrityKey] = []
    }

    /// One run of a script.
    struct Run {
        let server: TURNServer
        let ports = Ports()
        var now = Timestamp.zero
        var granted: [Int: Granted] = [:]
        /// By client and transaction (a fuzzer reuses transaction IDs across clients).
        var sent: [Int: [TransactionID: Sent]] = [:]
        var tokens: [UInt64] = []
        var counter: UInt64 = 0
        var summary = Summary()

        init() {
            var c = TURNServerConfiguration(realm: TURNServerFuzzChecks.realm)
            try? c.credentials.addUser("alice", password: "wonderland")
            c.credentials.restSecrets = [restSecret]
            c.unixTimeAtZero = unixTimeAtZero
            c.nonceSecret = Array(repeating: 0x5A, count: 32)
            c.peerFilter = .permitAll
            c.challengeRate = 0
            c.userQuota = userQuota
            c.maxChannelsPerAllocation = 3
            c.maxPermissionsPerAllocation = 3
            server = TURNServer(configuration: c, relayPorts: ports)
        }

        mutating func fail(_ what: String) {
            if summary.violations.count < 8 { summary.violations.append(what) }
        }

        func key(for tuple: Int, sha256: Bool) -> IntegrityKey? { keys[tuple][sha256 ? 1 : 0] }

        /// Signs `m` as client `tuple` would: its username, the realm, a fresh nonce.
        mutating func sign(_ m: Message, tuple: Int, sha256: Bool, fingerprint: Bool, wrongKey: Bool = false) -> [UInt8] {
            let replaced: Set<AttributeType> = [
                .username, .userhash, .realm, .nonce, .messageIntegrity, .messageIntegritySHA256, .fingerprint,
                .passwordAlgorithm, .passwordAlgorithms,
            ]
            var m = m
            m.attributes = m.attributes.filter { !replaced.contains($0.type) }
            m.append(.username(identities[tuple].username))
            m.append(.realm(realm))
            m.append(.nonce(server.nonces.mint(for: tuples[tuple].client, now: now)))
            if sha256 {
                m.append(.passwordAlgorithms([.md5, .sha256]))
                m.append(.passwordAlgorithm(.sha256))
            }
            let key = wrongKey ? IntegrityKey(bytes: [0x42]) : self.key(for: tuple, sha256: sha256)
            var record = Sent(tuple: tuple, request: m)
            if let earlier = sent[tuple]?[m.transactionID] { record.keys = earlier.keys }
            if let key { record.keys.append(key) }
            sent[tuple, default: [:]][m.transactionID] = record
            return sha256
                ? m.encode(integritySHA256: key, fingerprint: fingerprint) : m.encode(integrity: key, fingerprint: fingerprint)
        }

        /// A request sent unsigned (or as the input had it): what it asks, the keys of
        /// earlier ones of its transaction kept (a retransmitted Allocate is answered as
        /// the first was signed).
        mutating func note(_ m: Message, from tuple: Int) {
            var record = Sent(tuple: tuple, request: m)
            record.keys = sent[tuple]?[m.transactionID]?.keys ?? []
            sent[tuple, default: [:]][m.transactionID] = record
        }

        mutating func nextTransaction() -> TransactionID {
            counter += 1
            return TransactionID(high: 0x7475_7361, low: counter)
        }

        /// A request (or a Send indication) of method `method`, shaped by `p`.
        mutating func made(_ method: UInt8, tuple: Int, _ p: UInt8) -> [UInt8] {
            let peer = peers[Int(p) % peers.count]
            var m: Message
            switch method {
            case 0, 6, 7:
                m = Message(type: MessageType(method: .allocate, class: .request), transactionID: nextTransaction())
                m.append(.requestedTransport(p & 0x01 == 0 ? 17 : 6))
                if let lifetime = ([nil, 0, 60, 5000] as [UInt32?])[Int(p >> 1) & 3] { m.append(.lifetime(lifetime)) }
                if p & 0x08 != 0 { m.append(.evenPort(reserveNext: p & 0x10 != 0)) }
                if p & 0x20 != 0, let token = tokens.last { m.append(.reservationToken(token)) }
                if p & 0x40 != 0 { m.append(.additionalAddressFamily(0x02)) }
                if p & 0x80 != 0 { m.append(.requestedAddressFamily(method == 7 ? 0x01 : 0x02)) }
                if method == 6 { m.append(.dontFragment) }
            case 1:
                m = Message(type: MessageType(method: .refresh, class: .request), transactionID: nextTransaction())
                if let lifetime = ([0, 60, 600, nil] as [UInt32?])[Int(p) & 3] { m.append(.lifetime(lifetime)) }
                if p & 0x04 != 0 { m.append(.requestedAddressFamily(p & 0x08 == 0 ? 0x01 : 0x02)) }
            case 2:
                m = Message(type: MessageType(method: .createPermission, class: .request), transactionID: nextTransaction())
                for (i, peer) in peers.enumerated() where p & (1 << i) != 0 { m.append(.xorPeerAddress(peer)) }
            case 3:
                m = Message(type: MessageType(method: .channelBind, class: .request), transactionID: nextTransaction())
                let number: UInt16 = p >= 0xF0 ? (p & 1 == 0 ? 0x3FFF : 0x8000) : 0x4000 + UInt16(p & 0x03)
                m.append(.channelNumber(number))
                m.append(.xorPeerAddress(peers[Int(p >> 2) % peers.count]))
            case 4:
                var s = Message(type: MessageType(method: .send, class: .indication), transactionID: nextTransaction())
                s.append(.xorPeerAddress(peer))
                s.append(.data(payload(Int(p >> 2), tag: p)))
                return s.encode()
            default:
                // Unsigned, or signed with a wrong key: challenges and refusals.
                m = Message(type: MessageType(method: .allocate, class: .request), transactionID: nextTransaction())
                m.append(.requestedTransport(17))
                if p & 1 == 0 {
                    note(m, from: tuple)
                    return m.encode()
                }
                return sign(m, tuple: tuple, sha256: false, fingerprint: false, wrongKey: true)
            }
            return sign(m, tuple: tuple, sha256: p & 0x02 != 0 && method != 0, fingerprint: p & 0x04 != 0)
        }

        func payload(_ count: Int, tag: UInt8) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: $0) ^ tag } }

        /// Feeds one input and checks every action it caused.
        mutating func feed(_ input: TURNServer.Input, from tuple: Int?, channel: UInt16? = nil) {
            server.handle(input, now: now)
            while let action = server.pollAction() {
                switch action {
                case .sendToClient(let bytes, let to):
                    toClient(bytes, to, input: input)
                case .sendToPeer(let payload, let relay, let peer):
                    toPeer(payload, relay: relay, peer: peer, from: tuple, channel: channel)
                case .event:
                    break
                }
            }
            sync()
        }

        mutating func toPeer(
            _ payload: [UInt8], relay: TransportAddress, peer: TransportAddress, from tuple: Int?, channel: UInt16?
        ) {
            summary.toPeer += 1
            guard let tuple, let g = granted[tuple], g.expiry > now else {
                return fail("relayed to \(peer) for a client without an allocation")
            }
            guard g.relays.contains(relay) else { return fail("relayed from \(relay), not the sender's relay") }
            guard ports.open.contains(relay) else { return fail("relayed from \(relay), which is not open") }
            guard g.permits(peer, now: now) else { return fail("relayed to \(peer) without a permission at \(now)") }
            if let channel {
                guard let bound = g.channels[channel], bound.expiry > now, bound.peer == peer else {
                    return fail("ChannelData on \(channel) relayed to \(peer), which it is not bound to")
                }
            }
        }

        mutating func toClient(_ bytes: [UInt8], _ to: FiveTuple, input: TURNServer.Input) {
            guard let index = tuples.firstIndex(of: to) else { return fail("sent to a client that never spoke: \(to)") }
            if case .fromPeer(let payload, let peer, let relay) = input {
                summary.toClient += 1
                guard let g = granted[index], g.expiry > now, g.relays.contains(relay) else {
                    return fail("a datagram on \(relay) went to \(to), which does not own it")
                }
                guard g.permits(peer, now: now) else { return fail("relayed from \(peer) without a permission at \(now)") }
                if let frame = try? ChannelData(decoding: bytes) {
                    guard let bound = g.channels[frame.channel], bound.expiry > now, bound.peer == peer else {
                        return fail("data from \(peer) sent on channel \(frame.channel), not its own")
                    }
                    guard frame.data == payload else { return fail("ChannelData carries other bytes") }
                    if to.transport.isStream, bytes.count % 4 != 0 { return fail("unpadded ChannelData on a stream") }
                } else if let m = try? Message(decoding: bytes), m.type == MessageType(method: .data, class: .indication) {
                    guard case .xorPeerAddress(peer)? = try? m.value(.xorPeerAddress), case .data(payload)? = try? m.value(.data)
                    else { return fail("a Data indication names another peer or carries other bytes") }
                } else {
                    fail("a peer's datagram became neither ChannelData nor a Data indication")
                }
                return
            }
            guard let m = try? Message(decoding: bytes) else { return fail("an answer does not decode") }
            if m.checkFingerprint() == .invalid { fail("an answer has a bad FINGERPRINT") }
            guard let request = sent[index]?[m.transactionID] else { return }
            guard m.type.method == request.request.type.method else { return fail("an answer of another method") }
            guard m.type.messageClass == .successResponse else { return }
            guard !request.keys.isEmpty else { return fail("an unsigned request succeeded") }
            let sha256 = m.attribute(.messageIntegritySHA256) != nil
            guard
                request.keys.contains(where: {
                    (sha256 ? m.checkMessageIntegritySHA256(key: $0) : m.checkMessageIntegrity(key: $0)) == .valid
                })
            else { return fail("a success is not signed with the client's key") }
            summary.signedAnswers += 1
            learn(m, request: request.request, tuple: index)
        }

        /// What a success grants, as RFC 8656 says it does.
        mutating func learn(_ m: Message, request: Message, tuple: Int) {
            switch m.type.method {
            case .allocate:
                let relays = m.attributes.compactMap { raw -> TransportAddress? in
                    guard raw.type == .xorRelayedAddress,
                        case .xorRelayedAddress(let a)? = try? Attribute(raw, transactionID: m.transactionID)
                    else { return nil }
                    return a
                }
                guard case .lifetime(let lifetime)? = try? m.value(.lifetime), !relays.isEmpty else {
                    return fail("an Allocate success without a relay or a lifetime")
                }
                if case .reservationToken(let t)? = try? m.value(.reservationToken) { tokens.append(t) }
                // A retransmission is answered again: what was granted stays.
                if let g = granted[tuple], g.expiry > now, g.relays == relays { return }
                granted[tuple] = Granted(relays: relays, expiry: now + .seconds(Int64(lifetime)))
                summary.allocations += 1
            case .refresh:
                guard case .lifetime(let lifetime)? = try? m.value(.lifetime) else {
                    return fail("a Refresh success without a lifetime")
                }
                if lifetime == 0 { granted[tuple] = nil } else { granted[tuple]?.expiry = now + .seconds(Int64(lifetime)) }
            case .createPermission:
                for raw in request.attributes where raw.type == .xorPeerAddress {
                    if case .xorPeerAddress(let p)? = try? Attribute(raw, transactionID: request.transactionID) {
                        granted[tuple]?.permissions[p.ip] = now + .seconds(300)
                        summary.permissions += 1
                    }
                }
            case .channelBind:
                guard case .channelNumber(let number)? = try? request.value(.channelNumber),
                    case .xorPeerAddress(let peer)? = try? request.value(.xorPeerAddress)
                else { return fail("a ChannelBind without its channel or peer succeeded") }
                granted[tuple]?.channels[number] = (peer, now + .seconds(600))
                granted[tuple]?.permissions[peer.ip] = now + .seconds(300)
                summary.channels += 1
            default:
                fail("a success to a \(m.type.method) request")
            }
        }

        /// Forgets what the server no longer has (the model may only be stricter),
        /// and checks the quotas.
        mutating func sync() {
            for (i, tuple) in tuples.enumerated() where server.allocation(for: tuple) == nil { granted[i] = nil }
            for (user, count) in server.perUser where count > userQuota { fail("\(user) holds \(count), over the quota") }
        }

        /// Everything has lapsed: nothing may be left.
        mutating func checkEmpty() {
            if server.allocationCount != 0 { fail("\(server.allocationCount) allocations outlived every lifetime") }
            if !ports.open.isEmpty || !ports.held.isEmpty { fail("relay ports left open: \(ports.open), held: \(ports.held)") }
            if !server.reservations.isEmpty { fail("reservations outlived their lifetime") }
            if !server.perUser.isEmpty { fail("quota counts left: \(server.perUser)") }
            if !server.byRelay.isEmpty { fail("relay addresses still mapped") }
            summary.emptied += 1
        }

        mutating func wait(_ d: Duration) {
            now = now + d
            server.handleTimeout(now: now)
            while server.pollAction() != nil {}
            sync()
        }
    }

    /// Runs the input as a script of at most 128 steps, each an operation byte
    /// `kkk ttt ooo` read as: `o` the kind, `t` (bits 3-4) the client, `k` a variant.
    ///
    /// ```
    /// o 0: a made request, method k (0 Allocate, 1 Refresh, 2 CreatePermission,
    ///      3 ChannelBind, 4 Send indication, 5 unsigned or wrongly signed, 6-7
    ///      Allocate variants), shaped by the next byte
    ///   1: the next byte's length of input read as a message: signed by the client
    ///      (k bit 0: FINGERPRINT, bit 1: SHA-256) or, with k bit 2, sent as it is
    ///   2: ChannelData on channel 0x4000 + k (k 7: 0x7FFF), next byte's length
    ///   3: a datagram from peer k % 4 to the relay address the next byte picks
    ///      among those ever opened (or one never opened), the byte after's length
    ///   4: the client's connection closes
    ///   5: time goes on: 1 ms, 100 ms, 1 s, 30 s, 60 s, 300 s, 600 s or 3600 s (k)
    ///   6: time goes on to the server's next deadline
    ///   7: time goes on by two hours: nothing may be left
    /// ```
    public static func run(_ bytes: [UInt8]) -> Summary {
        var run = Run()
        var script = FuzzScript(bytes)
        while let op = script.nextStep() {
            let tuple = Int(op >> 3) & 3
            let variant = op >> 5
            switch op & 7 {
            case 0:
                guard let p = script.next() else { break }
                run.feed(.fromClient(run.made(variant, tuple: tuple, p), tuples[tuple]), from: tuple)
            case 1:
                guard let length = script.next() else { break }
                let input = script.take(Int(length))
                var wire = input
                if let m = try? Message(decoding: input), m.type.messageClass == .request {
                    if variant & 4 == 0 {
                        wire = run.sign(m, tuple: tuple, sha256: variant & 2 != 0, fingerprint: variant & 1 != 0)
                    } else {
                        run.note(m, from: tuple)
                    }
                }
                let channel = input.count >= 4 && input[0] & 0xC0 == 0x40 ? UInt16(input[0]) << 8 | UInt16(input[1]) : nil
                run.feed(.fromClient(wire, tuples[tuple]), from: tuple, channel: channel)
            case 2:
                guard let length = script.next() else { break }
                let number: UInt16 = variant == 7 ? 0x7FFF : 0x4000 + UInt16(variant)
                let frame = ChannelData(channel: number, data: run.payload(Int(length), tag: op))
                run.feed(
                    .fromClient(frame.encode(padded: tuples[tuple].transport.isStream), tuples[tuple]), from: tuple,
                    channel: number)
            case 3:
                guard let pick = script.next(), let length = script.next() else { break }
                let opened = run.ports.everOpened
                let relay =
                    Int(pick) < opened.count ? opened[Int(pick)] : TransportAddress(ip: .v4(0x0A00_0001), port: 9)
                run.feed(
                    .fromPeer(run.payload(Int(length), tag: op), from: peers[Int(variant) % peers.count], relay: relay),
                    from: nil)
            case 4:
                run.feed(.connectionClosed(tuples[tuple]), from: nil)
                if tuples[tuple].transport.isStream, run.server.allocation(for: tuples[tuple]) != nil {
                    run.fail("a closed connection's allocation is still there")
                }
            case 5:
                let waits: [Duration] = [
                    .milliseconds(1), .milliseconds(100), .seconds(1), .seconds(30), .seconds(60), .seconds(300),
                    .seconds(600), .seconds(3600),
                ]
                run.wait(waits[Int(variant)])
            case 6:
                let deadline = run.server.nextDeadline ?? run.now
                run.wait(deadline > run.now ? deadline - run.now : .zero)
            default:
                run.wait(.seconds(7200))
                run.checkEmpty()
            }
        }
        return run.summary
    }
}
