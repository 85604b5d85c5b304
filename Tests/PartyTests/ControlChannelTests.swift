import Foundation
import Party
import Secure
import Testing
import TusaBase

@Suite("Control messages survive a lossy hop")
struct ControlChannelTests {
    @Test func messagesArriveOnceAndInOrderDespiteLossAndReordering() throws {
        var a = ControlChannel(id: 1)
        var b = ControlChannel(id: 2)
        var now = Timestamp.seconds(1)
        let sent: [PartyControl] = (1...20).map { .kick(member: MemberID(UInt16($0))) }
        var wire = sent.map { a.send($0, now: now)[0] }
        // The first packet is lost, the rest arrive backwards, number 5 twice.
        wire.removeFirst()
        wire.reverse()
        wire.append(wire[wire.count - 5])
        var delivered: [PartyControl] = []
        for packet in wire {
            let r = try b.receive(packet, newID: 3)
            let (ack, messages) = (r.ack, r.messages)
            delivered += messages
            if let ack { _ = try a.receive(ack, newID: 4) }
        }
        #expect(delivered.isEmpty)  // all held behind the lost first one
        #expect(a.unacknowledged == 1)
        now = now + .milliseconds(250)
        let again = a.resend(now: now)
        #expect(again.count == 1)
        let r = try b.receive(try #require(again.first), newID: 3)
        let (ack, messages) = (r.ack, r.messages)
        #expect(messages == sent)
        _ = try a.receive(try #require(ack), newID: 4)
        #expect(a.unacknowledged == 0 && a.nextDeadline == nil)
    }

    /// Pings skip the JSON coder both ways: the bytes are the coder's own, so a
    /// peer that codes them (an older build) reads and writes the same message.
    @Test func aPingIsTheCodersJSONWithoutTheCoder() throws {
        let fast = PartyControl.ping.encodedJSON()
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        #expect(fast == Array(try encoder.encode(PartyControl.ping)))
        #expect(try JSONDecoder().decode(PartyControl.self, from: Data(fast)) == .ping)
        #expect(try PartyControl(json: fast) == .ping)
        // Other spellings of the same message still read, through the coder.
        #expect(try PartyControl(json: Array(#"{ "ping" : { } }"#.utf8)) == .ping)
        #expect(try PartyControl(json: PartyControl.leave.encodedJSON()) == .leave)
        #expect(throws: PartyWireError.self) { try PartyControl(json: Array(#"{"ping":{}"#.utf8)) }
    }

    @Test func aPeerThatRestartsIsNoticedAndBothSidesStartAfresh() throws {
        var relay = ControlChannel(id: 10)
        var member = ControlChannel(id: 20)
        let now = Timestamp.seconds(1)
        for i in 1...3 {
            let r = try relay.receive(member.send(.mute(i % 2 == 0), now: now)[0], newID: 11)
            #expect(!r.restarted && r.messages.count == 1)
        }
        // The member's client restarts: a fresh channel, numbering from 1 again.
        var restarted = ControlChannel(id: 21)
        let r = try relay.receive(restarted.send(.join(room: "x"), now: now)[0], newID: 11)
        #expect(r.restarted)
        #expect(r.messages == [.join(room: "x")])
        #expect(relay.id == 11 && relay.remoteID == 21)
        // The relay's answers are numbered from 1 under its new id, which the restarted side takes.
        let answer = try restarted.receive(relay.send(.leave, now: now)[0], newID: 22)
        #expect(answer.messages == [.leave] && !answer.restarted)
        // An acknowledgement for the old channel acknowledges nothing of the new one.
        var ack: [UInt8] = [PartyPacketType.ack.rawValue, 0, 0, 0, 10, 0, 0, 0, 1]
        _ = try relay.receive(ack, newID: 12)
        #expect(relay.unacknowledged == 1)
        ack[4] = 11
        _ = try relay.receive(ack, newID: 12)
        #expect(relay.unacknowledged == 0)
    }

    /// A roster of fifty does not fit one packet: it goes in parts of at most
    /// `maxChunk` bytes of JSON, each its own number, and comes out whole once,
    /// whatever the hop lost or turned round.
    @Test func aMessageLongerThanAPacketArrivesInPartsAndWhole() throws {
        var a = ControlChannel(id: 1)
        var b = ControlChannel(id: 2)
        var now = Timestamp.seconds(1)
        let roster = (1...50).map {
            RosterEntry(member: MemberID(UInt16($0)), key: PrivateKey.generate().publicKey, creator: $0 == 1)
        }
        let long = PartyControl.joined(
            room: "abcdefghijkl", name: "Hearthstone", you: MemberID(50), roster: roster, ticket: nil)
        let messages: [PartyControl] = [.mute(true), long, .mute(false)]
        let wire = messages.flatMap { a.send($0, now: now) }
        #expect(wire.count > 4, "the roster takes several packets")
        #expect(wire.allSatisfy { $0.count <= ControlChannel.maxChunk + 9 })
        #expect(wire.dropFirst().dropLast(2).allSatisfy { $0[0] == PartyPacketType.controlPart.rawValue })
        #expect(wire[wire.count - 2][0] == PartyPacketType.controlLastPart.rawValue)
        #expect(wire.first?[0] == PartyPacketType.control.rawValue && wire.last?[0] == PartyPacketType.control.rawValue)
        // Every other packet is lost; what arrives comes backwards.
        var delivered: [PartyControl] = []
        for (i, packet) in wire.enumerated().reversed() where i % 2 == 1 {
            let r = try b.receive(packet, newID: 3)
            #expect(r.malformed.isEmpty)
            delivered += r.messages
            if let ack = r.ack { _ = try a.receive(ack, newID: 4) }
        }
        #expect(delivered.isEmpty)  // held behind the lost first packet
        while a.unacknowledged > 0, let due = a.nextDeadline {
            now = due
            for packet in a.resend(now: now) {
                let r = try b.receive(packet, newID: 3)
                delivered += r.messages
                if let ack = r.ack { _ = try a.receive(ack, newID: 4) }
            }
        }
        #expect(delivered == messages)
    }

    /// Parts that would make a message past `maxMessage` are acknowledged and
    /// dropped (a peer cannot make the other hold what it likes), the message
    /// reported malformed, and the next message reads as usual.
    @Test func aMessagePastTheLimitIsDroppedAndTheNextOneReads() throws {
        var a = ControlChannel(id: 1)
        var b = ControlChannel(id: 2)
        let now = Timestamp.seconds(1)
        let huge = [UInt8](repeating: UInt8(ascii: " "), count: ControlChannel.maxMessage + 1) + Array("{}".utf8)
        var malformed: [PartyWireError] = []
        var delivered: [PartyControl] = []
        for packet in a.send(json: huge, now: now) + a.send(.leave, now: now) {
            let r = try b.receive(packet, newID: 3)
            #expect(r.ack != nil)
            malformed += r.malformed
            delivered += r.messages
        }
        #expect(malformed.count == 1 && "\(malformed)".contains("more than"))
        #expect(delivered == [.leave])
        // Parts that read as no message: acknowledged, reported, the next one read.
        var nonsense = Array("{\"type\": \"nonsense\", \"pad\": \"".utf8)
        nonsense += [UInt8](repeating: UInt8(ascii: "x"), count: ControlChannel.maxChunk) + Array("\"}".utf8)
        let bad = a.send(json: nonsense, now: now) + a.send(.mute(true), now: now)
        #expect(bad.count == 3)
        _ = try b.receive(bad[0], newID: 3)
        let last = try b.receive(bad[1], newID: 3)
        #expect(last.ack != nil && last.messages.isEmpty && last.malformed.count == 1)
        #expect(try b.receive(bad[2], newID: 3).messages == [.mute(true)])
        // A whole message that does not read is refused unacknowledged, and restarts nothing.
        var garbage: [UInt8] = [PartyPacketType.control.rawValue, 9, 9, 9, 9, 0, 0, 0, 1]
        garbage += Array("{\"type\": \"nonsense\"}".utf8)
        #expect(throws: PartyWireError.self) { try b.receive(garbage, newID: 3) }
        // A stray part under another channel id is no restart either.
        let stray: [UInt8] = [PartyPacketType.controlPart.rawValue, 9, 9, 9, 9, 0, 0, 0, 7, 0x7B]
        let r = try b.receive(stray, newID: 3)
        #expect(!r.restarted && r.ack == nil && b.remoteID == 1)
    }

    @Test func aHopThatNeverAnswersFailsAfterEveryAttempt() {
        var a = ControlChannel(id: 1)
        var now = Timestamp.seconds(1)
        _ = a.send(.leave, now: now)
        var sends = 1
        while !a.failed, let due = a.nextDeadline {
            now = due
            sends += a.resend(now: now).count
        }
        #expect(a.failed)
        #expect(sends == ControlChannel.maxAttempts)
        // Waits of 250 ms, 500 ms, 1 s, then 2 s five times: given up 11.75 s after the first send.
        #expect(now - Timestamp.seconds(1) == .milliseconds(11_750))
    }

    @Test func aRoomFormsAndEveryoneHearsEveryoneOverALossyHop() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol, dave] { h.connect(s) }
        var rng = SplitMix64(seed: 42)
        // A third of the packets each way are lost, control and voice alike.
        h.deliverTo = { _, _ in rng.next() % 3 != 0 }
        h.acceptFrom = { _, _ in rng.next() % 3 != 0 }
        h.input(alice, .create(name: "Dota 2", maxMembers: nil, invite: []))
        h.advance(by: .seconds(3))
        let room = try #require(h.members[alice]?.room)
        for s in [bob, carol, dave] {
            h.input(s, .join(room: room))
            h.advance(by: .seconds(3))
        }
        h.deliverTo = { _, _ in true }
        h.acceptFrom = { _, _ in true }
        h.advance(by: .seconds(5))
        for s in [alice, bob, carol, dave] {
            #expect(h.members[s]?.roster.count == 3, "\(s) sees \(h.members[s]?.roster.count ?? 0)")
        }
        for s in [alice, bob, carol, dave] {
            h.advance(by: .milliseconds(1100))
            let words = [UInt8](repeating: UInt8(s.value), count: 20)
            h.speak(s, words)
            let sender = try #require(h.id(s))
            for listener in [alice, bob, carol, dave] where listener != s {
                #expect(h.heard(listener, from: sender).last == words, "\(listener) from \(s): \(h.dropped(listener))")
            }
        }
    }

    @Test func theRelayDropsAMemberThatStopsAnswering() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob, carol]))
        let c = try #require(h.id(carol))
        // Carol's machine freezes: nothing she sends arrives, nothing reaches her.
        h.acceptFrom = { s, _ in s != carol }
        h.deliverTo = { s, _ in s != carol }
        h.input(bob, .mute(true))  // something the relay must tell everyone, Carol included
        h.advance(by: .seconds(14), step: .milliseconds(50))
        #expect(h.server.rooms[room]?.members[c] == nil)
        #expect(h.serverEvents.contains(.memberLeft(room: room, member: c, reason: .disconnected)))
        #expect(h.members[alice]?.roster[c] == nil)
    }
}
