import Testing
import TusaBase

@testable import STUN
@testable import TURN

/// Relay ports for the pure core's tests: hands out addresses, records closes.
final class RecordingPorts: TURNRelayPorts {
    var nextPort: UInt16 = 50_000
    var families: Set<UInt8> = [0x01]
    var open: Set<TransportAddress> = []
    var held: Set<TransportAddress> = []
    var closed: [TransportAddress] = []
    var attached: [TransportAddress: TURNAllocation] = [:]
    var exhausted = false

    func serves(family: UInt8) -> Bool { families.contains(family) }

    func openRelay(family: UInt8, even: Bool, reserveNext: Bool, dontFragment: Bool) -> (
        relay: TransportAddress, reserved: TransportAddress?
    )? {
        guard !exhausted else { return nil }
        if even && nextPort % 2 == 1 { nextPort += 1 }
        let ip: IPAddress = family == 0x01 ? IPAddress("192.0.2.10")! : IPAddress("2001:db8::10")!
        let relay = TransportAddress(ip: ip, port: nextPort)
        nextPort += 1
        open.insert(relay)
        var reserved: TransportAddress?
        if reserveNext {
            reserved = TransportAddress(ip: ip, port: nextPort)
            held.insert(reserved!)
            nextPort += 1
        }
        return (relay, reserved)
    }

    func openReserved(_ address: TransportAddress, dontFragment: Bool) -> Bool {
        guard held.remove(address) != nil else { return false }
        open.insert(address)
        return true
    }

    func attach(_ relay: TransportAddress, to allocation: TURNAllocation) { attached[relay] = allocation }

    func closeRelay(_ address: TransportAddress) {
        open.remove(address)
        held.remove(address)
        closed.append(address)
    }
}

/// A TURN client's side of the conversation, built by hand for the tests.
struct TestClient {
    var tuple: FiveTuple
    var username = "alice"
    var password = "wonderland"
    var realm = "example.org"
    var nonce: String?
    var algorithm: PasswordAlgorithm?
    var sha256MI = false

    init(_ client: String = "203.0.113.5:40000", transport: TURNTransport = .udp) {
        tuple = FiveTuple(client: TransportAddress(client)!, server: TransportAddress("198.51.100.1:3478")!, transport: transport)
    }

    var key: IntegrityKey {
        try! IntegrityKey.longTerm(username: username, realm: realm, password: password, algorithm: algorithm ?? .md5)
    }

    /// A signed request (unsigned while there is no nonce yet).
    func request(_ method: Method, _ attributes: [Attribute], id: TransactionID = .random(), userhash: Bool = false) -> [UInt8] {
        var m = Message(type: MessageType(method: method, class: .request), transactionID: id, attributes: attributes)
        guard let nonce else { return m.encode(fingerprint: true) }
        if let algorithm {
            m.append(.passwordAlgorithms([.md5, .sha256]))
            m.append(.passwordAlgorithm(algorithm))
        }
        m.append(userhash ? .userhash(try! IntegrityKey.userhash(username: username, realm: realm)) : .username(username))
        m.append(.realm(realm))
        m.append(.nonce(nonce))
        return sha256MI ? m.encode(integritySHA256: key, fingerprint: true) : m.encode(integrity: key, fingerprint: true)
    }
}

struct TURNServerTests {
    static let peer = TransportAddress("203.0.113.99:5000")!

    static func makeServer(_ configure: (inout TURNServerConfiguration) -> Void = { _ in }) -> (TURNServer, RecordingPorts) {
        var config = TURNServerConfiguration(realm: "example.org")
        try! config.credentials.addUser("alice", password: "wonderland")
        try! config.credentials.addUser("bob", password: "builder")
        configure(&config)
        let ports = RecordingPorts()
        return (TURNServer(configuration: config, relayPorts: ports), ports)
    }

    static func reply(_ outcome: TURNClientOutcome) throws -> Message {
        guard case .reply(let bytes) = outcome else {
            Issue.record("expected a reply, got \(outcome)")
            throw STUNError(.invalidValue, "no reply")
        }
        return try Message(decoding: bytes)
    }

    static func errorCode(_ m: Message) -> Int? {
        if case .errorCode(let e)? = try? m.value(.errorCode) { return e.code }
        return nil
    }

    /// Runs the 401 exchange and an Allocate; returns the success response.
    @discardableResult
    static func allocate(
        _ server: TURNServer, _ client: inout TestClient, _ extra: [Attribute] = [.requestedTransport(17)],
        now: Timestamp = .zero
    ) throws -> Message {
        if client.nonce == nil {
            let challenge = try reply(server.handleClient(client.request(.allocate, extra), from: client.tuple, now: now))
            #expect(errorCode(challenge) == 401)
            guard case .nonce(let n)? = try challenge.value(.nonce) else { throw STUNError(.invalidValue, "no nonce") }
            client.nonce = n
        }
        return try reply(server.handleClient(client.request(.allocate, extra), from: client.tuple, now: now))
    }

    // MARK: - Authentication

    @Test func challengeCarriesRealmNonceAndAlgorithmsAndNoSoftware() throws {
        let (server, _) = Self.makeServer { $0.software = "tusa" }
        let client = TestClient()
        let m = try Self.reply(
            server.handleClient(client.request(.allocate, [.requestedTransport(17)]), from: client.tuple, now: .zero))
        #expect(m.type == MessageType(method: .allocate, class: .errorResponse))
        #expect(Self.errorCode(m) == 401)
        #expect(try m.value(.realm) == .realm("example.org"))
        guard case .nonce(let nonce)? = try m.value(.nonce) else {
            Issue.record("no nonce")
            return
        }
        #expect(nonce.hasPrefix("obMatJos2"))
        #expect(try m.value(.passwordAlgorithms) == .passwordAlgorithms([.md5, .sha256]))
        #expect(m.attribute(.software) == nil)
        #expect(m.checkFingerprint() == .valid)
        #expect(server.allocationCount == 0)
        #expect(server.statistics.challenges == 1)
    }

