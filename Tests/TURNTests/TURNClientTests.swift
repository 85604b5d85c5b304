import Testing
import TusaBase

@testable import STUN
@testable import TURN

/// The TURN client core against hand-built server answers, on a virtual clock.
struct TURNClientTests {
    static let realm = "example.org"
    static let relayed = TransportAddress("192.0.2.15:50000")!
    static let mapped = TransportAddress("198.51.100.7:40000")!
    static let peer = TransportAddress("203.0.113.9:7000")!
    static let otherPeer = TransportAddress("203.0.113.10:7001")!

    static func key(_ password: String = "wonderland", algorithm: PasswordAlgorithm = .md5) throws -> IntegrityKey {
        try IntegrityKey.longTerm(username: "alice", realm: realm, password: password, algorithm: algorithm)
    }

    static func at(_ seconds: Double) -> Timestamp { Timestamp(nanoseconds: UInt64(seconds * 1e9)) }

    /// A client and the server side of the conversation.
    struct Fixture {
        var client: TURNClient
        var now = Timestamp.zero

        init(_ configure: (inout TURNClient.Configuration) -> Void = { _ in }) throws {
            var c = TURNClient.Configuration(username: "alice", password: "wonderland")
            configure(&c)
            client = try TURNClient(configuration: c)
        }

        /// Everything the client wants sent, decoded when STUN.
        mutating func sent() throws -> [Message] {
            var out: [Message] = []
            while let bytes = client.pollTransmit() { out.append(try Message(decoding: bytes)) }
            return out
        }

        /// The one request the client sent.
        mutating func request() throws -> Message {
            let all = try sent()
            try #require(all.count == 1, "expected one message, got \(all)")
            return all[0]
        }

        mutating func events() -> [TURNClient.Event] {
            var out: [TURNClient.Event] = []
            while let e = client.pollEvent() { out.append(e) }
            return out
        }

        @discardableResult
        mutating func deliver(_ bytes: [UInt8]) -> TURNClient.Datagram? {
            client.receive(bytes, now: now)
        }

        mutating func advance(to t: Timestamp) {
            now = t
            client.handleTimeout(now: t)
        }

        /// Runs the 401 challenge and a signed success: the client is then allocated at `now`.
        mutating func allocate(lifetime: UInt32 = 600) throws -> TURNClientAllocation {
            let op = try client.allocate(now: now)
            let first = try request()
            deliver(challenge(first))
            let second = try request()
            deliver(answer(second, [.xorRelayedAddress(relayed), .xorMappedAddress(mapped), .lifetime(lifetime)]))
            let events = events()
            guard case .allocated(op, let allocation)? = events.first else {
                Issue.record("no allocation: \(events)")
                throw TURNClientError.notAllocated
            }
            return allocation
        }
    }

    static func challenge(_ request: Message, code: Int = 401, nonce: String = "nonce-1", extra: [Attribute] = []) -> [UInt8] {
        Message(
            type: MessageType(method: request.type.method, class: .errorResponse), transactionID: request.transactionID,
            attributes: [
                .errorCode(ErrorCodeValue(code: code, reason: ErrorCodeValue.defaultReason(code))), .realm(realm), .nonce(nonce),
            ] + extra
        ).encode(fingerprint: true)
    }

    static func answer(_ request: Message, _ attributes: [Attribute], key: IntegrityKey? = nil, sha256: Bool = false) -> [UInt8] {
        let k = key ?? (try? Self.key())
        return Message(
            type: MessageType(method: request.type.method, class: .successResponse), transactionID: request.transactionID,
            attributes: attributes
        ).encode(integrity: sha256 ? nil : k, integritySHA256: sha256 ? k : nil, fingerprint: true)
    }

    static func error(_ request: Message, _ code: Int, key: IntegrityKey? = nil, extra: [Attribute] = []) -> [UInt8] {
        Message(
            type: MessageType(method: request.type.method, class: .errorResponse), transactionID: request.transactionID,
            attributes: [.errorCode(ErrorCodeValue(code: code, reason: ErrorCodeValue.defaultReason(code)))] + extra
        ).encode(integrity: key ?? (try? Self.key()), fingerprint: true)
    }

    // MARK: allocation and authentication

