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
        h.connect(carol)  // an older member: says nothing
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
        // Carol's key carries no format, and her listeners hear her all the same.
        #expect(Self.formats(h, alice, from: c) == [nil])
        #expect(h.heard(bob, from: c) == [[1, 2, 3]])
        #expect(h.members[alice]?.audioFormats == [b: try #require(Self.speex)])
        // A newcomer is handed the next ratchet step, the format with it.
        h.connect(dave)
        h.input(dave, .join(room: try unwrap(h.members[alice]?.room)))
        h.advance(by: .milliseconds(1100))
        h.speak(alice, [4])
        #expect(Self.formats(h, dave, from: a) == [Self.opus])
        // One who leaves is forgotten with its key.
        h.input(bob, .leave)
        #expect(h.members[alice]?.audioFormats[b] == nil)
    }

    @Test func aKeyWhoseFormatDoesNotReadIsRefusedAndNothingElseIsLost() throws {
        var h = PartyHarness()
        h.connect(alice)
        h.connect(bob)
        let room = try unwrap(h.room(alice, [bob]))
        let (a, b) = (try unwrap(h.id(alice)), try unwrap(h.id(bob)))
        // Mallory runs a client of her own: her session with the relay, her own control
        // channel, and keys for Bob followed by formats that do not read: a sample rate of
        // 0, a codec name with a capital, bytes cut short, bytes left over.
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
        func key(_ trailer: [UInt8], epoch: UInt16) throws -> PartyControl {
            var payload = Array("tusa-party-key-v1".utf8) + [UInt8(room.utf8.count)] + Array(room.utf8)
            payload.appendUInt64(SenderKeyID(member: m, epoch: epoch, step: 0).kid)
            payload += [UInt8](repeating: 7, count: SecretKey.length) + trailer
            return .key(member: b, sealed: Data(try Sealing.seal(payload, from: malloryKey, to: bobKey)))
        }
        var good: [UInt8] = []
        try #require(Self.speex).encode(into: &good)
        let bad: [[UInt8]] = [
            [5] + Array("speex".utf8) + [0, 0, 0, 0, 0, 20],
            [4] + Array("Opus".utf8) + [0, 0, 0x1F, 0x40, 0, 20],
            Array(good.dropLast()),
            good + [0],
        ]
        for (i, trailer) in bad.enumerated() {
            let before = h.events[bob]?.count ?? 0
            send(try key(trailer, epoch: UInt16(i)))
            let after = Array((h.events[bob] ?? []).dropFirst(before))
            #expect(
                after.contains {
                    if case .badKey(let from, let why) = $0 { from == m && why.contains("audio format") } else { false }
                }, "\(trailer): \(after)")
            #expect(!after.contains { if case .keyReceived = $0 { true } else { false } }, "\(trailer): \(after)")
            #expect(h.members[bob]?.audioFormats[m] == nil)
        }
        // The same key with a format that reads is taken, the format with it.
        send(try key(good, epoch: 9))
        #expect(h.members[bob]?.keyring.hasKey(from: m) == true)
        #expect(h.members[bob]?.audioFormats[m] == Self.speex)
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
