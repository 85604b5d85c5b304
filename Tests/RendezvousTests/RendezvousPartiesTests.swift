import Foundation
import Secure
import Testing
import TusaBase

@testable import Rendezvous

/// A relay of the directory on a virtual network: it registers, reports its load and lists its rooms.
private struct ListingRelay {
    let key = PrivateKey.generate()
    var client: RendezvousClient
    let grant: PartyGrant
    var connection: ConnectionID

    init(_ n: Int, connection: ConnectionID) {
        client = RendezvousClient(identity: key)
        grant = PartyGrant(address: "127.0.0.\(n):3481", key: key.publicKey.base64)
        self.connection = connection
    }

    /// Connects (again, on `connection` when given) and reports its load.
    mutating func connect(_ net: inout Net, on connection: ConnectionID? = nil) throws {
        if let connection { self.connection = connection }
        client = RendezvousClient(identity: key)
        _ = try net.connect(self.connection, &client)
        report(&net)
    }

    mutating func report(_ net: inout Net) {
        client.report(RelayLoad(party: grant, capacityBitsPerSecond: 100_000_000), secret: "s3cret")
        _ = try? net.pump(connection, &client)
    }

    mutating func list(_ net: inout Net, _ rooms: RelayRooms, secret: String = "s3cret") throws {
        client.report(rooms, secret: secret)
        _ = try net.pump(connection, &client)
    }
}

/// The directory's parties on a virtual clock: relays list their rooms, users ask
/// which they may see, and rooms go when their relay says, forgets them, or dies.
@Suite("Rendezvous parties") struct RendezvousPartiesTests {
    let alice = PrivateKey.generate(), bob = PrivateKey.generate(), carol = PrivateKey.generate()
    let dave = PrivateKey.generate(), eve = PrivateKey.generate()

    static func directory() -> Net {
        var configuration = RendezvousServerConfiguration()
        configuration.relaySecret = "s3cret"
        return Net(configuration)
    }

    func listing(_ room: String, _ name: String, members: [PrivateKey], invited: [PrivateKey] = []) -> PartyListing {
        PartyListing(
            room: room, name: name, creator: alice.publicKey, maxMembers: 50, members: members.map(\.publicKey),
            invited: invited.map(\.publicKey))
    }

    /// The rooms `key` sees, by id, with where each is; nil when the answer was not a list.
    static func parties(_ net: inout Net, _ id: ConnectionID, _ client: inout RendezvousClient) throws -> [String: PartyGrant?]? {
        let asked = client.parties(now: .zero)
        let frame = client.takeWrites()
        for event in try net.request(id, frame, &client) {
            if case .parties(let answered, let entries, more: false) = event, answered == asked {
                return Dictionary(entries.map { ($0.listing.room, $0.party) }, uniquingKeysWith: { a, _ in a })
            }
        }
        return nil
    }

    /// A relay lists an open room and an invite-only one. Each key sees what it may:
    /// members and invited keys their rooms, the creator's contacts (friends) its open
    /// room only, a stranger nothing; each with the relay that hosts it. A report
    /// whose proof is not the directory's secret, or that names a bad key, changes
    /// nothing and closes the connection; a room the relay closes is gone.
    @Test func eachKeySeesItsOwnInvitedAndFriendsOpenRoomsOnly() throws {
        var net = Self.directory()
        var relay = ListingRelay(1, connection: ConnectionID(40))
        try relay.connect(&net)
        let open = listing("abcd-hearthstone", "Hearthstone", members: [alice, bob])
        let raid = listing("abcd-raid", "Raid", members: [alice], invited: [carol])
        try relay.list(&net, RelayRooms(open: [open, raid], complete: true))
        #expect(net.records.filter { if case .party = $0 { true } else { false } }.count == 2, "\(net.records)")
        var clients = [alice, bob, carol, dave, eve].map { RendezvousClient(identity: $0) }
        for i in clients.indices { _ = try net.connect(ConnectionID(UInt64(i + 1)), &clients[i]) }
        // Alice makes Dave a contact (a friend): he sees her open room, not her invite-only one.
        let changed = clients[0].changeContacts(add: [dave.publicKey], remove: [], now: .zero)
        #expect(
            try net.request(ConnectionID(1), clients[0].takeWrites(), &clients[0]).contains(
                .contacts(id: changed, keys: [dave.publicKey])))
        let seen = try clients.indices.map { i in try Self.parties(&net, ConnectionID(UInt64(i + 1)), &clients[i]) }
        let both: [String: PartyGrant?] = ["abcd-hearthstone": relay.grant, "abcd-raid": relay.grant]
        #expect(seen[0] == both, "the creator sees both")
        #expect(seen[1] == ["abcd-hearthstone": relay.grant], "a member sees its room")
        #expect(seen[2] == ["abcd-raid": relay.grant], "an invited key sees the room it is invited to")
        #expect(seen[3] == ["abcd-hearthstone": relay.grant], "a friend sees the open room only")
        #expect(seen[4] == [:], "a stranger sees nothing")
        // The listing comes back as the relay gave it.
        let asked = clients[1].parties(now: .zero)
        let answer = try net.request(ConnectionID(2), clients[1].takeWrites(), &clients[1])
        #expect(answer == [.parties(id: asked, [PartyEntry(listing: open, party: relay.grant)], more: false)])

