import STUN
import Secure
import TURN
import Testing
import TusaBase

@testable import Rendezvous

/// The rendezvous cores on a virtual clock: a server and clients wired by hand.
struct Net {
    var server: RendezvousServer
    var now = Timestamp.seconds(1000)
    var unix: UInt64 = 1_800_000_000
    /// What the server sent each connection, unframed, and which connections it closed.
    var inbox: [ConnectionID: [UInt8]] = [:]
    var closed: Set<ConnectionID> = []
    /// What the server asked to be written down, in order; and, per record, the
    /// actions that came after it in the same batch (which wait for it).
    var records: [RendezvousRecord] = []
    var afterRecords: [RendezvousAction] = []

    init(_ configuration: RendezvousServerConfiguration = .init()) { server = RendezvousServer(configuration: configuration) }

    /// Feeds the server one input and applies what it does.
    mutating func feed(_ input: RendezvousServer.Input) {
        server.handle(input, now: now)
        apply(server.drainActions())
    }

    mutating func tick() {
        server.handleTimeout(now: now)
        apply(server.drainActions())
    }

    mutating func apply(_ actions: [RendezvousAction]) {
        var recorded = false
        for a in actions {
            switch a {
            case .send(let id, let bytes): inbox[id, default: []] += bytes
            case .close(let id): closed.insert(id)
            case .record(let r):
                records.append(r)
                recorded = true
                continue
            }
            if recorded { afterRecords.append(a) }
        }
    }
    mutating func take(_ id: ConnectionID) -> [UInt8] {
        defer { inbox[id] = [] }
        return inbox[id] ?? []
    }

    /// Client `client` on connection `id`: exchanges until quiet, returns the client's events.
    mutating func pump(_ id: ConnectionID, _ client: inout RendezvousClient) throws -> [RendezvousClient.Event] {
        var events: [RendezvousClient.Event] = []
        for _ in 0..<10 {
            let bytes = take(id)
            if !bytes.isEmpty { client.handle(.received(bytes), now: now) }
            var wrote = false
            for action in client.drainActions() {
                switch action {
                case .write(let reply):
                    feed(.received(id, reply, unixSeconds: unix))
                    wrote = true
                case .event(let e): events.append(e)
                case .failed(let error): throw error
                }
            }
            if bytes.isEmpty && !wrote { break }
        }
        return events
    }

    mutating func connect(_ id: ConnectionID, _ client: inout RendezvousClient) throws -> [RendezvousClient.Event] {
        feed(.accepted(id))
        return try pump(id, &client)
    }

    mutating func request(_ id: ConnectionID, _ bytes: [UInt8], _ client: inout RendezvousClient) throws -> [RendezvousClient
        .Event]
    {
        feed(.received(id, bytes, unixSeconds: unix))
        return try pump(id, &client)
    }

    /// Decoded messages sent to a connection that has no client core (raw tests).
    mutating func messages(_ id: ConnectionID) throws -> [RendezvousMessage] {
        var framer = RendezvousFrame()
        return try framer.append(take(id)).map { try RendezvousMessage(decoding: $0) }
    }
}

extension RendezvousClient {
    /// A lookup and the frame it writes (the frame goes to the server through `Net.request`).
    mutating func lookup(_ key: PublicKey) -> (UInt32, [UInt8]) {
        let id = lookup(key, now: .zero)
        return (id, takeWrites())
    }

    /// A sealed send and the frame it writes.
    mutating func send(_ payload: [UInt8], to peer: PublicKey) throws -> (UInt32, [UInt8]) {
        let id = try send(payload, to: peer, now: .zero)
        return (id, takeWrites())
    }

    /// A sealed post (kept for later delivery) and the frame it writes.
    mutating func post(_ payload: [UInt8], to peer: PublicKey) throws -> (UInt32, [UInt8]) {
        let id = try post(payload, to: peer, now: .zero)
        return (id, takeWrites())
    }

    func ping() -> [UInt8] { RendezvousFrame.frame(.ping) }

    /// What the client wrote since the last drain (a request writes nothing else).
    mutating func takeWrites() -> [UInt8] {
        var out: [UInt8] = []
        for action in drainActions() {
            if case .write(let bytes) = action { out += bytes } else { Issue.record("unexpected \(action)") }
        }
        return out
    }
}

@Suite("Rendezvous core") struct RendezvousCoreTests {
    let alice = PrivateKey.generate(), bob = PrivateKey.generate()
    let a = ConnectionID(1), b = ConnectionID(2), c = ConnectionID(3)

    /// A relayed call refreshes its allocation with the credentials it started
    /// with: by default they outlive a call of many hours and a clock stepped by one.
    @Test func grantsOutliveLongCallsByDefault() {
        let grant = TURNIssuer(secret: "s3cret", uris: []).grant(for: alice.publicKey, unixSeconds: 1_700_000_000)
        #expect(grant.expiry >= 1_700_000_000 + 24 * 3600)
    }

    @Test func registerLookupAndSealedDeliveryBothWays() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.turn = TURNIssuer(secret: "s3cret", lifetime: .seconds(600), uris: ["turn:127.0.0.1:3478?transport=udp"])
        var net = Net(configuration)
        var ca = RendezvousClient(identity: alice)
        var cb = RendezvousClient(identity: bob)
        let ea = try net.connect(a, &ca)
        guard case .registered(let grant?, _) = ea.first else {
            Issue.record("\(ea)")
            return
        }
        #expect(ca.isRegistered)
        // The relay's REST-API check accepts what the rendezvous issued.
        #expect(grant.expiry == net.unix + 600)
        #expect(RESTCredentials.password(secret: "s3cret", username: grant.username) == grant.password)
        #expect(!grant.username.contains(alice.publicKey.base64))
        _ = try net.connect(b, &cb)

