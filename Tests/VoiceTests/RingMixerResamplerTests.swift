import Foundation
import Synchronization
import Testing

@testable import Voice

private func write(_ ring: AudioRing, _ values: [Int16]) {
    values.withUnsafeBufferPointer { ring.write($0) }
}

private func read(_ ring: AudioRing, _ count: Int) -> [Int16] {
    var out = [Int16](repeating: -1, count: count)
    let n = out.withUnsafeMutableBufferPointer { ring.read(into: $0) }
    return Array(out[0..<n])
}

@Suite struct AudioRingTests {
    @Test func emptyReadsReturnNothing() {
        let ring = AudioRing(capacity: 4)
        #expect(read(ring, 3) == [])
        #expect(ring.count == 0)
        #expect(read(ring, 0) == [])
    }

    @Test func exactlyFullKeepsEverything() {
        let ring = AudioRing(capacity: 4)
        write(ring, [1, 2, 3, 4])
        #expect(ring.count == 4)
        #expect(read(ring, 10) == [1, 2, 3, 4])
        #expect(ring.droppedSamples == 0)
    }

    @Test func oneMoreThanFullDropsTheOldestOne() {
        let ring = AudioRing(capacity: 4)
        write(ring, [1, 2, 3, 4])
        write(ring, [5])
        #expect(ring.count == 4)
        #expect(read(ring, 10) == [2, 3, 4, 5])
        #expect(ring.droppedSamples == 1)
    }

    @Test func aWriteLargerThanTheRingKeepsTheNewest() {
        let ring = AudioRing(capacity: 4)
        write(ring, [9])
        write(ring, Array(1...10))
        #expect(read(ring, 10) == [7, 8, 9, 10])
        #expect(ring.droppedSamples == 7)
    }

    @Test func readsAndWritesAcrossTheWrap() {
        let ring = AudioRing(capacity: 5)
        write(ring, [1, 2, 3])
        #expect(read(ring, 2) == [1, 2])
        write(ring, [4, 5, 6, 7])  // wraps: occupies slots 3, 4, 0, 1
        #expect(ring.count == 5)
        #expect(read(ring, 4) == [3, 4, 5, 6])
        write(ring, [8, 9, 10])
        #expect(read(ring, 1) == [7])
        #expect(read(ring, 9) == [8, 9, 10])
        #expect(ring.droppedSamples == 0)
    }

    @Test func twoThreadsSeeAnOrderedStreamWithGapsOnlyFromDrops() async throws {
        // A writer thread writes a counting sequence (below 65536, so 16 bits hold it)
        // in uneven chunks; the reader loses the oldest samples when it falls behind, but
        // what it reads must be strictly increasing and every gap counted as dropped.
        // Real threads, not tasks: a busy test run must not be able to starve the writer,
        // and the spinning reader must not hold one of the cooperative pool's threads.
        let ring = AudioRing(capacity: 256)
        let total = 60_000
        let done = Flag()
        let writer = Thread {
            var next = 0
            var chunk = [Int16](repeating: 0, count: 97)
            while next < total {
                let n = min(chunk.count - next % 13, total - next)
                for i in 0..<n { chunk[i] = Int16(bitPattern: UInt16(next + i)) }
                chunk.withUnsafeBufferPointer { ring.write(UnsafeBufferPointer(rebasing: $0[0..<n])) }
                next += n
                if next % 7 == 0 { sched_yield() }
            }
            done.set()
        }
        writer.start()
        let r = try await offPool { () -> (last: Int, readCount: Int, ordered: Bool) in
            var buffer = [Int16](repeating: 0, count: 61)
            var last = -1
            var readCount = 0
            var ordered = true
            let deadline = Date().addingTimeInterval(30)
            while Date() < deadline {
                let finished = done.isSet
                let n = buffer.withUnsafeMutableBufferPointer { ring.read(into: $0) }
                for i in 0..<n {
                    let value = Int(UInt16(bitPattern: buffer[i]))
                    if value <= last { ordered = false }
                    last = value
                }
                readCount += n
                if n == 0 {
                    if finished { break }
                    sched_yield()
                }
            }
            return (last, readCount, ordered)
        }
        #expect(done.isSet, "the writer did not finish in 30 s")
        #expect(r.ordered)
        #expect(r.last == total - 1)
        #expect(r.readCount + ring.droppedSamples == total, "read \(r.readCount), dropped \(ring.droppedSamples)")
    }
}

