import ArgumentParser
import Foundation
import Voice

/// `voice-bench jitter`: ours (Playout) vs speexdsp's JitterBuffer vs the hindsight-best fixed delay.
struct JitterBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "jitter", abstract: "Jitter buffer delay and late loss on steady and spiky traces.")

    @Option(help: "Seeds per model.") var seeds = 3
    @Option(help: "Seconds per trace.") var seconds = 120

    /// Speech-like test signal: harmonic tone (f0 gliding 120–180 Hz), 4 Hz syllable envelope,
    /// 1.6 s talk / 0.8 s pause (low noise in pauses).
    static func signal(samples: Int, rate: Int) -> [Int16] {
        var out = [Int16](repeating: 0, count: samples)
        var phase = 0.0
        var rng: UInt64 = 12345
        for n in 0..<samples {
            let t = Double(n) / Double(rate)
            let f0 = 150 + 30 * sin(2 * .pi * 0.3 * t)
            phase += 2 * .pi * f0 / Double(rate)
            let talking = t.truncatingRemainder(dividingBy: 2.4) < 1.6
            let env = talking ? 0.55 + 0.45 * sin(2 * .pi * 4 * t) : 0
            var v = 0.0
            for h in 1...5 { v += sin(Double(h) * phase) / Double(h) }
            rng = rng &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let noise = (Double(rng >> 33) / Double(1 << 31) - 1) * 30
            out[n] = Int16(clamping: Int(v * env * 6000 + noise))
        }
        return out
    }

    struct Point {
        var late: Double
        var mean: Double
        var p95: Double
    }

    /// Mean delay at late loss `x` by linear interpolation over points sorted by late loss.
    static func interpolate(_ points: [Point], at x: Double) -> Double? {
        let p = points.sorted { $0.late < $1.late }
        guard let first = p.first, let last = p.last else { return nil }
        if x <= first.late { return first.mean }
        if x >= last.late { return last.mean }
        for i in 1..<p.count where p[i].late >= x {
            let a = p[i - 1]
            let b = p[i]
            let w = b.late > a.late ? (x - a.late) / (b.late - a.late) : 0
            return a.mean + w * (b.mean - a.mean)
        }
        return last.mean
    }

    /// The smallest fixed delay above minimum transit with late loss ≤ `late`: its mean delay (= the delay).
    static func hindsight(_ trace: NetworkTrace, late: Double) -> Double {
        let minT = trace.minimumTransitMilliseconds
        var seen = Set<Int>()
        var excess: [Double] = []
        for e in trace.entries {
            if let a = e.arrivalMilliseconds, seen.insert(e.sequence).inserted { excess.append(a - e.sendMilliseconds - minT) }
        }
        excess.sort()
        guard !excess.isEmpty else { return 0 }
        let allowed = Int((late * Double(excess.count)).rounded(.down))
        return excess[max(0, excess.count - 1 - allowed)]
    }

    func run() throws {
        let rate = voiceSampleRate
        let codec = CodecConfiguration(kind: .opus, sampleRate: rate, frameDuration: .ms20)
        let spf = codec.samplesPerFrame
        let packetsCount = seconds * 1000 / 20
        let pcm = Self.signal(samples: packetsCount * spf, rate: rate)
        let encoder = L16Encoder(codec)
        var packets: [[UInt8]] = []
        for i in 0..<packetsCount {
            var p = [UInt8](repeating: 0, count: encoder.maximumPacketSize)
            let n = try pcm.withUnsafeBufferPointer { src in
                try p.withUnsafeMutableBytes { dst in
                    try encoder.encode(UnsafeBufferPointer(rebasing: src[(i * spf)..<((i + 1) * spf)]), into: dst)
                }
            }
            p.removeLast(p.count - n)
            packets.append(p)
        }
        let quantiles = [0.80, 0.90, 0.95, 0.98, 0.995]
        let margins = [0, 10, 20, 40, 60, 100, 150, 200, 250, 300]
        print("# voice-bench jitter: \(seeds) seeds × \(seconds) s per model, 20 ms L16 frames of a speech-like signal\n")
        print(
            """
            Method: each trace is replayed on a virtual clock (pull 20 ms). Delay = playout time of a packet's first sample
            − its send time − the trace's minimum transit (mean/p95 over played packets); late loss = arrived packets never
            played / arrived packets. Ours uses targetQuantile 0.95 (default). "At equal late loss": ours and speexdsp are
            swept (ours: targetQuantile \(quantiles); speexdsp: JITTER_BUFFER_SET_MARGIN \(margins) ms) and the mean
            delay of each curve is linearly interpolated at a common late loss: ours-default's, or speexdsp's highest when
            ours-default loses more than speexdsp ever does (then ours is read off its sweep; * marks rows where ours'
            sweep does not get that low, so ours is shown at its lowest late loss, which is still above speexdsp's).
            Hindsight fixed: the smallest fixed delay (from the trace itself) whose late loss ≤ ours-default's.

            """)
        var verdicts: [String] = []
        for (name, model) in [("steady", NetworkModel.steady), ("spiky", NetworkModel.spiky)] {
            print("## \(name)\n")
            print(
                "| seed | ours mean / p95 / late % | speexdsp (default) mean / p95 / late % | ours @ common late | speexdsp @ common late | hindsight fixed @ ours' late | ours/speex | ours/hindsight |"
            )
            print("|---|---|---|---|---|---|---|---|")
            var sums = (ours: 0.0, oursAtCommon: 0.0, speex: 0.0, fixed: 0.0)
            var statsText = ""
            for seed in 1...seeds {
                let trace = NetworkTrace.generate(model, packets: packetsCount, frameMilliseconds: 20, seed: UInt64(seed))
                func ours(_ q: Double) throws -> TraceReplayResult {
                    let p = try Playout(decoder: L16Decoder(codec), configuration: PlayoutConfiguration(targetQuantile: q))
                    return TraceReplay.run(trace: trace, packets: packets, playout: p, samplesPerFrame: spf, sampleRate: rate)
                }
                func speex(_ m: Int?) throws -> TraceReplayResult {
                    let p = try SpeexJitterPlayout(decoder: L16Decoder(codec), marginMilliseconds: m)
                    return TraceReplay.run(trace: trace, packets: packets, playout: p, samplesPerFrame: spf, sampleRate: rate)
                }
                let o = try ours(0.95)
                let s = try speex(nil)
                var oursPts: [Point] = []
                var speexPts: [Point] = []
                for q in quantiles {
                    let r = q == 0.95 ? o : try ours(q)
                    oursPts.append(Point(late: r.lateLossRate, mean: r.meanDelayMilliseconds, p95: r.p95DelayMilliseconds))
                }
                for m in margins {
                    let r = try speex(m)
                    speexPts.append(Point(late: r.lateLossRate, mean: r.meanDelayMilliseconds, p95: r.p95DelayMilliseconds))
                }
                // The common late loss: ours-default's, unless speexdsp never loses that much
                // (its sweep ends at its lowest delay); then speexdsp's highest, where ours'
                // curve is read instead (a row marked * if ours cannot get that low).
                let speexMaxLate = speexPts.map(\.late).max() ?? s.lateLossRate
                let x = min(o.lateLossRate, speexMaxLate)
                let oursMinLate = oursPts.map(\.late).min() ?? o.lateLossRate
                let unreachable = x < oursMinLate - 1e-4
                let oEq =
                    x == o.lateLossRate ? o.meanDelayMilliseconds : (Self.interpolate(oursPts, at: x) ?? o.meanDelayMilliseconds)
                let sEq = Self.interpolate(speexPts, at: x) ?? s.meanDelayMilliseconds
                let fixed = Self.hindsight(trace, late: o.lateLossRate)
                sums.oursAtCommon += oEq
                sums.ours += o.meanDelayMilliseconds
                sums.speex += sEq
                sums.fixed += fixed
                func f(_ v: Double) -> String { String(format: "%.1f", v) }
                print(
                    "| \(seed) | \(f(o.meanDelayMilliseconds)) / \(f(o.p95DelayMilliseconds)) / \(f(o.lateLossRate * 100)) | \(f(s.meanDelayMilliseconds)) / \(f(s.p95DelayMilliseconds)) / \(f(s.lateLossRate * 100)) | \(f(oEq))\(unreachable ? "*" : "") @ \(f(x * 100)) % | \(f(sEq)) | \(f(fixed)) | \(String(format: "%.2f", oEq / max(sEq, 1e-9))) | \(String(format: "%.2f", o.meanDelayMilliseconds / max(fixed, 1e-9))) |"
                )
                if seed == 1 {
                    statsText = "ours (targetQuantile 0.95), seed 1:\n\n" + o.statistics.description + "\n"
                    print(
                        "<!-- ours sweep (late %, mean ms): "
                            + oursPts.map { "(\(f($0.late * 100)), \(f($0.mean)))" }.joined(separator: " ")
                            + "; speexdsp sweep: "
                            + speexPts.map { "(\(f($0.late * 100)), \(f($0.mean)))" }.joined(separator: " ") + " -->")
                }
            }
            print("\n" + statsText)
            let n = Double(seeds)
            let (mo, moc, ms, mf) = (sums.ours / n, sums.oursAtCommon / n, sums.speex / n, sums.fixed / n)
            print(
                "\nmean over seeds: ours \(String(format: "%.1f", mo)) ms (\(String(format: "%.1f", moc)) ms at the common late loss), speexdsp at the common late loss \(String(format: "%.1f", ms)) ms, hindsight fixed at ours' late loss \(String(format: "%.1f", mf)) ms\n"
            )
            if name == "spiky" {
                let r = moc / ms
                verdicts.append(
                    "- spiky: ours ≤ 0.7 × speexdsp mean delay at equal late loss: **\(r <= 0.7 ? "met" : "not met")** (ratio \(String(format: "%.2f", r)))"
                )
            } else {
                let r = mo / mf
                verdicts.append(
                    "- steady: ours within 5 % of hindsight-best fixed delay: **\(r <= 1.05 ? "met" : "not met")** (ratio \(String(format: "%.2f", r)))"
                )
            }
        }
        print("## Verdict\n")
        for v in verdicts { print(v) }
    }
}
