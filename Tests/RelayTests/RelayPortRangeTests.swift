import Testing
import TusaBase

@testable import Relay

/// The relay port range's picking and accounting, with a seeded generator and
/// a bind that the test decides (no sockets).
struct RelayPortRangeTests {
    @Test("consecutive allocations get unpredictable ports spread over the range, not one after another (RFC 8656 6.2)")
    func picksAreUnpredictable() {
        var range = RelayPortRange(minPort: 49152, maxPort: 65535)
        var random = SplitMix64(seed: 7)
        var ports: [Int] = []
        for _ in 0..<400 {
            guard let port = range.take(even: false, pair: false, using: &random, bind: { _ in true }) else { break }
            ports.append(port)
        }
        #expect(ports.count == 400)
        #expect(Set(ports).count == 400)
        // Sequential handing out would give steps of +1; random picks almost never do.
        let steps = zip(ports, ports.dropFirst()).map { $1 - $0 }
        #expect(steps.filter { abs($0) <= 2 }.count <= 2, "\(steps.prefix(20))")
        // Spread: each quarter of the range gets a fair share (expected 100 each).
        let quarter = (65535 - 49152 + 1) / 4
        let buckets = Dictionary(grouping: ports) { ($0 - 49152) / quarter }.mapValues(\.count)
        for q in 0..<4 { #expect((60...140).contains(buckets[q] ?? 0), "\(buckets)") }
        // Another generator state gives other ports.
        var other = RelayPortRange(minPort: 49152, maxPort: 65535)
        var random2 = SplitMix64(seed: 8)
        let first2 = (0..<5).compactMap { _ in other.take(even: false, pair: false, using: &random2, bind: { _ in true }) }
        #expect(first2 != Array(ports.prefix(5)))
    }

    @Test("every port of a range is handed out once, then none; a released port is the only one left to take")
    func accountingCoversTheRange() {
        var range = RelayPortRange(minPort: 50000, maxPort: 50099)
        var random = SplitMix64(seed: 1)
        var taken = Set<Int>()
        while let port = range.take(even: false, pair: false, using: &random, bind: { _ in true }) {
            #expect(taken.insert(port).inserted, "port \(port) handed out twice")
        }
        #expect(taken == Set(50000...50099))
        #expect(range.heldCount == 100 && range.free == 0)
        let r1 = range.release(50042)
        #expect(r1)
        let r2 = range.release(50042)
        #expect(!r2, "released twice")
        let r3 = range.release(49999)
        #expect(!r3, "outside the range")
        #expect(range.free == 1)
        let r4 = range.take(even: false, pair: false, using: &random, bind: { _ in true })
        #expect(r4 == 50042)
        let r5 = range.take(even: false, pair: false, using: &random, bind: { _ in true })
        #expect(r5 == nil)
    }

    @Test("ports another process holds are skipped: the search goes on until a bind succeeds, and only bound ports are held")
    func foreignPortsAreSkipped() {
        var range = RelayPortRange(minPort: 40000, maxPort: 40063)
        var random = SplitMix64(seed: 3)
        let foreign = Set(40000...40062)  // only 40063 is free on "the machine"
        var tried = 0
        let port = range.take(even: false, pair: false, using: &random) { port in
            tried += 1
            return !foreign.contains(port)
        }
        #expect(port == 40063)
        #expect(range.heldCount == 1)
        #expect(tried <= 64 + RelayPortRange.draws)
        // With every port foreign, the search gives up after trying each at most once past the draws.
        var full = RelayPortRange(minPort: 40000, maxPort: 40063)
        var calls = 0
        let r6 = full.take(
            even: false, pair: false, using: &random,
            bind: { _ in
                calls += 1
                return false
            })
        #expect(r6 == nil)
        #expect(calls <= 64 + RelayPortRange.draws && full.heldCount == 0)
        // The attempt limit bounds the binds.
        calls = 0
        let r7 = full.take(
            even: false, pair: false, attempts: 5, using: &random,
            bind: { _ in
                calls += 1
                return false
            })
        #expect(r7 == nil)
        #expect(calls == 5)
    }

    @Test("EVEN-PORT: even ports only; with a reservation, port+1 is held too and inside the range, and never taken twice")
    func evenPortsAndReservations() {
        var range = RelayPortRange(minPort: 50001, maxPort: 50010)
        var random = SplitMix64(seed: 5)
        var pairs: [Int] = []
        while let port = range.take(even: true, pair: true, using: &random, bind: { _ in true }) {
            pairs.append(port)
        }
        // 50002/3, 50004/5, 50006/7, 50008/9: 50010 has no 50011 inside the range.
        #expect(Set(pairs) == [50002, 50004, 50006, 50008])
        #expect(range.heldCount == 8)
        for port in pairs { #expect(range.isHeld(port) && range.isHeld(port + 1)) }
        // Only 50001 and 50010 are left: no even pair fits, an even single does.
        let r8 = range.take(even: true, pair: false, using: &random, bind: { _ in true })
        #expect(r8 == 50010)
        let r9 = range.take(even: false, pair: false, using: &random, bind: { _ in true })
        #expect(r9 == 50001)
        // A reserved port given back can be taken again by itself.
        let r10 = range.release(50005)
        #expect(r10)
        let r11 = range.take(even: true, pair: true, using: &random, bind: { _ in true })
        #expect(r11 == nil, "50004 is still held")
        let r12 = range.take(even: false, pair: false, using: &random, bind: { _ in true })
        #expect(r12 == 50005)
    }

    @Test("ranges of one port, an odd one for EVEN-PORT, and an empty range give nothing or the one port, without trapping")
    func degenerateRanges() {
        var random = SplitMix64(seed: 9)
        var one = RelayPortRange(minPort: 65535, maxPort: 65535)
        let r13 = one.take(even: true, pair: false, using: &random, bind: { _ in true })
        #expect(r13 == nil)
        let r14 = one.take(even: false, pair: true, using: &random, bind: { _ in true })
        #expect(r14 == nil)
        let r15 = one.take(even: false, pair: false, using: &random, bind: { _ in true })
        #expect(r15 == 65535)
        var empty = RelayPortRange(minPort: 50000, maxPort: 49999)
        #expect(empty.capacity == 0)
        let r16 = empty.take(even: false, pair: false, using: &random, bind: { _ in true })
        #expect(r16 == nil)
        var full = RelayPortRange(minPort: 1, maxPort: 65535)
        #expect(full.capacity == 65535)
        let pair = full.take(even: true, pair: true, using: &random, bind: { _ in true })
        #expect(pair.map { $0 % 2 == 0 && $0 < 65535 } == true)
    }
}
