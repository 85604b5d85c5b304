import Foundation
import Testing
import TusaBase

@testable import Voice

/// A decoder whose redundancy decode is recognisable (all samples 1234), for the FEC path.
final class FakeFECDecoder: VoiceDecoder {
    let inner: L16Decoder
    var configuration: CodecConfiguration { inner.configuration }
    var recoversFromNextPacket: Bool { true }
    init(_ c: CodecConfiguration) { inner = L16Decoder(c) }
    func decode(_ packet: UnsafeRawBufferPointer, into pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        try inner.decode(packet, into: pcm)
    }
    func decodeRedundancy(from nextPacket: UnsafeRawBufferPointer, into pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError)
        -> Int
    {
        for i in 0..<configuration.samplesPerFrame { pcm[i] = 1234 }
        return configuration.samplesPerFrame
    }
    func conceal(into pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int { try inner.conceal(into: pcm) }
    func reset() { inner.reset() }
}

struct Harness {
    static let codec = CodecConfiguration(sampleRate: 8000, frameDuration: .ms20)
    static let spf = 160
    let signal: [Int16]
    let packets: [[UInt8]]

    /// A 400 Hz tone, amplitude 8000, silent (zero) only in the frames `silent`.
    init(frames: Int, frequency: Double = 400, silent: Range<Int> = 0..<0) {
        var s = [Int16](repeating: 0, count: frames * Self.spf)
        for n in 0..<s.count where !silent.contains(n / Self.spf) {
            s[n] = Int16(8000 * sin(2 * Double.pi * frequency * Double(n) / 8000))
        }
        signal = s
        let enc = L16Encoder(Self.codec)
        var ps: [[UInt8]] = []
        for i in 0..<frames {
            var p = [UInt8](repeating: 0, count: 320)
            s.withUnsafeBufferPointer { src in
                p.withUnsafeMutableBytes { dst in
                    _ = try? enc.encode(UnsafeBufferPointer(rebasing: src[(i * Self.spf)..<((i + 1) * Self.spf)]), into: dst)
                }
            }
            ps.append(p)
        }
        packets = ps
    }

    /// Runs a schedule of (frame index, arrival ms) on a 20 ms pull clock for `ms` milliseconds.
    func run(
        _ playout: any PlayoutBuffer, arrivals: [(Int, Double)], ms: Double, seq0: UInt16 = 0, ts0: UInt32 = 0, start: Double = 0,
        sequence: (Int) -> Int = { $0 }
    ) -> [Int16] {
        let sorted = arrivals.sorted { $0.1 < $1.1 }
        var out = [Int16](repeating: 0, count: Int(ms / 20) * Self.spf)
        var next = 0
        for k in 0..<Int(ms / 20) {
            let t = start + Double(k) * 20
            while next < sorted.count && sorted[next].1 <= t {
                let (i, a) = sorted[next]
                packets[i].withUnsafeBytes { raw in
                    playout.insert(
                        sequence: seq0 &+ UInt16(truncatingIfNeeded: sequence(i)), timestamp: ts0 &+ UInt32(i * Self.spf),
                        payload: raw, arrivalNanoseconds: Int64(a * 1e6))
                }
                next += 1
            }
            out.withUnsafeMutableBufferPointer { o in
                playout.pull(
                    nowNanoseconds: Int64(t * 1e6),
                    into: UnsafeMutableBufferPointer(rebasing: o[(k * Self.spf)..<((k + 1) * Self.spf)]))
            }
        }
        return out
    }

    /// The offset at which `signal[range]` appears exactly in `out`, if any.
    func find(_ out: [Int16], frames: Range<Int>) -> Int? {
        let needle = Array(signal[(frames.lowerBound * Self.spf)..<(frames.upperBound * Self.spf)])
        guard out.count >= needle.count else { return nil }
        for off in 0...(out.count - needle.count) where out[off] == needle[0] && Array(out[off..<(off + needle.count)]) == needle
        { return off }
        return nil
    }
}

/// Frame i arriving 25 ms after its send time plus `extra`.
func on(_ i: Int, _ extra: Double = 0) -> (Int, Double) {
    let send: Double = Double(i) * 20
    return (i, send + 25 + extra)
}

func maxJump(_ x: ArraySlice<Int16>) -> Int {
    var m = 0
    var prev: Int16? = nil
    for v in x {
        if let p = prev { m = max(m, abs(Int(v) - Int(p))) }
        prev = v
    }
    return m
}

@Suite("Playout")
struct PlayoutTests {
    let h = Harness(frames: 200)
    var noStretch: PlayoutConfiguration { PlayoutConfiguration(maximumStretch: 0) }

    @Test func inOrderPlaysBitExact() throws {
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: noStretch)
        let out = h.run(p, arrivals: (0..<200).map { on($0) }, ms: 4400)
        #expect(h.find(out, frames: 0..<200) != nil)
        let s = p.statistics
        #expect(s.packetsPlayed == 200)
        #expect(s.framesConcealed == 0 || s.concealedByCause.lost == 0)
        #expect(s.latePackets == 0)
    }

