import Secure
import Testing
import TusaBase

@testable import Rendezvous

/// Directory nodes on one database, as cores: what each records for the others
/// (as a store publishes it) is what the others hear, in order.
private struct Cluster {
    var nodes: [Net]
    /// How many of each node's records were passed on.
    private var passed: [Int]

    init(nodes count: Int, _ configure: (inout RendezvousServerConfiguration) -> Void = { _ in }) {
        nodes = (1...count).map { n in
            var configuration = RendezvousServerConfiguration()
            configuration.node = UInt32(n)
            configure(&configuration)
            return Net(configuration)
        }
        passed = Array(repeating: 0, count: count)
    }

    /// Node `n` (from 1).
    subscript(n: Int) -> Net {
        get { nodes[n - 1] }
        set { nodes[n - 1] = newValue }
    }

    /// Passes on what the nodes recorded until nothing more comes.
    mutating func settle() {
        var moved = true
        var rounds = 0
        while moved {
            rounds += 1
            if rounds > 1000 {
                Issue.record("the nodes' notices never settle")
                return
            }
            moved = false
            for i in nodes.indices {
                let fresh = nodes[i].records[passed[i]...]
                passed[i] = nodes[i].records.count
                let node = UInt32(i + 1)
                for record in fresh {
                    guard let event = Self.event(record, from: node) else { continue }
                    moved = true
                    for j in nodes.indices where j != i {
                        let unix = nodes[j].unix
                        nodes[j].feed(.cluster(event, unixSeconds: unix))
                    }
                }
            }
        }
    }

    /// What the others hear of a record, as the PostgreSQL store says it.
    static func event(_ record: RendezvousRecord, from node: UInt32) -> RendezvousClusterEvent? {
        switch record {
        case .online(let key, let unix): .online(key, ClusterPresence(node: node, unixSeconds: unix))
        case .offline(let key): .offline(key, node: node)
        case .signal(let signal): .signal(signal)
        case .posted(let post): .posted(post)
        case .dropped(let ids): .dropped(ids)
        case .relayLoad(let key, let load): .relayLoad(key, load)
        case .relayGone(let key): .relayGone(key)
        case .roomMoved(let room, let relay): .roomMoved(room: room, relay: relay)
        case .placed(let relay): .placed(relay: relay)
        case .contacts(let owner, let add, let remove): .contacts(owner: owner, add: add, remove: remove)
        case .reached(let reach): .reached(reach)
        case .party(let party): .party(party)
        case .partyClosed(let room, let relay): .partyClosed(room: room, relay: relay)
        case .seen: nil
        }
    }
}

@Suite("Rendezvous cores as directory nodes on one database")
struct RendezvousClusterTests {
    let alice = PrivateKey.generate(), bob = PrivateKey.generate(), carol = PrivateKey.generate()
    let a = ConnectionID(1), b = ConnectionID(2), c = ConnectionID(3)

