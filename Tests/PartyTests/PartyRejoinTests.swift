import Foundation
import Party
import Secure
import Testing
import TusaBase

/// Members who lose their session with the relay (a network change, a relay
/// restart) and come back on their own, keeping their seats and their keys.
@Suite("Party rejoins")
struct PartyRejoinTests {
    private let speech: [UInt8] = Array(repeating: 0x33, count: 40)

    private func epoch(_ h: PartyHarness, _ s: PartySession) -> UInt16? { h.members[s]?.keyring.current?.id.epoch }
    private func phase(_ h: PartyHarness, _ s: PartySession) -> String { String(describing: h.members[s]?.phase) }

    private func lost(_ events: [PartyMemberEvent]?) -> Bool {
        (events ?? []).contains { if case .connectionLost = $0 { true } else { false } }
    }

    private func rejoined(_ events: [PartyMemberEvent]?) -> [MemberID] {
        (events ?? []).compactMap { if case .rejoined(_, _, let me, _) = $0 { me } else { nil } }
    }

    @Test func aRestartedRelayTakesItsMembersBackWithTheirSeatsAndKeys() throws {
        var h = PartyHarness()
        let members = [alice, bob, carol]
        for s in members { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob, carol]))
        let ids = try members.map { try unwrap(h.id($0)) }
        // Everyone past the first key (Dave came and went), so "kept" cannot mean "epoch 0 again".
        h.connect(dave)
        h.input(dave, .join(room: room))
        h.input(dave, .leave)
        h.advance(by: .milliseconds(100))
        let before = members.map { epoch(h, $0) }
        #expect(before.allSatisfy { $0 == 1 })

        h.restartRelay()
        // Silence from the relay: each member pings, then gives the session up.
        h.advance(by: .milliseconds(1800))
        for s in members { #expect(!lost(h.events[s])) }
        h.advance(by: .milliseconds(300))
        for s in members {
            #expect(lost(h.events[s]))
            guard case .rejoining(room, _, _, _)? = h.members[s]?.phase else {
                Issue.record("\(s) is \(phase(h, s))")
                continue
            }
        }
        for s in members { h.reconnect(s) }

        let restored = try #require(h.server.rooms[room])
        #expect(restored.name == "Hearthstone")
        #expect(restored.creator == h.identities[alice]?.publicKey)
        #expect(restored.members.count == 3)
        #expect(h.serverEvents.filter { if case .roomRestored = $0 { true } else { false } }.count == 1)
        for (s, id) in zip(members, ids) {
            #expect(h.id(s) == id, "\(s) keeps its seat")
            #expect(rejoined(h.events[s]) == [id])
        }
        #expect(members.map { epoch(h, $0) } == before, "no fresh keys: the members kept theirs")
        for (s, id) in zip(members, ids) {
            h.speak(s, speech)
            for other in members where other != s {
                #expect(h.heard(other, from: id).last == speech, "\(other) hears \(id) again")
            }
        }
        for s in members { #expect(h.dropped(s).isEmpty, "\(h.dropped(s))") }
    }

    @Test func aMemberWhoseSessionDiesTakesItsSeatBackOnANewOne() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob, carol]))
        let bobID = try unwrap(h.id(bob))
        let bobEpoch = epoch(h, bob)
        // Bob's session dies (a new network); the relay tells the others he left.
        h.disconnect(bob)
        guard case .rejoining? = h.members[bob]?.phase else {
            Issue.record("bob is \(phase(h, bob))")
            return
        }
        #expect(h.server.rooms[room]?.members.count == 2)
        // His client handshakes again from elsewhere and rejoins.
        let again = PartySession(22)
        h.reconnect(bob, as: again)
        #expect(h.id(again) == bobID)
        #expect(epoch(h, again) == bobEpoch)
        h.advance(by: .seconds(1))
        h.speak(again, speech)
        #expect(h.heard(alice, from: bobID).last == speech)
        #expect(h.heard(carol, from: bobID).last == speech)
        let aliceID = try unwrap(h.id(alice))
        h.speak(alice, speech)
        #expect(h.heard(again, from: aliceID).last == speech)
    }

    /// While the relay is short of memory it takes no new room and no new member,
    /// with a refusal saying why, and the members it has go on: they speak, and one
    /// whose session died takes its seat back. Once memory is back, rooms are made again.
    @Test func shortOfMemoryRefusesNewRoomsAndJoinsAndKeepsWhatIs() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol, dave] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob]))
        h.server.handle(.memoryShort(true), now: h.now)
        h.input(carol, .create(name: "Dota", maxMembers: nil, invite: []))
        #expect(h.refusals(carol) == [.tooManyRooms])
        h.input(dave, .join(room: room))
        #expect(h.refusals(dave) == [.full])
        #expect(h.server.rooms.count == 1)
        #expect(h.server.rooms[room]?.members.count == 2)
        // Bob's session dies and comes back: a member coming back is not new work.
        let bobID = try unwrap(h.id(bob))
        h.disconnect(bob)
        let again = PartySession(22)
        h.reconnect(bob, as: again)
        #expect(h.id(again) == bobID)
        h.advance(by: .seconds(1))
        h.speak(again, speech)
        #expect(h.heard(alice, from: bobID).last == speech)
        // Memory back: the refused are taken.
        h.server.handle(.memoryShort(false), now: h.now)
        h.input(dave, .join(room: room))
        #expect(h.members[dave]?.room == room)
        h.input(carol, .create(name: "Dota", maxMembers: nil, invite: []))
        #expect(h.members[carol]?.room != nil)
        #expect(h.server.rooms.count == 2)
    }

    /// The relay restarts (Bob is back in the rebuilt room before Alice, the
    /// creator), then Bob is frozen long enough to give the relay up, and comes back
    /// on a new session, which replaces his old one (Alice sees him leave, rekeys, and
    /// sees him join): Alice hears him again (the sequence `make soak`'s faults case plays).
    @Test func aMemberFrozenAfterARelayRestartIsHeardAgainWhenItComesBack() throws {
        var h = PartyHarness()
        for s in [alice, bob] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob]))
        let bobID = try unwrap(h.id(bob))
        h.restartRelay()
        h.advance(by: .milliseconds(2100))
        #expect(lost(h.events[alice]) && lost(h.events[bob]))
        h.reconnect(bob)
        h.advance(by: .milliseconds(200))
        h.reconnect(alice)
        h.advance(by: .seconds(2))
        h.speak(bob, speech)
        #expect(h.heard(alice, from: bobID).last == speech, "Alice hears Bob after the restart")

        var frozen = true
        h.deliverTo = { s, _ in !(frozen && s == bob) }
        h.acceptFrom = { s, _ in !(frozen && s == bob) }
        h.advance(by: .seconds(15))
        #expect(lost(h.events[bob]))
        frozen = false
        h.reconnect(bob)
        #expect(h.id(bob) == bobID)
        #expect(h.server.rooms[room]?.members.count == 2)
        let left = (h.events[alice] ?? []).contains { if case .memberLeft(bobID, .disconnected) = $0 { true } else { false } }
        #expect(left, "Alice saw Bob's old session go")
        h.advance(by: .seconds(1))
        let said: [UInt8] = Array(repeating: 0x44, count: 40)
        h.speak(bob, said)
        #expect(h.heard(alice, from: bobID).last == said, "Alice hears Bob again: \(h.dropped(alice))")
    }

    /// Away long enough for the relay to give its session up (a control message
    /// unacknowledged through every attempt): the member's new handshake opens the
    /// session again, and the rejoin takes its old seat back.
    @Test func aMemberAwayLongerThanTheRelayWaitsComesBackToItsSeat() throws {
        var h = PartyHarness()
        for s in [alice, bob] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob]))
        let bobID = try unwrap(h.id(bob))
        var away = true
        h.deliverTo = { s, _ in !(away && s == bob) }
        h.acceptFrom = { s, _ in !(away && s == bob) }
        h.connect(carol)
        h.input(carol, .join(room: room))  // a roster change Bob never acknowledges
        h.advance(by: .seconds(15))
        #expect(lost(h.events[bob]))
        #expect(h.server.rooms[room]?.members[bobID] == nil, "the relay gave Bob's session up")
        away = false
        h.reconnect(bob)
        #expect(h.id(bob) == bobID)
        #expect(h.server.rooms[room]?.members.count == 3)
        h.advance(by: .seconds(1))
        h.speak(bob, speech)
        #expect(h.heard(alice, from: bobID).last == speech)
        #expect(h.heard(carol, from: bobID).last == speech)
    }

    @Test func aMemberAloneInItsRoomGetsTheRoomBackAfterABlip() throws {
        var h = PartyHarness()
        h.connect(alice)
        let room = try unwrap(h.room(alice, []))
        h.disconnect(alice)
        #expect(h.server.rooms[room] == nil)
        h.advance(by: .seconds(5))
        h.reconnect(alice)
        #expect(h.members[alice]?.room == room)
        #expect(h.server.rooms[room]?.members.count == 1)
        // A friend still gets in with the same id.
        h.connect(bob)
        h.input(bob, .join(room: room))
        #expect(h.members[bob]?.room == room)
    }

    @Test func aRelayThatNeverComesBackEndsTheRoomAfterTheRejoinTimeout() throws {
        var h = PartyHarness()
        for s in [alice, bob] { h.connect(s) }
        _ = try unwrap(h.room(alice, [bob]))
        h.restartRelay()
        h.advance(by: .seconds(3))
        #expect(lost(h.events[alice]))
        h.advance(by: .seconds(29))
        #expect(h.members[alice]?.phase == .ended(.disconnected))
        #expect(h.members[alice]?.nextDeadline == nil)
    }

    @Test func ticketsCannotBeForgedAndDoNotReopenAClosedRoom() throws {
        var h = PartyHarness()
        for s in [alice, bob] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob]))
        let ticket = try #require(h.members[bob]?.ticket)
        #expect(ticket.room == room)

        // Bob, on another session, tries to come back as the creator of a room with another name.
        let mallory = PartySession(40)
        h.server.handle(.opened(mallory, key: try #require(h.identities[bob]).publicKey), now: h.now)
        var channel = ControlChannel(id: 5)
        var forged = ticket
        forged.creator = try #require(h.identities[bob]).publicKey.base64
        let refusedBefore = h.server.statistics.controlRefused
        for packet in channel.send(.rejoin(ticket: forged, member: MemberID(1), highest: MemberID(2)), now: h.now) {
            h.raw(mallory, packet)
        }
        #expect(h.server.statistics.controlRefused == refusedBefore + 1)
        #expect(h.server.rooms[room]?.creator == h.identities[alice]?.publicKey)

        // The creator closes the room: this relay process does not bring it back from a ticket.
        h.input(alice, .close)
        #expect(h.server.rooms[room] == nil)
        for packet in channel.send(.rejoin(ticket: ticket, member: MemberID(2), highest: MemberID(2)), now: h.now) {
            h.raw(mallory, packet)
        }
        #expect(h.server.statistics.controlRefused == refusedBefore + 2)
        #expect(h.server.rooms[room] == nil)

        // Another relay (another key) accepts none of this one's tickets.
        h = PartyHarness()
        h.connect(carol)
        var other = ControlChannel(id: 6)
        for packet in other.send(.rejoin(ticket: ticket, member: MemberID(1), highest: MemberID(1)), now: h.now) {
            h.raw(carol, packet)
        }
        #expect(h.server.rooms.isEmpty)
        #expect(h.server.statistics.controlRefused == 1)
    }

    /// The relays of one directory key their tickets from its relay secret: each
    /// takes the others' (a room moved off a dead or draining relay is rebuilt as it
    /// was made); a relay of another directory, or keyed by its identity, takes none.
    /// Their rooms' ids carry the relay's tag, for the directory to find them.
    @Test func relaysOfOneDirectoryTakeEachOthersTicketsAndTagTheirRooms() throws {
        let creator = PrivateKey.generate().publicKey
        for secret in ["s3cret", String(repeating: "a long secret ", count: 20)] {
            let issuer = RoomTicketAuthority(directorySecret: secret, incarnation: 1)
            let ticket = issuer.issue(room: "x7kq-abcdefghijkm", name: "Valheim", creator: creator, maxMembers: 8, invited: [])
            #expect(RoomTicketAuthority(directorySecret: secret, incarnation: 2).verify(ticket))
            #expect(!RoomTicketAuthority(directorySecret: secret + "!", incarnation: 1).verify(ticket))
            #expect(!RoomTicketAuthority(identity: PrivateKey.generate(), incarnation: 1).verify(ticket))
        }
        var configuration = PartyServer.Configuration()
        configuration.roomPrefix = "x7kq-"
        var h = PartyHarness(configuration: configuration)
        for s in [alice, bob] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob]))
        #expect(room.hasPrefix("x7kq-") && room.count == 17, "\(room)")
    }

    /// A relay shutting down with a directory to send its rooms to tells every
    /// member to move: each keeps its keys and seat for the rejoin elsewhere (its
    /// driver asks the directory where). It takes no new room or member; one that
    /// rejoins it anyway (the directory had not heard yet) is taken back and told again.
    @Test func aDrainingRelayTellsItsMembersToMoveAndTakesNoOneNew() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob]))
        let aliceID = try unwrap(h.id(alice))
        h.server.handle(.draining, now: h.now)
        h.pump()
        func toldToMove(_ s: PartySession) -> Int {
            (h.events[s] ?? []).filter { if case .relayDraining(room) = $0 { true } else { false } }.count
        }
        for s in [alice, bob] {
            #expect(toldToMove(s) == 1)
            #expect(h.members[s]?.rejoining == room)
            #expect((h.events[s] ?? []).contains { if case .connectionLost(room) = $0 { true } else { false } })
        }
        #expect(toldToMove(carol) == 0)
        h.input(carol, .join(room: room))
        h.input(carol, .create(name: "Valheim", maxMembers: nil, invite: []))
        #expect(h.refusals(carol) == [.draining, .draining])
        h.reconnect(alice)
        #expect((h.events[alice] ?? []).contains { if case .rejoined(room, _, aliceID, _) = $0 { true } else { false } })
        #expect(toldToMove(alice) == 2 && h.members[alice]?.rejoining == room)
    }

    @Test func newcomersInARestoredRoomAreNumberedAboveTheMembersToCome() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob, carol]))
        let carolID = try unwrap(h.id(carol))
        h.restartRelay()
        h.advance(by: .seconds(3))
        // Alice is back first; a newcomer joins before Carol is.
        h.reconnect(alice)
        h.connect(dave)
        h.input(dave, .join(room: room))
        let daveID = try unwrap(h.id(dave))
        #expect(daveID > carolID)
        h.reconnect(carol)
        h.reconnect(bob)
        #expect(h.id(carol) == carolID)
        #expect(h.server.rooms[room]?.members.count == 4)
        h.advance(by: .seconds(1))
        h.speak(dave, speech)
        for s in [alice, bob, carol] { #expect(h.heard(s, from: daveID).last == speech) }
        h.speak(carol, speech)
        #expect(h.heard(dave, from: carolID).last == speech)
    }

    @Test func twoRestartsInARowStillKeepTheSeatsOfThoseNotBackYet() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob, carol]))
        let carolID = try unwrap(h.id(carol))
        // The relay restarts; Alice is back, Bob and Carol not yet; it restarts again.
        for _ in 0..<2 {
            h.restartRelay()
            h.advance(by: .seconds(3))
            h.reconnect(alice)
        }
        h.connect(dave)
        h.input(dave, .join(room: room))
        #expect(try unwrap(h.id(dave)) > carolID, "a newcomer took a seat of one still to come back")
        h.reconnect(carol)
        #expect(h.id(carol) == carolID)
    }
}