        let (lookupID, lookup) = ca.lookup(bob.publicKey)
        #expect(try net.request(a, lookup, &ca) == [.lookup(id: lookupID, key: bob.publicKey, online: true)])

        let offer = Array("offer: candidates and codec".utf8)
        let (sendID, send) = try ca.send(offer, to: bob.publicKey)
        #expect(try net.request(a, send, &ca) == [.sent(id: sendID)])
        #expect(try net.pump(b, &cb) == [.received(from: alice.publicKey, payload: offer)])
        let answer = Array("answer".utf8)
        let (_, back) = try cb.send(answer, to: alice.publicKey)
        _ = try net.request(b, back, &cb)
        #expect(try net.pump(a, &ca) == [.received(from: bob.publicKey, payload: answer)])
        #expect(net.server.statistics.delivered == 2)
        #expect(net.closed.isEmpty)
    }

    @Test func theServerCannotReadOrForgeWhatPeersSeal() throws {
        let offer = Array("secret offer".utf8)
        let sealed = try Sealing.seal(offer, from: alice, to: bob.publicKey)
        #expect(!sealed.windowContainsSubsequence(offer))
        #expect(try Sealing.open(sealed, from: alice.publicKey, to: bob) == offer)
        // A server claiming another sender, a third party, or a flipped bit: nothing opens.
        let mallory = PrivateKey.generate()
        #expect(throws: RendezvousError.unsealable) { try Sealing.open(sealed, from: mallory.publicKey, to: bob) }
        #expect(throws: RendezvousError.unsealable) { try Sealing.open(sealed, from: alice.publicKey, to: mallory) }
        for i in stride(from: 0, to: sealed.count, by: 7) {
            var t = sealed
            t[i] ^= 0x40
            #expect(throws: RendezvousError.unsealable) { try Sealing.open(t, from: alice.publicKey, to: bob) }
        }
        #expect(throws: RendezvousError.unsealable) { try Sealing.open(Array(sealed.prefix(40)), from: alice.publicKey, to: bob) }
    }

    @Test func aWrongProofIsRefusedAndClosed() throws {
        var net = Net()
        net.feed(.accepted(a))
        guard case .hello(let challenge, let serverKey) = try net.messages(a).first else {
            Issue.record("no hello")
            return
        }
        // Proof made with another private key for alice's public key.
        let proof = try RegistrationProof.make(identity: bob, serverKey: serverKey, challenge: challenge)
        net.feed(.received(a, RendezvousFrame.frame(.register(key: alice.publicKey, proof: proof)), unixSeconds: net.unix))
        #expect(
            try net.messages(a).first == .error(code: .badProof, detail: "the proof does not match \(alice.publicKey)", id: nil))
        #expect(net.closed.contains(a))
        #expect(!net.server.isOnline(alice.publicKey))
        #expect(net.server.statistics.connections == 0)
    }

    @Test func offlineAndUnknownCalleesAreToldApart() throws {
        var net = Net()
        var ca = RendezvousClient(identity: alice)
        var cb = RendezvousClient(identity: bob)
        _ = try net.connect(a, &ca)
        let stranger = PrivateKey.generate().publicKey
        let (id1, s1) = try ca.send([1, 2, 3], to: stranger)
        guard case .refused(.unknownPeer, _, id1)? = try net.request(a, s1, &ca).first else {
            Issue.record("not unknownPeer")
            return
        }
        _ = try net.connect(b, &cb)
        net.feed(.closed(b))  // bob hangs up his connection
        let (id2, s2) = try ca.send([1, 2, 3], to: bob.publicKey)
        guard case .refused(.offline, _, id2)? = try net.request(a, s2, &ca).first else {
            Issue.record("not offline")
            return
        }
        let (id3, l) = ca.lookup(bob.publicKey)
        #expect(try net.request(a, l, &ca) == [.lookup(id: id3, key: bob.publicKey, online: false)])
        // Forgotten after rememberFor.
        net.now = net.now + .seconds(24 * 3600 + 1)
        net.tick()  // also closes alice's silent connection
        #expect(net.closed.contains(a))
        var later = RendezvousClient(identity: alice)
        _ = try net.connect(ConnectionID(3), &later)
        let (id4, s4) = try later.send([1], to: bob.publicKey)
        guard case .refused(.unknownPeer, _, id4)? = try net.request(ConnectionID(3), s4, &later).first else {
            Issue.record("not forgotten")
            return
        }
    }

    @Test func postsAreKeptForADayAndDeliveredAtEachRegistration() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.mailboxPerKey = 2
        configuration.party = PartyGrant(address: "127.0.0.1:3481", key: alice.publicKey.base64)
        var net = Net(configuration)
        var ca = RendezvousClient(identity: alice)
        let registered = try net.connect(a, &ca)
        #expect(registered.first == .registered(nil, party: configuration.party))
        // Bob has never been here: the invitations wait for him (two at most: the oldest goes).
        for n: UInt8 in 1...3 {
            let (id, frame) = try ca.post([n], to: bob.publicKey)
            #expect(try net.request(a, frame, &ca) == [.sent(id: id)])
        }
        #expect(net.server.statistics.posted == 2)
        var cb = RendezvousClient(identity: bob)
        var heard = try net.connect(b, &cb).compactMap { if case .received(let from, let p) = $0 { (from, p) } else { nil } }
        #expect(heard.map(\.1) == [[2], [3]] && heard.allSatisfy { $0.0 == alice.publicKey })
        // Online now: a new post arrives at once, and is kept too.
        let (id, frame) = try ca.post([4], to: bob.publicKey)
        #expect(try net.request(a, frame, &ca) == [.sent(id: id)])
        heard = try net.pump(b, &cb).compactMap { if case .received(let from, let p) = $0 { (from, p) } else { nil } }
        #expect(heard.map(\.1) == [[4]])
        // A day later nothing is left.
        net.now = net.now + .seconds(24 * 3600)
        net.tick()
        #expect(net.server.statistics.posted == 0)
        var again = RendezvousClient(identity: bob)
        let later = try net.connect(ConnectionID(7), &again)
        #expect(!later.contains { if case .received = $0 { true } else { false } })
        // Posting needs a registration first.
        net.feed(.accepted(ConnectionID(8)))
        net.feed(
            .received(ConnectionID(8), RendezvousFrame.frame(.post(id: 1, to: bob.publicKey, sealed: [1])), unixSeconds: net.unix)
        )
        #expect(try net.messages(ConnectionID(8)).contains { if case .error(.notRegistered, _, 1) = $0 { true } else { false } })
    }

    /// Short of memory, the rendezvous keeps nothing new: a post is refused with a
    /// reason (and kept posts are still delivered); sending to an online peer goes on.
    /// A key flooding invitations to strangers: its burst is kept, then each post
    /// is refused (rate-limited, not kept, the connection open for everything
    /// else) until its budget refills; a new connection under the same key starts
    /// from the same budget. Other keys post as before.
    @Test func aFloodOfPostsFromOneKeyIsCutShort() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.postBurst = 5
        configuration.postsPerMinute = 6
        var net = Net(configuration)
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(a, &ca)
        var answers: [RendezvousClient.Event] = []
        for _ in 0..<8 {
            let (_, frame) = try ca.post([1], to: PrivateKey.generate().publicKey)
            answers += try net.request(a, frame, &ca)
        }
        let kept = answers.filter { if case .sent = $0 { true } else { false } }.count
        let refused = answers.filter { if case .refused(.rateLimited, _, _?) = $0 { true } else { false } }.count
        #expect(kept == 5 && refused == 3, "\(answers)")
        #expect(net.server.statistics.posted == 5)
        #expect(!net.closed.contains(a))
        let (lookup, frame) = ca.lookup(bob.publicKey)
        #expect(try net.request(a, frame, &ca) == [.lookup(id: lookup, key: bob.publicKey, online: false)])
        // Alice again on a new connection: still out of posts.
        net.feed(.closed(a))
        var again = RendezvousClient(identity: alice)
        _ = try net.connect(c, &again)
        let (_, more) = try again.post([2], to: bob.publicKey)
        #expect(try net.request(c, more, &again).contains { if case .refused(.rateLimited, _, _) = $0 { true } else { false } })
        // Bob has his own budget; ten seconds later Alice has one post again.
        var cb = RendezvousClient(identity: bob)
        _ = try net.connect(b, &cb)
        let (bobs, post) = try cb.post([3], to: alice.publicKey)
        #expect(try net.request(b, post, &cb) == [.sent(id: bobs)])
        net.now = net.now + .seconds(10)
        let (one, once) = try again.post([4], to: bob.publicKey)
        // (Bob's invitation to her arrives with the answer.)
        let answer = try net.request(c, once, &again)
        #expect(answer == [.received(from: bob.publicKey, payload: [3]), .sent(id: one)], "\(answer)")
        let (_, twice) = try again.post([5], to: bob.publicKey)
        #expect(try net.request(c, twice, &again).contains { if case .refused(.rateLimited, _, _) = $0 { true } else { false } })
    }

    @Test func shortOfMemoryRefusesPostsAndSendsStillGo() throws {
        var net = Net(RendezvousServerConfiguration())
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(a, &ca)
        let (kept, frame) = try ca.post([1], to: bob.publicKey)
        #expect(try net.request(a, frame, &ca) == [.sent(id: kept)])
        net.feed(.memoryShort(true))
        let (refused, again) = try ca.post([2], to: bob.publicKey)
        #expect(
            try net.request(a, again, &ca) == [.refused(code: .full, detail: "the rendezvous is short of memory", id: refused)])
        #expect(net.server.statistics.posted == 1)
        var cb = RendezvousClient(identity: bob)
        let heard = try net.connect(b, &cb).compactMap { if case .received(_, let p) = $0 { p } else { nil } }
        #expect(heard == [[1]])
        let (sent, direct) = try ca.send([3], to: bob.publicKey)
        #expect(try net.request(a, direct, &ca) == [.sent(id: sent)])
        #expect(try net.pump(b, &cb).contains(.received(from: alice.publicKey, payload: [3])))
        net.feed(.memoryShort(false))
        let (accepted, later) = try ca.post([4], to: bob.publicKey)
        #expect(try net.request(a, later, &ca) == [.sent(id: accepted)])
    }

    /// Posts are written down before they are acknowledged, with every drop (a full
    /// box, the day's end); registrations too. A new server given them back delivers
    /// the posts as old as they were, and tells "offline" from "unknown".
    @Test func postsAndRegistrationsAreRecordedAndRestoredAfterARestart() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.mailboxPerKey = 2
        var net = Net(configuration)
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(a, &ca)
        #expect(net.records == [.seen(alice.publicKey, unixSeconds: net.unix)])
        for n: UInt8 in 1...3 {
            let (id, frame) = try ca.post([n], to: bob.publicKey)
            net.afterRecords = []
            #expect(try net.request(a, frame, &ca) == [.sent(id: id)])
            // The acknowledgement comes after the record, in the same batch.
            #expect(net.afterRecords.contains { if case .send(a, _) = $0 { true } else { false } })
        }
        let posts = net.records.compactMap { if case .posted(let p) = $0 { p } else { nil } }
        #expect(posts.count == 3 && Set(posts.map(\.sealed)).count == 3, "three sealed posts")
        #expect(posts.allSatisfy { $0.to == bob.publicKey && $0.from == alice.publicKey && $0.unixSeconds == net.unix })
        #expect(net.records.contains(.dropped([posts[0].id])), "the box holds two: the first went")
        // Alice leaves two hours after she came: that is when she was last here.
        net.now = net.now + .seconds(7200)
        net.feed(.closed(a))
        #expect(net.records.last == .seen(alice.publicKey, unixSeconds: net.unix + 7200))

        // A restart an hour later: the store gives back what is still kept.
        var restarted = Net(configuration)
        restarted.now = .seconds(50)  // a new process: its own clock
        let hourLater = net.unix + 3600
        restarted.feed(
            .restore(
                RendezvousSnapshot(posts: Array(posts[1...]), seen: [alice.publicKey: net.unix]), unixSeconds: hourLater))
        #expect(restarted.server.statistics.posted == 2)
        var cb = RendezvousClient(identity: bob)
        let heard = try restarted.connect(b, &cb).compactMap { if case .received(_, let p) = $0 { p } else { nil } }
        #expect(heard == [[2], [3]])
        // Alice was here: offline, not unknown. A key never seen is unknown.
        let (sent, frame) = try cb.send([9], to: alice.publicKey)
        #expect(
            try restarted.request(b, frame, &cb).contains { if case .refused(.offline, _, sent) = $0 { true } else { false } })
        let stranger = PrivateKey.generate().publicKey
        let (other, unknown) = try cb.send([9], to: stranger)
        #expect(
            try restarted.request(b, unknown, &cb).contains {
                if case .refused(.unknownPeer, _, other) = $0 { true } else { false }
            })
        // New posts are numbered after the restored ones.
        restarted.records = []
        let (id, again) = try cb.post([4], to: alice.publicKey)
        #expect(try restarted.request(b, again, &cb) == [.sent(id: id)])
        let next = restarted.records.compactMap { if case .posted(let p) = $0 { p.id } else { nil } }
        #expect(next.count == 1 && next[0] > posts[2].id)
        // The day ends 23 hours after the restart for the restored posts: dropped, and said so.
        restarted.now = restarted.now + .seconds(23 * 3600)
        restarted.records = []
        restarted.tick()
        #expect(restarted.records.contains(.dropped([posts[1].id, posts[2].id])))
        #expect(restarted.server.statistics.posted == 1)
    }

    /// Relays that report with the directory's secret are where registered peers
    /// are sent (their party relay and TURN URIs); a report without the secret is
    /// refused and closed; a relay whose connection closes is sent no one.
    @Test func peersAreSentToRelaysThatReportWithTheSecret() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.relaySecret = "s3cret"
        configuration.turn = TURNIssuer(secret: "rest", uris: ["turn:fallback:3478"])
        var net = Net(configuration)
        let relayKey = PrivateKey.generate()
        var relay = RendezvousClient(identity: relayKey)
        let r = ConnectionID(30)
        _ = try net.connect(r, &relay)
        let grant = PartyGrant(address: "127.0.0.9:3481", key: relayKey.publicKey.base64)
        let report = RelayLoad(party: grant, turnURIs: ["turn:127.0.0.9:3478"], capacityBitsPerSecond: 100_000_000)
        relay.report(report, secret: "s3cret")
        #expect(try net.pump(r, &relay).isEmpty)
        #expect(net.server.relayRegistry.live(now: net.now).map(\.key) == [relayKey.publicKey])
        var ca = RendezvousClient(identity: alice)
        let registered = try net.connect(a, &ca)
        guard case .registered(let turn?, let party)? = registered.first else {
            Issue.record("\(registered)")
            return
        }
        #expect(party == grant && turn.uris == ["turn:127.0.0.9:3478"])
        // A report changed on the way (a proof good for another report) is refused and closed.
        relay.report(RelayLoad(party: grant, capacityBitsPerSecond: 100_000_000), secret: "s3cret")
        guard case .write(let framed)? = relay.drainActions().first,
            case .load(_, let proof) = try RendezvousMessage(decoding: Array(framed.dropFirst(2)))
        else {
            Issue.record("the relay wrote no report")
            return
        }
        var forged = report
        forged.party = PartyGrant(address: "203.0.113.66:3481", key: grant.key)
        net.feed(.received(r, RendezvousFrame.frame(.load(forged, proof: proof)), unixSeconds: net.unix))
        #expect(net.closed.contains(r))
        #expect(net.server.relayRegistry.live(now: net.now).isEmpty)
        // A relay without the secret: refused, closed, not placed.
        let impostor = PrivateKey.generate()
        var fake = RendezvousClient(identity: impostor)
        let f = ConnectionID(31)
        _ = try net.connect(f, &fake)
        fake.report(report, secret: "guess")
        #expect(try net.pump(f, &fake).contains { if case .refused(.badProof, _, nil) = $0 { true } else { false } })
        #expect(net.closed.contains(f))
        #expect(net.server.relayRegistry.live(now: net.now).isEmpty)
        // With no relay left, peers get the configured grants again.
        var cb = RendezvousClient(identity: bob)
        guard case .registered(let fallback?, nil)? = try net.connect(b, &cb).first else {
            Issue.record("bob was not registered with the fallback grants")
            return
        }
        #expect(fallback.uris == ["turn:fallback:3478"])
    }

    /// Every registered peer's TURN credentials name the least loaded relay that
    /// offers TURN (a 1:1 call's relay), not the random pick its rooms get.
    @Test func callsAreGrantedTheLeastLoadedRelay() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.relaySecret = "s3cret"
        configuration.turn = TURNIssuer(secret: "rest", uris: ["turn:fallback:3478"])
        var net = Net(configuration)
        for (n, bits) in [(0, UInt64(40_000_000)), (1, 10_000_000), (2, 30_000_000)] {
            var relay = RendezvousClient(identity: .generate())
            let id = ConnectionID(UInt64(40 + n))
            _ = try net.connect(id, &relay)
            relay.report(
                RelayLoad(
                    party: PartyGrant(address: "127.0.0.\(n + 1):3481", key: PrivateKey.generate().publicKey.base64),
                    turnURIs: ["turn:127.0.0.\(n + 1):3478"], capacityBitsPerSecond: 100_000_000, bitsPerSecond: bits),
                secret: "s3cret")
            #expect(try net.pump(id, &relay).isEmpty)
        }
        var uris: [[String]] = []
        for n in 0..<8 {
            var peer = RendezvousClient(identity: .generate())
            guard case .registered(let turn?, _)? = try net.connect(ConnectionID(UInt64(100 + n)), &peer).first else {
                Issue.record("peer \(n) was not registered with TURN credentials")
                return
            }
            uris.append(turn.uris)
        }
        #expect(uris.allSatisfy { $0 == ["turn:127.0.0.2:3478"] }, "\(uris)")
    }

    /// A new room is placed when it is about to be made (`place`): below 70 % of a
    /// relay's capacity, its expected use reserved there; none below it is a clear
    /// refusal; a relay's own rendezvous names its party service.
    @Test func aNewRoomIsPlacedByLoadWhenItIsMade() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.relaySecret = "s3cret"
        var net = Net(configuration)
        var relay = RendezvousClient(identity: .generate())
        let r = ConnectionID(40)
        _ = try net.connect(r, &relay)
        let grant = PartyGrant(address: "127.0.0.1:3481", key: PrivateKey.generate().publicKey.base64)
        func report(_ bits: UInt64) throws {
            relay.report(
                RelayLoad(party: grant, capacityBitsPerSecond: 100_000_000, bitsPerSecond: bits), secret: "s3cret")
            _ = try net.pump(r, &relay)
        }
        try report(10_000_000)
        var ca = RendezvousClient(identity: alice)
        net.feed(.accepted(a))
        let early = ca.place(now: .zero)
        let unregistered = try net.request(a, ca.takeWrites(), &ca)
        #expect(
            unregistered.first == .refused(code: .notRegistered, detail: "register before place", id: early), "\(unregistered)")
        _ = try net.pump(a, &ca)
        let reserved = { net.server.relayRegistry.relays.values.first?.reservations.count ?? -1 }
        #expect(reserved() == 0, "a registration reserves nothing")
        let asked = ca.place(now: .zero)
        #expect(try net.request(a, ca.takeWrites(), &ca) == [.located(id: asked, room: "", party: grant)])
        #expect(reserved() == 1)
        try report(80_000_000)
        let full = ca.place(now: .zero)
        let answer = try net.request(a, ca.takeWrites(), &ca)
        #expect(
            answer == [
                .refused(code: .noRelay, detail: "no live relay below 70 % of its capacity hosts parties", id: full)
            ], "\(answer)")

        var single = RendezvousServerConfiguration()
        single.party = grant
        var one = Net(single)
        var cb = RendezvousClient(identity: bob)
        _ = try one.connect(b, &cb)
        let own = cb.place(now: .zero)
        #expect(try one.request(b, cb.takeWrites(), &cb) == [.located(id: own, room: "", party: grant)])
    }

    /// A party room is found through the directory: on the relay its id names
    /// while that relay reports, on the one placed next once it is gone (for
    /// every member that asks), and a relay's own rendezvous names its relay.
    @Test func roomsAreLocatedOnTheirRelayAndPlacedAgainWhenItGoes() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.relaySecret = "s3cret"
        var net = Net(configuration)
        var relays: [(key: PrivateKey, client: RendezvousClient, grant: PartyGrant)] = []
        for n in 0..<3 {
            let key = PrivateKey.generate()
            var client = RendezvousClient(identity: key)
            _ = try net.connect(ConnectionID(UInt64(40 + n)), &client)
            let grant = PartyGrant(address: "127.0.0.\(n + 1):3481", key: key.publicKey.base64)
            client.report(RelayLoad(party: grant, capacityBitsPerSecond: 100_000_000), secret: "s3cret")
            #expect(try net.pump(ConnectionID(UInt64(40 + n)), &client).isEmpty)
            relays.append((key, client, grant))
        }
        func locate(_ connection: ConnectionID, _ client: inout RendezvousClient, _ room: String) throws -> RendezvousClient
            .Event?
        {
            let id = client.locate(room: room, now: .zero)
            return try net.request(connection, client.takeWrites(), &client).first {
                if case .timedOut = $0 { false } else { true }
            }
            .map { event in
                if case .located(let answered, _, _) = event { #expect(answered == id) }
                return event
            }
        }
        var ca = RendezvousClient(identity: alice)
        var cb = RendezvousClient(identity: bob)
        // Asked before registering: refused, the connection stays.
        net.feed(.accepted(b))
        #expect(try locate(b, &cb, "x") == .refused(code: .notRegistered, detail: "register before locate", id: 1))
        #expect(!net.closed.contains(b))
        _ = try net.pump(b, &cb)
        _ = try net.connect(a, &ca)
        let home = relays[1]
        let room = RoomHome.roomPrefix(for: home.key.publicKey) + "abcdefghijkm"
        #expect(try locate(a, &ca, room) == .located(id: 1, room: room, party: home.grant))
        // Its relay's connection closes (SIGKILL): the room goes where the highest weight says, for everyone.
        net.feed(.closed(ConnectionID(41)))
        guard case .located(_, _, let moved)? = try locate(a, &ca, room) else {
            Issue.record("the room was not placed again")
            return
        }
        #expect(moved != home.grant && [relays[0].grant, relays[2].grant].contains(moved))
        #expect(try locate(b, &cb, room) == .located(id: 2, room: room, party: moved))
        // Its old relay back (restarted with its identity): the room stays where it went.
        var back = RendezvousClient(identity: home.key)
        _ = try net.connect(ConnectionID(41), &back)
        back.report(RelayLoad(party: home.grant, capacityBitsPerSecond: 100_000_000), secret: "s3cret")
        _ = try net.pump(ConnectionID(41), &back)
        #expect(try locate(a, &ca, room) == .located(id: 3, room: room, party: moved))
        // A room id too long is refused, the connection stays; a room of no relay's gets a relay.
        #expect(
            try locate(a, &ca, String(repeating: "r", count: 65))
                == .refused(code: .malformed, detail: "a room id is 1-64 bytes, not 65", id: 4))
        #expect(!net.closed.contains(a))
        guard case .located? = try locate(a, &ca, "abcdefghijkm") else {
            Issue.record("a room without a tag found no relay")
            return
        }
        // A relay's own rendezvous (no relays reporting) names its party service, or says there is none.
        var single = RendezvousServerConfiguration()
        single.party = PartyGrant(address: "127.0.0.1:3481", key: alice.publicKey.base64)
        var one = Net(single)
        var cc = RendezvousClient(identity: bob)
        _ = try one.connect(c, &cc)
        _ = cc.locate(room: room, now: .zero)
        #expect(try one.request(c, cc.takeWrites(), &cc) == [.located(id: 1, room: room, party: single.party!)])
        var none = Net()
        var cd = RendezvousClient(identity: bob)
        _ = try none.connect(c, &cd)
        _ = cd.locate(room: room, now: .zero)
        #expect(
            try none.request(c, cd.takeWrites(), &cd) == [.refused(code: .noRelay, detail: "no relay hosts parties now", id: 1)])
    }

    /// A member that still hears its relay asks with `follow`, which places nothing:
    /// a relay whose reports lapsed is still named for its room (its members are not
    /// moved for that alone), until a member that lost it, or a joiner, asks without
    /// `follow` and the room is placed again; then `follow` names where it went.
    @Test func aMemberFollowingItsRoomNeverMovesIt() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.relaySecret = "s3cret"
        configuration.node = 1
        var net = Net(configuration)
        var relays: [(id: ConnectionID, client: RendezvousClient, grant: PartyGrant)] = []
        for n in 0..<3 {
            let key = PrivateKey.generate()
            var client = RendezvousClient(identity: key)
            let id = ConnectionID(UInt64(40 + n))
            _ = try net.connect(id, &client)
            relays.append((id, client, PartyGrant(address: "127.0.0.\(n + 1):3481", key: key.publicKey.base64)))
        }
        func report(_ n: Int) throws {
            relays[n].client.report(RelayLoad(party: relays[n].grant, capacityBitsPerSecond: 100_000_000), secret: "s3cret")
            #expect(try net.pump(relays[n].id, &relays[n].client).isEmpty)
        }
        for n in 0..<3 { try report(n) }
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(a, &ca)
        func locate(_ room: String, follow: Bool) throws -> RendezvousClient.Event? {
            _ = ca.locate(room: room, follow: follow, now: .zero)
            return try net.request(a, ca.takeWrites(), &ca).first
        }
        let homeKey = try #require(PublicKey(base64: relays[1].grant.key))
        let room = RoomHome.roomPrefix(for: homeKey) + "abcdefghijkm"
        guard case .located(_, _, relays[1].grant)? = try locate(room, follow: true) else {
            Issue.record("the room is not on its own relay")
            return
        }
        // Relay 1's reports lapse; the others go on.
        net.now = net.now + .seconds(7)
        try report(0)
        try report(2)
        net.records = []
        guard case .located(_, _, relays[1].grant)? = try locate(room, follow: true) else {
            Issue.record("following placed the room again")
            return
        }
        #expect(!net.records.contains { if case .roomMoved = $0 { true } else { false } }, "\(net.records)")
        // A member that lost relay 1 asks: the room is placed again, and told to the other nodes.
        guard case .located(_, _, let moved)? = try locate(room, follow: false), moved != relays[1].grant else {
            Issue.record("the room was not placed again")
            return
        }
        #expect(net.records.contains { if case .roomMoved = $0 { true } else { false } }, "\(net.records)")
        guard case .located(_, _, moved)? = try locate(room, follow: true) else {
            Issue.record("following did not name where the room went")
            return
        }
        // A room whose relay this node does not know, never placed: nothing to follow.
        let unknown = RoomHome.roomPrefix(for: PrivateKey.generate().publicKey) + "abcdefghijkm"
        guard case .refused(.noRelay, _, _)? = try locate(unknown, follow: true) else {
            Issue.record("following an unknown room placed it")
            return
        }
    }

    @Test func aNewerRegistrationOfTheSameKeyReplacesTheOlder() throws {
        var net = Net()
        var first = RendezvousClient(identity: alice)
        var second = RendezvousClient(identity: alice)
        _ = try net.connect(a, &first)
        _ = try net.connect(b, &second)
        let events = try net.pump(a, &first)
        guard case .refused(.replaced, _, nil)? = events.first else {
            Issue.record("\(events)")
            return
        }
        #expect(!first.isRegistered && second.isRegistered)
        #expect(net.closed == [a])
        // Deliveries go to the newer connection; the driver's late close of the old one changes nothing.
        net.feed(.closed(a))
        #expect(net.server.isOnline(alice.publicKey))
        // Registering twice on one connection is refused without closing it.
        let again = try RegistrationProof.make(identity: alice, serverKey: PrivateKey.generate().publicKey, challenge: [0])
        net.feed(.received(b, RendezvousFrame.frame(.register(key: alice.publicKey, proof: again)), unixSeconds: net.unix))
        guard case .refused(.alreadyRegistered, _, nil)? = try net.pump(b, &second).first else {
            Issue.record("not alreadyRegistered")
            return
        }
        #expect(!net.closed.contains(b))
    }

    @Test(arguments: [
        Array("{\"type\":\"register\"}".utf8),
        Array("not json".utf8),
        Array("{\"type\":\"send\",\"id\":1,\"to\":\"AAAA\",\"sealed\":\"\"}".utf8),
        Array("{\"type\":\"hello\",\"challenge\":\"AA==\",\"key\":\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\"}".utf8),
        Array("{\"type\":\"teleport\"}".utf8),
        [UInt8](repeating: 0xFF, count: 64),
    ])
    func malformedFramesGetAnErrorAndTheConnectionCloses(body: [UInt8]) throws {
        var net = Net()
        net.feed(.accepted(a))
        _ = try net.messages(a)
        net.feed(.received(a, [UInt8(body.count >> 8), UInt8(body.count & 0xFF)] + body, unixSeconds: net.unix))
        let reply = try net.messages(a)
        guard case .error(.malformed, let detail, nil)? = reply.first else {
            Issue.record("\(reply)")
            return
        }
        #expect(!detail.isEmpty)
        #expect(net.closed.contains(a))
        #expect(net.server.statistics.connections == 0)
        // Whatever the driver still delivers is ignored.
        net.server.handle(.received(a, [0, 2, 0x7B, 0x7D], unixSeconds: net.unix), now: net.now)
        #expect(net.server.pollAction() == nil)
    }

    @Test func anOversizedFrameIsRefusedBeforeItArrives() throws {
        var net = Net()
        net.feed(.accepted(a))
        _ = try net.messages(a)
        net.feed(.received(a, [0xFF, 0xFF, 0x7B], unixSeconds: net.unix))
        guard case .error(.tooLarge, _, nil)? = try net.messages(a).first else {
            Issue.record("not tooLarge")
            return
        }
        #expect(net.closed.contains(a))
        // The client refuses to build one.
        var ca = RendezvousClient(identity: alice)
        #expect(throws: RendezvousError.self) { try ca.send([UInt8](repeating: 1, count: 20_000), to: bob.publicKey) }
    }

    @Test func requestsBeforeRegistrationAreRefusedAndSilentConnectionsTimeOut() throws {
        var net = Net()
        net.feed(.accepted(a))
        _ = try net.messages(a)
        net.feed(.received(a, RendezvousFrame.frame(.lookup(id: 9, key: bob.publicKey)), unixSeconds: net.unix))
        #expect(try net.messages(a).first == .error(code: .notRegistered, detail: "register before lookup", id: 9))
        #expect(net.server.nextDeadline == net.now + .seconds(10))
        net.now = net.now + .seconds(10)
        net.tick()
        guard case .error(.timeout, _, nil)? = try net.messages(a).first else {
            Issue.record("no timeout")
            return
        }
        #expect(net.closed.contains(a))
        // A registered connection that pings stays; one that goes silent for 90 s is closed.
        var cb = RendezvousClient(identity: bob)
        _ = try net.connect(b, &cb)
        net.now = net.now + .seconds(60)
        #expect(try net.request(b, cb.ping(), &cb) == [.pong])
        net.now = net.now + .seconds(60)
        net.tick()
        #expect(!net.closed.contains(b))
        net.now = net.now + .seconds(31)
        net.tick()
        #expect(net.closed.contains(b))
        #expect(!net.server.isOnline(bob.publicKey))
    }

    /// Slowloris on a registered connection: bytes trickled into a frame do not count as
    /// heard, and a frame begun must be whole within `frameTimeout` of its first byte.
    @Test func aFrameTrickledAByteAtATimeIsCutAtItsDeadline() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.frameTimeout = .seconds(7)  // (not the registration's 10 s: each deadline seen apart)
        var net = Net(configuration)
        var cb = RendezvousClient(identity: bob)
        _ = try net.connect(b, &cb)
        // The registration's deadline passes (the next one is never later than the real
        // one, sometimes earlier: a poll with nothing to do), and the idle one is next.
        net.now = try #require(net.server.nextDeadline)
        net.tick()
        // A frame sent in two pieces inside its deadline is taken, and resets it.
        let ping = cb.ping()
        let first = net.now
        net.feed(.received(b, Array(ping.prefix(3)), unixSeconds: net.unix))
        #expect(net.server.nextDeadline == first + .seconds(7))
        net.now = first + .seconds(6)
        net.tick()
        net.feed(.received(b, Array(ping.dropFirst(3)), unixSeconds: net.unix))
        #expect(try net.messages(b) == [.pong])
        let heard = net.now
        #expect(try #require(net.server.nextDeadline) <= heard + .seconds(90))
        net.now = try #require(net.server.nextDeadline)
        net.tick()
        #expect(!net.closed.contains(b))
        #expect(net.server.nextDeadline == heard + .seconds(90))
        // Then a ping's bytes, one every 4 s: the deadline stays 7 s after its first byte.
        let begun = net.now
        let bytes = cb.ping()
        net.feed(.received(b, [bytes[0]], unixSeconds: net.unix))
        #expect(net.server.nextDeadline == begun + .seconds(7))
        net.now = begun + .seconds(4)
        net.tick()
        net.feed(.received(b, [bytes[1]], unixSeconds: net.unix))
        #expect(net.server.nextDeadline == begun + .seconds(7))
        net.now = try #require(net.server.nextDeadline)
        net.tick()
        #expect(net.closed.contains(b))
        guard case .error(.timeout, let detail, nil)? = try net.messages(b).last else {
            Issue.record("no timeout")
            return
        }
        #expect(detail.contains("frame"))
    }

    /// The SansIOCore contract: with no connection left, the next deadline is when a
    /// peer that left is forgotten (or earlier: one passed that has nothing to do, and
    /// then that), and handling it forgets the peer (lookups say unknown).
    @Test func aPeerThatLeftIsForgottenAtItsDeadline() throws {
        var net = Net()
        var cb = RendezvousClient(identity: bob)
        _ = try net.connect(b, &cb)
        net.feed(.closed(b))
        let left = net.now
        #expect(try #require(net.server.nextDeadline) <= left + net.server.configuration.rememberFor)
        net.now = try #require(net.server.nextDeadline)
        net.tick()
        #expect(net.server.nextDeadline == left + net.server.configuration.rememberFor)
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(a, &ca)
        net.feed(.closed(a))
        net.now = net.now + net.server.configuration.rememberFor
        net.tick()
        var later = RendezvousClient(identity: alice)
        _ = try net.connect(ConnectionID(3), &later)
        let (id, s) = try later.send([1], to: bob.publicKey)
        guard case .refused(.unknownPeer, _, id)? = try net.request(ConnectionID(3), s, &later).first else {
            Issue.record("bob was not forgotten")
            return
        }
    }

    /// The client's clock: the registration, a request and pings each have their deadline.
    @Test func theClientTimesOutRegistrationAndRequestsAndPings() throws {
        var timing = RendezvousClient.Timing()
        timing.registration = .seconds(5)
        timing.request = .seconds(3)
        timing.ping = .seconds(30)
        var silent = RendezvousClient(identity: alice, timing: timing)
        silent.handle(.connected, now: .seconds(100))
        #expect(silent.nextDeadline == .seconds(105))
        silent.handleTimeout(now: .seconds(105))
        #expect(silent.drainActions() == [.event(.timedOut(id: nil))])
        #expect(silent.nextDeadline == nil)

        var net = Net()
        var ca = RendezvousClient(identity: alice, timing: timing)
        ca.handle(.connected, now: net.now)
        _ = try net.connect(a, &ca)
        #expect(ca.isRegistered)
        // Registered: the next deadline is the first ping.
        #expect(ca.nextDeadline == net.now + .seconds(30))
        let id = ca.lookup(bob.publicKey, now: net.now)
        #expect(ca.nextDeadline == net.now + .seconds(3))
        _ = ca.drainActions()  // the lookup's frame is lost on the way
        ca.handleTimeout(now: net.now + .seconds(3))
        #expect(ca.drainActions() == [.event(.timedOut(id: id))])
        ca.handleTimeout(now: net.now + .seconds(30))
        #expect(ca.drainActions() == [.write(RendezvousFrame.frame(.ping))])
        #expect(ca.nextDeadline == net.now + .seconds(60))
        // A stream that is not the protocol fails the client once; it then ignores input.
        ca.handle(.received([0, 3, 0x6E, 0x6F, 0x21]), now: net.now)
        guard case .failed? = ca.pollAction() else {
            Issue.record("no failure")
            return
        }
        ca.handle(.received([0, 3, 0x6E, 0x6F, 0x21]), now: net.now)
        #expect(ca.pollAction() == nil && ca.nextDeadline == nil)
    }

    @Test func aFloodIsCutOff() throws {
        var net = Net()
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(a, &ca)
        var flood: [UInt8] = []
        for _ in 0..<150 { flood += ca.ping() }
        net.feed(.received(a, flood, unixSeconds: net.unix))
        let replies = try net.messages(a)
        #expect(replies.filter { $0 == .pong }.count < 110)
        #expect(replies.last == .error(code: .rateLimited, detail: "more than 20 requests a second", id: nil))
        #expect(net.closed.contains(a))
    }

    @Test func everyMessageRoundTrips() throws {
        let k = alice.publicKey
        let all: [RendezvousMessage] = [
            .hello(challenge: [1, 2, 3], serverKey: k), .register(key: k, proof: [9]),
            .registered(turn: nil), .registered(turn: TURNGrant(username: "1:ab", password: "p", expiry: 1, uris: ["turn:x"])),
            .registered(turn: nil, party: PartyGrant(address: "127.0.0.1:3481", key: k.base64)), .post(id: 8, to: k, sealed: [7]),
            .lookup(id: 1, key: k), .lookupResult(id: 2, key: k, online: true), .send(id: 3, to: k, sealed: [0]),
            .sent(id: 4), .deliver(from: k, sealed: [5, 6]), .error(code: .offline, detail: "d", id: 7),
            .error(code: .timeout, detail: "", id: nil), .ping, .pong, .locate(id: 9, room: "x7kq-abcdefghijkm"),
            .locate(id: 10, room: "x7kq-abcdefghijkm", follow: true), .place(id: 11),
            .located(id: 9, room: "x7kq-abcdefghijkm", party: PartyGrant(address: "127.0.0.1:3481", key: k.base64)),
            .error(code: .noRelay, detail: "none", id: 9),
            .changeContacts(id: 10, add: [k], remove: []), .changeContacts(id: 11, add: [], remove: [k, bob.publicKey]),
            .changeContacts(id: 12, add: [], remove: []), .contacts(id: 10, keys: [k, bob.publicKey]),
            .contacts(id: 12, keys: []),
        ]
        for m in all { #expect(try RendezvousMessage(decoding: m.encode()) == m) }
        // Split at every byte: the framer reassembles.
        let stream = all.flatMap { RendezvousFrame.frame($0) }
        var framer = RendezvousFrame()
        var frames: [[UInt8]] = []
        for byte in stream { frames += try framer.append([byte]) }
        #expect(try frames.map { try RendezvousMessage(decoding: $0) } == all)
    }
}

extension Array where Element == UInt8 {
    func windowContainsSubsequence(_ needle: [UInt8]) -> Bool {
        guard needle.count <= count else { return false }
        for i in 0...(count - needle.count) where Array(self[i..<(i + needle.count)]) == needle { return true }
        return false
    }
}