    @Test func allocateSucceedsWithSignedAnswer() throws {
        let (server, ports) = Self.makeServer { $0.software = "tusa" }
        var client = TestClient()
        let m = try Self.allocate(server, &client, [.requestedTransport(17), .lifetime(1200)])
        #expect(m.type == MessageType(method: .allocate, class: .successResponse))
        #expect(m.checkMessageIntegrity(key: client.key) == .valid)
        #expect(try m.value(.xorMappedAddress) == .xorMappedAddress(client.tuple.client))
        guard case .xorRelayedAddress(let relay)? = try m.value(.xorRelayedAddress) else {
            Issue.record("no relay")
            return
        }
        #expect(ports.open.contains(relay))
        #expect(ports.attached[relay] === server.allocation(for: client.tuple))
        #expect(try m.value(.lifetime) == .lifetime(1200))
        #expect(try m.value(.software) == .software("tusa"))
        #expect(server.statistics.allocationsActive == 1)
    }

    @Test func retransmittedAllocateGetsTheSameAnswerAnotherGets437() throws {
        let (server, _) = Self.makeServer()
        var c = TestClient()
        let challenge = try Self.reply(
            server.handleClient(c.request(.allocate, [.requestedTransport(17)]), from: c.tuple, now: .zero))
        guard case .nonce(let n)? = try challenge.value(.nonce) else {
            Issue.record("no nonce")
            return
        }
        c.nonce = n
        let request = c.request(.allocate, [.requestedTransport(17)])
        guard case .reply(let a) = server.handleClient(request, from: c.tuple, now: .zero),
            case .reply(let b) = server.handleClient(request, from: c.tuple, now: .seconds(1))
        else {
            Issue.record("no answers")
            return
        }
        #expect(a == b)
        #expect(server.allocationCount == 1)
        // Another transaction on the same 5-tuple is a mismatch.
        let other = try Self.reply(
            server.handleClient(c.request(.allocate, [.requestedTransport(17)]), from: c.tuple, now: .seconds(2)))
        #expect(Self.errorCode(other) == 437)
        #expect(other.checkMessageIntegrity(key: c.key) == .valid)
    }

    @Test func wrongPasswordIsAnotherChallengeAndCounted() throws {
        let (server, _) = Self.makeServer()
        var client = TestClient()
        client.password = "guess"
        let m = try Self.allocate(server, &client)
        #expect(Self.errorCode(m) == 401)
        #expect(server.statistics.authFailures == 1)
        #expect(server.allocationCount == 0)
    }

    @Test func unknownUserIsRefused() throws {
        let (server, _) = Self.makeServer()
        var client = TestClient()
        client.username = "mallory"
        #expect(Self.errorCode(try Self.allocate(server, &client)) == 401)
    }

    @Test func staleAndForeignNoncesGet438() throws {
        let (server, _) = Self.makeServer()
        var client = TestClient()
        _ = try Self.allocate(server, &client, now: .zero)
        // A nonce older than its lifetime.
        var late = TestClient("203.0.113.5:40001")
        late.nonce = client.nonce
        let stale = try Self.reply(
            server.handleClient(late.request(.allocate, [.requestedTransport(17)]), from: late.tuple, now: .seconds(700)))
        #expect(Self.errorCode(stale) == 438)
        #expect(stale.attribute(.nonce) != nil)
        // A nonce minted for another client address is not accepted either.
        let foreign = try Self.reply(
            server.handleClient(late.request(.allocate, [.requestedTransport(17)]), from: late.tuple, now: .seconds(1)))
        #expect(Self.errorCode(foreign) == 438)
    }

    @Test func sha256IntegrityAndUserhash() throws {
        let (server, _) = Self.makeServer()
        var client = TestClient()
        client.algorithm = .sha256
        client.sha256MI = true
        let challenge = try Self.reply(
            server.handleClient(client.request(.allocate, [.requestedTransport(17)]), from: client.tuple, now: .zero))
        guard case .nonce(let n)? = try challenge.value(.nonce) else {
            Issue.record("no nonce")
            return
        }
        client.nonce = n
        let m = try Self.reply(
            server.handleClient(
                client.request(.allocate, [.requestedTransport(17)], userhash: true), from: client.tuple, now: .zero))
        #expect(m.type.messageClass == .successResponse)
        #expect(m.checkMessageIntegritySHA256(key: client.key) == .valid)
        #expect(m.attribute(.messageIntegrity) == nil)
    }

    @Test func passwordAlgorithmWithoutTheOfferedListIs400() throws {
        let (server, _) = Self.makeServer()
        var client = TestClient()
        _ = try Self.allocate(server, &client)
        var m = Message(
            type: MessageType(method: .refresh, class: .request),
            attributes: [
                .passwordAlgorithm(.sha256), .username("alice"), .realm("example.org"), .nonce(client.nonce!),
            ])
        m.append(.software(String(repeating: "x", count: 40)))
        let bytes = m.encode(integrity: client.key)
        #expect(Self.errorCode(try Self.reply(server.handleClient(bytes, from: client.tuple, now: .zero))) == 400)
    }

    @Test func restCredentialsValidUntilTheirExpiry() throws {
        let (server, _) = Self.makeServer {
            $0.credentials.restSecrets = ["northwind"]
            $0.unixTimeAtZero = 1_700_000_000
        }
        let creds = RESTCredentials.make(secret: "northwind", user: "bob", expiry: 1_700_000_100)
        var client = TestClient()
        client.username = creds.username
        client.password = creds.password
        #expect(try Self.allocate(server, &client).type.messageClass == .successResponse)

        var late = TestClient("203.0.113.5:40002")
        late.username = creds.username
        late.password = creds.password
        #expect(Self.errorCode(try Self.allocate(server, &late, now: .seconds(101))) == 401)
        // The system clock is stepped back an hour (the driver reads it again): the
        // expiry is judged on the clock its issuer stamped it by, not the start's.
        server.unixTimeAtZero -= 3600
        var stepped = TestClient("203.0.113.5:40004")
        stepped.username = creds.username
        stepped.password = creds.password
        #expect(try Self.allocate(server, &stepped, now: .seconds(101)).type.messageClass == .successResponse)

        var forged = TestClient("203.0.113.5:40003")
        forged.username = "1700000100:bob"
        forged.password = RESTCredentials.password(secret: "other", username: forged.username)
        #expect(Self.errorCode(try Self.allocate(server, &forged)) == 401)
    }

    @Test func anonymousOnlyWhenAsked() throws {
        let (server, _) = Self.makeServer { $0.anonymous = true }
        let client = TestClient()
        let m = try Self.reply(
            server.handleClient(client.request(.allocate, [.requestedTransport(17)]), from: client.tuple, now: .zero))
        #expect(m.type.messageClass == .successResponse)
        #expect(m.attribute(.messageIntegrity) == nil)
    }