    @Test func reorderWithinDelayPlaysInOrder() throws {
        let p = try Playout(
            decoder: L16Decoder(Harness.codec),
            configuration: PlayoutConfiguration(minimumDelayMilliseconds: 60, maximumStretch: 0))
        let arrivals = (0..<200).map { i in on(i, i % 2 == 0 ? 25.0 : 0.0) }  // even frames after the odd ones
        let out = h.run(p, arrivals: arrivals, ms: 4600)
        #expect(h.find(out, frames: 0..<200) != nil)
        #expect(p.statistics.latePackets == 0)
    }

    @Test func duplicatesIgnoredAndCounted() throws {
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: noStretch)
        let arrivals = (0..<200).flatMap { i in [on(i), on(i, 2)] }
        let out = h.run(p, arrivals: arrivals, ms: 4400)
        #expect(h.find(out, frames: 0..<200) != nil)
        #expect(p.statistics.duplicates == 200)
    }

    @Test func sequenceAndTimestampWrap() throws {
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: noStretch)
        let out = h.run(
            p, arrivals: (0..<200).map { on($0) }, ms: 4400,
            seq0: 65530, ts0: UInt32.max - 160 * 5 + 1)
        #expect(h.find(out, frames: 0..<200) != nil)
        #expect(p.statistics.packetsPlayed == 200)
    }

    @Test func gapConcealsThenCrossFades() throws {
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: noStretch)
        let out = h.run(p, arrivals: (0..<200).filter { $0 != 50 }.map { on($0) }, ms: 4400)
        let s = p.statistics
        #expect(s.framesConcealed >= 1)
        #expect(s.lostPackets >= 1)
        #expect(h.find(out, frames: 52..<200) != nil)  // frame 51's first half is cross-faded
        let natural = maxJump(h.signal[...])
        #expect(maxJump(out[...]) <= natural * 3)
    }

    @Test func fecUsedWhenDecoderRecovers() throws {
        // A jittery path (every fourth packet 15 ms late): the missing packet is waited
        // for, the next one arrives first, and the frame is rebuilt from its redundancy.
        let p = try Playout(decoder: FakeFECDecoder(Harness.codec), configuration: noStretch)
        let out = h.run(p, arrivals: (0..<200).filter { $0 != 50 }.map { on($0, $0 % 4 == 0 ? 15 : 0) }, ms: 4400)
        #expect(p.statistics.framesRecoveredByFEC == 1)
        #expect(out.indices.contains { i in i + 160 <= out.count && out[i..<(i + 160)].allSatisfy { $0 == 1234 } })
    }

    @Test func burstsOnASteadyPathAreConcealedOnceAndAddNoDelay() throws {
        // Every packet 25 ms after its send time, bursts of 3 and 4 lost: the frames
        // concealed while waiting stand in for the lost ones (not concealed twice), and
        // what follows each burst plays at the same delay as what came before it.
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: noStretch)
        let lost: Set<Int> = [60, 61, 62, 120, 121, 122, 123]
        nonisolated(unsafe) var delays: [Int: Int64] = [:]  // frame -> play time minus send time (ns)
        p.onPacketPlayed = { ts, playNs in delays[Int(ts) / Harness.spf] = playNs - Int64(ts) / 8 * 1_000_000 }
        _ = h.run(p, arrivals: (0..<200).filter { !lost.contains($0) }.map { on($0) }, ms: 4400)
        let s = p.statistics
        #expect(s.concealedByCause.lost == lost.count, "\(s)")
        #expect(s.lostPackets == lost.count, "\(s)")
        #expect(delays.count == 200 - lost.count)
        let first = try #require(delays[10])
        #expect(delays.values.allSatisfy { $0 == first }, "delays: \(Set(delays.values).sorted())")
    }

    /// The sender pauses mid-stream (DTX: frames 80..<105 never sent, sequence numbers
    /// without a gap) on a path steady or jittery (every fourth packet 15 ms late): the
    /// pause is never counted as loss, and what follows it plays with no more delay than before.
    @Test(arguments: [0.0, 15.0])
    func aSendersPauseIsNeitherLossNorDelay(jitter: Double) throws {
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: noStretch)
        let pause = 80..<105
        nonisolated(unsafe) var delays: [Int: Int64] = [:]  // frame -> play time minus send time (ns)
        p.onPacketPlayed = { ts, playNs in delays[Int(ts) / Harness.spf] = playNs - Int64(ts) / 8 * 1_000_000 }
        let sent = (0..<200).filter { !pause.contains($0) }
        let out = h.run(
            p, arrivals: sent.map { on($0, $0 % 4 == 0 ? jitter : 0) }, ms: 4400,
            sequence: { $0 < pause.upperBound ? $0 : $0 - pause.count })
        let s = p.statistics
        #expect(s.lostPackets == 0 && s.concealedByCause.lost == 0, "\(s)")
        #expect(s.packetsPlayed == sent.count, "\(s)")
        let before = try #require(delays[79])
        let after = try #require(delays[106])
        // Not grown by the pause (half a second): at most shrunk toward the target in it.
        #expect(after - before < 20_000_000, "delay \(before / 1_000_000) ms before the pause, \(after / 1_000_000) after")
        #expect(h.find(out, frames: 105..<190) != nil)
    }

    @Test(arguments: [(40, 5.0), (160, 20.0)])
    func theFloorIsOnePullNotOneFrame(pull: Int, floor: Double) throws {
        // Packets every 20 ms, 25 ms after sending, pulled `pull` samples at a time at an
        // arbitrary phase: on a steady path each packet plays one pull after it arrives
        // (not a frame), and nothing is concealed once playing.
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: noStretch)
        nonisolated(unsafe) var waits: [Double] = []
        p.onPacketPlayed = { ts, playNs in waits.append(Double(playNs) / 1e6 - (Double(ts) / 8 + 25)) }
        var out = [Int16](repeating: 0, count: pull)
        var next = 0
        let step = Double(pull) / 8  // ms
        var t = 3.7
        while t < 4000 {
            while next < 190 && Double(next) * 20 + 25 <= t {
                h.packets[next].withUnsafeBytes {
                    p.insert(
                        sequence: UInt16(next), timestamp: UInt32(next * 160), payload: $0,
                        arrivalNanoseconds: Int64((Double(next) * 20 + 25) * 1e6))
                }
                next += 1
            }
            out.withUnsafeMutableBufferPointer { p.pull(nowNanoseconds: Int64(t * 1e6), into: $0) }
            t += step
        }
        let steady = Array(waits.dropFirst(5).prefix(150))
        #expect(steady.count == 150)
        #expect(
            steady.allSatisfy { $0 >= floor - 0.01 && $0 < floor + step + 0.01 },
            "\(Set(steady.map { ($0 * 10).rounded() / 10 }))")
        #expect(p.statistics.lostPackets == 0 && p.statistics.concealedByCause.lost == 0, "\(p.statistics)")
    }

    /// On a 5 ms audio clock, one packet 7 ms late on a steady path (no floor): the
    /// playout point waits for it with concealment, and plays it at the first pull
    /// after it came, the rest of the concealed frame dropped. It and what follows play
    /// at most two pulls (10 ms) later than before, not a whole frame.
    @Test func aLatePacketCostsThePullsWaitedNotAFrame() throws {
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: noStretch)
        nonisolated(unsafe) var delays: [Int: Double] = [:]  // frame -> play time minus send time (ms)
        p.onPacketPlayed = { ts, playNs in delays[Int(ts) / Harness.spf] = Double(playNs) / 1e6 - Double(ts) / 8 }
        let arrival = { (i: Int) in Double(i) * 20 + 25 + (i == 100 ? 7 : 0) }
        var out = [Int16](repeating: 0, count: 40)
        var next = 0
        var t = 3.7
        var pending = Array(0..<190).sorted { arrival($0) < arrival($1) }[...]
        while t < 3500 {  // (stopped before the stream ends, which would be waited for too)
            while let i = pending.first, arrival(i) <= t {
                h.packets[i].withUnsafeBytes {
                    p.insert(
                        sequence: UInt16(i), timestamp: UInt32(i * 160), payload: $0, arrivalNanoseconds: Int64(arrival(i) * 1e6))
                }
                pending.removeFirst()
                next += 1
            }
            out.withUnsafeMutableBufferPointer { p.pull(nowNanoseconds: Int64(t * 1e6), into: $0) }
            t += 5
        }
        let s = p.statistics
        #expect(next > 170 && s.packetsPlayed > 170 && s.lostPackets == 0, "\(s)")
        #expect(s.concealedByCause.bufferEmpty == 1, "\(s)")
        let before = try #require(delays[99])
        let late = try #require(delays[100])
        let after = try #require(delays[150])
        #expect(late > before && late <= before + 10.01, "frame 99 played \(before) ms after it was sent, 100 \(late) ms")
        #expect(after <= before + 10.01, "frame 99 played \(before) ms after it was sent, 150 \(after) ms")
    }

    @Test func longOutageFadesToComfortNoise() throws {
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: noStretch)
        _ = h.run(p, arrivals: (0..<200).filter { $0 < 50 || $0 >= 100 }.map { on($0) }, ms: 4400)
        let s = p.statistics
        #expect(s.framesComfortNoise >= 40)
        #expect(s.interruptions == 1)
        #expect(s.interruptionMilliseconds >= 900)
    }

    @Test func latePacketDiscardedAndCounted() throws {
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: noStretch)
        _ = h.run(p, arrivals: (0..<200).map { on($0, $0 == 50 ? 500.0 : 0.0) }, ms: 4400)
        #expect(p.statistics.latePackets == 1)
        #expect(p.statistics.lateLossRate > 0)
    }

    /// The sender is frozen for 10 s (SIGSTOP) and goes on where it was: its
    /// timestamps carry on from before. On a stream that lost packets lately (here a
    /// second's outage before, as a relay restart makes) the playout point moved on
    /// through the silence, so they are 10 s behind it: heard again within a fraction
    /// of a second, not dropped as late for the rest of the call (found by `make
    /// soak`'s faults case, in a party).
    @Test func aSenderFrozenAndResumedIsHeardAgain() throws {
        let h = Harness(frames: 300)
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: noStretch)
        let resumed = 100.0 * 20 + 10_000
        let arrivals = (0..<300).filter { !(30..<80).contains($0) }.map { i in
            i < 100 ? on(i) : (i, resumed + Double(i - 100) * 20 + 25)
        }
        let out = h.run(p, arrivals: arrivals, ms: resumed + 200 * 20 + 400)
        #expect(h.find(out, frames: 120..<290) != nil, "late: \(p.statistics.latePackets)")
        #expect(p.statistics.latePackets <= 15)
    }

    /// A delay spike past the largest delay: its backlog is late and dropped, and the
    /// buffer does not re-anchor on it (the packets after it are on time again).
    @Test func aSpikesBacklogIsDroppedNotFollowed() throws {
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: noStretch)
        // Frames 50..<75 held back and delivered together 700 ms late.
        let arrivals = (0..<200).map { i in (50..<75).contains(i) ? (i, 75.0 * 20 + 700) : on(i) }
        let out = h.run(p, arrivals: arrivals, ms: 4400)
        #expect(p.statistics.latePackets >= 20)
        #expect(h.find(out, frames: 80..<190) != nil)
    }

    @Test func singleSpikeDoesNotRaiseTargetForLong() throws {
        let h = Harness(frames: 2000)
        var rng = SplitMix64(seed: 7)
        var arrivals: [(Int, Double)] = []
        for i in 0..<2000 {
            let send = Double(i) * 20
            var a = send + 20 + rng.uniform() * 10
            if send >= 10_000 && send < 10_300 { a = max(a, 10_300 + 20) }
            arrivals.append((i, a))
        }
        let p = try Playout(decoder: L16Decoder(Harness.codec))
        _ = h.run(p, arrivals: Array(arrivals.prefix(450)), ms: 9000)
        let before = p.statistics.targetDelayMilliseconds
        _ = h.run(p, arrivals: arrivals.filter { $0.1 > 9000 }, ms: 0)  // no-op helper call keeps types simple
        let p2 = try Playout(decoder: L16Decoder(Harness.codec))
        _ = h.run(p2, arrivals: Array(arrivals.prefix(1250)), ms: 25_000)  // 15 s after the spike
        let after = p2.statistics.targetDelayMilliseconds
        #expect(after <= before + 10, "target \(after) ms 15 s after one spike, \(before) ms before")
    }

    /// One packet 30 ms late in the middle of speech: the frame waited for adds a frame
    /// of delay. The call's playout speeds speech up to take it off again; with
    /// `shrinkInPausesUpToMilliseconds` the delay stays until the speaker's next pause
    /// (frames 120..<135 silent) and comes off there, speech untouched.
    @Test func aLatePacketsDelayComesOffInTheNextPause() throws {
        let h = Harness(frames: 200, silent: 120..<135)
        let arrivals = (0..<200).map { on($0, $0 == 40 ? 30 : 0) }
        func run(_ configuration: PlayoutConfiguration) throws -> (PlayoutStatistics, [Int: Double]) {
            let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: configuration)
            nonisolated(unsafe) var delays: [Int: Double] = [:]  // frame -> play time minus send time (ms)
            p.onPacketPlayed = { ts, playNs in delays[Int(ts) / Harness.spf] = Double(playNs) / 1e6 - Double(ts) / 8 }
            _ = h.run(p, arrivals: arrivals, ms: 4400)
            return (p.statistics, delays)
        }
        let (call, _) = try run(PlayoutConfiguration())
        #expect(call.accelerateSamples > 0, "the call's playout: \(call)")
        let (party, delays) = try run(PlayoutConfiguration(shrinkInPausesUpToMilliseconds: 60))
        #expect(party.accelerateSamples == 0 && party.expandSamples == 0, "\(party)")
        #expect(party.framesDroppedInSilence + party.silenceTrimmedSamples > 0, "\(party)")
        #expect(party.lostPackets == 0 && party.packetsPlayed == 200, "\(party)")
        let before = try #require(delays[30])
        let held = try #require(delays[100])
        let after = try #require(delays[150])
        #expect(held >= before + 10, "delay before \(before) ms, after the late packet \(held) ms")
        #expect(after <= before + 1, "delay before \(before) ms, after the pause \(after) ms")
    }

    /// A 300 ms stall (a TCP member's: frames 50..<65 held up, then all at once): the
    /// pile-up is drained by speeding speech up, past the 5 % stretch budget, to under
    /// 60 ms over the target within three seconds; the call's playout, held to its
    /// budget, is still some 40 ms over that then.
    @Test func aPileUpIsDrainedFasterThanTheStretchBudget() throws {
        let arrivals = (0..<200).map { i in (50..<65).contains(i) ? (i, 65.0 * 20 + 25) : on(i) }
        func delay(_ configuration: PlayoutConfiguration) throws -> (Double, PlayoutStatistics) {
            let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: configuration)
            nonisolated(unsafe) var delays: [Int: Double] = [:]
            p.onPacketPlayed = { ts, playNs in delays[Int(ts) / Harness.spf] = Double(playNs) / 1e6 - Double(ts) / 8 }
            _ = h.run(p, arrivals: arrivals, ms: 4400)
            return (try #require(delays[190]) - 25, p.statistics)  // over the path's own 25 ms
        }
        let (party, ps) = try delay(PlayoutConfiguration(minimumDelayMilliseconds: 20, shrinkInPausesUpToMilliseconds: 60))
        let (call, cs) = try delay(PlayoutConfiguration(minimumDelayMilliseconds: 20))
        #expect(ps.lostPackets == 0 && ps.framesDroppedInCatchUp == 0, "\(ps)")
        #expect(party <= 20 + 60 + 20, "the party's playout: \(party) ms buffered 3 s after the stall; \(ps)")
        #expect(call >= party + 30, "the call's playout: \(call) ms, the party's \(party) ms; \(cs)")
        // The statistics say so too: the pile-up's longest wait, and the last second's
        // delay back near the party's buffered delay 3 s after the stall.
        #expect(ps.delayMaxMilliseconds >= 150, "\(ps)")
        #expect(abs(ps.delayRecentMilliseconds - party) <= 10, "\(party) ms; \(ps)")
        #expect(cs.delayRecentMilliseconds >= ps.delayRecentMilliseconds + 30, "\(cs)")
    }

    @Test func hardMaximumTriggersCatchUp() throws {
        let p = try Playout(
            decoder: L16Decoder(Harness.codec), configuration: PlayoutConfiguration(maximumDelayMilliseconds: 200))
        // The path gets 300 ms faster after 2 s (a route change): measured against the new
        // minimum transit, everything buffered is suddenly 300 ms late, above the maximum.
        let arrivals = (0..<200).map { i -> (Int, Double) in
            let send = Double(i) * 20
            return (i, send < 2000 ? send + 325 : max(send + 25, 2325))
        }
        _ = h.run(p, arrivals: arrivals, ms: 4400)
        let s = p.statistics
        #expect(s.catchUps >= 1)
        #expect(s.framesDroppedInCatchUp >= 5)
        #expect(s.delayP95Milliseconds < 400)
    }

    /// A stream losing 5 % of its packets (more than the 3 % above which a missing packet
    /// is taken for lost rather than waited for) whose path also holds packets back for
    /// 300 ms every 10 s: once a spike was seen, the next spike's backlog is waited for
    /// and played, not given up for lost and then thrown away as too late.
    @Test func aLossyStreamWithDelaySpikesPlaysEachSpikesBacklog() throws {
        let frames = 6000
        let model = NetworkModel(
            baseDelayMilliseconds: 20, jitterMilliseconds: 10, lossRate: 0.05, spikeIntervalSeconds: 10,
            spikeMilliseconds: 300)
        let packets = (0..<frames).map { i in h.packets[i % h.packets.count] }
        for seed: UInt64 in [1, 2, 3] {
            let trace = NetworkTrace.generate(model, packets: frames, frameMilliseconds: 20, seed: seed)
            let p = try Playout(decoder: L16Decoder(Harness.codec))
            let r = TraceReplay.run(trace: trace, packets: packets, playout: p, samplesPerFrame: 160, sampleRate: 8000)
            // 12 spikes hold back 15 packets each (3 % of the stream): waited for, most play.
            #expect(r.lateLossRate < 0.015, "seed \(seed): \(r.statistics)")
            #expect(r.meanDelayMilliseconds < 80, "seed \(seed): \(r.statistics)")
        }
    }

    /// Replays 3 minutes of a 5 ms-jitter trace with the given sender clock drift.
    func driftRun(_ ppm: Double) throws -> TraceReplayResult {
        let frames = 9000
        let trace = NetworkTrace.generate(
            NetworkModel(baseDelayMilliseconds: 20, jitterMilliseconds: 5, clockDriftPPM: ppm),
            packets: frames, frameMilliseconds: 20, seed: 3)
        let packets = (0..<frames).map { i in h.packets[i % h.packets.count] }
        let p = try Playout(decoder: L16Decoder(Harness.codec))
        return TraceReplay.run(trace: trace, packets: packets, playout: p, samplesPerFrame: 160, sampleRate: 8000)
    }

    @Test func clockDriftStaysBounded() throws {
        let base = try driftRun(0).statistics
        for ppm in [1000.0, -1000.0] {
            let r = try driftRun(ppm)
            let s = r.statistics
            // 1000 ppm is 180 ms over the run: the delay must not follow it.
            #expect(s.delayP95Milliseconds < base.delayP95Milliseconds + 30, "\(ppm) ppm: \(s)")
            // (End-to-end delay above minimum transit includes the drift itself, ~90 ms on average here: not asserted.)
            // No constant underrun: concealment stays near the drift-free run's (the 0.95 quantile allows a few %).
            #expect(
                s.framesConcealed <= base.framesConcealed * 3 / 2 + 20,
                "\(ppm) ppm: \(s.framesConcealed) vs \(base.framesConcealed) without drift")
            #expect(s.framesConcealed < 9000 / 20, "\(ppm) ppm: \(s)")
        }
    }

    /// Ten minutes of speech-like audio (3 s of voice, 0.6 s of pause, over and over)
    /// from a sender whose clock is `ppm` off, over a loopback-like path (1 ms, 0.5 ms
    /// jitter), pulled every 5 ms as a call's voice loop does: the buffer's delay (play
    /// − arrival) averaged each minute, and the playout's statistics.
    func driftMinutes(_ ppm: Double) throws -> (minutes: [Double], statistics: PlayoutStatistics) {
        let frames = 30_000
        let enc = L16Encoder(Harness.codec)
        var frame = [Int16](repeating: 0, count: Harness.spf)
        let packets: [[UInt8]] = (0..<frames).map { i in
            for n in 0..<Harness.spf {
                frame[n] =
                    i % 180 >= 150
                    ? Int16((i * 7919 + n * 104_729) % 41 - 20)
                    : Int16(8000 * sin(2 * Double.pi * 400 * Double(i * Harness.spf + n) / 8000))
            }
            var p = [UInt8](repeating: 0, count: 320)
            _ = frame.withUnsafeBufferPointer { src in p.withUnsafeMutableBytes { try? enc.encode(src, into: $0) } }
            return p
        }
        let trace = NetworkTrace.generate(
            NetworkModel(baseDelayMilliseconds: 1, jitterMilliseconds: 0.5, clockDriftPPM: ppm),
            packets: frames, frameMilliseconds: 20, seed: 3)
        var arrival = [Double](repeating: -1, count: frames)
        for e in trace.entries where e.sequence >= 0 && e.sequence < frames {
            if let a = e.arrivalMilliseconds { arrival[e.sequence] = a }
        }
        let p = try Playout(decoder: L16Decoder(Harness.codec))
        final class Played: @unchecked Sendable { var events: [(UInt32, Int64)] = [] }
        let played = Played()
        p.onPacketPlayed = { ts, ns in played.events.append((ts, ns)) }
        let order = (0..<frames).filter { arrival[$0] >= 0 }.sorted { arrival[$0] < arrival[$1] }
        var next = 0
        var out = [Int16](repeating: 0, count: 40)
        var t = 0.0
        while t < Double(frames) * 20 + 1000 {
            while next < order.count && arrival[order[next]] <= t {
                let s = order[next]
                packets[s].withUnsafeBytes { raw in
                    p.insert(
                        sequence: UInt16(truncatingIfNeeded: s), timestamp: UInt32(truncatingIfNeeded: s * Harness.spf),
                        payload: raw, arrivalNanoseconds: Int64(arrival[s] * 1e6))
                }
                next += 1
            }
            out.withUnsafeMutableBufferPointer { p.pull(nowNanoseconds: Int64(t * 1e6), into: $0) }
            t += 5
        }
        var sums = [Double](repeating: 0, count: 10)
        var counts = [Double](repeating: 0, count: 10)
        for (ts, ns) in played.events {
            let seq = Int(ts) / Harness.spf
            guard seq >= 0, seq < frames, arrival[seq] >= 0 else { continue }
            sums[seq / 3000] += Double(ns) / 1e6 - arrival[seq]
            counts[seq / 3000] += 1
        }
        return (zip(sums, counts).map { $0 / max(1, $1) }, p.statistics)
    }

    /// Issue 19's drift: two ends' clocks ±200 ppm apart for ten minutes. The delay the
    /// buffer holds stays level, within a few ms of a drift-free stream's, and the drift
    /// comes off (or is added) in the pauses, not by stretching speech.
    @Test(arguments: [200.0, -200.0])
    func aSendersClockDriftIsTakenUpInPausesAndTheDelayStaysLevel(_ ppm: Double) throws {
        let base = try driftMinutes(0)
        let run = try driftMinutes(ppm)
        let baseMean = base.minutes.dropFirst().reduce(0, +) / 9
        print("drift \(ppm) ppm: buffer delay a minute \(run.minutes.map { (($0 * 10).rounded() / 10) }) ms; none: \(baseMean)")
        for (minute, delay) in run.minutes.enumerated().dropFirst() {
            #expect(delay < baseMean + 3, "minute \(minute + 1): \(delay) ms against \(baseMean) without drift")
        }
        #expect(run.minutes.dropFirst(2).max()! < run.minutes[1] + 2, "the delay grew: \(run.minutes)")
        let s = run.statistics
        // Speech is not stretched for it (a few ms in ten minutes at most: a frame inserted in
        // a pause for a slow sender, then a few ms too much).
        #expect(s.accelerateSamples + s.expandSamples <= 80, "\(s)")
        #expect(s.lostPackets == 0 && s.latePackets == 0, "\(s)")
        // Concealment stays near the drift-free stream's: a slow sender's buffer may run dry
        // a few times more in ten minutes, in pauses.
        #expect(s.framesConcealed <= base.statistics.framesConcealed + 10, "\(s)")
        // The drift, 120 ms over the ten minutes, came off (or was added) in the pauses, most
        // of it as frames dropped, inserted or cut short.
        let taken = Double(s.silenceTrimmedSamples + (s.framesDroppedInSilence - s.framesInsertedInSilence) * Harness.spf)
        let drift = ppm * 600 / 1000
        #expect(taken / 8 / drift > 0.4, "\(taken / 8) ms of \(drift) in pauses: \(s)")
    }

    @Test func rejectsBadConfiguration() {
        #expect(throws: VoiceError.self) {
            try Playout(decoder: L16Decoder(Harness.codec), configuration: PlayoutConfiguration(capacity: 1))
        }
        #expect(throws: VoiceError.self) {
            try Playout(decoder: L16Decoder(Harness.codec), configuration: PlayoutConfiguration(frameDuration: .ms10))
        }
        #expect(throws: VoiceError.self) {
            try Playout(
                decoder: L16Decoder(Harness.codec),
                configuration: PlayoutConfiguration(maximumDelayMilliseconds: 200, shrinkInPausesUpToMilliseconds: 201))
        }
    }

    @Test func speexBaselinePlaysInOrderStream() throws {
        let p = try SpeexJitterPlayout(decoder: L16Decoder(Harness.codec))
        let out = h.run(p, arrivals: (0..<200).map { on($0) }, ms: 4400)
        #expect(h.find(out, frames: 10..<190) != nil)
    }
}

