import Party
import Secure
import Testing
import TusaBase

@Suite("Party rooms on a virtual clock")
struct PartyRoomTests {
    private let speech: [UInt8] = Array(repeating: 0x5A, count: 40)

    @Test func fourMembersHearEachOther() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol, dave] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob, carol, dave]))
        #expect(h.server.rooms[room]?.members.count == 4)
        // Each speaks in turn (a second apart: the relay forwards three speakers at
        // once); everyone else opens it, word for word.
        for (i, s) in [alice, bob, carol, dave].enumerated() {
            let words = [UInt8](repeating: UInt8(i + 1), count: 40)
            h.advance(by: .milliseconds(1100))
            h.speak(s, words)
            let sender = try #require(h.id(s))
            for listener in [alice, bob, carol, dave] where listener != s {
                #expect(h.heard(listener, from: sender) == [words], "\(listener) from \(sender)")
            }
        }
        for s in [alice, bob, carol, dave] { #expect(h.dropped(s).isEmpty, "\(s): \(h.dropped(s))") }
        // The roster each shows has the others' keys; the creator is marked.
        let roster = try #require(h.members[dave]?.roster)
        #expect(roster.count == 3)
        #expect(roster.values.filter(\.creator).map(\.member) == [try #require(h.id(alice))])
    }

    @Test func aVoiceStreamThatStopsIsPingedAfter100msAQuietRoomAfter500() throws {
        final class Count: @unchecked Sendable { var pings = 0 }
        let count = Count()
        var h = PartyHarness()
        for s in [alice, bob] { h.connect(s) }
        _ = try unwrap(h.room(alice, [bob]))
        h.acceptFrom = { session, bytes in
            if session == bob, bytes.first == 0x02, String(decoding: bytes.dropFirst(9), as: UTF8.self).contains("ping") {
                count.pings += 1
            }
            return true
        }
        /// When bob pinged, stepping the clock 10 ms at a time for `total`.
        func pingTimes(over total: Duration) -> [Timestamp] {
            var at: [Timestamp] = []
            let end = h.now + total
            while h.now < end {
                let before = count.pings
                h.advance(by: .milliseconds(10))
                if count.pings > before { at.append(h.now) }
            }
            return at
        }
        // A quiet room: the relay is pinged half a second after it was last heard.
        let quiet = pingTimes(over: .seconds(2))
        try #require(quiet.count >= 2)
        #expect(quiet[quiet.count - 1] - quiet[quiet.count - 2] == .milliseconds(500))
        // Alice talks for 200 ms, then her stream stops (a rebinding, or her word's end): 100 ms.
        var lastFrame = h.now
        for _ in 0..<10 {
            h.advance(by: .milliseconds(20))
            h.speak(alice, speech)
            lastFrame = h.now
        }
        let after = pingTimes(over: .milliseconds(400))
        #expect(after.first.map { $0 - lastFrame } == .milliseconds(100), "\(after)")
        #expect(after.count == 1, "then the quiet room's pace: \(after)")
    }

    @Test func theRelayCannotOpenWhatItForwards() throws {
        var h = PartyHarness()
        for s in [alice, bob] { h.connect(s) }
        _ = try unwrap(h.room(alice, [bob]))
        let words: [UInt8] = Array("the cards are on the table".utf8)
        let frame = try unwrap(h.speak(alice, words))
        // What the relay handles is the sealed frame: its header, never the words.
        #expect(h.framesTo[bob] == [frame])
        #expect(!String(decoding: frame, as: UTF8.self).contains("cards"))
        #expect(h.heard(bob, from: try #require(h.id(alice))) == [words])
    }

    @Test func aNewcomerCannotOpenWhatWasSaidBeforeItJoined() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob]))
        let before = try unwrap(h.speak(alice, speech))
        h.input(carol, .join(room: room))
        let after = try unwrap(h.speak(alice, speech))
        let a = try #require(h.id(alice))
        #expect(h.heard(carol, from: a) == [speech])
        #expect(h.heard(bob, from: a).count == 2)
        // Carol now holds every key she was given; the earlier frame still does not open.
        var carolCore = try #require(h.members[carol])
        #expect(throws: FrameOpenError.self) { _ = try carolCore.open(before) }
        #expect(after != before)
    }

    @Test func aKickedMemberCannotOpenWhatIsSaidAfterTheRekey() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol] { h.connect(s) }
        _ = try unwrap(h.room(alice, [bob, carol]))
        h.speak(bob, speech)
        // Carol keeps her core as it was, with every key she ever held.
        var kicked = try #require(h.members[carol])
        let c = try #require(h.id(carol))
        h.input(alice, .kick(c))
        #expect(h.members[carol]?.phase == .ended(.kicked))
        // Every remaining member's fresh key is acknowledged at once here: in use now.
        for s in [alice, bob] {
            #expect(h.members[s]?.keyring.pending == nil, "\(s) still waits")
            let sending = (h.events[s] ?? []).contains { if case .sendingUnder = $0 { true } else { false } }
            #expect(sending, "\(s) did not switch")
        }
        let words: [UInt8] = Array(repeating: 0x33, count: 40)
        let fromAlice = try unwrap(h.speak(alice, words))
        let fromBob = try unwrap(h.speak(bob, words))
        #expect(h.heard(bob, from: try #require(h.id(alice))).last == words)
        #expect(h.heard(alice, from: try #require(h.id(bob))).last == words)
        // The relay no longer sends Carol anything; had it (or had she captured it), nothing opens.
        #expect(h.framesTo[carol]?.contains(fromAlice) != true)
        #expect(throws: FrameOpenError.self) { _ = try kicked.open(fromAlice) }
        #expect(throws: FrameOpenError.self) { _ = try kicked.open(fromBob) }
        #expect(h.serverEvents.contains(.memberLeft(room: try #require(h.members[alice]?.room), member: c, reason: .kicked)))
    }

    @Test func aFreshKeyIsUsedAtTheDeadlineWhenAnAcknowledgementIsLost() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol, dave] { h.connect(s) }
        _ = try unwrap(h.room(alice, [bob, carol, dave]))
        // Carol is frozen: nothing she sends reaches the relay, so she acknowledges no key.
        h.acceptFrom = { session, _ in session != carol }
        let d = try #require(h.id(dave))
        h.input(dave, .leave)
        #expect(h.members[alice]?.keyring.pending != nil)
        h.advance(by: .milliseconds(990))
        #expect(h.members[alice]?.keyring.pending != nil)
        h.advance(by: .milliseconds(20))
        #expect(h.members[alice]?.keyring.pending == nil)
        #expect(h.members[bob]?.keyring.pending == nil)  // Bob's acks arrived: he switched at once
        // Bob and Carol hold Alice's fresh key already: they hear her under it.
        h.speak(alice, speech)
        let a = try #require(h.id(alice))
        #expect(h.heard(bob, from: a).count == 1 && h.heard(carol, from: a).count == 1)
        #expect(h.server.rooms.values.first?.members[d] == nil)
    }

    @Test func joinsAndLeavesRacingStillLeaveEveryoneHearingEveryone() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol, dave, erin] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob, carol]))
        // Nothing reaches anyone for a moment: a leave, a join and another leave pile up.
        var held: [(PartySession, [UInt8])] = []
        h.deliverTo = { target, bytes in
            held.append((target, bytes))
            return false
        }
        h.input(carol, .leave)
        h.input(dave, .join(room: room))
        h.deliverTo = { _, _ in true }
        for (target, bytes) in held {
            h.members[target]?.handle(.received(bytes), now: h.now)
            h.pump()
        }
        h.input(erin, .join(room: room))
        h.input(bob, .leave)
        h.advance(by: .seconds(2))
        for s in [alice, dave, erin] {
            #expect(h.members[s]?.keyring.pending == nil, "\(s) still holds a pending key")
            #expect(h.members[s]?.roster.count == 2, "\(s): \(h.members[s]?.roster.keys.sorted() ?? [])")
        }
        for s in [alice, dave, erin] {
            let words = [UInt8](repeating: UInt8(s.value), count: 30)
            h.speak(s, words)
            let sender = try #require(h.id(s))
            for listener in [alice, dave, erin] where listener != s {
                #expect(h.heard(listener, from: sender).last == words, "\(listener) from \(s): \(h.dropped(listener))")
            }
        }
    }

    @Test func keysRotateEveryFifteenMinutes() throws {
        var h = PartyHarness()
        for s in [alice, bob] { h.connect(s) }
        _ = try unwrap(h.room(alice, [bob]))
        let first = try #require(h.members[alice]?.keyring.current?.id)
        h.advance(by: .seconds(14 * 60 + 59), step: .seconds(1))
        #expect(h.members[alice]?.keyring.current?.id == first)
        h.advance(by: .seconds(2), step: .seconds(1))
        let second = try #require(h.members[alice]?.keyring.current?.id)
        #expect(second.epoch == first.epoch &+ 1)
        h.speak(alice, speech)
        #expect(h.heard(bob, from: try #require(h.id(alice))).count == 1)
    }

    @Test func aMemberCannotSendAsAnother() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol] { h.connect(s) }
        _ = try unwrap(h.room(alice, [bob, carol]))
        let a = try #require(h.id(alice))
        // Bob seals a frame claiming Alice's id with Alice's current key (every member holds it).
        let aliceKey = try #require(h.members[alice]?.keyring.current)
        let forged = try PartyFrame.seal(
            speech, key: aliceKey, counter: 999, sequence: 1, timestamp: 0, level: .init(level: 10, voiced: true))
        let before = h.server.statistics.framesSpoofed
        h.raw(bob, forged)
        #expect(h.server.statistics.framesSpoofed == before + 1)
        #expect(h.heard(carol, from: a).isEmpty)
        // And a session that is in no room forwards nothing either.
        h.connect(dave)
        h.raw(dave, forged)
        #expect(h.server.statistics.framesSpoofed == before + 2)
        #expect(h.framesTo[carol] == nil)
    }

    /// The relay's own path (`forward(_:from:now:into:)`, one array kept from frame
    /// to frame): a frame that goes nowhere leaves the array empty, never holding the
    /// members of the frame before.
    @Test func theTargetsARelayKeepsFromFrameToFrameAreOnlyTheLastFramesOwn() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol, dave] { h.connect(s) }
        _ = try unwrap(h.room(alice, [bob, carol]))
        var targets: [PartySession] = [dave, dave, dave]
        let sealed = h.members[alice]?.seal(speech, timestamp: 0, level: .init(level: 30, voiced: true), now: h.now)
        let frame = try #require(sealed)
        h.server.forward(frame, from: alice, now: h.now, into: &targets)
        #expect(Set(targets) == [bob, carol] && targets.count == 2)
        // Bob's forgery of Alice's frame, then a frame from Dave, who is in no room: nothing.
        h.server.forward(frame, from: bob, now: h.now, into: &targets)
        #expect(targets.isEmpty)
        h.server.forward(frame, from: alice, now: h.now, into: &targets)
        #expect(targets.count == 2)
        h.server.forward(frame, from: dave, now: h.now, into: &targets)
        #expect(targets.isEmpty)
        // What the relay forwards is what `.received` forwards: the same sessions.
        h.server.forward(frame, from: alice, now: h.now, into: &targets)
        #expect(Set(h.server.forward(frame, from: alice, now: h.now)) == Set(targets))
    }

    @Test func atMostThreeSpeakersWithHysteresis() throws {
        var h = PartyHarness()
        let all = [alice, bob, carol, dave, erin]
        for s in all { h.connect(s) }
        _ = try unwrap(h.room(alice, [bob, carol, dave, erin]))
        func round(_ levels: [PartySession: UInt8]) {
            for (s, l) in levels.sorted(by: { $0.key.value < $1.key.value }) {
                h.speak(s, speech, level: AudioLevel(level: l, voiced: l < 127))
            }
            h.advance(by: .milliseconds(20), step: .milliseconds(20))
        }
        // Alice, Bob and Carol speak first; Dave, as loud, does not cut them off.
        for _ in 0..<10 { round([alice: 30, bob: 30, carol: 30]) }
        for _ in 0..<10 { round([alice: 30, bob: 30, carol: 30, dave: 30]) }
        #expect(h.heard(erin, from: try #require(h.id(dave))).isEmpty)
        // Carol falls silent; after the release time Dave takes her place.
        for _ in 0..<60 { round([alice: 30, bob: 30, carol: 127, dave: 30]) }
        #expect(!h.heard(erin, from: try #require(h.id(dave))).isEmpty)
        let carolHeard = h.heard(erin, from: try #require(h.id(carol))).count
        // Her 20 voiced frames and the first 3 silent ones (the tail of a word), no more.
        #expect(carolHeard == 20 + 3, "Carol's silence was forwarded: \(carolHeard)")
        // Erin, much louder than Bob (30 vs 5 → 25 dB), displaces the quietest once they held 500 ms.
        for _ in 0..<30 { round([alice: 5, bob: 40, dave: 5, erin: 5]) }
        #expect(!h.heard(alice, from: try #require(h.id(erin))).isEmpty)
        #expect(h.server.statistics.framesNotSelected > 0)
    }

    @Test func roomRulesAreEnforcedWithClearRefusals() throws {
        var configuration = PartyServer.Configuration()
        configuration.maxMembers = 3
        var h = PartyHarness(configuration: configuration)
        for s in [alice, bob, carol, dave, erin] { h.connect(s) }
        // Names: empty or too long are refused.
        h.input(alice, .create(name: "", maxMembers: nil, invite: []))
        #expect(h.refusals(alice) == [.badName])
        // An invite list past the limit is refused.
        let many = (0...PartyControl.maximumInvited).map { _ in PrivateKey.generate().publicKey }
        h.input(alice, .create(name: "Dota", maxMembers: nil, invite: many))
        #expect(h.refusals(alice) == [.badName, .malformed])
        let room = try unwrap(h.room(alice, [bob, carol]))
        // Full at three.
        h.input(dave, .join(room: room))
        #expect(h.refusals(dave) == [.full])
        // Only the creator kicks; unknown rooms are refused.
        h.input(bob, .kick(try #require(h.id(carol))))
        #expect(h.refusals(bob) == [.notCreator])
        h.input(erin, .join(room: "nosuchroom"))
        #expect(h.refusals(erin) == [.noSuchRoom])
        // An invite list keeps others out.
        let invited = try #require(h.members[erin]?.identity.publicKey)
        h.input(dave, .create(name: "Dota", maxMembers: 5, invite: [invited]))
        let dota = try #require(h.members[dave]?.room)
        let stranger = PartySession(9)
        h.connect(stranger)
        h.input(stranger, .join(room: dota))
        #expect(h.refusals(stranger) == [.notInvited])
        h.input(erin, .join(room: dota))
        #expect(h.members[erin]?.room == dota)
        // The last one out closes the room.
        h.input(erin, .leave)
        h.input(dave, .leave)
        #expect(h.server.rooms[dota] == nil)
        #expect(h.serverEvents.contains(.roomClosed(id: dota)))
        // Garbage is a typed refusal, not a crash.
        // (A new session: the relay expects its control message number 1.)
        let garbler = PartySession(10)
        h.connect(garbler)
        h.raw(garbler, [PartyPacketType.control.rawValue, 0, 0, 0, 9, 0, 0, 0, 1] + Array("not json".utf8))
        #expect(h.refusals(garbler) == [.malformed])
        h.raw(garbler, [PartyPacketType.ack.rawValue, 0])
        h.raw(garbler, [0x7F, 1, 2, 3, 4, 5])
        #expect(h.refusals(garbler) == [.malformed, .malformed, .malformed])
        // Then a well-formed request still works.
        h.input(garbler, .join(room: room))
        #expect(h.refusals(garbler).last == .full)
        h.raw(bob, [0x01, 0x02])
        #expect(h.server.rooms[room]?.members.count == 3)
    }

    @Test func aRoomOfFiftyWorksAndTheFiftyFirstIsRefused() throws {
        var h = PartyHarness()
        let sessions = (1...51).map { PartySession(UInt64(100 + $0)) }
        for s in sessions { h.connect(s) }
        let room = try unwrap(h.room(sessions[0], Array(sessions[1..<50])))
        #expect(h.server.rooms[room]?.members.count == 50)
        h.input(sessions[50], .join(room: room))
        #expect(h.refusals(sessions[50]) == [.full])
        // Everyone holds everyone's key: the last to join speaks, all 49 others hear it.
        let last = try #require(h.id(sessions[49]))
        h.speak(sessions[49], speech)
        for s in sessions[0..<49] { #expect(h.heard(s, from: last) == [speech], "\(s)") }
        for s in sessions[0..<50] { #expect(h.dropped(s).isEmpty, "\(s): \(h.dropped(s))") }
    }

    @Test func theCreatorClosesTheRoomForEveryone() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob, carol]))
        h.input(alice, .close)
        for s in [alice, bob, carol] { #expect(h.members[s]?.phase == .ended(.roomClosed)) }
        #expect(h.server.rooms[room] == nil)
    }

    @Test func aRoomIsDescribedOnlyToThoseWhoMayJoinIt() throws {
        var h = PartyHarness()
        for s in [alice, bob, carol, dave] { h.connect(s) }
        let bobKey = try #require(h.identities[bob]).publicKey
        h.input(alice, .create(name: "Raid", maxMembers: 8, invite: [bobKey]))
        let room = try #require(h.members[alice]?.room)
        func described(_ s: PartySession) -> RoomDescription?? {
            (h.events[s] ?? []).lazy.compactMap { if case .described(room, let d) = $0 { d } else { nil } }.last
        }
        h.input(bob, .describe(room: room))
        let seen = try #require(described(bob) ?? nil, "the invited one sees the room")
        #expect(seen.name == "Raid" && seen.maxMembers == 8)
        #expect(seen.members.map(\.key) == [try #require(h.identities[alice]).publicKey.base64])
        #expect(seen.members.first?.creator == true)
        // Not invited: the same answer as for a room that does not exist.
        h.input(carol, .describe(room: room))
        #expect(described(carol) == .some(nil))
        h.input(carol, .describe(room: "nosuchroomxx"))
        #expect((h.events[carol] ?? []).contains { if case .described("nosuchroomxx", nil) = $0 { true } else { false } })
        // An open room shows itself to anyone with its id; asking does not join.
        h.input(dave, .create(name: "Open", maxMembers: nil, invite: []))
        let open = try #require(h.members[dave]?.room)
        h.input(carol, .describe(room: open))
        #expect(
            (h.events[carol] ?? []).contains { if case .described(open, let d?) = $0 { d.members.count == 1 } else { false } })
        #expect(h.members[carol]?.room == nil && h.server.rooms[open]?.members.count == 1)
    }

    @Test func aClientRestartedOnTheSameSessionStartsAfresh() throws {
        var h = PartyHarness()
        for s in [alice, bob] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob]))
        let oldBob = try #require(h.id(bob))
        // Bob's client restarts and finds the relay's session for his key still open
        // (same session, same key): its control numbering starts again under a new id.
        let identity = try #require(h.members[bob]?.identity)
        h.members[bob] = PartyMember(identity: identity, random: SeededRandom(seed: 999))
        h.input(bob, .join(room: room))
        let newBob = try #require(h.id(bob), "\(h.events[bob] ?? [])")
        #expect(newBob != oldBob)
        #expect(h.server.rooms[room]?.members.count == 2)
        #expect(h.serverEvents.contains(.memberLeft(room: room, member: oldBob, reason: .disconnected)))
        h.speak(bob, speech)
        #expect(h.heard(alice, from: newBob) == [speech])
        h.speak(alice, speech)
        #expect(h.heard(bob, from: try #require(h.id(alice))).count == 1)
    }
}