    @Test func challengesAreRateLimitedPerSource() throws {
        let (server, _) = Self.makeServer {
            $0.challengeRate = 1
            $0.challengeBurst = 3
        }
        let client = TestClient()
        var answered = 0
        for _ in 0..<10 {
            if case .reply = server.handleClient(
                client.request(.allocate, [.requestedTransport(17)]), from: client.tuple, now: .zero)
            {
                answered += 1
            }
        }
        #expect(answered == 3)
        #expect(server.statistics.dropped(.challengeRateLimited) == 7)
        // Budget comes back with time.
        if case .reply = server.handleClient(
            client.request(.allocate, [.requestedTransport(17)]), from: client.tuple, now: .seconds(2))
        {
        } else {
            Issue.record("no challenge after the budget refilled")
        }
    }

    @Test func unauthenticatedErrorsNeverOutgrowTheRequest() throws {
        let (server, _) = Self.makeServer()
        let client = TestClient()
        // An unknown method in a bare 20-byte request: the 400 would be larger, so nothing is sent.
        let tiny = Message(type: MessageType(method: Method(rawValue: 0x0FF), class: .request)).encode()
        if case .drop(.amplification) = server.handleClient(tiny, from: client.tuple, now: .zero) {
        } else {
            Issue.record("tiny request answered")
        }
        // The same with room for the answer is answered 400.
        let padded = Message(
            type: MessageType(method: Method(rawValue: 0x0FF), class: .request),
            attributes: [.software(String(repeating: "p", count: 64))]
        ).encode()
        #expect(Self.errorCode(try Self.reply(server.handleClient(padded, from: client.tuple, now: .zero))) == 400)
        // Strict mode drops a challenge that is larger than its request.
        let (strict, _) = Self.makeServer { $0.strictAmplification = true }
        if case .drop(.amplification) = strict.handleClient(
            client.request(.allocate, [.requestedTransport(17)]), from: client.tuple, now: .zero)
        {
        } else {
            Issue.record("strict mode sent a large challenge")
        }
    }

    @Test func unknownComprehensionRequiredAttributeIs420() throws {
        let (server, _) = Self.makeServer()
        let client = TestClient()
        let req = Message(
            type: MessageType(method: .allocate, class: .request),
            attributes: [
                .requestedTransport(17), .unknown(RawAttribute(type: AttributeType(rawValue: 0x7F00), value: [1, 2, 3, 4])),
                .software(String(repeating: "s", count: 60)),
            ]
        ).encode()
        let m = try Self.reply(server.handleClient(req, from: client.tuple, now: .zero))
        #expect(Self.errorCode(m) == 420)
        #expect(try m.value(.unknownAttributes) == .unknownAttributes([AttributeType(rawValue: 0x7F00)]))
    }

    // MARK: - Allocate errors

    @Test func allocateErrors() throws {
        let cases: [([Attribute], Int)] = [
            ([], 400),
            ([.requestedTransport(6)], 442),
            ([.requestedTransport(17), .requestedAddressFamily(0x03)], 440),
            ([.requestedTransport(17), .requestedAddressFamily(0x02)], 440),  // no IPv6 relays here
            ([.requestedTransport(17), .reservationToken(42), .evenPort(reserveNext: false)], 400),
            ([.requestedTransport(17), .requestedAddressFamily(0x01), .additionalAddressFamily(0x02)], 400),
            ([.requestedTransport(17), .additionalAddressFamily(0x01)], 400),
            ([.requestedTransport(17), .reservationToken(42)], 508),
            ([.requestedTransport(17), .reservationToken(42), .additionalAddressFamily(0x02)], 400),
        ]
        for (attrs, code) in cases {
            let (server, ports) = Self.makeServer()
            var client = TestClient()
            let m = try Self.allocate(server, &client, attrs)
            #expect(Self.errorCode(m) == code, "\(attrs)")
            #expect(m.checkMessageIntegrity(key: client.key) == .valid)
            #expect(server.allocationCount == 0)
            #expect(ports.open.isEmpty)
        }
    }

    @Test func noFreePortIs508() throws {
        let (server, ports) = Self.makeServer()
        ports.exhausted = true
        var client = TestClient()
        #expect(Self.errorCode(try Self.allocate(server, &client)) == 508)
    }

    @Test func evenPortReservesTheNextForTheToken() throws {
        let (server, ports) = Self.makeServer()
        var a = TestClient()
        let first = try Self.allocate(server, &a, [.requestedTransport(17), .evenPort(reserveNext: true)])
        guard case .xorRelayedAddress(let relay)? = try first.value(.xorRelayedAddress),
            case .reservationToken(let token)? = try first.value(.reservationToken)
        else {
            Issue.record("no relay or token")
            return
        }
        #expect(relay.port % 2 == 0)
        var b = TestClient("203.0.113.6:40000")
        let second = try Self.allocate(server, &b, [.requestedTransport(17), .reservationToken(token)])
        #expect(try second.value(.xorRelayedAddress) == .xorRelayedAddress(TransportAddress(ip: relay.ip, port: relay.port + 1)))
        // A token is good once.
        var c = TestClient("203.0.113.7:40000")
        #expect(Self.errorCode(try Self.allocate(server, &c, [.requestedTransport(17), .reservationToken(token)])) == 508)
        // An unused reservation is released after its 30 s.
        var d = TestClient("203.0.113.8:40000")
        let third = try Self.allocate(server, &d, [.requestedTransport(17), .evenPort(reserveNext: true)])
        #expect(third.attribute(.reservationToken) != nil)
        #expect(ports.held.count == 1)
        server.expire(now: .seconds(31))
        #expect(ports.held.isEmpty)
    }