        // A forged report (another secret) is refused and closes the connection; nothing changes.
        var forger = ListingRelay(2, connection: ConnectionID(41))
        try forger.connect(&net)
        try forger.list(&net, RelayRooms(closed: ["abcd-hearthstone"]), secret: "guess")
        #expect(net.closed.contains(ConnectionID(41)))
        // A listing with a bad key is left out (counted as malformed), the rest of its report taken.
        var bad = listing("abcd-bad", "Bad", members: [alice])
        bad.creator = "AAAA"
        var careless = ListingRelay(3, connection: ConnectionID(42))
        try careless.connect(&net)
        let malformed = net.server.statistics.refused[.malformed] ?? 0
        try careless.list(&net, RelayRooms(open: [bad, listing("abcd-good", "Good", members: [alice], invited: [carol])]))
        #expect(!net.closed.contains(ConnectionID(42)))
        #expect(net.server.statistics.refused[.malformed] == malformed + 1)
        #expect(try Self.parties(&net, ConnectionID(1), &clients[0]) == both.merging(["abcd-good": careless.grant]) { a, _ in a })
        try careless.list(&net, RelayRooms(closed: ["abcd-good"]))
        #expect(try Self.parties(&net, ConnectionID(1), &clients[0]) == both)
        // Another relay cannot close a room it does not host.
        var other = ListingRelay(4, connection: ConnectionID(43))
        try other.connect(&net)
        try other.list(&net, RelayRooms(closed: ["abcd-raid"], complete: true))
        #expect(try Self.parties(&net, ConnectionID(1), &clients[0]) == both)
        // Bob leaves, the raid closes: the creator's list says so.
        try relay.list(
            &net, RelayRooms(open: [listing("abcd-hearthstone", "Hearthstone", members: [alice])], closed: ["abcd-raid"]))
        #expect(net.records.last == .partyClosed(room: "abcd-raid", relay: relay.key.publicKey))
        #expect(try Self.parties(&net, ConnectionID(1), &clients[0]) == ["abcd-hearthstone": relay.grant])
        #expect(try Self.parties(&net, ConnectionID(2), &clients[1]) == [:], "Bob left")
        // Alice drops Dave from her contacts: her open room is no longer his to see.
        _ = clients[0].changeContacts(add: [], remove: [dave.publicKey], now: .zero)
        _ = try net.request(ConnectionID(1), clients[0].takeWrites(), &clients[0])
        #expect(try Self.parties(&net, ConnectionID(4), &clients[3]) == [:])
    }

    /// A key's own rooms and those it is in or invited to come before its friends'
    /// open rooms, whatever their names: a friend's rooms never push them out of an answer.
    @Test func aKeysOwnRoomsComeBeforeItsFriends() throws {
        var net = Self.directory()
        var relay = ListingRelay(1, connection: ConnectionID(40))
        try relay.connect(&net)
        let zebra = PartyListing(
            room: "abcd-zebra", name: "Zebra", creator: carol.publicKey, maxMembers: 50, members: [carol.publicKey],
            invited: [bob.publicKey])
        let friends = (0..<3).map { listing("abcd-a\($0)", "Aardvark \($0)", members: [alice]) }
        try relay.list(&net, RelayRooms(open: friends + [zebra], complete: true))
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(ConnectionID(1), &ca)
        _ = ca.changeContacts(add: [bob.publicKey], remove: [], now: .zero)
        _ = try net.request(ConnectionID(1), ca.takeWrites(), &ca)
        var cb = RendezvousClient(identity: bob)
        _ = try net.connect(ConnectionID(2), &cb)
        let asked = cb.parties(now: .zero)
        let answer = try net.request(ConnectionID(2), cb.takeWrites(), &cb)
        guard case .parties(asked, let entries, more: false)? = answer.first else {
            Issue.record("\(answer)")
            return
        }
        #expect(entries.map(\.listing.room) == ["abcd-zebra", "abcd-a0", "abcd-a1", "abcd-a2"])
    }

    /// A relay's whole list comes at once on each connection, past any user's pace
    /// (hundreds of reports), and taken whole; listed again unchanged (a reconnect),
    /// nothing is written again. A relay whose room's members followed it to another
    /// relay does not take the room back by listing what it has left, nor close it there.
    @Test func aLongListIsTakenWholeAndAnUnchangedOneWritesNothing() throws {
        var net = Self.directory()
        var relay = ListingRelay(1, connection: ConnectionID(40))
        try relay.connect(&net)
        let many = (0..<3000).map { n in
            PartyListing(
                room: "abcd-room\(n)", name: "Room \(n)", creator: alice.publicKey, maxMembers: 50,
                members: (0..<40).map { _ in PrivateKey.generate().publicKey }, invited: [])
        }
        let reports = RelayRooms.reports(open: many, closed: [], complete: true)
        #expect(reports.count > 150, "\(reports.count) reports")
        for report in reports { relay.client.report(report, secret: "s3cret") }
        _ = try net.pump(relay.connection, &relay.client)
        #expect(!net.closed.contains(relay.connection), "the relay was cut off")
        #expect(net.server.parties.count == 3000)
        let written = net.records.count
        net.feed(.closed(relay.connection))
        try relay.connect(&net, on: ConnectionID(41))
        for report in reports { relay.client.report(report, secret: "s3cret") }
        _ = try net.pump(relay.connection, &relay.client)
        #expect(net.server.parties.count == 3000)
        #expect(!net.records[written...].contains { if case .party = $0 { true } else { false } }, "rewritten")

        // The room's members follow it to another relay, which lists it; the first
        // relay, live, still lists the member it has left, then closes it: the room stays on the second.
        var second = ListingRelay(2, connection: ConnectionID(42))
        try second.connect(&net)
        let room = "\(RoomHome.roomPrefix(for: relay.key.publicKey))abcdefghijkm"
        let home = PartyListing(
            room: room, name: "Moved", creator: alice.publicKey, maxMembers: 50, members: [alice.publicKey, bob.publicKey],
            invited: [])
        try relay.list(&net, RelayRooms(open: [home]))
        net.feed(.cluster(.roomMoved(room: room, relay: second.key.publicKey), unixSeconds: net.unix))
        var there = home
        there.members = [alice.publicKey.base64]
        try second.list(&net, RelayRooms(open: [there], complete: true))
        var left = home
        left.members = [bob.publicKey.base64]
        try relay.list(&net, RelayRooms(open: [left]))
        try relay.list(&net, RelayRooms(closed: [room]))
        #expect(net.server.parties.rows[room]?.party.relay == second.key.publicKey)
        #expect(net.server.parties.rows[room]?.party.listing.members == [alice.publicKey.base64])
    }

    /// A relay that connects again lists all its rooms: one it held before and does
    /// not list is gone (it restarted without it), but not before the list is
    /// complete. Rooms of a relay that died stay listed a minute (without a place:
    /// the directory does not place a room to answer a list); one another relay
    /// lists in that time is that relay's; the others go. A restarted directory
    /// lists what its store kept.
    @Test func roomsGoWhenTheirRelayForgetsThemOrIsGoneAMinute() throws {
        var net = Self.directory()
        var relay = ListingRelay(1, connection: ConnectionID(40))
        try relay.connect(&net)
        let rooms = ["abcd-first", "abcd-second", "abcd-third"].map { listing($0, "Valheim", members: [alice]) }
        try relay.list(&net, RelayRooms(open: rooms, complete: true))
        var ca = RendezvousClient(identity: alice)
        _ = try net.connect(ConnectionID(1), &ca)
        #expect(try Self.parties(&net, ConnectionID(1), &ca)?.count == 3)
        // Connected again: the first report of its list leaves everything; the complete list drops the second.
        net.feed(.closed(ConnectionID(40)))
        try relay.connect(&net, on: ConnectionID(44))
        try relay.list(&net, RelayRooms(open: [rooms[0]]))
        #expect(try Self.parties(&net, ConnectionID(1), &ca)?.count == 3)
        try relay.list(&net, RelayRooms(open: [rooms[2]], complete: true))
        #expect(Set(try Self.parties(&net, ConnectionID(1), &ca)?.keys ?? [:].keys) == ["abcd-first", "abcd-third"])
        #expect(net.records.last == .partyClosed(room: "abcd-second", relay: relay.key.publicKey))
        // A connection lost halfway through its list takes nothing for gone.
        net.feed(.closed(ConnectionID(44)))
        try relay.connect(&net, on: ConnectionID(45))
        try relay.list(&net, RelayRooms(open: [rooms[0]]))
        net.feed(.closed(ConnectionID(45)))
        try relay.connect(&net, on: ConnectionID(46))
        try relay.list(&net, RelayRooms(open: [rooms[0], rooms[2]], complete: true))
        #expect(try Self.parties(&net, ConnectionID(1), &ca)?.count == 2)
        // Connected again (its new registration replaces the old connection, whose close
        // the driver reports late): the new list ends as it says, the relay live.
        try relay.list(&net, RelayRooms(open: [listing("abcd-fourth", "Valheim", members: [alice])]))
        #expect(try Self.parties(&net, ConnectionID(1), &ca)?.count == 3)
        try relay.connect(&net, on: ConnectionID(48))
        try relay.list(&net, RelayRooms(open: [rooms[0]]))
        net.feed(.closed(ConnectionID(46)))
        try relay.list(&net, RelayRooms(open: [rooms[2]], complete: true))
        #expect(Set(try Self.parties(&net, ConnectionID(1), &ca)?.keys ?? [:].keys) == ["abcd-first", "abcd-third"])

        // It dies (its connection closes): listed without a place; another relay lists the third room.
        var other = ListingRelay(2, connection: ConnectionID(47))
        try other.connect(&net)
        net.feed(.closed(ConnectionID(48)))
        #expect(try Self.parties(&net, ConnectionID(1), &ca) == ["abcd-first": nil, "abcd-third": nil])
        net.now = net.now + .seconds(30)
        other.report(&net)
        try other.list(&net, RelayRooms(open: [listing("abcd-third", "Valheim", members: [alice, bob])], complete: true))
        net.tick()
        #expect(try Self.parties(&net, ConnectionID(1), &ca) == ["abcd-first": nil, "abcd-third": other.grant])
        net.now = net.now + .seconds(31)
        other.report(&net)
        net.tick()
        #expect(try Self.parties(&net, ConnectionID(1), &ca) == ["abcd-third": other.grant])
        #expect(net.records.last == .partyClosed(room: "abcd-first", relay: relay.key.publicKey))

        // A directory started again on what its store kept lists the rooms at once.
        let kept = net.records.compactMap { if case .party(let p) = $0 { p } else { nil } }.filter {
            $0.listing.room == "abcd-third" && $0.relay == other.key.publicKey
        }
        var restarted = Self.directory()
        restarted.feed(.restore(RendezvousSnapshot(parties: Array(kept.suffix(1))), unixSeconds: restarted.unix))
        // Its rooms are looked at for their relays' going, with nothing else due.
        #expect(restarted.server.nextDeadline.map { $0 <= restarted.now + RendezvousServer.partySweep } == true)
        var again = RendezvousClient(identity: bob)
        _ = try restarted.connect(ConnectionID(2), &again)
        #expect(try Self.parties(&restarted, ConnectionID(2), &again) == ["abcd-third": nil])
    }

    /// A relay's own rendezvous lists that relay's rooms (as the relay gives them,
    /// in process), placed there; a relay's own rendezvous without parties lists none.
    @Test func aRelaysOwnRendezvousListsItsOwnRooms() throws {
        let relay = PrivateKey.generate()
        var configuration = RendezvousServerConfiguration()
        configuration.party = PartyGrant(address: "127.0.0.1:3481", key: relay.publicKey.base64)
        var net = Net(configuration)
        var cb = RendezvousClient(identity: bob)
        _ = try net.connect(ConnectionID(2), &cb)
        let rooms = ["room-one", "room-two"].map { listing($0, "Factorio", members: [alice, bob]) }
        net.feed(.localRooms(RelayRooms(open: rooms, complete: true), unixSeconds: net.unix))
        #expect(
            try Self.parties(&net, ConnectionID(2), &cb) == ["room-one": configuration.party, "room-two": configuration.party])
        // A minute on, its rooms are still its own (the relay this rendezvous runs in is never down).
        net.now = net.now + .seconds(80)
        net.tick()
        net.feed(.localRooms(RelayRooms(closed: ["room-two"]), unixSeconds: net.unix))
        #expect(try Self.parties(&net, ConnectionID(2), &cb) == ["room-one": configuration.party])
        var none = Net()
        _ = try none.connect(ConnectionID(2), &cb)
        none.feed(.localRooms(RelayRooms(open: rooms, complete: true), unixSeconds: none.unix))
        #expect(try Self.parties(&none, ConnectionID(2), &cb) == [:])
    }

    /// A room listed at one node of a cluster is seen at the others; closed, gone at all.
    @Test func aRoomListedAtOneNodeIsSeenAtTheOthers() throws {
        var one = Self.directory()
        var two = Self.directory()
        var relay = ListingRelay(1, connection: ConnectionID(40))
        try relay.connect(&one)
        let room = listing("abcd-lobby", "Lobby", members: [alice, bob])
        try relay.list(&one, RelayRooms(open: [room], complete: true))
        guard case .party(let party)? = one.records.last else {
            Issue.record("no party recorded: \(one.records)")
            return
        }
        two.feed(.cluster(.party(party), unixSeconds: two.unix))
        var cb = RendezvousClient(identity: bob)
        _ = try two.connect(ConnectionID(2), &cb)
        #expect(try Self.parties(&two, ConnectionID(2), &cb)?.keys.sorted() == ["abcd-lobby"])
        // Closed by another relay (an old host's word, late): it stays; by its own, it goes.
        two.feed(.cluster(.partyClosed(room: "abcd-lobby", relay: bob.publicKey), unixSeconds: two.unix))
        #expect(try Self.parties(&two, ConnectionID(2), &cb)?.keys.sorted() == ["abcd-lobby"])
        two.feed(.cluster(.partyClosed(room: "abcd-lobby", relay: relay.key.publicKey), unixSeconds: two.unix))
        #expect(try Self.parties(&two, ConnectionID(2), &cb) == [:])
    }

    /// A relay's whole list goes in reports that each fit a frame, the last one
    /// complete; an empty whole list is one complete report; a change, one report.
    @Test func aLongListIsCutIntoReportsThatFitAFrame() throws {
        let many = (0..<300).map { n in
            PartyListing(
                room: "abcd-room\(n)", name: "Room \(n)", creator: alice.publicKey, maxMembers: 50,
                members: (0..<20).map { _ in PrivateKey.generate().publicKey }, invited: [])
        }
        let reports = RelayRooms.reports(open: many, closed: ["abcd-gone"], complete: true)
        #expect(reports.count > 10)
        #expect(reports.flatMap(\.open) == many && reports.flatMap(\.closed) == ["abcd-gone"])
        #expect(reports.map(\.complete) == Array(repeating: false, count: reports.count - 1) + [true])
        for report in reports {
            let frame = RendezvousFrame.frame(.rooms(report, proof: [UInt8](repeating: 1, count: 32)))
            #expect(frame.count - 2 <= RendezvousFrame.maximumLength, "a report of \(frame.count) bytes")
        }
        #expect(RelayRooms.reports(open: [], closed: [], complete: true) == [RelayRooms(complete: true)])
        #expect(RelayRooms.reports(open: [], closed: [], complete: false) == [])
        #expect(RelayRooms.reports(open: [many[0]], closed: [], complete: false) == [RelayRooms(open: [many[0]])])
        // A room of 10,000 members is named by its first members only.
        let crowd = PartyListing(
            room: "abcd-crowd", name: "Crowd", creator: alice.publicKey, maxMembers: 10_000,
            members: (0..<200).map { _ in PrivateKey.generate().publicKey }, invited: [])
        #expect(crowd.memberCount == 200 && crowd.members.count == PartyListing.shownMembers)
        #expect(throws: Never.self) { try crowd.checked() }
    }
}
