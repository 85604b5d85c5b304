import Testing

@testable import Secure

struct ReplayWindowTests {
    @Test func firstPacketIsFreshWhateverItsIndex() {
        for first: UInt64 in [0, 1, 2047, 2048, 65535, 1 << 40, UInt64.max] {
            var w = ReplayWindow()
            #expect(w.check(first) == .fresh)
            w.accept(first)
            #expect(w.check(first) == .replayed)
            #expect(w.highest == first)
        }
    }

    @Test func windowEdges() {
        var w = ReplayWindow()
        w.accept(5000)
        #expect(w.check(5000 - 2047) == .fresh)  // oldest judged index
        #expect(w.check(5000 - 2048) == .tooOld)  // one past the edge
        #expect(w.check(5001) == .fresh)
        w.accept(5000 - 2047)
        #expect(w.check(5000 - 2047) == .replayed)
        // Accepting beyond the edge is ignored.
        w.accept(5000 - 2048)
        #expect(w.check(5000 - 2048) == .tooOld)
        #expect(w.highest == 5000)
    }

    @Test func everyIndexInTheWindowIsTrackedSeparately() {
        var w = ReplayWindow()
        let top: UInt64 = 10_000
        w.accept(top)
        for i in stride(from: top - 2047, to: top, by: 2) { w.accept(i) }
        for i in (top - 2047)...top {
            let expected: ReplayVerdict = (i == top || (i - (top - 2047)) % 2 == 0) ? .replayed : .fresh
            #expect(w.check(i) == expected, "index \(i)")
        }
    }

    @Test func advancingClearsWhatLeavesTheWindow() {
        var w = ReplayWindow()
        for i: UInt64 in 0..<3000 { w.accept(i) }
        for i: UInt64 in 3000 - 2048..<3000 { #expect(w.check(i) == .replayed) }
        #expect(w.check(3000 - 2049) == .tooOld)
        // Move by one block at a time and one index at a time: the new indices are fresh.
        for i: UInt64 in 3000..<3200 { #expect(w.check(i) == .fresh, "index \(i)") }
    }

    @Test(arguments: [UInt64(64), 2047, 2048, 2049, 4096, 100_000, 1 << 33])
    func largeJumps(jump: UInt64) {
        var w = ReplayWindow()
        for i: UInt64 in 100..<200 { w.accept(i) }
        let top = 199 + jump
        w.accept(top)
        #expect(w.check(top) == .replayed)
        // Indices between the old and the new top were never seen.
        for i in max(top >= 2047 ? top - 2047 : 0, 200)..<top { #expect(w.check(i) == .fresh, "index \(i)") }
        for i: UInt64 in 100..<200 {
            let expected: ReplayVerdict = top - i >= 2048 ? .tooOld : .replayed
            #expect(w.check(i) == expected, "old index \(i)")
        }
    }

    @Test func wrapOfTheBlockRing() {
        // Indices whose blocks map to the same ring slot (33 blocks of 64 apart) must not alias.
        var w = ReplayWindow()
        w.accept(0)
        w.accept(33 * 64)
        #expect(w.check(0) == .tooOld)
        #expect(w.check(33 * 64 - 2047) == .fresh)
        w.accept(33 * 64 + 1)
        #expect(w.check(33 * 64) == .replayed)
        #expect(w.check(33 * 64 + 2) == .fresh)
    }

    @Test func nearTheTopOfTheIndexSpace() {
        var w = ReplayWindow()
        w.accept(UInt64.max - 1)
        #expect(w.check(UInt64.max) == .fresh)
        w.accept(UInt64.max)
        #expect(w.check(UInt64.max) == .replayed && w.check(UInt64.max - 1) == .replayed)
        #expect(w.check(UInt64.max - 2048) == .tooOld)
    }
}

struct ExtendedSequenceTests {
    @Test func rfc3711Estimation() {
        #expect(ExtendedSequence.estimate(7, highest: nil) == 7)
        #expect(ExtendedSequence.estimate(65535, highest: nil) == 65535)
        // In order, and a roll forward.
        #expect(ExtendedSequence.estimate(101, highest: 100) == 101)
        #expect(ExtendedSequence.estimate(2, highest: 65530) == 65536 + 2)
        #expect(ExtendedSequence.estimate(65535, highest: 65536 + 5) == 65535)  // late packet from the previous roll
        #expect(ExtendedSequence.estimate(10, highest: 3 << 16 | 40_000) == 4 << 16 | 10)
        #expect(ExtendedSequence.estimate(60_000, highest: 3 << 16 | 100) == 2 << 16 | 60_000)
        // Exactly half a roll away stays in the same roll.
        #expect(ExtendedSequence.estimate(32768 + 100, highest: 100) == 32768 + 100)
        #expect(ExtendedSequence.estimate(101, highest: 5 << 16 | (32768 + 100)) == 5 << 16 | 101)
        // ROC 0: there is no earlier roll.
        #expect(ExtendedSequence.estimate(65000, highest: 10) == 65000)
    }

    @Test func aLongRunOfInOrderPacketsTracksEveryRoll() {
        var highest: UInt64? = nil
        for n: UInt64 in stride(from: 0, to: 5 * 65536, by: 97) {
            let e = ExtendedSequence.estimate(UInt16(truncatingIfNeeded: n), highest: highest)
            #expect(e == n)
            if e != n { return }
            highest = e
        }
    }
}