    @Test func aLapsedReservationIsReleasedWhenRedeemedLate() throws {
        let (server, ports) = Self.makeServer()
        var a = TestClient()
        let first = try Self.allocate(server, &a, [.requestedTransport(17), .evenPort(reserveNext: true)])
        guard case .reservationToken(let token)? = try first.value(.reservationToken) else {
            Issue.record("no token")
            return
        }
        let held = try #require(ports.held.first)
        var b = TestClient("203.0.113.6:40000")
        // Redeemed after its 30 s but before a sweep: 508, and the held port is closed, not leaked.
        #expect(
            Self.errorCode(try Self.allocate(server, &b, [.requestedTransport(17), .reservationToken(token)], now: .seconds(31)))
                == 508)
        #expect(ports.held.isEmpty && ports.closed.contains(held))
    }

    @Test func heldPortsCountAgainstTheUserQuota() throws {
        let (server, _) = Self.makeServer { $0.userQuota = 2 }
        var a = TestClient("203.0.113.5:1")
        #expect(
            try Self.allocate(server, &a, [.requestedTransport(17), .evenPort(reserveNext: true)]).type.messageClass
                == .successResponse)
        var b = TestClient("203.0.113.5:2")
        #expect(Self.errorCode(try Self.allocate(server, &b)) == 486)
        // Once the reservation lapses the slot is free again.
        server.expire(now: .seconds(31))
        #expect(try Self.allocate(server, &b, now: .seconds(31)).type.messageClass == .successResponse)
    }

    /// An allocation that would also hold the next port needs two slots: with one
    /// left, it is refused (it used to be granted, leaving the user over the quota).
    @Test func anAllocationWithAHeldPortNeedsTwoSlotsOfTheQuota() throws {
        let reserving: [Attribute] = [.requestedTransport(17), .evenPort(reserveNext: true)]
        let (server, ports) = Self.makeServer { $0.userQuota = 2 }
        var a = TestClient("203.0.113.5:1")
        #expect(try Self.allocate(server, &a).type.messageClass == .successResponse)
        var b = TestClient("203.0.113.5:2")
        #expect(Self.errorCode(try Self.allocate(server, &b, reserving)) == 486)
        #expect(ports.held.isEmpty)
        #expect(try Self.allocate(server, &b).type.messageClass == .successResponse)

        // The same for the server's total.
        let (full, fullPorts) = Self.makeServer {
            $0.userQuota = 0
            $0.totalQuota = 2
        }
        var c = TestClient("203.0.113.5:3")
        #expect(try Self.allocate(full, &c).type.messageClass == .successResponse)
        var d = TestClient("203.0.113.5:4")
        #expect(Self.errorCode(try Self.allocate(full, &d, reserving)) == 508)
        #expect(fullPorts.held.isEmpty)
        #expect(try Self.allocate(full, &d).type.messageClass == .successResponse)

        // At the quota with a port held, its token still redeems: the held slot becomes
        // the allocation's (the RTP/RTCP pair the reservation is for).
        let (paired, _) = Self.makeServer { $0.userQuota = 2 }
        var rtp = TestClient("203.0.113.5:5")
        let first = try Self.allocate(paired, &rtp, reserving)
        guard case .reservationToken(let token)? = try first.value(.reservationToken) else {
            Issue.record("no token")
            return
        }
        var rtcp = TestClient("203.0.113.5:6")
        let second = try Self.allocate(paired, &rtcp, [.requestedTransport(17), .reservationToken(token)])
        #expect(second.type.messageClass == .successResponse, "\(Self.errorCode(second) ?? 0)")
        var third = TestClient("203.0.113.5:7")
        #expect(Self.errorCode(try Self.allocate(paired, &third)) == 486)
    }

    @Test func dualStackAllocationAndAddressErrorCode() throws {
        let (server, ports) = Self.makeServer()
        var client = TestClient()
        let v4only = try Self.allocate(server, &client, [.requestedTransport(17), .additionalAddressFamily(0x02)])
        #expect(v4only.type.messageClass == .successResponse)
        guard case .addressErrorCode(let family, let e)? = try v4only.value(.addressErrorCode) else {
            Issue.record("no ADDRESS-ERROR-CODE")
            return
        }
        #expect(family == 0x02 && e.code == 440)

        ports.families = [0x01, 0x02]
        var other = TestClient("203.0.113.9:1")
        let both = try Self.allocate(server, &other, [.requestedTransport(17), .additionalAddressFamily(0x02)])
        let relays = both.effectiveAttributes.filter { $0.type == .xorRelayedAddress }
        #expect(relays.count == 2)
        var six = TestClient("203.0.113.9:2")
        let v6 = try Self.allocate(server, &six, [.requestedTransport(17), .requestedAddressFamily(0x02)])
        guard case .xorRelayedAddress(let r)? = try v6.value(.xorRelayedAddress) else {
            Issue.record("no relay")
            return
        }
        #expect(!r.ip.isIPv4)
    }

    @Test func userQuotaIs486AndFreedOnDelete() throws {
        let (server, _) = Self.makeServer { $0.userQuota = 1 }
        var a = TestClient("203.0.113.5:1")
        #expect(try Self.allocate(server, &a).type.messageClass == .successResponse)
        var b = TestClient("203.0.113.5:2")
        #expect(Self.errorCode(try Self.allocate(server, &b)) == 486)
        // Another user is not affected.
        var c = TestClient("203.0.113.5:3")
        c.username = "bob"
        c.password = "builder"
        #expect(try Self.allocate(server, &c).type.messageClass == .successResponse)
        // Deleting frees the slot.
        _ = try Self.reply(server.handleClient(a.request(.refresh, [.lifetime(0)]), from: a.tuple, now: .zero))
        #expect(try Self.allocate(server, &b).type.messageClass == .successResponse)
    }

    @Test func externalIPIsAdvertised() throws {
        let (server, _) = Self.makeServer { $0.externalIP = [0x01: IPAddress("198.51.100.200")!] }
        var client = TestClient()
        let m = try Self.allocate(server, &client)
        guard case .xorRelayedAddress(let r)? = try m.value(.xorRelayedAddress) else {
            Issue.record("no relay")
            return
        }
        #expect(r.ip == IPAddress("198.51.100.200"))
    }

    // MARK: - Refresh

    @Test func refreshLifetimesAndDeletion() throws {
        let (server, ports) = Self.makeServer()
        var client = TestClient()
        try Self.allocate(server, &client)
        func refresh(_ attrs: [Attribute], at t: Timestamp = .zero) throws -> Message {
            try Self.reply(server.handleClient(client.request(.refresh, attrs), from: client.tuple, now: t))
        }
        #expect(try refresh([.lifetime(100)]).value(.lifetime) == .lifetime(600))  // never below the default
        #expect(try refresh([.lifetime(99_999)]).value(.lifetime) == .lifetime(3600))  // capped
        #expect(try refresh([]).value(.lifetime) == .lifetime(600))
        #expect(Self.errorCode(try refresh([.requestedAddressFamily(0x02)])) == 443)
        let gone = try refresh([.lifetime(0)])
        #expect(try gone.value(.lifetime) == .lifetime(0))
        #expect(server.allocationCount == 0)
        #expect(ports.open.isEmpty)
        #expect(Self.errorCode(try refresh([.lifetime(0)])) == 437)
    }

    @Test func anotherUsersRequestOnTheTupleIs441() throws {
        let (server, _) = Self.makeServer()
        var client = TestClient()
        try Self.allocate(server, &client)
        var bob = client
        bob.username = "bob"
        bob.password = "builder"
        let m = try Self.reply(server.handleClient(bob.request(.refresh, []), from: bob.tuple, now: .zero))
        #expect(Self.errorCode(m) == 441)
    }

    @Test func allocationExpiresAndItsRelayCloses() throws {
        let (server, ports) = Self.makeServer()
        var client = TestClient()
        try Self.allocate(server, &client)
        server.expire(now: .seconds(599))
        #expect(server.allocationCount == 1)
        server.expire(now: .seconds(600))
        #expect(server.allocationCount == 0)
        #expect(ports.open.isEmpty)
        #expect(server.statistics.allocationsExpired == 1)
    }

    // MARK: - Permissions, channels, data

    static func allocated(_ configure: (inout TURNServerConfiguration) -> Void = { _ in }) throws -> (
        TURNServer, TestClient, TURNAllocation
    ) {
        let (server, _) = makeServer(configure)
        var client = TestClient()
        try allocate(server, &client)
        guard let a = server.allocation(for: client.tuple) else { throw STUNError(.invalidValue, "no allocation") }
        return (server, client, a)
    }

    @Test func createPermissionChecksPeers() throws {
        let (server, client, a) = try Self.allocated()
        func create(_ peers: [TransportAddress]) throws -> Message {
            try Self.reply(
                server.handleClient(
                    client.request(.createPermission, peers.map { .xorPeerAddress($0) }), from: client.tuple, now: .zero))
        }
        #expect(Self.errorCode(try create([])) == 400)
        #expect(Self.errorCode(try create([TransportAddress("127.0.0.1:9")!])) == 403)
        #expect(Self.errorCode(try create([TransportAddress("10.1.2.3:9")!])) == 403)
        #expect(Self.errorCode(try create([TransportAddress("[2001:db8::1]:9")!])) == 443)
        #expect(a.permissionCount == 0)
        #expect(try create([Self.peer, TransportAddress("198.51.100.7:1")!]).type.messageClass == .successResponse)
        #expect(a.permissionCount == 2)
    }

    @Test func loopbackPeersWhenAllowed() throws {
        let (server, client, _) = try Self.allocated { $0.peerFilter = PeerFilter(allowLoopback: true) }
        let m = try Self.reply(
            server.handleClient(
                client.request(.createPermission, [.xorPeerAddress(TransportAddress("127.0.0.1:9")!)]), from: client.tuple,
                now: .zero))
        #expect(m.type.messageClass == .successResponse)
    }

    @Test func permissionCapIs508() throws {
        let (server, client, _) = try Self.allocated { $0.maxPermissionsPerAllocation = 2 }
        let peers: [Attribute] = (1...3).map { .xorPeerAddress(TransportAddress("198.51.100.\($0):1")!) }
        let m = try Self.reply(server.handleClient(client.request(.createPermission, peers), from: client.tuple, now: .zero))
        #expect(Self.errorCode(m) == 508)
    }

    @Test func channelBindRules() throws {
        let (server, client, a) = try Self.allocated { $0.nonceLifetime = .seconds(3600) }
        _ = server.handleClient(client.request(.refresh, [.lifetime(3600)]), from: client.tuple, now: .zero)
        func bind(_ number: UInt16, _ peer: TransportAddress, at t: Timestamp = .zero) throws -> Int? {
            let m = try Self.reply(
                server.handleClient(
                    client.request(.channelBind, [.channelNumber(number), .xorPeerAddress(peer)]), from: client.tuple, now: t))
            return m.type.messageClass == .successResponse ? nil : Self.errorCode(m)
        }
        let other = TransportAddress("198.51.100.7:7")!
        #expect(try bind(0x3FFF, Self.peer) == 400)
        #expect(try bind(0x8000, Self.peer) == 400)
        #expect(try bind(0x4000, Self.peer) == nil)
        #expect(try bind(0x4000, Self.peer, at: .seconds(100)) == nil)  // the same pair refreshes
        #expect(try bind(0x4000, other) == 400)  // the channel is taken
        #expect(try bind(0x4001, Self.peer) == 400)  // the peer is taken
        #expect(try bind(0x4001, TransportAddress("127.0.0.1:1")!) == 403)
        #expect(a.channelCount == 1)
        // Binding installs a permission.
        #expect(a.hasPermission(Self.peer.ip, now: .seconds(1)))
        // After the binding lapses, the number can go to another peer.
        #expect(try bind(0x4000, other, at: .seconds(701)) == nil)
    }

    @Test func strictChannelRangeOnRequest() throws {
        let (server, client, _) = try Self.allocated { $0.channelNumbers = ChannelNumber.validRange }
        let m = try Self.reply(
            server.handleClient(
                client.request(.channelBind, [.channelNumber(0x5000), .xorPeerAddress(Self.peer)]), from: client.tuple, now: .zero
            ))
        #expect(Self.errorCode(m) == 400)
        let ok = try Self.reply(
            server.handleClient(
                client.request(.channelBind, [.channelNumber(0x4FFF), .xorPeerAddress(Self.peer)]), from: client.tuple, now: .zero
            ))
        #expect(ok.type.messageClass == .successResponse)
    }

    @Test func channelCapIs508() throws {
        let (server, client, _) = try Self.allocated { $0.maxChannelsPerAllocation = 2 }
        var codes: [Int?] = []
        for i in 0..<3 {
            let m = try Self.reply(
                server.handleClient(
                    client.request(
                        .channelBind,
                        [.channelNumber(0x4000 + UInt16(i)), .xorPeerAddress(TransportAddress("198.51.100.9:\(1000 + i)")!)]),
                    from: client.tuple, now: .zero))
            codes.append(Self.errorCode(m))
        }
        #expect(codes == [nil, nil, 508])
    }

    @Test func theServerItselfIsNoPeer() throws {
        let (server, client, a) = try Self.allocated { $0.peerFilter = .permitAll }
        server.ownEndpoints = [TransportAddress("198.51.100.1:3478")!, TransportAddress("0.0.0.0:5349")!]
        let relay = try #require(a.relays.first)
        for peer in [relay, TransportAddress("198.51.100.1:3478")!, TransportAddress("203.0.113.200:5349")!] {
            let m = try Self.reply(
                server.handleClient(
                    client.request(.channelBind, [.channelNumber(0x4000), .xorPeerAddress(peer)]), from: client.tuple, now: .zero)
            )
            #expect(Self.errorCode(m) == 403, "\(peer)")
        }
        _ = server.handleClient(client.request(.createPermission, [.xorPeerAddress(relay)]), from: client.tuple, now: .zero)
        let send = Message(
            type: MessageType(method: .send, class: .indication), attributes: [.xorPeerAddress(relay), .data([1])]
        ).encode()
        if case .drop(.ownAddress) = server.handleClient(send, from: client.tuple, now: .zero) {
        } else {
            Issue.record("relayed to its own relay")
        }
    }

    /// Two clients that both need the relay (symmetric NATs, relay-only calls) meet
    /// relay to relay: another allocation's relay is a peer, and the datagram arrives.
    @Test func anotherAllocationsRelayIsAPeer() throws {
        let (server, first, a) = try Self.allocated { $0.peerFilter = .permitAll }
        var second = TestClient("203.0.113.6:40000")
        try Self.allocate(server, &second)
        let b = try #require(server.allocation(for: second.tuple))
        let (relayA, relayB) = (try #require(a.relays.first), try #require(b.relays.first))
        for (client, peer) in [(first, relayB), (second, relayA)] {
            let m = try Self.reply(
                server.handleClient(client.request(.createPermission, [.xorPeerAddress(peer)]), from: client.tuple, now: .zero))
            #expect(m.type.messageClass == .successResponse)
        }
        let bind = try Self.reply(
            server.handleClient(
                first.request(.channelBind, [.channelNumber(0x4000), .xorPeerAddress(relayB)]), from: first.tuple, now: .zero))
        #expect(bind.type.messageClass == .successResponse)
        let send = Message(
            type: MessageType(method: .send, class: .indication), attributes: [.xorPeerAddress(relayB), .data([1, 2, 3])]
        ).encode()
        guard case .relay(let from, let to, _) = server.handleClient(send, from: first.tuple, now: .zero) else {
            Issue.record("not relayed to the other allocation's relay")
            return
        }
        #expect(from === a && to == relayB)
        // What A's relay sends arrives at B's relay from A's relayed address: B's permission lets it through.
        if case .drop = server.handlePeer([1, 2, 3], from: relayA, allocation: b, now: .zero) {
            Issue.record("B dropped A's relay")
        }
    }

    @Test func oversizedPeerDatagramIsDroppedNotTruncated() throws {
        let (server, client, a) = try Self.allocated()
        _ = server.handleClient(client.request(.createPermission, [.xorPeerAddress(Self.peer)]), from: client.tuple, now: .zero)
        let big = [UInt8](repeating: 7, count: 65_535 - 20)
        if case .drop(.tooLarge) = server.handlePeer(big, from: Self.peer, allocation: a, now: .zero) {
        } else {
            Issue.record("oversized Data indication built")
        }
        guard
            case .indication(let bytes, _) = server.handlePeer(
                [UInt8](repeating: 7, count: 3000), from: Self.peer, allocation: a, now: .zero)
        else {
            Issue.record("no indication")
            return
        }
        #expect(try Message(decoding: bytes).value(.data) == .data([UInt8](repeating: 7, count: 3000)))
    }

    @Test func loggedUsernamesAreEscapedAndShort() {
        #expect(TURNServer.printable("alice") == "alice")
        #expect(TURNServer.printable("a\nb\u{7F}") == "a\\u{a}b\\u{7f}")
        #expect(TURNServer.printable(String(repeating: "x", count: 100)).count == 65)
    }

    @Test func sendIndicationNeedsAPermission() throws {
        let (server, client, a) = try Self.allocated()
        let payload: [UInt8] = Array(0..<100)
        let send = Message(
            type: MessageType(method: .send, class: .indication), attributes: [.xorPeerAddress(Self.peer), .data(payload)]
        ).encode()
        if case .drop(.noPermission) = server.handleClient(send, from: client.tuple, now: .zero) {
        } else {
            Issue.record("relayed without permission")
        }
        _ = server.handleClient(client.request(.createPermission, [.xorPeerAddress(Self.peer)]), from: client.tuple, now: .zero)
        guard case .relay(let to, let peer, let range) = server.handleClient(send, from: client.tuple, now: .zero) else {
            Issue.record("not relayed")
            return
        }
        #expect(to === a)
        #expect(peer == Self.peer)
        #expect(Array(send[range]) == payload)
        // Permissions last 300 s.
        if case .drop(.noPermission) = server.handleClient(send, from: client.tuple, now: .seconds(301)) {
        } else {
            Issue.record("permission outlived 300 s")
        }
        // Another 5-tuple has no allocation.
        var stranger = client
        stranger.tuple.client.port += 1
        if case .drop(.noAllocation) = server.handleClient(send, from: stranger.tuple, now: .zero) {
        } else {
            Issue.record("stranger relayed")
        }
    }

    @Test func channelDataBothWays() throws {
        let (server, client, a) = try Self.allocated()
        _ = server.handleClient(
            client.request(.channelBind, [.channelNumber(0x4001), .xorPeerAddress(Self.peer)]), from: client.tuple, now: .zero)
        let frame = ChannelData(channel: 0x4001, data: [9, 8, 7]).encode(padded: true)
        guard case .relay(_, let peer, let range) = server.handleClient(frame, from: client.tuple, now: .zero) else {
            Issue.record("not relayed")
            return
        }
        #expect(peer == Self.peer && Array(frame[range]) == [9, 8, 7])
        let unbound = ChannelData(channel: 0x4002, data: [1]).encode()
        if case .drop(.noChannel) = server.handleClient(unbound, from: client.tuple, now: .zero) {
        } else {
            Issue.record("unbound channel relayed")
        }
        let short: [UInt8] = [0x40, 0x01, 0x00, 0x09, 1]
        if case .drop(.malformed) = server.handleClient(short, from: client.tuple, now: .zero) {
        } else {
            Issue.record("short frame relayed")
        }

        // From the peer: ChannelData on the bound channel.
        guard case .channel(0x4001, let tuple) = server.handlePeer([1, 2], from: Self.peer, allocation: a, now: .zero) else {
            Issue.record("no channel answer")
            return
        }
        #expect(tuple == client.tuple)
        // The same peer IP on another port has a permission but no channel: Data indication.
        let otherPort = TransportAddress(ip: Self.peer.ip, port: 6000)
        guard case .indication(let bytes, _) = server.handlePeer([5], from: otherPort, allocation: a, now: .zero) else {
            Issue.record("no indication")
            return
        }
        let m = try Message(decoding: bytes)
        #expect(m.type == MessageType(method: .data, class: .indication))
        #expect(try m.value(.xorPeerAddress) == .xorPeerAddress(otherPort))
        #expect(try m.value(.data) == .data([5]))
        // A peer without permission is dropped.
        if case .drop(.noPermission) = server.handlePeer(
            [5], from: TransportAddress("198.51.100.50:1")!, allocation: a, now: .zero)
        {
        } else {
            Issue.record("relayed from a stranger")
        }
        #expect(server.statistics.packetsToPeer == 1 && server.statistics.packetsToClient == 2)
    }

    @Test func channelsAndPermissionsExpire() throws {
        let (server, client, a) = try Self.allocated()
        _ = server.handleClient(client.request(.refresh, [.lifetime(3600)]), from: client.tuple, now: .zero)
        _ = server.handleClient(
            client.request(.channelBind, [.channelNumber(0x4001), .xorPeerAddress(Self.peer)]), from: client.tuple, now: .zero)
        server.expire(now: .seconds(301))
        #expect(a.permissionCount == 0 && a.channelCount == 1)
        server.expire(now: .seconds(601))
        #expect(a.channelCount == 0)
        #expect(server.statistics.permissionsExpired == 1 && server.statistics.channelsExpired == 1)
        let frame = ChannelData(channel: 0x4001, data: [1]).encode()
        if case .drop(.noChannel) = server.handleClient(frame, from: client.tuple, now: .seconds(601)) {
        } else {
            Issue.record("expired channel relayed")
        }
    }

    /// The hot path remembers the channel a packet last used; what it remembers
    /// must not outlive the channel or its peer's permission (to the nanosecond,
    /// with no sweep in between), must follow two peers taking turns, a refreshed
    /// permission, and a channel number bound to another peer once it lapsed.
    @Test func aChannelInUseStopsWithItsPermissionAndFollowsItsPeers() throws {
        // Nonces outlast the test (600 s would make the late ChannelBinds stale).
        let (server, client, a) = try Self.allocated { $0.nonceLifetime = .seconds(3600) }
        let other = TransportAddress("198.51.100.7:6000")!
        func request(_ method: Method, _ attributes: [Attribute], at: Timestamp) throws {
            let m = try Self.reply(server.handleClient(client.request(method, attributes), from: client.tuple, now: at))
            #expect(m.type.messageClass == .successResponse, "\(method) at \(at): \(Self.errorCode(m) ?? 0)")
        }
        func up(_ channel: UInt16, _ at: Timestamp) -> String {
            switch server.handleClient(ChannelData(channel: channel, data: [1]).encode(), from: client.tuple, now: at) {
            case .relay(_, let peer, _): "\(peer)"
            case .drop(let reason): "\(reason)"
            case .reply: "reply"
            }
        }
        func down(_ from: TransportAddress, _ at: Timestamp) -> String {
            switch server.handlePeer([2], from: from, allocation: a, now: at) {
            case .channel(let number, _): "0x" + String(number, radix: 16)
            case .indication: "indication"
            case .drop(let reason): "\(reason)"
            }
        }
        let noPermission = "\(TURNDropReason.noPermission)"
        let noChannel = "\(TURNDropReason.noChannel)"
        try request(.refresh, [.lifetime(3600)], at: .zero)
        try request(.channelBind, [.channelNumber(0x4001), .xorPeerAddress(Self.peer)], at: .zero)
        try request(.channelBind, [.channelNumber(0x4002), .xorPeerAddress(other)], at: .zero)
        // Two peers taking turns, each on its own channel; the first peer's IP on
        // another port has its permission but no channel.
        for t in [Timestamp.seconds(1), .seconds(2)] {
            #expect(up(0x4001, t) == "\(Self.peer)" && down(Self.peer, t) == "0x4001")
            #expect(up(0x4002, t) == "\(other)" && down(other, t) == "0x4002")
            #expect(down(Self.peer, t) == "0x4001" && up(0x4001, t) == "\(Self.peer)")
            #expect(down(TransportAddress(ip: Self.peer.ip, port: 5001), t) == "indication")
        }
        // Permissions last 300 s, channels 600 s; no sweep runs here.
        let permissionEnds = Timestamp.seconds(300)
        #expect(up(0x4001, Timestamp(nanoseconds: permissionEnds.nanoseconds - 1)) == "\(Self.peer)")
        #expect(down(Self.peer, Timestamp(nanoseconds: permissionEnds.nanoseconds - 1)) == "0x4001")
        #expect(up(0x4001, permissionEnds) == noPermission && down(Self.peer, permissionEnds) == noPermission)
        // A refreshed permission counts at once (the other peer's stays lapsed).
        try request(.createPermission, [.xorPeerAddress(Self.peer)], at: .seconds(302))
        #expect(down(Self.peer, .seconds(303)) == "0x4001" && up(0x4001, .seconds(303)) == "\(Self.peer)")
        #expect(up(0x4002, .seconds(303)) == noPermission && down(other, .seconds(303)) == noPermission)
        let channelEnds = Timestamp.seconds(600)
        #expect(up(0x4001, Timestamp(nanoseconds: channelEnds.nanoseconds - 1)) == "\(Self.peer)")
        #expect(down(Self.peer, Timestamp(nanoseconds: channelEnds.nanoseconds - 1)) == "0x4001")
        #expect(up(0x4001, channelEnds) == noChannel && down(Self.peer, channelEnds) == "indication")
        // Lapsed, 0x4001 goes to the other peer, and the first peer moves to 0x4003.
        try request(.channelBind, [.channelNumber(0x4001), .xorPeerAddress(other)], at: .seconds(601))
        try request(.channelBind, [.channelNumber(0x4003), .xorPeerAddress(Self.peer)], at: .seconds(601))
        #expect(up(0x4001, .seconds(602)) == "\(other)" && down(other, .seconds(602)) == "0x4001")
        #expect(down(Self.peer, .seconds(602)) == "0x4003" && up(0x4003, .seconds(602)) == "\(Self.peer)")
    }

    @Test func bandwidthCapDropsTheExcess() throws {
        let (server, client, a) = try Self.allocated { $0.maxBandwidth = 1000 }
        _ = server.handleClient(
            client.request(.channelBind, [.channelNumber(0x4001), .xorPeerAddress(Self.peer)]), from: client.tuple, now: .zero)
        let frame = ChannelData(channel: 0x4001, data: [UInt8](repeating: 0, count: 400)).encode()
        var relayed = 0
        for _ in 0..<5 { if case .relay = server.handleClient(frame, from: client.tuple, now: .zero) { relayed += 1 } }
        #expect(relayed == 2)
        #expect(server.statistics.dropped(.bandwidth) == 3)
        // The other direction has its own budget.
        if case .channel = server.handlePeer([UInt8](repeating: 0, count: 400), from: Self.peer, allocation: a, now: .zero) {
        } else {
            Issue.record("to-client budget spent by to-peer traffic")
        }
        if case .relay = server.handleClient(frame, from: client.tuple, now: .seconds(1)) {
        } else {
            Issue.record("no budget after a second")
        }
        _ = a
    }

    @Test func tcpConnectionCloseDeletesTheAllocation() throws {
        let (server, ports) = Self.makeServer()
        var client = TestClient(transport: .tcp)
        try Self.allocate(server, &client)
        #expect(server.allocationCount == 1)
        server.connectionClosed(client.tuple, now: .seconds(1))
        #expect(server.allocationCount == 0 && ports.open.isEmpty)
    }

    @Test func garbageIsDroppedNeverAnswered() throws {
        let (server, _) = Self.makeServer()
        let t = TestClient().tuple
        for bytes: [UInt8] in [[], [0xFF, 1, 2], [0x00, 0x01, 0x00], [0x40], Array(repeating: 0, count: 20)] {
            if case .reply = server.handleClient(bytes, from: t, now: .zero) { Issue.record("answered \(bytes)") }
        }
        // A success response is not a request.
        let response = Message(type: MessageType(method: .allocate, class: .successResponse)).encode()
        if case .drop(.notARequest) = server.handleClient(response, from: t, now: .zero) {
        } else {
            Issue.record("response handled")
        }
    }

    // MARK: - Pieces

    @Test func peerFilterDefaults() {
        let f = PeerFilter()
        for denied in [
            "127.0.0.1", "10.9.8.7", "172.16.0.1", "192.168.1.1", "100.64.0.1", "169.254.1.1", "0.1.2.3",
            "224.0.0.1", "255.255.255.255", "::", "::1", "fe80::1", "fc00::1", "fd12::1", "ff02::1",
            "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:192.168.0.1", "64:ff9b::10.0.0.1", "64:ff9b::127.0.0.1",
            "2002:0a00:0001::1", "2002:7f00:0001::", "64:ff9b:1::8.8.8.8",
        ] {
            #expect(!f.permits(IPAddress(denied)!), "\(denied)")
        }
        for allowed in ["8.8.8.8", "203.0.113.5", "2001:db8::1", "::ffff:8.8.8.8", "64:ff9b::8.8.8.8", "2002:0808:0808::1"] {
            #expect(f.permits(IPAddress(allowed)!), "\(allowed)")
        }
        let loop = PeerFilter(allowLoopback: true, allowed: [IPRange("10.1.0.0/16")!], denied: [IPRange("8.8.8.0/24")!])
        #expect(loop.permits(IPAddress("127.0.0.1")!) && loop.permits(IPAddress("::ffff:127.0.0.1")!))
        #expect(loop.permits(IPAddress("10.1.2.3")!) && !loop.permits(IPAddress("10.2.0.1")!))
        #expect(!loop.permits(IPAddress("8.8.8.8")!))
        #expect(IPRange("10.0.0.0/33") == nil && IPRange("nonsense") == nil)
    }

    @Test func noncesCheckOwnerAndAge() {
        let n = StatelessNonce(secret: [1, 2, 3], lifetime: .seconds(60))
        let a = TransportAddress("203.0.113.5:1")!
        let nonce = n.mint(for: a, now: .seconds(1000))
        #expect(nonce.count == StatelessNonce.length)
        #expect(n.check(nonce, for: a, now: .seconds(1030)) == .fresh)
        #expect(n.check(nonce, for: a, now: .seconds(1061)) == .stale)
        #expect(n.check(nonce, for: TransportAddress("203.0.113.5:2")!, now: .seconds(1001)) == .invalid)
        #expect(StatelessNonce(secret: [9], lifetime: .seconds(60)).check(nonce, for: a, now: .seconds(1001)) == .invalid)
        var tampered = Array(nonce.utf8)
        tampered[20] = tampered[20] == UInt8(ascii: "0") ? UInt8(ascii: "1") : UInt8(ascii: "0")
        #expect(n.check(String(decoding: tampered, as: UTF8.self), for: a, now: .seconds(1001)) == .invalid)
        #expect(n.check("short", for: a, now: .zero) == .invalid)
    }

    @Test func coturnStyleUserSpecs() throws {
        var c = TURNCredentials(realm: "example.org")
        try c.addUser(spec: "alice:wonderland")
        let key = try IntegrityKey.longTerm(username: "alice", realm: "example.org", password: "wonderland")
        let hex = key.bytes.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }
            .joined()
        try c.addUser(spec: "carol:0x" + hex)
        #expect(c.keys(for: "alice", algorithm: .md5, unixNow: 0) == [key])
        #expect(c.keys(for: "carol", algorithm: .md5, unixNow: 0) == [key])
        #expect(c.keys(for: "carol", algorithm: .sha256, unixNow: 0).isEmpty)
        #expect(throws: STUNError.self) { try c.addUser(spec: "nocolon") }
        #expect(throws: STUNError.self) { try c.addUser(spec: ":pw") }
    }
}