    /// Alice at node 1, Bob at node 2: each sees the other online and their sealed
    /// sends cross, each acknowledged once written down for the other node.
    @Test func peersAtTwoNodesFindAndReachEachOther() throws {
        var cluster = Cluster(nodes: 2)
        var ca = RendezvousClient(identity: alice)
        var cb = RendezvousClient(identity: bob)
        _ = try cluster[1].connect(a, &ca)
        _ = try cluster[2].connect(b, &cb)
        cluster.settle()
        #expect(cluster[1].server.statistics.elsewhere == 1 && cluster[2].server.statistics.elsewhere == 1)

        let (lookupID, lookup) = cb.lookup(alice.publicKey)
        #expect(try cluster[2].request(b, lookup, &cb) == [.lookup(id: lookupID, key: alice.publicKey, online: true)])
        let offer = Array("offer".utf8)
        let (sendID, send) = try cb.send(offer, to: alice.publicKey)
        cluster[2].afterRecords = []
        #expect(try cluster[2].request(b, send, &cb) == [.sent(id: sendID)])
        // The acknowledgement waits for the signal's record.
        #expect(cluster[2].afterRecords.contains { if case .send(b, _) = $0 { true } else { false } })
        cluster.settle()
        #expect(try cluster[1].pump(a, &ca) == [.received(from: bob.publicKey, payload: offer)])
        let (_, back) = try ca.send(Array("answer".utf8), to: bob.publicKey)
        _ = try cluster[1].request(a, back, &ca)
        cluster.settle()
        #expect(try cluster[2].pump(b, &cb) == [.received(from: alice.publicKey, payload: Array("answer".utf8))])
        #expect(cluster[1].server.statistics.signalsOut == 1 && cluster[1].server.statistics.signalsIn == 1)

        // Alice leaves node 1: offline at node 2 (known, not unknown).
        cluster[1].feed(.closed(a))
        cluster.settle()
        let (gone, again) = try cb.send([1], to: alice.publicKey)
        #expect(
            try cluster[2].request(b, again, &cb).contains { if case .refused(.offline, _, gone) = $0 { true } else { false } })
    }

    /// Bob makes Alice a contact at node 2; Alice, at node 1 and with no stranger
    /// budget, reaches him there; Carol, a stranger, does not. When Bob removes her,
    /// node 1 refuses her too.
    @Test func contactsMadeAtOneNodeHoldAtTheOthers() throws {
        var cluster = Cluster(nodes: 2) { $0.strangerBurst = 0 }
        var ca = RendezvousClient(identity: alice)
        var cb = RendezvousClient(identity: bob)
        var cc = RendezvousClient(identity: carol)
        _ = try cluster[1].connect(a, &ca)
        _ = try cluster[2].connect(b, &cb)
        _ = try cluster[1].connect(c, &cc)
        let (_, add) = cb.changeContacts(add: [alice.publicKey])
        _ = try cluster[2].request(b, add, &cb)
        cluster.settle()
        let (sent, offer) = try ca.send([1], to: bob.publicKey)
        #expect(try cluster[1].request(a, offer, &ca) == [.sent(id: sent)])
        let (_, strange) = try cc.send([2], to: bob.publicKey)
        #expect(RendezvousContactsTests.isRateLimited(try cluster[1].request(c, strange, &cc)))
        cluster.settle()
        #expect(try cluster[2].pump(b, &cb) == [.received(from: alice.publicKey, payload: [1])])
        let (_, remove) = cb.changeContacts(remove: [alice.publicKey])
        _ = try cluster[2].request(b, remove, &cb)
        cluster.settle()
        let (_, again) = try ca.post([3], to: bob.publicKey)
        #expect(RendezvousContactsTests.isRateLimited(try cluster[1].request(a, again, &ca)))
    }

    /// A key's stranger and post budgets are the cluster's, not each node's: what it
    /// spent at node 1 is spent at node 2 when it moves there, where the strangers it
    /// reached stay free to reach again for the hour.
    @Test func aKeysBudgetsSpentAtOneNodeAreSpentAtTheOthers() throws {
        var cluster = Cluster(nodes: 2) {
            $0.strangerBurst = 2
            $0.strangersPerHour = 0.001
            $0.postBurst = 3
            $0.postsPerMinute = 0.001
        }
        let (x, y, z) = (PrivateKey.generate().publicKey, PrivateKey.generate().publicKey, PrivateKey.generate().publicKey)
        var ca = RendezvousClient(identity: alice)
        _ = try cluster[1].connect(a, &ca)
        for stranger in [x, y] {
            let (sent, post) = try ca.post([1], to: stranger)
            #expect(try cluster[1].request(a, post, &ca) == [.sent(id: sent)])
        }
        cluster.settle()
        // Alice moves to node 2 (her connection at node 1 is replaced).
        var moved = RendezvousClient(identity: alice)
        _ = try cluster[2].connect(b, &moved)
        cluster.settle()
        let (refused, third) = try moved.post([2], to: z)
        let answer = try cluster[2].request(b, third, &moved)
        #expect(answer.contains { if case .refused(.rateLimited, _, refused) = $0 { true } else { false } }, "\(answer)")
        // A stranger she reached at node 1 is free at node 2, from her post budget's last one...
        let (again, toX) = try moved.post([3], to: x)
        #expect(try cluster[2].request(b, toX, &moved) == [.sent(id: again)])
        // ...which node 2 counts with the two she spent at node 1: none left.
        let (spent, toY) = try moved.post([4], to: y)
        let last = try cluster[2].request(b, toY, &moved)
        #expect(last.contains { if case .refused(.rateLimited, _, spent) = $0 { true } else { false } }, "\(last)")
    }

    /// A reach read back in a resync and then heard as its notice (the listening
    /// connection was made between the two) is spent once. A node that has not yet
    /// read who is at the others forgets no contacts, and its timer does not spin.
    @Test func aReachHeardTwiceIsSpentOnceAndAnUnsyncedNodeWaits() throws {
        var cluster = Cluster(nodes: 1) {
            $0.strangerBurst = 2
            $0.strangersPerHour = 0.001
        }
        let (x, y, z) = (PrivateKey.generate().publicKey, PrivateKey.generate().publicKey, PrivateKey.generate().publicKey)
        let reach = RendezvousReach(from: alice.publicKey, to: x, unixSeconds: cluster[1].unix)
        cluster[1].feed(.restore(RendezvousSnapshot(contacts: [carol.publicKey: [bob.publicKey]]), unixSeconds: cluster[1].unix))
        // Ten minutes and more without a resync: the sweep waits, and is due again later, not now.
        cluster[1].now = cluster[1].now + .seconds(700)
        cluster[1].tick()
        #expect(cluster[1].server.nextDeadline.map { $0 > cluster[1].now } ?? true)
        #expect(!cluster[1].records.contains { if case .contacts = $0 { true } else { false } })
        cluster[1].feed(.clusterResync(RendezvousSnapshot(reaches: [reach]), presence: [:], unixSeconds: cluster[1].unix))
        cluster[1].feed(.cluster(.reached(reach), unixSeconds: cluster[1].unix))
        var ca = RendezvousClient(identity: alice)
        _ = try cluster[1].connect(a, &ca)
        let (one, toY) = try ca.post([1], to: y)
        #expect(try cluster[1].request(a, toY, &ca) == [.sent(id: one)], "one of two left")
        let (two, toZ) = try ca.post([2], to: z)
        let refused = try cluster[1].request(a, toZ, &ca)
        #expect(refused.contains { if case .refused(.rateLimited, _, two) = $0 { true } else { false } }, "\(refused)")
    }

    /// A stranger reached from another node answers freely there; a resync that read
    /// the database before this node's own latest change keeps that change.
    @Test func answersCrossNodesFreelyAndAResyncKeepsOwnChanges() throws {
        var cluster = Cluster(nodes: 2) {
            $0.strangerBurst = 1
            $0.strangersPerHour = 0.001
        }
        var ca = RendezvousClient(identity: alice)
        var cb = RendezvousClient(identity: bob)
        var cc = RendezvousClient(identity: carol)
        _ = try cluster[1].connect(a, &ca)
        _ = try cluster[2].connect(b, &cb)
        _ = try cluster[2].connect(c, &cc)
        cluster.settle()
        // Bob spends his stranger on Carol; Alice, at the other node, reaches Bob.
        let (_, toCarol) = try cb.send([1], to: carol.publicKey)
        _ = try cluster[2].request(b, toCarol, &cb)
        let (_, call) = try ca.send([2], to: bob.publicKey)
        _ = try cluster[1].request(a, call, &ca)
        cluster.settle()
        #expect(try cluster[2].pump(b, &cb).contains(.received(from: alice.publicKey, payload: [2])))
        let (answered, answer) = try cb.send([3], to: alice.publicKey)
        #expect(try cluster[2].request(b, answer, &cb) == [.sent(id: answered)])

        // Carol makes Alice a contact at node 2; a resync there reads a database
        // without it (not written yet): the change stands.
        let (_, add) = cc.changeContacts(add: [alice.publicKey])
        _ = try cluster[2].request(c, add, &cc)
        cluster[2].feed(.clusterResync(RendezvousSnapshot(), presence: [:], unixSeconds: cluster[2].unix))
        let (_, ask) = cc.changeContacts()
        #expect(
            try cluster[2].request(c, ask, &cc).contains { if case .contacts(_, [alice.publicKey]) = $0 { true } else { false } })
    }

    /// A post made at node 1 reaches its recipient online at node 2 at once, and
    /// one offline at the next login at any node; ids never collide; drops and
    /// expiry hold at every node.
    @Test func postsReachTheirRecipientsAtAnyNode() throws {
        var cluster = Cluster(nodes: 3) { $0.mailboxPerKey = 2 }
        var ca = RendezvousClient(identity: alice)
        var cb = RendezvousClient(identity: bob)
        _ = try cluster[1].connect(a, &ca)
        _ = try cluster[2].connect(b, &cb)
        cluster.settle()
        let (_, toBob) = try ca.post([1], to: bob.publicKey)
        _ = try cluster[1].request(a, toBob, &ca)
        cluster.settle()
        #expect(try cluster[2].pump(b, &cb) == [.received(from: alice.publicKey, payload: [1])])

        // Carol is offline: three posts from two nodes, the box holds two.
        for n: UInt8 in 2...3 {
            let (_, frame) = try ca.post([n], to: carol.publicKey)
            _ = try cluster[1].request(a, frame, &ca)
            cluster.settle()
        }
        let (_, fromBob) = try cb.post([4], to: carol.publicKey)
        _ = try cluster[2].request(b, fromBob, &cb)
        cluster.settle()
        let ids = cluster.nodes.flatMap { $0.records }.compactMap { if case .posted(let p) = $0 { p.id } else { nil } }
        #expect(Set(ids).count == ids.count, "\(ids)")
        #expect(ids.map(RendezvousCluster.node(ofPost:)) == [1, 1, 1, 2])
        // Node 2 pushed out the oldest of Carol's (node 1's [2]); every node holds the same.
        #expect(cluster.nodes.map { $0.server.statistics.posted } == [3, 3, 3])
        var cc = RendezvousClient(identity: carol)
        let heard = try cluster[3].connect(c, &cc).compactMap { if case .received(_, let p) = $0 { p } else { nil } }
        #expect(heard == [[3], [4]])

        // A day later every node has let them go.
        for i in 1...3 {
            cluster[i].now = cluster[i].now + .seconds(24 * 3600)
            cluster[i].tick()
        }
        #expect(cluster.nodes.map { $0.server.statistics.posted } == [0, 0, 0])
    }

    /// One key registered at two nodes (a client that moved): the later
    /// registration wins, the earlier connection is told it was replaced and closed,
    /// and the others send to the later one.
    @Test(arguments: [1, 2])
    func theLaterRegistrationOfAKeyWinsAcrossNodes(later: Int) throws {
        var cluster = Cluster(nodes: 3)
        let earlier = 3 - later
        var first = RendezvousClient(identity: alice)
        var second = RendezvousClient(identity: alice)
        _ = try cluster[earlier].connect(a, &first)
        cluster.settle()
        cluster[later].unix += 1
        _ = try cluster[later].connect(a, &second)
        cluster.settle()
        #expect(cluster[earlier].closed == [a])
        #expect(!cluster[later].closed.contains(a))
        #expect(
            try cluster[earlier].pump(a, &first).contains { if case .refused(.replaced, _, nil) = $0 { true } else { false } })
        // Bob at node 3 reaches her where she is now.
        var cb = RendezvousClient(identity: bob)
        _ = try cluster[3].connect(b, &cb)
        let (_, send) = try cb.send([5], to: alice.publicKey)
        _ = try cluster[3].request(b, send, &cb)
        cluster.settle()
        #expect(try cluster[later].pump(a, &second) == [.received(from: bob.publicKey, payload: [5])])
        #expect(cluster[earlier].server.isOnline(alice.publicKey))
    }

    /// Two registrations of one key made at once, each before its node heard of
    /// the other, replace each other; an announcement heard again (a node that
    /// says who is registered at it once more) replaces nothing.
    @Test func registrationsAtOnceReplaceEachOtherAndARepeatReplacesNothing() throws {
        var cluster = Cluster(nodes: 2)
        var first = RendezvousClient(identity: alice)
        var second = RendezvousClient(identity: alice)
        _ = try cluster[1].connect(a, &first)
        _ = try cluster[2].connect(a, &second)
        cluster.settle()
        #expect(cluster[1].closed == [a] && cluster[2].closed == [a])

        var ca = RendezvousClient(identity: alice)
        _ = try cluster[1].connect(b, &ca)
        cluster.settle()
        let unix = cluster[1].unix
        cluster[2].feed(.cluster(.online(alice.publicKey, ClusterPresence(node: 1, unixSeconds: unix)), unixSeconds: unix))
        var again = RendezvousClient(identity: alice)
        // Alice moves to node 2, which had heard of her at node 1: node 1's connection goes.
        _ = try cluster[2].connect(c, &again)
        cluster[2].feed(.cluster(.online(alice.publicKey, ClusterPresence(node: 1, unixSeconds: unix)), unixSeconds: unix))
        #expect(!cluster[2].closed.contains(c), "node 1's registration, heard again, is not a new one")
        cluster.settle()
        #expect(cluster[1].closed.contains(b) && !cluster[2].closed.contains(c))
    }

    /// After a gap in what the others said, the rows decide: a post made elsewhere
    /// in the gap is taken (and delivered to its recipient here), one dropped
    /// elsewhere in the gap is let go; this node's own posts stay.
    @Test func aResyncTakesAndDropsWhatTheGapHid() throws {
        var cluster = Cluster(nodes: 2)
        var cb = RendezvousClient(identity: bob)
        var ca = RendezvousClient(identity: alice)
        _ = try cluster[1].connect(b, &cb)
        _ = try cluster[2].connect(a, &ca)
        cluster.settle()
        // Node 2's posts for Carol reach node 1; node 1 posts one of its own.
        for n: UInt8 in 1...2 {
            let (_, frame) = try ca.post([n], to: carol.publicKey)
            _ = try cluster[2].request(a, frame, &ca)
        }
        cluster.settle()
        let (_, own) = try cb.post([3], to: carol.publicKey)
        _ = try cluster[1].request(b, own, &cb)
        let posts = cluster.nodes.flatMap { $0.records }.compactMap { if case .posted(let p) = $0 { p } else { nil } }
        #expect(cluster[1].server.statistics.posted == 3)
        // In the gap node 2 dropped its first and posted one for Bob; the rows say so.
        let forBob = RendezvousPost(
            id: RendezvousCluster.firstPostID(node: 2) + 10, to: bob.publicKey, from: alice.publicKey,
            sealed: try Sealing.seal([4], from: alice, to: bob.publicKey), unixSeconds: cluster[1].unix)
        let second = try #require(posts.first { $0.id == RendezvousCluster.firstPostID(node: 2) + 1 })
        let rows = RendezvousSnapshot(posts: [second, forBob])
        cluster[1].feed(
            .clusterResync(
                rows, presence: [alice.publicKey: ClusterPresence(node: 2, unixSeconds: cluster[1].unix)],
                unixSeconds: cluster[1].unix))
        #expect(cluster[1].server.statistics.posted == 3, "node 2's second, node 1's own, and Bob's")
        #expect(try cluster[1].pump(b, &cb) == [.received(from: alice.publicKey, payload: [4])])
        var cc = RendezvousClient(identity: carol)
        let heard = try cluster[1].connect(c, &cc).compactMap { if case .received(_, let p) = $0 { p } else { nil } }
        #expect(heard == [[2], [3]])
    }

    /// A node gone (stopped, or silent: its database says so) takes its keys with
    /// it: offline at the others. The presence read after a gap replaces what was known.
    @Test func aNodeGoneTakesItsKeysOfflineAndPresenceIsReadAfresh() throws {
        var cluster = Cluster(nodes: 2)
        var ca = RendezvousClient(identity: alice)
        var cb = RendezvousClient(identity: bob)
        _ = try cluster[1].connect(a, &ca)
        _ = try cluster[2].connect(b, &cb)
        cluster.settle()
        cluster[1].feed(.cluster(.nodeGone(2), unixSeconds: cluster[1].unix))
        #expect(!cluster[1].server.isOnline(bob.publicKey))
        let (gone, send) = try ca.send([1], to: bob.publicKey)
        #expect(
            try cluster[1].request(a, send, &ca).contains { if case .refused(.offline, _, gone) = $0 { true } else { false } })

        // Read afresh: Carol at node 3 and Bob back at node 2.
        let unix = cluster[1].unix
        cluster[1].feed(
            .clusterResync(
                RendezvousSnapshot(),
                presence: [
                    bob.publicKey: ClusterPresence(node: 2, unixSeconds: unix),
                    carol.publicKey: ClusterPresence(node: 3, unixSeconds: unix),
                ], unixSeconds: unix))
        #expect(cluster[1].server.isOnline(bob.publicKey) && cluster[1].server.isOnline(carol.publicKey))
        #expect(cluster[1].server.statistics.elsewhere == 2)
        cluster[1].feed(.clusterResync(RendezvousSnapshot(), presence: [:], unixSeconds: unix))
        #expect(!cluster[1].server.isOnline(carol.publicKey) && cluster[1].server.statistics.elsewhere == 0)
        // A signal for another node, or for a key not here, is dropped.
        cluster[1].feed(
            .cluster(
                .signal(ClusterSignal(to: alice.publicKey, node: 2, from: bob.publicKey, sealed: [1])),
                unixSeconds: unix))
        cluster[1].feed(
            .cluster(
                .signal(ClusterSignal(to: carol.publicKey, node: 1, from: bob.publicKey, sealed: [1])),
                unixSeconds: unix))
        #expect(try cluster[1].pump(a, &ca).isEmpty)
        #expect(cluster[1].server.statistics.signalsIn == 0)
    }

    /// A relay reporting to node 1 is where node 2 sends its peers too, until it
    /// leaves node 1 (or, with node 1 gone, until its last report is 6 s old).
    @Test func relaysReportingToOneNodeAreUsedByAll() throws {
        var cluster = Cluster(nodes: 2) { $0.relaySecret = "s3cret" }
        let relayKey = PrivateKey.generate()
        var relay = RendezvousClient(identity: relayKey)
        let r = ConnectionID(30)
        _ = try cluster[1].connect(r, &relay)
        let grant = PartyGrant(address: "127.0.0.9:3481", key: relayKey.publicKey.base64)
        relay.report(RelayLoad(party: grant, capacityBitsPerSecond: 100_000_000), secret: "s3cret")
        _ = try cluster[1].pump(r, &relay)
        cluster.settle()
        #expect(cluster[2].server.relayRegistry.live(now: cluster[2].now).map(\.key) == [relayKey.publicKey])
        var cb = RendezvousClient(identity: bob)
        guard case .registered(_, let party)? = try cluster[2].connect(b, &cb).first else {
            Issue.record("bob was not registered")
            return
        }
        #expect(party == grant)
        // The relay's connection to node 1 closes: node 2 stops placing on it at once.
        cluster[1].feed(.closed(r))
        cluster.settle()
        #expect(cluster[2].server.relayRegistry.live(now: cluster[2].now).isEmpty)
        // Reported again, then node 1 dies silently: node 2 lets it go 6 s after its last report.
        _ = try cluster[1].connect(ConnectionID(31), &relay)
        relay.report(RelayLoad(party: grant, capacityBitsPerSecond: 100_000_000), secret: "s3cret")
        _ = try cluster[1].pump(ConnectionID(31), &relay)
        cluster.settle()
        #expect(cluster[2].server.relayRegistry.live(now: cluster[2].now).count == 1)
        cluster[2].now = cluster[2].now + .seconds(6)
        #expect(cluster[2].server.relayRegistry.live(now: cluster[2].now).isEmpty)
    }

    /// Rooms placed by node 1 are reserved on their relay at node 2 too: node 2's
    /// next placement sees them, as node 1's own does. A registration alone
    /// reserves nothing: only a room about to be made does.
    @Test func placementsAtOneNodeAreReservedAtTheOthers() throws {
        var cluster = Cluster(nodes: 2) { $0.relaySecret = "s3cret" }
        let relayKey = PrivateKey.generate()
        var relay = RendezvousClient(identity: relayKey)
        _ = try cluster[1].connect(ConnectionID(30), &relay)
        let grant = PartyGrant(address: "127.0.0.9:3481", key: relayKey.publicKey.base64)
        relay.report(RelayLoad(party: grant, capacityBitsPerSecond: 100_000_000), secret: "s3cret")
        _ = try cluster[1].pump(ConnectionID(30), &relay)
        cluster.settle()
        let reservations = { (n: Int) in cluster[n].server.relayRegistry.relays[relayKey.publicKey]?.reservations.count ?? -1 }
        #expect(reservations(1) == 0 && reservations(2) == 0)
        var peers: [RendezvousClient] = []
        for n in 0..<3 {
            var peer = RendezvousClient(identity: .generate())
            _ = try cluster[1].connect(ConnectionID(UInt64(50 + n)), &peer)
            peers.append(peer)
        }
        cluster.settle()
        #expect(reservations(1) == 0 && reservations(2) == 0, "registrations reserve nothing")
        for n in 0..<3 {
            let asked = peers[n].place(now: .zero)
            let answer = try cluster[1].request(ConnectionID(UInt64(50 + n)), peers[n].takeWrites(), &peers[n])
            #expect(answer == [.located(id: asked, room: "", party: grant)], "\(answer)")
        }
        cluster.settle()
        #expect(reservations(1) == 3 && reservations(2) == 3, "node 1: \(reservations(1)), node 2: \(reservations(2))")
        let before = cluster[2].server.relayRegistry.relays[relayKey.publicKey]?.utilisation(now: cluster[2].now) ?? 0
        #expect(before > 0, "node 2 counts node 1's placements in the relay's use")
    }

    /// A room moved off its dead relay by node 1 is where node 2 sends its members
    /// too, also once its own relay is back (node 2 never saw it gone): one room
    /// stays one room, whichever node its members ask.
    @Test func aRoomMovedAtOneNodeIsWhereEveryNodeSendsItsMembers() throws {
        var cluster = Cluster(nodes: 2) { $0.relaySecret = "s3cret" }
        var relays: [(key: PrivateKey, client: RendezvousClient, grant: PartyGrant)] = []
        func report(_ n: Int) throws {
            relays[n].client.report(RelayLoad(party: relays[n].grant, capacityBitsPerSecond: 100_000_000), secret: "s3cret")
            _ = try cluster[1].pump(ConnectionID(UInt64(40 + n)), &relays[n].client)
        }
        for n in 0..<3 {
            let key = PrivateKey.generate()
            relays.append(
                (key, RendezvousClient(identity: key), PartyGrant(address: "127.0.0.\(n + 1):3481", key: key.publicKey.base64)))
            _ = try cluster[1].connect(ConnectionID(UInt64(40 + n)), &relays[n].client)
            try report(n)
        }
        cluster.settle()
        var ca = RendezvousClient(identity: alice)
        var cb = RendezvousClient(identity: bob)
        _ = try cluster[1].connect(a, &ca)
        _ = try cluster[2].connect(b, &cb)
        func locate(_ node: Int, _ id: ConnectionID, _ client: inout RendezvousClient, _ room: String) throws -> PartyGrant? {
            _ = client.locate(room: room, now: .zero)
            let events = try cluster[node].request(id, client.takeWrites(), &client)
            for case .located(_, _, let party) in events { return party }
            return nil
        }
        let room = RoomHome.roomPrefix(for: relays[0].key.publicKey) + "abcdefghijkm"
        #expect(try locate(2, b, &cb, room) == relays[0].grant)
        // Its relay's connection to node 1 closes; Alice (at node 1) is the first to ask.
        cluster[1].feed(.closed(ConnectionID(40)))
        cluster.settle()
        let moved = try #require(try locate(1, a, &ca, room))
        #expect(moved != relays[0].grant)
        cluster.settle()
        // The relay is back (restarted with its key) before Bob, at node 2, asks.
        _ = try cluster[1].connect(ConnectionID(40), &relays[0].client)
        try report(0)
        cluster.settle()
        #expect(cluster[2].server.relayRegistry.live(now: cluster[2].now).count == 3)
        #expect(try locate(2, b, &cb, room) == moved)
        #expect(try locate(1, a, &ca, room) == moved)
    }

    /// Two nodes move one room at once, seeing different relays live (a new relay's
    /// report has reached only node 2): each moves it to the heaviest relay it sees.
    /// Once each hears the other, both send its members to the same relay, the
    /// heavier of the two, and say so again to each other no more than once.
    @Test func twoNodesMovingOneRoomAtOnceAgreeOnOneRelay() throws {
        var cluster = Cluster(nodes: 2) { $0.relaySecret = "s3cret" }
        var relays: [(key: PrivateKey, client: RendezvousClient, grant: PartyGrant, node: Int)] = []
        func add(at node: Int) throws {
            let n = relays.count
            let key = PrivateKey.generate()
            relays.append(
                (
                    key, RendezvousClient(identity: key), PartyGrant(address: "127.0.0.\(n + 1):3481", key: key.publicKey.base64),
                    node
                ))
            _ = try cluster[node].connect(ConnectionID(UInt64(40 + n)), &relays[n].client)
            relays[n].client.report(RelayLoad(party: relays[n].grant, capacityBitsPerSecond: 100_000_000), secret: "s3cret")
            _ = try cluster[node].pump(ConnectionID(UInt64(40 + n)), &relays[n].client)
        }
        for _ in 0..<3 { try add(at: 1) }
        cluster.settle()
        // The room's own relay (0) goes; node 2 hears of it.
        cluster[1].feed(.closed(ConnectionID(40)))
        cluster.settle()
        // A fourth relay reports at node 2; node 1 has not heard of it yet.
        try add(at: 2)
        #expect(cluster[1].server.relayRegistry.live(now: cluster[1].now).count == 2)
        #expect(cluster[2].server.relayRegistry.live(now: cluster[2].now).count == 3)
        // A room of relay 0 whose heaviest relay is the new one: the nodes' choices differ.
        let prefix = RoomHome.roomPrefix(for: relays[0].key.publicKey)
        let room = try #require(
            (0..<500).lazy.map { prefix + String(format: "%012d", $0) }.first { room in
                let weights = relays[1...].map { RoomHome.weight(room: room, relay: $0.key.publicKey) }
                return weights[2] > weights[0] && weights[2] > weights[1]
            })
        var ca = RendezvousClient(identity: alice)
        var cb = RendezvousClient(identity: bob)
        _ = try cluster[1].connect(a, &ca)
        _ = try cluster[2].connect(b, &cb)
        func locate(_ node: Int, _ id: ConnectionID, _ client: inout RendezvousClient) throws -> PartyGrant? {
            _ = client.locate(room: room, now: .zero)
            let events = try cluster[node].request(id, client.takeWrites(), &client)
            for case .located(_, _, let party) in events { return party }
            return nil
        }
        let atNode1 = try #require(try locate(1, a, &ca))
        let atNode2 = try #require(try locate(2, b, &cb))
        #expect(atNode2 == relays[3].grant)
        #expect(atNode1 != atNode2)
        let before = [cluster[1].records.count, cluster[2].records.count]
        cluster.settle()
        let moves = Array(cluster[1].records.dropFirst(before[0])) + Array(cluster[2].records.dropFirst(before[1]))
        #expect(try locate(1, a, &ca) == relays[3].grant)
        #expect(try locate(2, b, &cb) == relays[3].grant)
        let told = moves.filter { if case .roomMoved = $0 { true } else { false } }.count
        #expect(told == 1, "node 2's heavier move told again, once: \(told)")
    }

    /// Every notice a node sends reads back the same; what is not one is a typed error.
    @Test func clusterNoticesRoundTripAndBadOnesAreTypedErrors() throws {
        let key = alice.publicKey
        let post = RendezvousPost(id: 1 << 40 | 7, to: key, from: bob.publicKey, sealed: [1, 2, 3], unixSeconds: 99)
        let bodies: [ClusterNotice.Body] = [
            .event(.online(key, ClusterPresence(node: 3, unixSeconds: 1_800_000_000))), .event(.offline(key, node: 3)),
            .event(.signal(ClusterSignal(to: key, node: 2, from: bob.publicKey, sealed: [9, 8]))), .event(.posted(post)),
            .event(.dropped([1, 2, 1 << 41])), .event(.nodeGone(4)), .signalRow(12, node: 2), .postRow(1 << 40 | 7),
            .event(
                .relayLoad(
                    bob.publicKey,
                    RelayLoad(
                        party: PartyGrant(address: "127.0.0.9:3481", key: key.base64), turnURIs: ["turn:127.0.0.9:3478"],
                        capacityBitsPerSecond: 1_000_000))),
            .event(.relayGone(bob.publicKey)), .event(.roomMoved(room: "x7kq-abcdefghijkm", relay: bob.publicKey)),
            .event(.contacts(owner: key, add: [bob.publicKey], remove: [])),
            .event(.contacts(owner: key, add: [], remove: [key])),
            .event(.placed(relay: bob.publicKey)),
            .event(.reached(RendezvousReach(from: key, to: bob.publicKey, unixSeconds: 1_800_000_000))),
            .event(
                .party(
                    RendezvousParty(
                        listing: PartyListing(
                            room: "x7kq-abcdefghijkm", name: "Hearthstone", creator: key, maxMembers: 50,
                            members: [key, bob.publicKey], invited: [carol.publicKey]),
                        relay: bob.publicKey, unixSeconds: 1_800_000_000))),
            .event(.partyClosed(room: "x7kq-abcdefghijkm", relay: bob.publicKey)),
        ]
        for body in bodies {
            let notice = ClusterNotice(origin: 5, body)
            #expect(try ClusterNotice(decoding: notice.encode()) == notice)
        }
        for bad in [
            "", "{", "[]", #"{"origin":1}"#, #"{"v":1,"origin":1,"type":"warp"}"#,
            #"{"v":2,"origin":1,"type":"node-gone","node":1}"#,
            #"{"v":1,"origin":1,"type":"online","key":"AAAA","node":1,"at":5}"#, #"{"v":1,"origin":1,"type":"offline"}"#,
            #"{"v":1,"origin":-1,"type":"node-gone","node":1}"#,
            #"{"v":1,"origin":1,"type":"room-moved","key":"\#(bob.publicKey.base64)"}"#,
            #"{"v":1,"origin":1,"type":"room-moved","room":"","key":"\#(bob.publicKey.base64)"}"#,
            #"{"v":1,"origin":1,"type":"contacts","key":"\#(bob.publicKey.base64)","add":["AAAA"]}"#,
            #"{"v":1,"origin":1,"type":"reached","from":"\#(bob.publicKey.base64)","at":5}"#,
            #"{"v":1,"origin":1,"type":"party","key":"\#(bob.publicKey.base64)","at":5}"#,
            #"{"v":1,"origin":1,"type":"party","key":"\#(bob.publicKey.base64)","at":5,"party":{"room":"r","name":"n","creator":"AAAA","maxMembers":2,"memberCount":0,"members":[],"invited":[]}}"#,
            #"{"v":1,"origin":1,"type":"party-closed"}"#,
        ] {
            #expect(throws: RendezvousError.self, "\(bad)") { try ClusterNotice(decoding: bad) }
        }
    }
}