@Suite("L16")
struct L16Tests {
    @Test func roundTripIsExactAndBigEndian() throws {
        let c = CodecConfiguration(frameDuration: .ms20)
        let pcm: [Int16] = (0..<160).map { Int16(truncatingIfNeeded: $0 * 397 - 30000) }
        var packet = [UInt8](repeating: 0, count: 320)
        let n = try pcm.withUnsafeBufferPointer { src in
            try packet.withUnsafeMutableBytes { dst in try L16Encoder(c).encode(src, into: dst) }
        }
        #expect(n == 320)
        #expect(packet[0] == UInt8(UInt16(bitPattern: pcm[0]) >> 8))
        var back = [Int16](repeating: 0, count: 160)
        let d = L16Decoder(c)
        _ = try packet.withUnsafeBytes { raw in
            try back.withUnsafeMutableBufferPointer { o in try d.decode(raw, into: o) }
        }
        #expect(back == pcm)
        #expect(throws: VoiceError.self) {
            try [UInt8](repeating: 0, count: 3).withUnsafeBytes { raw in
                try back.withUnsafeMutableBufferPointer { o in try d.decode(raw, into: o) }
            }
        }
    }

    @Test func theFactoryRefusesRatesL16CannotCarry() {
        #expect(throws: VoiceError.self) { _ = try makeEncoder(CodecConfiguration(kind: .l16, sampleRate: 0)) }
        #expect(throws: VoiceError.self) { _ = try makeDecoder(CodecConfiguration(kind: .l16, sampleRate: 1_000_000)) }
        #expect((try? makeDecoder(CodecConfiguration(kind: .l16, sampleRate: 16_000))) != nil)
    }
}

