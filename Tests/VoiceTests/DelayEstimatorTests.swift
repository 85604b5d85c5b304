import Testing
import TusaBase

@testable import Voice

@Suite struct DelayEstimatorTests {
    /// 20 ms packets with 0–8 ms of jitter for `seconds`, a 300 ms spike at each time in `spikes` (s).
    func feed(_ e: inout DelayEstimator, seconds: Double, spikes: [Double]) {
        var rng = SplitMix64(seed: 5)
        var t = 0.0
        while t < seconds * 1000 {
            var delay = 20 + rng.uniform() * 8
            for s in spikes where t >= s * 1000 && t < s * 1000 + 300 { delay += s * 1000 + 300 - t }
            e.add(absoluteDelayMs: delay, arrivalMs: t + delay)
            t += 20
        }
    }

    @Test func spikesStayOutOfTheQuantile() {
        var e = DelayEstimator(quantile: 0.95)
        feed(&e, seconds: 60, spikes: [10, 20, 30, 40, 50])
        #expect(e.target(nowMs: 60_000) < 20, "target \(e.target(nowMs: 60_000))")
        #expect(e.spikes > 0)
    }

    @Test func peakMemoryHoldsTheTargetOnlyWhenSpikesRecur() {
        var recurring = DelayEstimator(quantile: 0.95)
        recurring.peakWindowSeconds = 20
        feed(&recurring, seconds: 35, spikes: [10, 20, 30])
        #expect(recurring.target(nowMs: 35_000) > 200, "held target \(recurring.target(nowMs: 35_000))")

        var single = DelayEstimator(quantile: 0.95)
        single.peakWindowSeconds = 20
        feed(&single, seconds: 35, spikes: [10])
        #expect(single.target(nowMs: 35_000) < 20)
    }
}