/// A flag one thread sets and another reads.
final class Flag: Sendable {
    private let value = Atomic<Bool>(false)
    func set() { value.store(true, ordering: .releasing) }
    var isSet: Bool { value.load(ordering: .acquiring) }
}

@Suite struct PacketRingTests {
    @Test func packetsComeOutInOrderWithTheirMetadata() {
        let ring = PacketRing(slots: 3, maximumPacketSize: 8)
        for i in 0..<3 {
            let payload: [UInt8] = Array(repeating: UInt8(i), count: i + 1)
            let pushed = payload.withUnsafeBytes {
                ring.push(sequence: UInt16(i), timestamp: UInt32(i * 160), arrivalNanoseconds: Int64(i), payload: $0)
            }
            #expect(pushed)
        }
        // Full: refused and counted. Too large: refused and counted.
        #expect(
            [UInt8](repeating: 9, count: 1).withUnsafeBytes {
                ring.push(sequence: 9, timestamp: 0, arrivalNanoseconds: 0, payload: $0)
            } == false)
        var got: [(UInt16, UInt32, Int64, [UInt8])] = []
        while ring.pop({ got.append(($0, $1, $2, Array($3))) }) {}
        #expect(got.map(\.0) == [0, 1, 2])
        #expect(got.map(\.1) == [0, 160, 320])
        #expect(got.map(\.3) == [[0], [1, 1], [2, 2, 2]])
        #expect(
            [UInt8](repeating: 1, count: 9).withUnsafeBytes {
                ring.push(sequence: 0, timestamp: 0, arrivalNanoseconds: 0, payload: $0)
            } == false)
        #expect(ring.droppedPackets == 2)
        #expect(ring.pop { _, _, _, _ in } == false)
    }

    @Test func aProducerAndAConsumerThreadLoseNothingWhenTheConsumerKeepsUp() async throws {
        let ring = PacketRing(slots: 16, maximumPacketSize: 4)
        // 1,250 trips round the ring: enough to meet every wrap, few enough that two
        // spinning threads finish well inside the deadline with both cores busy.
        let total = 20_000
        let stop = Flag()
        let producer = Thread {
            var i = 0
            // A full ring makes the producer retry; `stop` ends it if the consumer gives up.
            while i < total && !stop.isSet {
                var v = UInt32(i).bigEndian
                let ok = withUnsafeBytes(of: &v) {
                    ring.push(
                        sequence: UInt16(truncatingIfNeeded: i), timestamp: UInt32(i), arrivalNanoseconds: Int64(i), payload: $0)
                }
                if ok { i += 1 } else { sched_yield() }
            }
        }
        producer.start()
        // The spinning consumer runs off the cooperative pool (see offPool).
        let (expected, consistent) = try await offPool { () -> (Int, Bool) in
            var expected = 0
            var consistent = true
            // Only bounds a failure (a lost packet would leave the consumer waiting).
            let deadline = Date().addingTimeInterval(120)
            while expected < total, Date() < deadline {
                let popped = ring.pop { seq, ts, arrival, payload in
                    let v = payload.count == 4 ? UInt32(bigEndian: payload.loadUnaligned(as: UInt32.self)) : UInt32.max
                    if ts != UInt32(expected) || v != ts || arrival != Int64(expected)
                        || seq != UInt16(truncatingIfNeeded: expected)
                    {
                        consistent = false
                    }
                    expected += 1
                }
                if !popped { sched_yield() }
            }
            return (expected, consistent)
        }
        stop.set()
        #expect(expected == total)
        #expect(consistent)
        // Dropped counts only refusals of a full ring, which the producer retried.
        #expect(ring.count == 0)
    }
}

