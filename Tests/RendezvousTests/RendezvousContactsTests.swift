import Secure
import Testing
import TusaBase

@testable import Rendezvous

extension RendezvousClient {
    /// A change of contacts and the frame it writes.
    mutating func changeContacts(add: [PublicKey] = [], remove: [PublicKey] = []) -> (UInt32, [UInt8]) {
        let id = changeContacts(add: add, remove: remove, now: .zero)
        return (id, takeWrites())
    }
}

/// Contacts on a virtual clock: the keys a user takes posts and sends from freely.
/// Anyone else is a stranger: a key reaches few strangers an hour, and a box keeps
/// few strangers' posts, never at a contact's expense.
@Suite("Rendezvous contacts") struct RendezvousContactsTests {
    let alice = PrivateKey.generate(), bob = PrivateKey.generate(), carol = PrivateKey.generate()
    let a = ConnectionID(1), b = ConnectionID(2), c = ConnectionID(3)

    static func isRateLimited(_ events: [RendezvousClient.Event]) -> Bool {
        events.contains { if case .refused(.rateLimited, _, _?) = $0 { true } else { false } }
    }

    /// A key floods invitations and calls to strangers: its burst goes, then each new
    /// stranger is refused (rate-limited, nothing kept, nothing delivered, the
    /// connection open), while a stranger it reached already, and anyone who made it
    /// a contact, are reached as before. The budget refills over the hour.
    @Test func aKeyReachesFewStrangersAnHourAndItsContactsFreely() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.strangerBurst = 3
        configuration.strangersPerHour = 3
        var net = Net(configuration)
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(a, &ca)
        let strangers = (0..<5).map { _ in PrivateKey.generate().publicKey }
        var answers: [[RendezvousClient.Event]] = []
        for key in strangers {
            let (_, frame) = try ca.post([1], to: key)
            answers.append(try net.request(a, frame, &ca))
        }
        #expect(answers.map { $0.contains { if case .sent = $0 { true } else { false } } } == [true, true, true, false, false])
        #expect(answers[3...].allSatisfy(Self.isRateLimited), "\(answers)")
        #expect(net.server.statistics.posted == 3, "a refused post is not kept")
        #expect(!net.closed.contains(a))
        // The first stranger again: reached this hour already, it costs nothing.
        let (again, frame) = try ca.post([2], to: strangers[0])
        #expect(try net.request(a, frame, &ca) == [.sent(id: again)])
        // Carol is online but a stranger to Alice: neither a call's send nor a post reaches her.
        var cc = RendezvousClient(identity: carol)
        _ = try net.connect(c, &cc)
        let (_, call) = try ca.send([3], to: carol.publicKey)
        #expect(Self.isRateLimited(try net.request(a, call, &ca)))
        let (_, invite) = try ca.post([3], to: carol.publicKey)
        #expect(Self.isRateLimited(try net.request(a, invite, &ca)))
        #expect(!(try net.pump(c, &cc)).contains { if case .received = $0 { true } else { false } })
        // Bob makes Alice a contact: she reaches him with her budget spent.
        var cb = RendezvousClient(identity: bob)
        _ = try net.connect(b, &cb)
        let (changed, add) = cb.changeContacts(add: [alice.publicKey])
        #expect(try net.request(b, add, &cb) == [.contacts(id: changed, keys: [alice.publicKey])])
        let (sent, direct) = try ca.send([4], to: bob.publicKey)
        #expect(try net.request(a, direct, &ca) == [.sent(id: sent)])
        let (posted, invitation) = try ca.post([5], to: bob.publicKey)
        #expect(try net.request(a, invitation, &ca) == [.sent(id: posted)])
        let heard = try net.pump(b, &cb).compactMap { if case .received(_, let p) = $0 { p } else { nil } }
        #expect(heard == [[4], [5]])
        // Twenty minutes give one stranger back (three an hour): Carol, then no one new.
        net.now = net.now + .seconds(20 * 60)
        let (rang, ring) = try ca.send([6], to: carol.publicKey)
        #expect(try net.request(a, ring, &ca) == [.sent(id: rang)])
        let (_, next) = try ca.post([7], to: strangers[4])
        #expect(Self.isRateLimited(try net.request(a, next, &ca)))
        // Others have budgets of their own.
        let (bobs, toCarol) = try cb.post([8], to: carol.publicKey)
        #expect(try net.request(b, toCarol, &cb) == [.sent(id: bobs)])
    }

    /// Strangers flooding one user's box push out only each other's posts (the oldest
    /// first, a few kept); a contact's invitation stays, and a box full of contacts'
    /// posts refuses a stranger's rather than drop one of them.
    @Test func strangersNeverPushOutAContactsInvitation() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.mailboxPerKey = 4
        configuration.mailboxFromStrangers = 2
        configuration.strangerBurst = 1
        configuration.strangersPerHour = 0.001
        var net = Net(configuration)
        // Bob makes Alice a contact, and leaves.
        var cb = RendezvousClient(identity: bob)
        _ = try net.connect(b, &cb)
        let (_, add) = cb.changeContacts(add: [alice.publicKey])
        _ = try net.request(b, add, &cb)
        net.feed(.closed(b))
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(a, &ca)
        let (first, frame) = try ca.post([1], to: bob.publicKey)
        #expect(try net.request(a, frame, &ca) == [.sent(id: first)])
        // Five strangers post to Bob, each from a key of its own.
        for n: UInt8 in 10..<15 {
            var stranger = RendezvousClient(identity: .generate())
            let id = ConnectionID(UInt64(n))
            _ = try net.connect(id, &stranger)
            let (sent, post) = try stranger.post([n], to: bob.publicKey)
            #expect(try net.request(id, post, &stranger) == [.sent(id: sent)])
        }
        #expect(net.records.filter { if case .dropped = $0 { true } else { false } }.count == 3)
        var back = RendezvousClient(identity: bob)
        let heard = try net.connect(ConnectionID(20), &back).compactMap { if case .received(_, let p) = $0 { p } else { nil } }
        #expect(heard == [[1], [13], [14]], "Alice's, and the two newest strangers'")
        // Alice fills the box (her posts push out strangers' first, then her oldest)...
        for n: UInt8 in 2...5 {
            let (sent, post) = try ca.post([n], to: bob.publicKey)
            #expect(try net.request(a, post, &ca) == [.sent(id: sent)])
        }
        // ...and a stranger's post finds no stranger's to push out: refused, nothing lost.
        var late = RendezvousClient(identity: .generate())
        _ = try net.connect(ConnectionID(30), &late)
        let (refused, post) = try late.post([99], to: bob.publicKey)
        let answer = try net.request(ConnectionID(30), post, &late)
        #expect(answer.contains { if case .refused(.full, _, refused) = $0 { true } else { false } }, "\(answer)")
        // A refused post costs its poster nothing: its one stranger is still to reach.
        let (elsewhere, other) = try late.post([98], to: carol.publicKey)
        #expect(try net.request(ConnectionID(30), other, &late) == [.sent(id: elsewhere)])
        net.feed(.closed(ConnectionID(20)))
        var last = RendezvousClient(identity: bob)
        let kept = try net.connect(ConnectionID(21), &last).compactMap { if case .received(_, let p) = $0 { p } else { nil } }
        #expect(kept == [[2], [3], [4], [5]])
    }

    /// A change is recorded (before its answer) as what it added and removed; a
    /// restarted server given the store's contacts, and another node told of a
    /// change, let the contact through where a stranger is refused.
    @Test func contactsAreRecordedRestoredAndHeardFromOtherNodes() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.strangerBurst = 0
        var net = Net(configuration)
        var cb = RendezvousClient(identity: bob)
        _ = try net.connect(b, &cb)
        net.records = []
        let (_, add) = cb.changeContacts(add: [alice.publicKey, carol.publicKey])
        _ = try net.request(b, add, &cb)
        // Asking changes nothing, and records nothing.
        let (asked, ask) = cb.changeContacts()
        let answer = try net.request(b, ask, &cb)
        let listed: [Set<PublicKey>] = answer.map { if case .contacts(asked, let keys) = $0 { Set(keys) } else { [] } }
        #expect(listed == [[alice.publicKey, carol.publicKey]])
        #expect(net.records.count == 1)
        guard case .contacts(let owner, let added, let removed)? = net.records.first else {
            Issue.record("no record of the change: \(net.records)")
            return
        }
        #expect(owner == bob.publicKey && Set(added) == [alice.publicKey, carol.publicKey] && removed.isEmpty)
        net.afterRecords = []
        let (dropped, drop) = cb.changeContacts(remove: [carol.publicKey])
        #expect(try net.request(b, drop, &cb) == [.contacts(id: dropped, keys: [alice.publicKey])])
        #expect(net.records.last == .contacts(owner: bob.publicKey, add: [], remove: [carol.publicKey]))
        #expect(net.afterRecords.contains { if case .send(b, _) = $0 { true } else { false } }, "answered after the record")

        // A restart: the store gives the contacts back.
        var restarted = Net(configuration)
        restarted.feed(.restore(RendezvousSnapshot(contacts: [bob.publicKey: [alice.publicKey]]), unixSeconds: net.unix))
        var rb = RendezvousClient(identity: bob)
        _ = try restarted.connect(b, &rb)
        var ra = RendezvousClient(identity: alice)
        _ = try restarted.connect(a, &ra)
        var rc = RendezvousClient(identity: carol)
        _ = try restarted.connect(c, &rc)
        let (sent, frame) = try ra.send([1], to: bob.publicKey)
        #expect(try restarted.request(a, frame, &ra) == [.sent(id: sent)])
        let (_, strange) = try rc.send([2], to: bob.publicKey)
        #expect(Self.isRateLimited(try restarted.request(c, strange, &rc)))
        // Another node says Bob made Carol a contact there.
        restarted.feed(.cluster(.contacts(owner: bob.publicKey, add: [carol.publicKey], remove: []), unixSeconds: net.unix))
        let (now, friendly) = try rc.send([3], to: bob.publicKey)
        #expect(try restarted.request(c, friendly, &rc) == [.sent(id: now)])
    }

    /// The contacts of a key registered nowhere for `contactsFor` are forgotten, as a
    /// removal recorded (the store and the other nodes forget them too); a key
    /// registered here, or at another node, however long, keeps them; after a restart
    /// the store's row of when a key was last here counts, and a key with no such row
    /// is counted from the restart.
    @Test func theContactsOfAKeyGoneForGoodAreForgotten() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.strangerBurst = 0
        configuration.contactsFor = .seconds(2 * 24 * 3600)
        configuration.idleTimeout = .seconds(30 * 24 * 3600)
        let day = Duration.seconds(24 * 3600)
        /// Both clocks on by `d`, then the server's timers.
        func pass(_ net: inout Net, _ d: Duration) {
            net.now = net.now + d
            net.unix += UInt64(d.components.seconds)
            net.tick()
        }
        func removals(_ records: [RendezvousRecord]) -> [PublicKey: [PublicKey]] {
            var out: [PublicKey: [PublicKey]] = [:]
            for case .contacts(let owner, let add, let remove) in records where add.isEmpty { out[owner, default: []] += remove }
            return out
        }
        var net = Net(configuration)
        var cb = RendezvousClient(identity: bob)
        var cc = RendezvousClient(identity: carol)
        _ = try net.connect(b, &cb)
        _ = try net.connect(c, &cc)
        let (_, bobAdds) = cb.changeContacts(add: [alice.publicKey])
        _ = try net.request(b, bobAdds, &cb)
        let (_, carolAdds) = cc.changeContacts(add: [alice.publicKey])
        _ = try net.request(c, carolAdds, &cc)
        net.feed(.closed(b))  // Bob leaves; Carol stays registered
        net.records = []
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(a, &ca)
        pass(&net, day)
        #expect(removals(net.records).isEmpty)
        let (kept, toBob) = try ca.post([1], to: bob.publicKey)
        #expect(try net.request(a, toBob, &ca) == [.sent(id: kept)], "a contact still, a day on")
        pass(&net, day + .seconds(600))
        #expect(removals(net.records) == [bob.publicKey: [alice.publicKey]], "\(net.records)")
        let (gone, again) = try ca.post([2], to: bob.publicKey)
        let refused = try net.request(a, again, &ca)
        #expect(refused.contains { if case .refused(.rateLimited, _, gone) = $0 { true } else { false } }, "\(refused)")
        let (asked, ask) = cc.changeContacts()
        #expect(try net.request(c, ask, &cc) == [.contacts(id: asked, keys: [alice.publicKey])], "Carol, here all along")
        // Her last-seen row was written again while she stayed (a kill would not count her gone since her login).
        #expect(
            net.records.contains { if case .seen(carol.publicKey, let at) = $0 { at > net.unix - 2 * 24 * 3600 } else { false } },
            "\(net.records)")

        // Restarted: Dave was last here three days ago, Erin's row is gone.
        let (dave, erin) = (PrivateKey.generate().publicKey, PrivateKey.generate().publicKey)
        var restarted = Net(configuration)
        restarted.unix = net.unix
        restarted.feed(
            .restore(
                RendezvousSnapshot(
                    seen: [dave: net.unix - 3 * 24 * 3600], contacts: [dave: [alice.publicKey], erin: [bob.publicKey]]),
                unixSeconds: net.unix))
        pass(&restarted, .seconds(600))
        #expect(removals(restarted.records) == [dave: [alice.publicKey]], "\(restarted.records)")
        pass(&restarted, day * 2 + .seconds(600))
        #expect(removals(restarted.records) == [dave: [alice.publicKey], erin: [bob.publicKey]], "\(restarted.records)")

        // A node of a cluster: Frank, registered at node 1 since long ago, keeps his
        // until node 1 says he left, and for `contactsFor` after.
        var node = configuration
        node.node = 2
        let frank = PrivateKey.generate().publicKey
        var two = Net(node)
        two.unix = net.unix
        two.feed(
            .clusterResync(
                RendezvousSnapshot(seen: [frank: net.unix - 30 * 24 * 3600], contacts: [frank: [alice.publicKey]]),
                presence: [frank: ClusterPresence(node: 1, unixSeconds: net.unix - 30 * 24 * 3600)], unixSeconds: net.unix))
        pass(&two, day * 3)
        #expect(removals(two.records).isEmpty, "\(two.records)")
        two.feed(.cluster(.offline(frank, node: 1), unixSeconds: two.unix))
        pass(&two, day)
        #expect(removals(two.records).isEmpty, "\(two.records)")
        pass(&two, day + .seconds(600))
        #expect(removals(two.records) == [frank: [alice.publicKey]], "\(two.records)")
    }

    /// A restart does not refill a budget: the strangers reached (recorded as they are
    /// spent) and the posts to strangers in the store's snapshot are spent again, an
    /// hour's worth; the strangers reached stay free to reach for the rest of it.
    @Test func aRestartSpendsWhatTheSnapshotSaysWasSpent() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.strangerBurst = 3
        configuration.strangersPerHour = 0.001
        configuration.postBurst = 4
        configuration.postsPerMinute = 0.001
        var net = Net(configuration)
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(a, &ca)
        let strangers = (0..<4).map { _ in PrivateKey.generate().publicKey }
        for stranger in strangers.prefix(2) {
            let (sent, post) = try ca.post([1], to: stranger)
            #expect(try net.request(a, post, &ca) == [.sent(id: sent)])
        }
        let reaches = net.records.compactMap { if case .reached(let r) = $0 { r } else { nil } }
        let posts = net.records.compactMap { if case .posted(let p) = $0 { p } else { nil } }
        #expect(reaches.map(\.to) == Array(strangers.prefix(2)) && reaches.allSatisfy { $0.from == alice.publicKey })
        #expect(posts.count == 2)

        // Restarted with what the store kept, and a reach older than the hour (not counted).
        var restarted = Net(configuration)
        let old = RendezvousReach(from: alice.publicKey, to: carol.publicKey, unixSeconds: net.unix - 3700)
        restarted.feed(.restore(RendezvousSnapshot(posts: posts, reaches: [old] + reaches), unixSeconds: net.unix))
        var ra = RendezvousClient(identity: alice)
        _ = try restarted.connect(a, &ra)
        // One stranger left of three, and two posts of four.
        let (third, toThird) = try ra.post([2], to: strangers[2])
        #expect(try restarted.request(a, toThird, &ra) == [.sent(id: third)])
        let (fourth, toFourth) = try ra.post([3], to: strangers[3])
        let refused = try restarted.request(a, toFourth, &ra)
        #expect(refused.contains { if case .refused(.rateLimited, _, fourth) = $0 { true } else { false } }, "\(refused)")
        // A stranger reached before the restart is free, from the last post.
        let (again, toFirst) = try ra.post([4], to: strangers[0])
        #expect(try restarted.request(a, toFirst, &ra) == [.sent(id: again)])
        let (over, toSecond) = try ra.post([5], to: strangers[1])
        let noPosts = try restarted.request(a, toSecond, &ra)
        #expect(noPosts.contains { if case .refused(.rateLimited, _, over) = $0 { true } else { false } }, "\(noPosts)")
    }

    /// A stranger who was reached answers freely for the hour after, with its own
    /// budget spent (a callee answering a call); then the hour is over both ways.
    @Test func aStrangerReachedAnswersFreelyForAnHour() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.strangerBurst = 1
        configuration.strangersPerHour = 0.001
        var net = Net(configuration)
        var ca = RendezvousClient(identity: alice)
        var cb = RendezvousClient(identity: bob)
        var cc = RendezvousClient(identity: carol)
        _ = try net.connect(a, &ca)
        _ = try net.connect(b, &cb)
        _ = try net.connect(c, &cc)
        // Bob spends his one stranger on Carol; Alice hers on Bob.
        let (toCarol, offer) = try cb.send([1], to: carol.publicKey)
        #expect(try net.request(b, offer, &cb) == [.sent(id: toCarol)])
        let (toBob, call) = try ca.send([2], to: bob.publicKey)
        #expect(try net.request(a, call, &ca) == [.sent(id: toBob)])
        // Bob answers Alice, and again half an hour on: free.
        let (answered, answer) = try cb.send([3], to: alice.publicKey)
        let answers = try net.request(b, answer, &cb)
        #expect(answers.contains(.sent(id: answered)), "\(answers)")
        net.now = net.now + .seconds(1800)
        let (hungUp, hangup) = try cb.send([4], to: alice.publicKey)
        #expect(try net.request(b, hangup, &cb) == [.sent(id: hungUp)])
        // An hour after the last message between them (the silent connections closed
        // meanwhile, and what is remembered pruned), each is a new stranger to the other.
        net.now = net.now + .seconds(3600)
        net.tick()
        var ra = RendezvousClient(identity: alice)
        var rb = RendezvousClient(identity: bob)
        _ = try net.connect(ConnectionID(4), &ra)
        _ = try net.connect(ConnectionID(5), &rb)
        let (_, late) = try rb.send([5], to: alice.publicKey)
        let lateAnswer = try net.request(ConnectionID(5), late, &rb)
        #expect(Self.isRateLimited(lateAnswer), "\(lateAnswer)")
        let (_, again) = try ra.send([6], to: bob.publicKey)
        let againAnswer = try net.request(ConnectionID(4), again, &ra)
        #expect(Self.isRateLimited(againAnswer), "\(againAnswer)")
    }

    /// A key's full list of contacts goes back in one frame; one more is refused.
    @Test func aFullListOfContactsFitsOneAnswer() throws {
        var net = Net(RendezvousServerConfiguration())
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(a, &ca)
        let limit = RendezvousServerConfiguration().maximumContacts
        let keys = (0..<limit).map { _ in PrivateKey.generate().publicKey }
        var listed: [PublicKey] = []
        for start in stride(from: 0, to: limit, by: RendezvousMessage.maximumContactChange) {
            let (id, frame) = ca.changeContacts(
                add: Array(keys[start..<min(start + RendezvousMessage.maximumContactChange, limit)]))
            for event in try net.request(a, frame, &ca) { if case .contacts(id, let now) = event { listed = now } }
        }
        #expect(Set(listed) == Set(keys))
        let (more, frame) = ca.changeContacts(add: [bob.publicKey])
        #expect(try net.request(a, frame, &ca).contains { if case .refused(.full, _, more) = $0 { true } else { false } })
    }

    /// A change of more keys than one notification carries, more contacts than a key
    /// may hold, or a change before registering: refused with the reason, the
    /// connection open, nothing recorded.
    @Test func oversizedChangesAndTooManyContactsAreRefused() throws {
        var configuration = RendezvousServerConfiguration()
        configuration.maximumContacts = 3
        var net = Net(configuration)
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(a, &ca)
        net.records = []
        let many = (0...RendezvousMessage.maximumContactChange).map { _ in PrivateKey.generate().publicKey }
        let (big, frame) = ca.changeContacts(add: many)
        let answer = try net.request(a, frame, &ca)
        #expect(answer.contains { if case .refused(.malformed, _, big) = $0 { true } else { false } }, "\(answer)")
        let (full, four) = ca.changeContacts(add: Array(many.prefix(4)))
        #expect(try net.request(a, four, &ca).contains { if case .refused(.full, _, full) = $0 { true } else { false } })
        #expect(net.records.isEmpty && !net.closed.contains(a))
        let (three, fits) = ca.changeContacts(add: Array(many.prefix(3)))
        #expect(
            try net.request(a, fits, &ca).contains { if case .contacts(three, let keys) = $0 { keys.count == 3 } else { false } })
        net.feed(.accepted(b))
        net.feed(
            .received(b, RendezvousFrame.frame(.changeContacts(id: 1, add: [bob.publicKey], remove: [])), unixSeconds: net.unix))
        #expect(try net.messages(b).contains { if case .error(.notRegistered, _, 1) = $0 { true } else { false } })
    }
}