@Suite("Playout resync")
struct PlayoutResyncTests {
    /// A sender that restarted (a new random initial timestamp, here 10 minutes behind
    /// the old one): its new stream is heard within a second or so, not after the old
    /// timeline's minima age out.
    @Test func timestampJumpBackResyncs() throws {
        let h = Harness(frames: 300)
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: PlayoutConfiguration(maximumStretch: 0))
        let ahead = UInt32(8000 * 600)
        var out = h.run(p, arrivals: (0..<100).map { on($0) }, ms: 2400, ts0: ahead)
        out += h.run(p, arrivals: (100..<300).map { on($0) }, ms: 4000, start: 2400)
        #expect(h.find(out, frames: 150..<280) != nil, "\(p.statistics)")
    }

    @Test func timestampJumpAfterSilenceResyncs() throws {
        let h = Harness(frames: 200)
        let p = try Playout(decoder: L16Decoder(Harness.codec), configuration: PlayoutConfiguration(maximumStretch: 0))
        // Frames 0..<100 with their own timestamps, then frames 100..<200 with timestamps 10 minutes later.
        var out = h.run(p, arrivals: (0..<100).map { on($0) }, ms: 2400)
        let jump = UInt32(8000 * 600)
        out += h.run(p, arrivals: (100..<200).map { i in (i, Double(i) * 20 + 25 + 1000) }, ms: 4000, ts0: jump, start: 2400)
        #expect(h.find(out, frames: 110..<190) != nil)
        #expect(p.statistics.packetsPlayed >= 190)
    }
}