    @Test func challengeThenSignedSuccessGivesTheAddresses() throws {
        var f = try Fixture()
        let op = try f.client.allocate(now: .zero)
        let first = try f.request()
        #expect(first.type == MessageType(method: .allocate, class: .request))
        #expect(try first.value(.requestedTransport) == .requestedTransport(17))
        #expect(try first.value(.lifetime) == .lifetime(600))
        #expect(first.attribute(.username) == nil && first.attribute(.messageIntegrity) == nil)
        #expect(first.checkFingerprint() == .valid)

        f.deliver(Self.challenge(first))
        let second = try f.request()
        #expect(second.transactionID != first.transactionID)
        #expect(try second.value(.username) == .username("alice"))
        #expect(try second.value(.realm) == .realm(Self.realm))
        #expect(try second.value(.nonce) == .nonce("nonce-1"))
        #expect(try second.value(.requestedTransport) == .requestedTransport(17))
        #expect(second.checkMessageIntegrity(key: try Self.key()) == .valid)
        #expect(second.attribute(.passwordAlgorithm) == nil && second.attribute(.messageIntegritySHA256) == nil)
        #expect(f.events().isEmpty)

        f.now = Self.at(0.03)
        f.deliver(Self.answer(second, [.xorRelayedAddress(Self.relayed), .xorMappedAddress(Self.mapped), .lifetime(600)]))
        let expected = TURNClientAllocation(
            relayed: Self.relayed, mapped: Self.mapped, lifetime: .seconds(600), expiresAt: Self.at(600.03))
        #expect(f.events() == [.allocated(op, expected)])
        #expect(f.client.phase == .allocated)
        #expect(f.client.allocation == expected)
    }

    @Test func optionalAllocateAttributes() throws {
        var f = try Fixture {
            $0.addressFamily = 0x02
            $0.dontFragment = true
            $0.lifetime = nil
            $0.software = "tusa test"
        }
        _ = try f.client.allocate(now: .zero)
        let r = try f.request()
        #expect(try r.value(.requestedAddressFamily) == .requestedAddressFamily(0x02))
        #expect(r.attribute(.dontFragment) != nil)
        #expect(r.attribute(.lifetime) == nil)
        #expect(try r.value(.software) == .software("tusa test"))
        // 420 naming DONT-FRAGMENT: asked again without it (RFC 8656 §7.1).
        f.deliver(Self.challenge(r))
        let signed = try f.request()
        f.deliver(Self.error(signed, 420, extra: [.unknownAttributes([.dontFragment])]))
        let retry = try f.request()
        #expect(retry.attribute(.dontFragment) == nil)
        #expect(retry.checkMessageIntegrity(key: try Self.key()) == .valid)
        #expect(f.events().isEmpty)
    }

    @Test func wrongOrMissingIntegrityIsIgnored() throws {
        var f = try Fixture()
        let op = try f.client.allocate(now: .zero)
        f.deliver(Self.challenge(try f.request()))
        let signed = try f.request()
        let attributes: [Attribute] = [.xorRelayedAddress(Self.relayed), .lifetime(600)]
        // Signed with another password, and not signed at all: as if never received.
        f.deliver(Self.answer(signed, attributes, key: try Self.key("guess")))
        f.deliver(
            Message(
                type: MessageType(method: .allocate, class: .successResponse), transactionID: signed.transactionID,
                attributes: attributes
            ).encode())
        // An error response with a forged signature neither.
        f.deliver(Self.error(signed, 486, key: try Self.key("guess")))
        #expect(f.client.ignoredResponses == 3)
        #expect(f.events().isEmpty)
        #expect(f.client.phase == .allocating)
        // The transaction is still alive: it retransmits at 0.5 s.
        f.advance(to: Self.at(0.5))
        #expect(try f.request().transactionID == signed.transactionID)
        // A broken FINGERPRINT is dropped too.
        var bytes = Self.answer(signed, attributes)
        bytes[bytes.count - 1] ^= 1
        f.deliver(bytes)
        #expect(f.events().isEmpty)
        // The real answer counts.
        f.deliver(Self.answer(signed, attributes))
        guard case .allocated(op, let a)? = f.events().first else {
            Issue.record("not allocated")
            return
        }
        #expect(a.relayed == Self.relayed && a.mapped == nil)
    }

    @Test func unauthorisedAfterCredentialsIsAuthenticationFailure() throws {
        var f = try Fixture { $0.password = "wrong" }
        let op = try f.client.allocate(now: .zero)
        f.deliver(Self.challenge(try f.request()))
        let signed = try f.request()
        #expect(signed.checkMessageIntegrity(key: try Self.key()) == .invalid)
        f.deliver(Self.challenge(signed, nonce: "nonce-2"))
        let events = f.events()
        guard case .failed(op, .authenticationFailed(let why))? = events.first else {
            Issue.record("\(events)")
            return
        }
        #expect(why.contains("401"))
        #expect(try f.sent().isEmpty)
        #expect(f.client.phase == .idle)
    }

