/// NetEq-style target-delay estimator. Each packet's relative delay is its arrival minus its send
/// time (from the RTP timestamp), relative to the fastest packet of the last ~16 s (a ring of 1 s
/// minima, which also follows clock drift). Relative delays go into a fixed histogram (2 ms bins)
/// with a forgetting factor; the target is its `quantile`. A delay far above the target (a spike:
/// > target + 60 ms and > 2 × target) stays out of the histogram. Optionally (`peakWindowSeconds`
/// > 0) spikes hold the target up (peak memory) when a second one comes within that window of the
/// previous one. Off by default: the playout absorbs a spike by waiting through it and shrinks the
/// delay again afterwards, which on recurring 300 ms spikes gave a third of the delay a held peak
/// gave, at a similar late loss (voice-bench jitter).
public struct DelayEstimator: Sendable {
    public static let binMilliseconds = 2.0
    public static let bins = 512
    private var histogram: [Double]
    public var quantile: Double
    public var forgetting: Double = 0.997
    private var minima: [Double] = Array(repeating: .infinity, count: 16)
    private var minimaSecond: Int = Int.min
    public private(set) var minimumDelay: Double = .infinity
    public private(set) var quantileDelay: Double = 0
    private var peak: Double = 0
    private var lastSpikeMs: Double = -.infinity
    private var peakUntilMs: Double = -.infinity
    /// Peak memory window; 0 (the default) turns peak memory off.
    public var peakWindowSeconds: Double = 0
    public private(set) var spikes = 0
    /// When the latest packet of a spike arrived (ms, the callers' clock); -∞ before any.
    public private(set) var latestSpikeMs: Double = -.infinity
    private var count = 0

    public init(quantile: Double) {
        self.quantile = quantile
        histogram = Array(repeating: 0, count: Self.bins)
    }

    public mutating func reset() {
        for i in 0..<Self.bins { histogram[i] = 0 }
        for i in 0..<minima.count { minima[i] = .infinity }
        minimaSecond = Int.min
        minimumDelay = .infinity
        quantileDelay = 0
        peak = 0
        lastSpikeMs = -.infinity
        latestSpikeMs = -.infinity
        peakUntilMs = -.infinity
        count = 0
    }

    /// The target relative delay in ms (quantile, or the held spike peak).
    public func target(nowMs: Double) -> Double {
        nowMs < peakUntilMs ? max(quantileDelay, peak) : quantileDelay
    }

    /// A packet that came too late to play: it changes nothing the target follows, but a
    /// spike it shows is remembered (``latestSpikeMs``). A spike's backlog that a buffer
    /// gave up on is exactly what must not go unseen.
    public mutating func observeLate(absoluteDelayMs d: Double, arrivalMs: Double) {
        let rel = max(0, d - minimumDelay)
        if count > 20 && rel > quantileDelay + 150 && rel > 3 * quantileDelay { latestSpikeMs = arrivalMs }
    }

    /// Adds one packet: `absoluteDelayMs` = arrival − send time (any constant offset).
    public mutating func add(absoluteDelayMs d: Double, arrivalMs: Double) {
        let second = Int((arrivalMs / 1000).rounded(.down))
        if second != minimaSecond {
            if minimaSecond == Int.min || second - minimaSecond >= minima.count {
                for i in 0..<minima.count { minima[i] = .infinity }
            } else {
                var s = minimaSecond + 1
                while s <= second {
                    minima[((s % minima.count) + minima.count) % minima.count] = .infinity
                    s += 1
                }
            }
            minimaSecond = second
        }
        let slot = ((second % minima.count) + minima.count) % minima.count
        if d < minima[slot] { minima[slot] = d }
        var m = Double.infinity
        for v in minima where v < m { m = v }
        minimumDelay = m
        let rel = max(0, d - m)
        count += 1
        if count > 20 && rel > quantileDelay + 60 && rel > 2 * quantileDelay {
            spikes += 1
            latestSpikeMs = arrivalMs
            if arrivalMs - lastSpikeMs < peakWindowSeconds * 1000 && arrivalMs - lastSpikeMs > 1000 {
                peak = max(rel, arrivalMs < peakUntilMs ? peak : 0)
                peakUntilMs = arrivalMs + peakWindowSeconds * 1000
            }
            if arrivalMs - lastSpikeMs > 1000 || lastSpikeMs == -.infinity { lastSpikeMs = arrivalMs }
            return
        }
        var total = 0.0
        for i in 0..<Self.bins {
            histogram[i] *= forgetting
            total += histogram[i]
        }
        let bin = Int(min(Double(Self.bins - 1), rel / Self.binMilliseconds))
        histogram[bin] += 1 - forgetting
        total += 1 - forgetting
        var acc = 0.0
        let want = quantile * total
        for i in 0..<Self.bins {
            acc += histogram[i]
            if acc >= want {
                quantileDelay = Double(i + 1) * Self.binMilliseconds
                break
            }
        }
    }
}