@Suite("Party cores under garbage")
struct PartyGarbageTests {
    /// Random bytes, and mangled real packets, into both cores: typed refusals and
    /// drops, never a crash, and the room still works afterwards.
    @Test func garbageNeverCrashesAndLosesNothing() throws {
        var h = PartyHarness()
        for s in [alice, bob] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob]))
        var rng = SplitMix64(seed: 5)
        let real = try unwrap(h.speak(alice, [UInt8](repeating: 1, count: 40)))
        for i in 0..<3000 {
            var bytes: [UInt8]
            if i % 3 == 0 {
                // A real frame with a few bytes flipped or cut.
                bytes = real
                for _ in 0..<(1 + Int(rng.next() % 3)) {
                    bytes[Int(rng.next() % UInt64(bytes.count))] ^= UInt8(truncatingIfNeeded: rng.next() | 1)
                }
                if rng.next() % 4 == 0 { bytes = Array(bytes.prefix(Int(rng.next() % UInt64(bytes.count)))) }
            } else {
                bytes = (0..<Int(rng.next() % 80)).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
                if let first = bytes.indices.first { bytes[first] = [0x01, 0x02, 0x03, 0x7F][Int(rng.next() % 4)] }
            }
            h.raw(bob, bytes)
            h.members[alice]?.handle(.received(bytes), now: h.now)
            h.pump()
        }
        let words = [UInt8](repeating: 9, count: 40)
        h.speak(bob, words)
        #expect(h.heard(alice, from: try #require(h.id(bob))).last == words)
        #expect(h.server.rooms[room]?.members.count == 2)
    }
}