    @Test func expectedRealmMustMatch() throws {
        var f = try Fixture { $0.realm = "other.example" }
        let op = try f.client.allocate(now: .zero)
        f.deliver(Self.challenge(try f.request()))
        #expect(
            f.events() == [.failed(op, .authenticationFailed("the server's realm is 'example.org', expected 'other.example'"))])
    }

    @Test func staleNonceIsRetriedWithTheNewNonce() throws {
        var f = try Fixture()
        _ = try f.allocate()
        let op = try f.client.createPermission(for: [Self.peer.ip], now: f.now)
        let first = try f.request()
        #expect(try first.value(.nonce) == .nonce("nonce-1"))
        f.deliver(Self.challenge(first, code: 438, nonce: "nonce-2"))
        let second = try f.request()
        #expect(second.transactionID != first.transactionID)
        #expect(try second.value(.nonce) == .nonce("nonce-2"))
        #expect(try second.value(.xorPeerAddress) == .xorPeerAddress(TransportAddress(ip: Self.peer.ip, port: 0)))
        #expect(second.checkMessageIntegrity(key: try Self.key()) == .valid)
        f.deliver(Self.answer(second, []))
        #expect(f.events() == [.permissionsCreated(op, [Self.peer.ip])])
        #expect(f.client.hasPermission(for: Self.peer.ip))
        // Later requests carry the new nonce.
        _ = try f.client.bindChannel(to: Self.peer, now: f.now)
        #expect(try f.request().value(.nonce) == .nonce("nonce-2"))
    }

    @Test func staleNoncesInARowGiveUp() throws {
        var f = try Fixture()
        _ = try f.allocate()
        let op = try f.client.createPermission(for: [Self.peer.ip], now: f.now)
        for n in 0..<3 {
            f.deliver(Self.challenge(try f.request(), code: 438, nonce: "stale-\(n)"))
        }
        f.deliver(Self.challenge(try f.request(), code: 438, nonce: "stale-3"))
        #expect(f.events() == [.failed(op, .authenticationFailed("4 stale nonces in a row"))])
        #expect(try f.sent().isEmpty)
    }

    @Test func sha256PasswordAlgorithmWhenTheNonceCookieOffersIt() throws {
        var f = try Fixture()
        let op = try f.client.allocate(now: .zero)
        let offer: [PasswordAlgorithm] = [.sha256, .md5]
        // "gAAA": the first of the 24 feature bits, password algorithms.
        f.deliver(Self.challenge(try f.request(), nonce: "obMatJos2gAAAxyz", extra: [.passwordAlgorithms(offer)]))
        let signed = try f.request()
        #expect(try signed.value(.passwordAlgorithms) == .passwordAlgorithms(offer))
        #expect(try signed.value(.passwordAlgorithm) == .passwordAlgorithm(.sha256))
        let key = try Self.key(algorithm: .sha256)
        #expect(signed.checkMessageIntegrity(key: key) == .valid)
        #expect(signed.checkMessageIntegritySHA256(key: key) == .valid)
        // An MD5-keyed answer is not believed; a SHA-256 one is.
        f.deliver(Self.answer(signed, [.xorRelayedAddress(Self.relayed), .lifetime(600)], key: try Self.key()))
        #expect(f.client.ignoredResponses == 1)
        f.deliver(Self.answer(signed, [.xorRelayedAddress(Self.relayed), .lifetime(600)], key: key, sha256: true))
        guard case .allocated(op, _)? = f.events().first else {
            Issue.record("not allocated")
            return
        }
    }

    @Test func passwordAlgorithmsWithoutTheCookieMeanMD5() throws {
        var f = try Fixture()
        _ = try f.client.allocate(now: .zero)
        f.deliver(Self.challenge(try f.request(), nonce: "plain-nonce", extra: [.passwordAlgorithms([.sha256, .md5])]))
        let signed = try f.request()
        #expect(signed.attribute(.passwordAlgorithm) == nil && signed.attribute(.passwordAlgorithms) == nil)
        #expect(signed.checkMessageIntegrity(key: try Self.key()) == .valid)
    }

    @Test func aStrippedAlgorithmOfferIsADowngrade() throws {
        var f = try Fixture()
        let op = try f.client.allocate(now: .zero)
        // The cookie announces algorithms (erratum 6290 bit order: "AAAB"), the list is gone.
        f.deliver(Self.challenge(try f.request(), nonce: "obMatJos2AAABxyz"))
        guard case .failed(op, .authenticationFailed(let why))? = f.events().first else {
            Issue.record("not refused")
            return
        }
        #expect(why.contains("offers none"))
        #expect(TURNClientAuth.offersPasswordAlgorithms("obMatJos2gAAA"))
        #expect(TURNClientAuth.offersPasswordAlgorithms("obMatJos2AAAB"))
        #expect(!TURNClientAuth.offersPasswordAlgorithms("obMatJos2QAAA"))  // username anonymity only
        #expect(!TURNClientAuth.offersPasswordAlgorithms("obMatJos2g*AA"))
        #expect(!TURNClientAuth.offersPasswordAlgorithms("obMatJos2"))
    }

    @Test func errorResponsesAreTyped() throws {
        var f = try Fixture()
        var op = try f.client.allocate(now: .zero)
        f.deliver(Self.challenge(try f.request()))
        f.deliver(Self.error(try f.request(), 486))
        #expect(f.events() == [.failed(op, .quotaReached)])
        #expect(f.client.phase == .idle)
        op = try f.client.allocate(now: .zero)
        f.deliver(Self.error(try f.request(), 437))  // credentials known now: signed at once
        #expect(f.events() == [.failed(op, .allocationMismatch(.allocate))])
        op = try f.client.allocate(now: .zero)
        f.deliver(Self.error(try f.request(), 508))
        #expect(
            f.events() == [.failed(op, .errorResponse(.allocate, ErrorCodeValue(code: 508, reason: "Insufficient Capacity")))])
        #expect(throws: TURNClientError.notAllocated) { _ = try f.client.createPermission(for: [Self.peer.ip], now: .zero) }
        #expect(throws: TURNClientError.notAllocated) { _ = try f.client.wrap([1], for: Self.peer) }
    }

    @Test func credentialsAreValidated() {
        #expect(throws: TURNClientError.self) { _ = try TURNClient(configuration: .init(username: "", password: "x")) }
        #expect(throws: TURNClientError.self) { _ = try TURNClient(configuration: .init(username: "a", password: "\u{1}")) }
        #expect(throws: TURNClientError.self) {
            _ = try TURNClient(configuration: .init(username: String(repeating: "a", count: 509), password: "x"))
        }
        #expect(throws: TURNClientError.self) {
            _ = try TURNClient(configuration: .init(username: "a", password: "b", lifetime: 0))
        }
    }

    // MARK: timers

    @Test func retransmissionScheduleThenTimeout() throws {
        var f = try Fixture()
        let op = try f.client.allocate(now: .zero)
        let first = try f.request()
        var sentAt: [Double] = [0]
        var failedAt: Double?
        while let wake = f.client.nextDeadline, wake < Self.at(60) {
            f.advance(to: wake)
            let t = Double(wake.nanoseconds) / 1e9
            for m in try f.sent() {
                #expect(m.transactionID == first.transactionID)
                sentAt.append(t)
            }
            let events = f.events()
            if !events.isEmpty {
                #expect(events == [.failed(op, .timeout(.allocate))])
                failedAt = t
            }
        }
        #expect(sentAt == [0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5])
        #expect(failedAt == 39.5)
        #expect(f.client.phase == .idle)
        #expect(f.client.nextDeadline == nil)
    }

    @Test func reliableTransportSendsOnceAndTimesOut() throws {
        var f = try Fixture { $0.reliability = .reliable() }
        let op = try f.client.allocate(now: .zero)
        _ = try f.request()
        #expect(f.client.nextDeadline == Self.at(39.5))
        f.advance(to: Self.at(20))
        #expect(try f.sent().isEmpty)
        f.advance(to: Self.at(39.5))
        #expect(try f.sent().isEmpty)
        #expect(f.events() == [.failed(op, .timeout(.allocate))])
    }

    @Test func allocationIsRefreshedAMinuteBeforeItEnds() throws {
        var f = try Fixture()
        _ = try f.allocate(lifetime: 600)
        #expect(f.client.nextDeadline == Self.at(540))
        f.advance(to: Self.at(539))
        #expect(try f.sent().isEmpty)
        f.advance(to: Self.at(540))
        let refresh = try f.request()
        #expect(refresh.type == MessageType(method: .refresh, class: .request))
        #expect(try refresh.value(.lifetime) == .lifetime(600))
        #expect(refresh.checkMessageIntegrity(key: try Self.key()) == .valid)
        f.deliver(Self.answer(refresh, [.lifetime(300)]))
        #expect(f.events() == [.refreshed(lifetime: .seconds(300), expiresAt: Self.at(840))])
        #expect(f.client.allocation?.expiresAt == Self.at(840))
        #expect(f.client.nextDeadline == Self.at(780))
    }

    @Test func aRefreshAskedForConfirmsTheAllocationAndMovesItsRefresh() throws {
        var f = try Fixture()
        let allocation = try f.allocate(lifetime: 600)
        f.advance(to: Self.at(100))
        let op = try f.client.refresh(now: f.now)
        let refresh = try f.request()
        #expect(refresh.type == MessageType(method: .refresh, class: .request))
        #expect(refresh.checkMessageIntegrity(key: try Self.key()) == .valid)
        f.deliver(Self.answer(refresh, [.lifetime(600)]))
        var confirmed = allocation
        confirmed.expiresAt = Self.at(700)
        #expect(f.events() == [.refreshed(lifetime: .seconds(600), expiresAt: Self.at(700)), .confirmed(op, confirmed)])
        #expect(f.client.nextDeadline == Self.at(640))
    }

    @Test func aRefreshAskedForAnswered437FailsAndLosesTheAllocation() throws {
        var f = try Fixture()
        _ = try f.allocate()
        let op = try f.client.refresh(now: f.now)
        f.deliver(Self.error(try f.request(), 437))
        #expect(f.events() == [.failed(op, .allocationMismatch(.refresh)), .allocationLost(.allocationMismatch(.refresh))])
        #expect(f.client.phase == .closed)
        #expect(throws: TURNClientError.closed) { _ = try f.client.refresh(now: f.now) }
    }

    @Test func aRefreshAskedForThatTimesOutFailsButTheAllocationLastsItsTime() throws {
        var f = try Fixture()
        _ = try f.allocate(lifetime: 600)
        let op = try f.client.refresh(now: f.now)
        let refresh = try f.request()
        var events: [TURNClient.Event] = []
        var retried: Message?
        while let wake = f.client.nextDeadline, wake < Self.at(60), events.isEmpty {
            f.advance(to: wake)
            events = f.events()
            for m in try f.sent() where m.transactionID != refresh.transactionID { retried = m }
        }
        #expect(events == [.failed(op, .timeout(.refresh))])
        #expect(f.client.phase == .allocated, "the server may still hold it: kept while it lasts")
        #expect(retried?.type.method == .refresh, "and refreshed again on the client's own")
    }

    @Test func aRefreshAskedForAnsweredWithLifetimeZeroFailsAndLosesTheAllocation() throws {
        var f = try Fixture()
        _ = try f.allocate()
        let op = try f.client.refresh(now: f.now)
        f.deliver(Self.answer(try f.request(), [.lifetime(0)]))
        let bad = TURNClientError.badResponse("Refresh success with LIFETIME 0")
        #expect(f.events() == [.failed(op, bad), .allocationLost(bad)])
    }

    @Test func noRefreshWithoutAnAllocation() throws {
        var f = try Fixture()
        #expect(throws: TURNClientError.notAllocated) { _ = try f.client.refresh(now: f.now) }
    }

    @Test func shortLifetimesAreRefreshedHalfway() throws {
        var f = try Fixture()
        _ = try f.allocate(lifetime: 100)
        #expect(f.client.nextDeadline == Self.at(50))
        #expect(TURNClient.refreshDelay(lifetime: .seconds(120)) == .seconds(60))
        #expect(TURNClient.refreshDelay(lifetime: .seconds(3600)) == .seconds(3540))
    }

    @Test func anUnansweredRefreshIsRetriedThenTheAllocationIsLost() throws {
        var f = try Fixture()
        _ = try f.allocate(lifetime: 100)
        f.advance(to: Self.at(50))
        let refresh = try f.request()
        // Retransmissions until 89.5 s, then a second Refresh while the allocation lasts.
        var retried: Message?
        while let wake = f.client.nextDeadline, wake < Self.at(100) {
            f.advance(to: wake)
            for m in try f.sent() where m.transactionID != refresh.transactionID { retried = m }
        }
        #expect(retried?.type.method == .refresh)
        #expect(f.events().isEmpty)
        f.advance(to: Self.at(100))
        #expect(f.events() == [.allocationLost(.timeout(.refresh))])
        #expect(f.client.phase == .closed)
        #expect(throws: TURNClientError.notAllocated) { _ = try f.client.wrap([1], for: Self.peer) }
    }

    @Test func a437ToRefreshLosesTheAllocation() throws {
        var f = try Fixture()
        _ = try f.allocate()
        let op = try f.client.createPermission(for: [Self.peer.ip], now: f.now)
        let permission = try f.request()
        f.advance(to: Self.at(540))
        let refresh = try f.sent().first { $0.type.method == .refresh }
        f.deliver(Self.error(try #require(refresh), 437))
        #expect(f.events() == [.failed(op, .notAllocated), .allocationLost(.allocationMismatch(.refresh))])
        // A late answer to the permission changes nothing.
        f.deliver(Self.answer(permission, []))
        #expect(f.events().isEmpty)
    }

    @Test func permissionsAndChannelsAreRefreshed() throws {
        var f = try Fixture()
        _ = try f.allocate(lifetime: 3600)
        let p = try f.client.createPermission(for: [Self.peer.ip, Self.otherPeer.ip, Self.peer.ip], now: f.now)
        let create = try f.request()
        let peers = create.attributes.filter { $0.type == .xorPeerAddress }
        #expect(peers.count == 2)
        f.deliver(Self.answer(create, []))
        #expect(f.events() == [.permissionsCreated(p, [Self.peer.ip, Self.otherPeer.ip])])

        f.now = Self.at(10)
        let c = try f.client.bindChannel(to: Self.peer, now: f.now)
        let bind = try f.request()
        #expect(try bind.value(.channelNumber) == .channelNumber(0x4000))
        #expect(try bind.value(.xorPeerAddress) == .xorPeerAddress(Self.peer))
        f.deliver(Self.answer(bind, []))
        #expect(f.events() == [.channelBound(c, ChannelNumber(rawValue: 0x4000)!, peer: Self.peer)])

        // 240 s after creation the other peer's permission; the peer's was
        // renewed by the ChannelBind at 10 s, so its turn comes at 250 s.
        #expect(f.client.nextDeadline == Self.at(240))
        f.advance(to: Self.at(240))
        let refreshOther = try f.request()
        #expect(refreshOther.type.method == .createPermission)
        #expect(try refreshOther.value(.xorPeerAddress) == .xorPeerAddress(TransportAddress(ip: Self.otherPeer.ip, port: 0)))
        f.deliver(Self.answer(refreshOther, []))
        f.advance(to: Self.at(250))
        let refreshPeer = try f.request()
        #expect(try refreshPeer.value(.xorPeerAddress) == .xorPeerAddress(TransportAddress(ip: Self.peer.ip, port: 0)))
        f.deliver(Self.answer(refreshPeer, []))
        #expect(f.events().isEmpty)  // refreshes of the client's own make no events
        // The channel at 10 + 480 s, with the same number.
        f.advance(to: Self.at(480))
        let refreshes = try f.sent()
        #expect(refreshes.map(\.type.method) == [.createPermission])  // the other peer's, 240 s after 240
        f.deliver(Self.answer(refreshes[0], []))
        f.advance(to: Self.at(490))
        let rebind = try f.sent()
        #expect(rebind.map(\.type.method) == [.createPermission, .channelBind])
        #expect(try rebind[1].value(.channelNumber) == .channelNumber(0x4000))
        #expect(f.client.channel(for: Self.peer)?.rawValue == 0x4000)
    }

    @Test func aFailedPermissionRefreshIsReported() throws {
        var f = try Fixture()
        _ = try f.allocate(lifetime: 3600)
        _ = try f.client.createPermission(for: [Self.peer.ip], now: f.now)
        f.deliver(Self.answer(try f.request(), []))
        _ = f.events()
        f.advance(to: Self.at(240))
        f.deliver(Self.error(try f.request(), 403))
        #expect(
            f.events() == [
                .permissionLost(Self.peer.ip, .errorResponse(.createPermission, ErrorCodeValue(code: 403, reason: "Forbidden")))
            ])
        #expect(throws: TURNClientError.noPermission(Self.peer.ip)) { _ = try f.client.wrap([1], for: Self.peer) }
    }

    // MARK: data

    @Test func sendIndicationUntilTheChannelIsBoundThenChannelData() throws {
        var f = try Fixture()
        _ = try f.allocate()
        #expect(throws: TURNClientError.noPermission(Self.peer.ip)) { _ = try f.client.wrap([1, 2, 3], for: Self.peer) }
        _ = try f.client.bindChannel(to: Self.peer, now: f.now)
        let bind = try f.request()
        // Pending: a Send indication.
        let indication = try Message(decoding: f.client.wrap([1, 2, 3], for: Self.peer))
        #expect(indication.type == MessageType(method: .send, class: .indication))
        #expect(try indication.value(.xorPeerAddress) == .xorPeerAddress(Self.peer))
        #expect(try indication.value(.data) == .data([1, 2, 3]))
        #expect(indication.attribute(.messageIntegrity) == nil)
        #expect(indication.checkFingerprint() == .valid)
        f.deliver(Self.answer(bind, []))
        #expect(try f.client.wrap([1, 2, 3], for: Self.peer) == [0x40, 0x00, 0x00, 0x03, 1, 2, 3])
        // Another port on the same IP has the permission but not the channel.
        let other = TransportAddress(ip: Self.peer.ip, port: 1)
        #expect(try Message(decoding: f.client.wrap([9], for: other)).type.method == .send)
    }

    @Test func channelDataIsPaddedOnStreams() throws {
        var f = try Fixture { $0.reliability = .reliable() }
        _ = try f.allocate()
        _ = try f.client.bindChannel(to: Self.peer, now: f.now)
        f.deliver(Self.answer(try f.request(), []))
        #expect(try f.client.wrap([1, 2, 3, 4, 5], for: Self.peer) == [0x40, 0x00, 0x00, 0x05, 1, 2, 3, 4, 5, 0, 0, 0])
    }

    @Test func dataIndicationsAndChannelDataAreUnwrapped() throws {
        var f = try Fixture()
        _ = try f.allocate()
        _ = try f.client.createPermission(for: [Self.peer.ip], now: f.now)
        f.deliver(Self.answer(try f.request(), []))
        let data = Message(
            type: MessageType(method: .data, class: .indication),
            attributes: [
                .xorPeerAddress(Self.peer), .data([7, 8, 9]),
            ]
        ).encode(fingerprint: true)
        #expect(f.deliver(data) == TURNClient.Datagram(peer: Self.peer, payload: [7, 8, 9]))
        // From an address without a permission, or without DATA: dropped.
        let stranger = Message(
            type: MessageType(method: .data, class: .indication),
            attributes: [
                .xorPeerAddress(Self.otherPeer), .data([1]),
            ]
        ).encode()
        #expect(f.deliver(stranger) == nil)
        let empty = Message(type: MessageType(method: .data, class: .indication), attributes: [.xorPeerAddress(Self.peer)])
            .encode()
        #expect(f.deliver(empty) == nil)
        // ChannelData on a bound channel, padded or not; unknown channels and garbage dropped.
        _ = try f.client.bindChannel(to: Self.peer, now: f.now)
        f.deliver(Self.answer(try f.request(), []))
        #expect(
            f.deliver([0x40, 0x00, 0x00, 0x02, 5, 6]) == TURNClient.Datagram(peer: Self.peer, payload: [5, 6], channel: 0x4000))
        #expect(f.deliver([0x40, 0x00, 0x00, 0x02, 5, 6, 0, 0])?.payload == [5, 6])
        #expect(f.deliver([0x40, 0x01, 0x00, 0x01, 5]) == nil)
        #expect(f.deliver([0x40, 0x00, 0x00, 0x09, 5]) == nil)
        #expect(f.deliver([0x80, 0x00, 0x00, 0x00]) == nil)
        #expect(f.deliver([]) == nil)
    }

    /// The SansIOCore contract: an input through `handle`, everything it leads to out of
    /// `pollAction()` in order — the answer's event, then the peer's data.
    @Test func handleAndPollActionCarryResponsesAndData() throws {
        var f = try Fixture()
        _ = try f.allocate()
        let op = try f.client.createPermission(for: [Self.peer.ip], now: f.now)
        let request = try f.request()
        f.client.handle(.received(Self.answer(request, [])), now: f.now)
        let data = Message(
            type: MessageType(method: .data, class: .indication),
            attributes: [
                .xorPeerAddress(Self.peer), .data([7, 8, 9]),
            ]
        ).encode(fingerprint: true)
        f.client.handle(.received(data), now: f.now)
        f.client.handle(.received([0x80, 0, 0, 0]), now: f.now)  // not for the client: nothing
        #expect(
            f.client.drainActions() == [
                .event(.permissionsCreated(op, [Self.peer.ip])),
                .deliver(TURNClient.Datagram(peer: Self.peer, payload: [7, 8, 9])),
            ])
        #expect(f.client.pollAction() == nil)
        // A timeout's retransmission comes out the same way.
        _ = try f.client.bindChannel(to: Self.peer, now: f.now)
        guard case .transmit(let first)? = f.client.pollAction() else {
            Issue.record("ChannelBind not sent")
            return
        }
        let deadline = try #require(f.client.nextDeadline)
        f.client.handleTimeout(now: deadline)
        #expect(f.client.drainActions() == [.transmit(first)])
    }

    @Test func channelNumbersAreNotReused() throws {
        var f = try Fixture()
        _ = try f.allocate()
        _ = try f.client.bindChannel(to: Self.peer, now: f.now)
        let first = try f.request()
        f.deliver(Self.error(first, 400))
        _ = f.events()
        _ = try f.client.bindChannel(to: Self.peer, now: f.now)
        #expect(try f.request().value(.channelNumber) == .channelNumber(0x4001))
    }

    // MARK: deallocation

    @Test func deallocateSendsRefreshWithLifetimeZero() throws {
        var f = try Fixture()
        _ = try f.allocate()
        let p = try f.client.createPermission(for: [Self.peer.ip], now: f.now)
        _ = try f.request()
        let op = f.client.deallocate(now: f.now)
        let refresh = try f.request()
        #expect(refresh.type == MessageType(method: .refresh, class: .request))
        #expect(try refresh.value(.lifetime) == .lifetime(0))
        #expect(refresh.checkMessageIntegrity(key: try Self.key()) == .valid)
        #expect(f.client.phase == .deallocating)
        f.deliver(Self.answer(refresh, [.lifetime(0)]))
        #expect(f.events() == [.failed(p, .closed), .deallocated(op)])
        #expect(f.client.phase == .closed)
        #expect(f.client.nextDeadline == nil)
        #expect(throws: TURNClientError.closed) { _ = try f.client.allocate(now: f.now) }
    }

    @Test func deallocationOfAnAllocationTheServerForgotSucceeds() throws {
        var f = try Fixture()
        _ = try f.allocate()
        let op = f.client.deallocate(now: f.now)
        f.deliver(Self.error(try f.request(), 437))
        #expect(f.events() == [.deallocated(op)])
    }

    @Test func deallocationTimesOut() throws {
        var f = try Fixture { $0.reliability = .reliable(timeout: .seconds(2)) }
        _ = try f.allocate()
        let op = f.client.deallocate(now: f.now)
        _ = try f.request()
        f.advance(to: Self.at(2))
        #expect(f.events() == [.failed(op, .timeout(.refresh))])
        #expect(f.client.phase == .closed)
    }

    @Test func deallocateWithoutAnAllocationIsImmediate() throws {
        var f = try Fixture()
        let a = try f.client.allocate(now: .zero)
        _ = try f.request()
        let op = f.client.deallocate(now: .zero)
        #expect(try f.sent().isEmpty)
        #expect(f.events() == [.failed(a, .closed), .deallocated(op)])
    }

    // MARK: hostile input

    @Test func theFuzzFixtureBuildsAndCorruptedAnswersNeverTrap() throws {
        let fixture = try #require(TURNFuzzChecks.turnFixture)
        #expect(fixture.client.phase == .allocated)
        // A challenge with every attribute the client parses, as an answer to
        // the waiting request, corrupted at every byte (FuzzChecks patches the
        // transaction ID in).
        let challenge = Message(
            type: MessageType(method: .createPermission, class: .errorResponse), transactionID: fixture.pending,
            attributes: [
                .errorCode(ErrorCodeValue(code: 438, reason: "Stale Nonce")), .realm("fuzz"), .nonce("obMatJos2gAAAnonce"),
                .passwordAlgorithms([.sha256, .md5]), .unknownAttributes([.dontFragment]),
            ]
        ).encode(fingerprint: true)
        let data = Message(
            type: MessageType(method: .data, class: .indication),
            attributes: [
                .xorPeerAddress(fixture.peer), .data([1, 2, 3]),
            ]
        ).encode(fingerprint: true)
        for original in [challenge, data, ChannelData(channel: 0x4000, data: [1, 2, 3]).encode(padded: true)] {
            TURNFuzzChecks.exerciseTURNClient(original)
            for i in original.indices {
                var bad = original
                bad[i] ^= 0x5A
                TURNFuzzChecks.exerciseTURNClient(bad)
                TURNFuzzChecks.exerciseTURNClient(Array(original.prefix(i)))
            }
        }
        // The unmodified stale-nonce answer is taken: the request goes again with the new nonce.
        var client = fixture.client
        _ = client.receive(challenge, now: .zero)
        let sent = client.pollTransmit()
        let retry = try Message(decoding: try #require(sent))
        #expect(try retry.value(.nonce) == .nonce("obMatJos2gAAAnonce"))
        #expect(try retry.value(.passwordAlgorithm) == .passwordAlgorithm(.sha256))
    }
}
