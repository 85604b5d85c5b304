import Foundation
import Party
import Secure
import Testing
import TusaBase

/// The sender keys a member's key log holds open captured frames, and nothing else does.
@Suite("Party frames from a key log")
struct PartyFrameOpenerTests {
    @Test func loggedKeysOpenTheirFramesAndLaterRatchetSteps() throws {
        var random: any SecureRandom = SeededRandom(seed: 3)
        let key = SenderKey.fresh(member: MemberID(2), epoch: 1, random: &random)
        let later = key.ratcheted().ratcheted()
        let other = SenderKey.fresh(member: MemberID(3), epoch: 0, random: &random)
        let level = AudioLevel(level: 20, voiced: true)
        let first = try PartyFrame.seal([1, 2, 3], key: key, counter: 0, sequence: 1, timestamp: 0, level: level)
        let stepped = try PartyFrame.seal([4, 5], key: later, counter: 1, sequence: 2, timestamp: 160, level: level)
        let unknown = try PartyFrame.seal([6], key: other, counter: 0, sequence: 1, timestamp: 0, level: level)

        let lines = [KeyLog.partyLine(kid: key.id.kid, base: try SecretKey(bytes: key.baseBytes))]
        let opener = PartyFrameOpener(keys: try KeyLog.parseParty(lines.joined(separator: "\n")))
        guard case .opened(let h, let audio) = opener.open(first) else {
            Issue.record("the logged key")
            return
        }
        #expect(h.sender == MemberID(2) && audio == [1, 2, 3])
        guard case .opened(_, let audio2) = opener.open(stepped) else {
            Issue.record("two steps on")
            return
        }
        #expect(audio2 == [4, 5])
        guard case .noKey(let id) = opener.open(unknown) else {
            Issue.record("another member's frame opened")
            return
        }
        #expect(id?.member == MemberID(3))
        var tampered = first
        tampered[tampered.count - 1] ^= 1
        guard case .failed(_, .authenticationFailed) = opener.open(tampered) else {
            Issue.record("a tampered frame")
            return
        }
        guard case .notAFrame = opener.open([0x02, 0, 0]) else {
            Issue.record("a control packet")
            return
        }
        #expect(throws: KeyLog.ParseError.self) { try KeyLog.parseParty("TUSA_PARTY_KEY 12 00") }
        // The media key parser passes party lines over, and still reads its own.
        #expect(try KeyLog.parse(lines[0]).isEmpty)
    }

    @Test func aMemberWithKeyLoggingReportsEveryKeyItUsesOrIsHanded() throws {
        var h = PartyHarness()
        var logging = PartyMember.Configuration()
        logging.keyLog = true
        h.connect(alice, configuration: logging)
        h.connect(bob)
        let room = try unwrap(h.room(alice, [bob]))
        h.connect(carol)
        h.input(carol, .join(room: room))
        let lines = (h.events[alice] ?? []).compactMap { if case .keyLog(let l) = $0 { l } else { nil } }
        let kids = Set(try KeyLog.parseParty(lines.joined(separator: "\n")).map(\.kid))
        // Her first key, her ratchet steps for Bob and for Carol, Bob's and Carol's keys.
        #expect(kids.count == 5, "\(lines)")
        #expect((h.events[bob] ?? []).allSatisfy { if case .keyLog = $0 { false } else { true } }, "logging is opt-in")
    }
}
