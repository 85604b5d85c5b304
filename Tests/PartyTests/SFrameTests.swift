import Party
import Secure
import Testing

@Suite("SFrame header and sender keys")
struct SFrameTests {
    private func encoded(_ kid: UInt64, _ ctr: UInt64) -> [UInt8] {
        var out: [UInt8] = []
        SFrameHeader(keyID: kid, counter: ctr).encode(into: &out)
        return out
    }

    @Test func headersAreEncodedAsRFC9605Says() {
        // Values below 8 sit in the first byte; larger ones follow in as few bytes as they need.
        #expect(encoded(0, 0) == [0x00])
        #expect(encoded(7, 7) == [0x77])
        #expect(encoded(8, 0) == [0x80, 0x08])
        #expect(encoded(0, 8) == [0x08, 0x08])
        // KID in 2 bytes (X=1, K=1), CTR in 3 (Y=1, C=2).
        #expect(encoded(0x1234, 0x010203) == [0x9A, 0x12, 0x34, 0x01, 0x02, 0x03])
        #expect(encoded(UInt64.max, UInt64.max) == [0xFF] + [UInt8](repeating: 0xFF, count: 16))
    }

    @Test(arguments: [UInt64(0), 1, 7, 8, 255, 256, 65_535, 1 << 32, 1 << 48, UInt64.max])
    func headersRoundTrip(value: UInt64) throws {
        for (kid, ctr) in [(value, UInt64(3)), (UInt64(5), value), (value, value)] {
            let bytes = encoded(kid, ctr)
            let (header, length) = try SFrameHeader.decode(bytes + [0xAA, 0xBB])
            #expect(header == SFrameHeader(keyID: kid, counter: ctr))
            #expect(length == bytes.count)
        }
    }

    @Test func aTruncatedHeaderIsATypedError() {
        #expect(throws: PartyWireError.self) { _ = try SFrameHeader.decode([0x92, 0x12]) }
        #expect(throws: PartyWireError.self) { _ = try SFrameHeader.decode([UInt8]()) }
    }

    /// RFC 9605 §4.3: a value takes the fewest bytes it can. One in more (a KID of 5 in
    /// a byte of its own, a counter with a leading zero byte) is a typed refusal:
    /// the opener rebuilds the header it authenticates from the values.
    @Test func aValueInMoreBytesThanItNeedsIsRefused() throws {
        for bytes: [UInt8] in [[0x80, 0x05], [0x08, 0x07], [0x90, 0x00, 0x08], [0x09, 0x00, 0xFF], [0x88, 0x00, 0x08]] {
            #expect(throws: PartyWireError.malformed("an SFrame KID or CTR not in the fewest bytes (RFC 9605 §4.3)")) {
                _ = try SFrameHeader.decode(bytes)
            }
        }
        // The same values in their fewest bytes read.
        #expect(try SFrameHeader.decode([0x50]).0 == SFrameHeader(keyID: 5, counter: 0))
        #expect(try SFrameHeader.decode([0x80, 0x08]).0 == SFrameHeader(keyID: 8, counter: 0))
        #expect(try SFrameHeader.decode([0x89, 0x08, 0x01, 0x00]).0 == SFrameHeader(keyID: 8, counter: 256))
    }

    @Test func framesOpenWithTheirKeyAndNoOther() throws {
        var random: any SecureRandom = SeededRandom(seed: 7)
        let key = SenderKey.fresh(member: MemberID(3), epoch: 1, random: &random)
        let audio: [UInt8] = Array(0..<160)
        let frame = try PartyFrame.seal(
            audio, key: key, counter: 42, sequence: 9, timestamp: 1234, level: AudioLevel(level: 20, voiced: true))
        let header = try PartyFrameHeader.decode(frame)
        #expect(header.sender == MemberID(3))
        #expect(header.sequence == 9 && header.timestamp == 1234 && header.level.level == 20 && header.level.voiced)
        #expect(try PartyFrame.open(frame, header: header, key: key) == audio)
        // The audio is not in the frame in the clear.
        #expect(!frame.indices.dropLast(audio.count).contains { Array(frame[$0..<($0 + 16)]) == Array(audio.prefix(16)) })
        // Another epoch's key, the next ratchet step, a changed level: none open it.
        let other = SenderKey.fresh(member: MemberID(3), epoch: 1, random: &random)
        #expect(throws: FrameOpenError.authenticationFailed) { _ = try PartyFrame.open(frame, header: header, key: other) }
        #expect(throws: FrameOpenError.authenticationFailed) {
            _ = try PartyFrame.open(frame, header: header, key: key.ratcheted())
        }
        var louder = frame
        louder[9] = 0x80 | 5
        #expect(throws: FrameOpenError.authenticationFailed) {
            _ = try PartyFrame.open(louder, header: try PartyFrameHeader.decode(louder), key: key)
        }
    }

    @Test func theRatchetGoesOneWay() throws {
        var random: any SecureRandom = SeededRandom(seed: 8)
        let k0 = SenderKey.fresh(member: MemberID(1), epoch: 0, random: &random)
        let k1 = k0.ratcheted()
        let k2 = k1.ratcheted()
        #expect(k1.id.step == 1 && k2.id.step == 2)
        #expect(k0.ratcheted().baseBytes == k1.baseBytes)
        #expect(k1.baseBytes != k0.baseBytes && k2.baseBytes != k1.baseBytes)
        // A receiver holding step 1 follows a sender at step 2 and opens its frames…
        var keyring = PartyKeyring()
        keyring.add(SenderKey(id: k1.id, base: try SecretKey(bytes: k1.baseBytes)))
        let later = try PartyFrame.seal([1, 2, 3], key: k2, counter: 1, sequence: 1, timestamp: 0, level: .silence)
        #expect(try keyring.open(later, header: try PartyFrameHeader.decode(later)) == [1, 2, 3])
        // …but never opens what was sealed under step 0, nor the same frame twice.
        let earlier = try PartyFrame.seal([4, 5, 6], key: k0, counter: 0, sequence: 0, timestamp: 0, level: .silence)
        #expect(throws: FrameOpenError.noKey(k0.id)) {
            _ = try keyring.open(earlier, header: try PartyFrameHeader.decode(earlier))
        }
        #expect(throws: FrameOpenError.replayed) { _ = try keyring.open(later, header: try PartyFrameHeader.decode(later)) }
    }
}