@Suite struct MixerTests {
    @Test func oneStreamPassesBitExact() {
        let mixer = Mixer(frameSize: 160)
        let frame = (0..<160).map { Int16(truncatingIfNeeded: $0 * 200 - 16000) }
        var out = [Int16](repeating: 0, count: 160)
        frame.withUnsafeBufferPointer { f in out.withUnsafeMutableBufferPointer { mixer.mix([f], into: $0) } }
        #expect(out == frame)
    }

    @Test func loudSumsNeverClipOrWrapAndTheGainRecovers() {
        let mixer = Mixer(frameSize: 160)
        let loud = (0..<160).map { Int16(30000 * sin(Double($0) / 5)) }
        var out = [Int16](repeating: 0, count: 160)
        for _ in 0..<5 {
            loud.withUnsafeBufferPointer { f in out.withUnsafeMutableBufferPointer { mixer.mix([f, f, f], into: $0) } }
            // Same shape, scaled: no sample pinned at full scale (a clip) and no sign flip (a wrap).
            #expect(out.allSatisfy { $0 > Int16.min && $0 < Int16.max })
            #expect(zip(out, loud).allSatisfy { ($0 >= 0) == ($1 >= 0) || abs(Int($0)) < 3 })
        }
        #expect(mixer.currentGain < 0.5)
        let quiet = [Int16](repeating: 100, count: 160)
        for _ in 0..<200 {
            quiet.withUnsafeBufferPointer { f in out.withUnsafeMutableBufferPointer { mixer.mix([f], into: $0) } }
        }
        #expect(mixer.currentGain > 0.99)
    }
}

@Suite struct ResamplerTests {
    @Test(arguments: [44_100, 48_000, 16_000])
    func deviceRatesToTheVoiceRateAndBack(rate: Int) throws {
        // A 1 kHz tone in uneven chunks: whole samples out, the tone's frequency kept,
        // and the output count matches the rate ratio.
        let seconds = 1
        let input = (0..<(rate * seconds)).map { Int16(10000 * sin(2 * Double.pi * 1000 * Double($0) / Double(rate))) }
        let down = try Resampler(from: rate, to: 8000)
        var out: [Int16] = []
        var scratch = [Int16](repeating: 0, count: down.outputCapacity(forInput: 1100))
        var i = 0
        var chunk = 1
        while i < input.count {
            let n = min(chunk, input.count - i)
            let produced = try input.withUnsafeBufferPointer { inp in
                try scratch.withUnsafeMutableBufferPointer {
                    try down.process(UnsafeBufferPointer(rebasing: inp[i..<(i + n)]), into: $0)
                }
            }
            out += scratch[0..<produced]
            i += n
            chunk = chunk % 997 + 37
        }
        // Whole samples at the ratio (the filter's delay is inside them, as leading silence).
        #expect(abs(out.count - 8000 * seconds) <= 2, "got \(out.count)")
        let tail = Array(out.suffix(4000))
        let crossings = zip(tail, tail.dropFirst()).filter { ($0 < 0) != ($1 < 0) }.count
        #expect(abs(crossings - 1000) <= 4, "zero crossings in 0.5 s: \(crossings)")
        let back = try Resampler.resampleAll(Resampler.resampleAll(input, from: rate, to: 8000), from: 8000, to: rate)
        #expect(back.count == input.count)
        // Aligned to within one sample at 8 kHz (the filter delays are whole samples at each rate).
        let tolerance = rate / 8000 + 1
        let match = Signal.bestCorrelation(
            Array(input[(rate / 10)..<(rate * 9 / 10)]), Array(back[(rate / 10)..<(rate * 9 / 10)]),
            lags: -(tolerance + 3)...(tolerance + 3))
        #expect(match.correlation > 0.98 && abs(match.lag) <= tolerance, "\(match)")
    }

    @Test func tooSmallAnOutputIsRefused() throws {
        let r = try Resampler(from: 48_000, to: 8000)
        let input = [Int16](repeating: 0, count: 960)
        var out = [Int16](repeating: 0, count: 100)
        #expect(throws: VoiceError.self) {
            _ = try input.withUnsafeBufferPointer { i in try out.withUnsafeMutableBufferPointer { try r.process(i, into: $0) } }
        }
    }
}