/// Timestamps and sequence numbers are the sender's to choose: a peer with shorter
/// frames than ours, or one sending nonsense, is heard or dropped, never a crash.
@Suite("Playout under any timestamps")
struct PlayoutAnyTimestampTests {
    static func buffers() throws -> [(String, any PlayoutBuffer)] {
        [
            ("Playout", try Playout(decoder: L16Decoder(Harness.codec))),
            (
                "party Playout",
                try Playout(decoder: L16Decoder(Harness.codec), configuration: .init(shrinkInPausesUpToMilliseconds: 60))
            ),
            ("speexdsp", try SpeexJitterPlayout(decoder: L16Decoder(Harness.codec))),
        ]
    }

    /// A sender with 10 ms frames (its timestamps step half of our frame; a party member's
    /// `--frame 10` heard at 20 ms trapped here): every packet is taken in, none crashes.
    @Test func aSendersShorterFramesAreTakenIn() throws {
        let payload = [UInt8](repeating: 0x10, count: 320)
        for (name, p) in try Self.buffers() {
            var out = [Int16](repeating: 0, count: Harness.spf)
            for i in 0..<200 {
                payload.withUnsafeBytes {
                    p.insert(
                        sequence: UInt16(i), timestamp: UInt32(i * Harness.spf / 2), payload: $0,
                        arrivalNanoseconds: Int64(i) * 10_000_000 + 25_000_000)
                }
                if i % 2 == 1 {
                    out.withUnsafeMutableBufferPointer { p.pull(nowNanoseconds: Int64(i) * 10_000_000 + 25_000_000, into: $0) }
                }
            }
            #expect(p.statistics.packetsReceived == 200, "\(name): \(p.statistics)")
        }
    }

