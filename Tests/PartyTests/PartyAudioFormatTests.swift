import Foundation
import Party
import Rendezvous
import Secure
import Testing
import TusaBase

@Suite("How each member encodes, announced with its sender keys")
struct PartyAudioFormatTests {
    static let opus = PartyAudioFormat(codec: "opus", sampleRate: 16_000, frameMilliseconds: 10)
    static let speex = PartyAudioFormat(codec: "speex", sampleRate: 8_000, frameMilliseconds: 20)

    static func announcing(_ format: PartyAudioFormat?) -> PartyMember.Configuration {
        var c = PartyMember.Configuration()
        c.audioFormat = format
        return c
    }

    /// The formats each `listener` got with `sender`'s frames, in order.
    static func formats(_ h: PartyHarness, _ listener: PartySession, from sender: MemberID) -> [PartyAudioFormat?] {
        (h.events[listener] ?? []).compactMap {
            if case .audio(let from, _, _, let format) = $0, from == sender { format } else { nil }
        }
    }

    @Test func eachListenerGetsEachSpeakersFormatWithItsFrames() throws {
        var h = PartyHarness()
        h.connect(alice, configuration: Self.announcing(Self.opus))
        h.connect(bob, configuration: Self.announcing(Self.speex))
        h.connect(carol)  // a member from before formats: says nothing
        _ = try unwrap(h.room(alice, [bob, carol]))
        let (a, b, c) = (try unwrap(h.id(alice)), try unwrap(h.id(bob)), try unwrap(h.id(carol)))
        for s in [alice, bob, carol] {
            h.advance(by: .milliseconds(1100))
            h.speak(s, [1, 2, 3])
        }
        #expect(Self.formats(h, bob, from: a) == [Self.opus])
        #expect(Self.formats(h, carol, from: a) == [Self.opus])
        #expect(Self.formats(h, alice, from: b) == [Self.speex])
        #expect(Self.formats(h, carol, from: b) == [Self.speex])
        // Carol says nothing of her format, and her listeners hear her all the same.
        #expect(Self.formats(h, alice, from: c) == [nil])
        #expect(h.heard(bob, from: c) == [[1, 2, 3]])
        #expect(h.members[alice]?.audioFormats == [b: try #require(Self.speex)])
        // A newcomer is handed the next ratchet step, and the format, and says its own.
        h.connect(dave, configuration: Self.announcing(Self.speex))
        h.input(dave, .join(room: try unwrap(h.members[alice]?.room)))
        let d = try unwrap(h.id(dave))
        h.advance(by: .milliseconds(1100))
        h.speak(alice, [4])
        h.advance(by: .milliseconds(1100))
        h.speak(dave, [5])
        #expect(Self.formats(h, dave, from: a) == [Self.opus])
        #expect(Self.formats(h, alice, from: d) == [Self.speex])
        // One who leaves is forgotten with its key; the rekey that follows keeps the
        // formats of those who stay.
        h.input(bob, .leave)
        h.advance(by: .seconds(2))
        #expect(h.members[alice]?.audioFormats[b] == nil)
        h.speak(alice, [6])
        #expect(Self.formats(h, dave, from: a) == [Self.opus, Self.opus])
    }

    /// A member from before formats reads exactly `tusa-party-key-v1 ‖ room ‖ KID ‖
    /// key` and refuses anything longer: every key stays that, and the format travels
    /// in a message of its own, once per member per stay, not once per key.
    @Test func keysStayAsOlderMembersReadThemAndTheFormatIsSaidOnceBeforeTheFirst() throws {
        var h = PartyHarness()
        final class Seen: @unchecked Sendable { var said: [String] = [], keyLengths: [Int] = [] }
        let seen = Seen()
        h.connect(alice, configuration: Self.announcing(Self.opus))
        h.connect(bob)
        let aliceIdentity = try #require(h.identities[alice])
        let bobIdentity = try #require(h.identities[bob])
        // What Alice seals to Bob, opened with Bob's key, in the order sent.
        h.acceptFrom = { session, bytes in
            guard session == alice, bytes.first == PartyPacketType.control.rawValue,
                case .key(_, let sealed)? = try? PartyControl(json: bytes.dropFirst(9)),
                let payload = try? Sealing.open(Array(sealed), from: aliceIdentity.publicKey, to: bobIdentity)
            else { return true }
            if payload.starts(with: Array("tusa-party-key-v1".utf8)) {
                seen.said.append("key")
                seen.keyLengths.append(payload.count)
            }
            if payload.starts(with: Array("tusa-party-format-v1".utf8)) { seen.said.append("format") }
            return true
        }
        let room = try unwrap(h.room(alice, [bob]))
        // Carol joins (a ratchet step, to her alone) and leaves (a fresh key for Bob), twice.
        for _ in 0..<2 {
            h.connect(carol)
            h.input(carol, .join(room: room))
            h.advance(by: .milliseconds(500))
            h.input(carol, .leave)
            h.advance(by: .seconds(2))
        }
        // The format once, before the first key (control messages arrive in order, and
        // no frame opens before its key: Bob knows it before he can hear Alice).
        #expect(seen.said == ["format", "key", "key", "key"], "\(seen.said)")
        #expect(seen.keyLengths.allSatisfy { $0 == 17 + 1 + room.utf8.count + 8 + SecretKey.length }, "\(seen.keyLengths)")
        #expect(h.members[bob]?.audioFormats[try unwrap(h.id(alice))] == Self.opus)
    }

    @Test func aFormatThatDoesNotReadIsRefusedAndNothingElseIsLost() throws {
        var h = PartyHarness()
        h.connect(alice)
        h.connect(bob)
        let room = try unwrap(h.room(alice, [bob]))
        let (a, b) = (try unwrap(h.id(alice)), try unwrap(h.id(bob)))
        // Mallory runs a client of her own: her session with the relay, her own control
        // channel, and formats for Bob that do not read: a sample rate of 0, a codec
        // name with a capital, bytes cut short, bytes left over; one for another room
        // and one for another member's key.
        let mallory = PartySession(6)
        let malloryKey = PrivateKey.generate()
        h.server.handle(.opened(mallory, key: malloryKey.publicKey), now: h.now)
        var channel = ControlChannel(id: 77)
        func send(_ message: PartyControl) {
            for packet in channel.send(message, now: h.now) { h.raw(mallory, packet) }
        }
        send(.join(room: room))
        let m = try #require(h.members[bob]?.roster.keys.first { $0 != a }, "Mallory is in Bob's roster")
        let bobKey = try #require(h.identities[bob]?.publicKey)
        func sealed(_ label: String, room: String = room, kid: SenderKeyID, _ rest: [UInt8]) throws -> PartyControl {
            var payload = Array(label.utf8) + [UInt8(room.utf8.count)] + Array(room.utf8)
            payload.appendUInt64(kid.kid)
            payload += rest
            return .key(member: b, sealed: Data(try Sealing.seal(payload, from: malloryKey, to: bobKey)))
        }
        let kid = SenderKeyID(member: m, epoch: 3, step: 0)
        var good: [UInt8] = []
        try #require(Self.speex).encode(into: &good)
        let bad: [PartyControl] = [
            try sealed("tusa-party-format-v1", kid: kid, [5] + Array("speex".utf8) + [0, 0, 0, 0, 0, 20]),
            try sealed("tusa-party-format-v1", kid: kid, [4] + Array("Opus".utf8) + [0, 0, 0x1F, 0x40, 0, 20]),
            try sealed("tusa-party-format-v1", kid: kid, Array(good.dropLast())),
            try sealed("tusa-party-format-v1", kid: kid, good + [0]),
            try sealed("tusa-party-format-v1", room: "elsewhere", kid: kid, good),
            try sealed("tusa-party-format-v1", kid: SenderKeyID(member: a, epoch: 3, step: 0), good),
            // A key with bytes after it is what an older member refuses: so is it here.
            try sealed("tusa-party-key-v1", kid: kid, [UInt8](repeating: 7, count: SecretKey.length) + good),
        ]
        for message in bad {
            let before = h.events[bob]?.count ?? 0
            send(message)
            let after = Array((h.events[bob] ?? []).dropFirst(before))
            #expect(after.contains { if case .badKey(let from, _) = $0 { from == m } else { false } }, "\(after)")
            #expect(!after.contains { if case .keyReceived = $0 { true } else { false } }, "\(after)")
            #expect(h.members[bob]?.audioFormats[m] == nil)
        }
        // One that reads is taken, and the last one read holds (whatever key it names:
        // a member that started again numbers its keys from 0 again).
        send(try sealed("tusa-party-format-v1", kid: kid, good))
        #expect(h.members[bob]?.audioFormats[m] == Self.speex)
        var opus: [UInt8] = []
        try #require(Self.opus).encode(into: &opus)
        send(try sealed("tusa-party-format-v1", kid: SenderKeyID(member: m, epoch: 0, step: 0), opus))
        #expect(h.members[bob]?.audioFormats[m] == Self.opus)
        // Nothing else was lost: Bob hears Alice as before.
        h.advance(by: .milliseconds(1100))
        h.speak(alice, [9])
        #expect(h.heard(bob, from: a) == [[9]])
    }

    @Test func formatsReadBackAndOutOfRangeOnesAreRefused() throws {
        for f in [Self.opus, Self.speex, PartyAudioFormat(codec: "l16", sampleRate: 48_000, frameMilliseconds: 120)] {
            let format = try #require(f)
            var bytes: [UInt8] = []
            format.encode(into: &bytes)
            #expect(try PartyAudioFormat.decode(bytes[...]) == format)
        }
        #expect(PartyAudioFormat(codec: "", sampleRate: 8000, frameMilliseconds: 20) == nil)
        #expect(PartyAudioFormat(codec: String(repeating: "a", count: 16), sampleRate: 8000, frameMilliseconds: 20) == nil)
        #expect(PartyAudioFormat(codec: "opus", sampleRate: 999, frameMilliseconds: 20) == nil)
        #expect(PartyAudioFormat(codec: "opus", sampleRate: 8000, frameMilliseconds: 0) == nil)
        #expect(PartyAudioFormat(codec: "opus", sampleRate: 8000, frameMilliseconds: 121) == nil)
        #expect(throws: PartyWireError.truncated("audio format")) { try PartyAudioFormat.decode([][...]) }
        #expect(throws: PartyWireError.self) {
            try PartyAudioFormat.decode([4, 0x6F, 0x70, 0x75, 0x73, 0, 0, 0x1F, 0x40, 0, 0][...])
        }
    }
}