    /// Seeded nonsense: timestamps near the last and anywhere, sequences at random,
    /// payloads of every size (none, too large), arrivals jittered and going back,
    /// pulls of any length, redundant copies of any depth.
    @Test func nonsenseTimestampsNeverTrap() throws {
        var rng = SplitMix64(seed: 11)
        for (name, p) in try Self.buffers() {
            var timestamp: UInt32 = 1000
            var sequence: UInt16 = 0
            var arrival: Int64 = 0
            var played = 0
            var plain = 0
            for _ in 0..<4000 {
                let r = rng.next()
                switch r % 4 {
                case 0: timestamp = UInt32(truncatingIfNeeded: rng.next())
                case 1: timestamp &+= UInt32(rng.next() % 400)
                case 2: timestamp &-= UInt32(rng.next() % 400)
                default: timestamp &+= UInt32(Harness.spf)
                }
                sequence = (r >> 8) % 3 == 0 ? UInt16(truncatingIfNeeded: rng.next()) : sequence &+ 1
                arrival += Int64(rng.next() % 40_000_000) - 10_000_000
                let payload = [UInt8](repeating: UInt8(truncatingIfNeeded: r), count: Int(rng.next() % 2000))
                payload.withUnsafeBytes {
                    if (r >> 16) % 5 == 0 {
                        p.insertRedundant(
                            sequence: sequence, timestamp: timestamp, back: Int(rng.next() % 4), payload: $0,
                            arrivalNanoseconds: arrival)
                    } else {
                        p.insert(sequence: sequence, timestamp: timestamp, payload: $0, arrivalNanoseconds: arrival)
                        plain += 1
                    }
                }
                var out = [Int16](repeating: 0, count: Int(rng.next() % 400))
                out.withUnsafeMutableBufferPointer { p.pull(nowNanoseconds: arrival, into: $0) }
                played += out.count
            }
            // (A redundant copy is a packet to a buffer that knows no redundancy.)
            #expect(p.statistics.packetsReceived >= plain && plain > 3000, "\(name): \(p.statistics)")
            #expect(played > 0)
        }
    }
}
