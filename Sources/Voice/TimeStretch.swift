/// Pitch-synchronous time-stretch (NetEq-style accelerate / preemptive expand) on one frame.
/// The pitch period is the lag of highest normalized autocorrelation; one period is removed or
/// repeated with a linear overlap-add cross-fade, and only when that correlation is high.
public enum TimeStretch {
    /// Best lag in `minLag...maxLag` (2·maxLag ≤ x.count) and its normalized correlation.
    public static func pitch(_ x: UnsafeBufferPointer<Int16>, minLag: Int, maxLag: Int) -> (lag: Int, correlation: Double) {
        var best = 0
        var bestC = -1.0
        let hi = min(maxLag, x.count / 2)
        guard minLag <= hi else { return (0, 0) }
        for lag in minLag...hi {
            var xy = 0.0
            var xx = 0.0
            var yy = 0.0
            for i in 0..<lag {
                let a = Double(x[i])
                let b = Double(x[i + lag])
                xy += a * b
                xx += a * a
                yy += b * b
            }
            let c = xx > 0 && yy > 0 ? xy / (xx * yy).squareRoot() : 0
            if c > bestC + 1e-9 {
                bestC = c
                best = lag
            }
        }
        return (best, bestC)
    }

    /// Removes one pitch period from `x` into `out` (needs x.count capacity). Returns samples written,
    /// or 0 if the frame is not periodic enough (correlation below `threshold`).
    public static func accelerate(
        _ x: UnsafeBufferPointer<Int16>, into out: UnsafeMutableBufferPointer<Int16>,
        minLag: Int, maxLag: Int, threshold: Double = 0.8
    ) -> Int {
        let (t, c) = pitch(x, minLag: minLag, maxLag: maxLag)
        guard t > 0, c >= threshold, out.count >= x.count - t else { return 0 }
        for i in 0..<t {
            let w = Double(i) / Double(t)
            out[i] = Int16(clamping: Int((Double(x[i]) * (1 - w) + Double(x[i + t]) * w).rounded()))
        }
        for i in (2 * t)..<x.count { out[i - t] = x[i] }
        return x.count - t
    }

    /// Repeats one pitch period of `x` into `out` (needs x.count + maxLag capacity). Returns samples
    /// written, or 0 if the frame is not periodic enough.
    public static func expand(
        _ x: UnsafeBufferPointer<Int16>, into out: UnsafeMutableBufferPointer<Int16>,
        minLag: Int, maxLag: Int, threshold: Double = 0.8
    ) -> Int {
        let (t, c) = pitch(x, minLag: minLag, maxLag: maxLag)
        guard t > 0, c >= threshold, out.count >= x.count + t else { return 0 }
        for i in 0..<t { out[i] = x[i] }
        for i in 0..<t {
            let w = Double(i) / Double(t)
            out[t + i] = Int16(clamping: Int((Double(x[t + i]) * (1 - w) + Double(x[i]) * w).rounded()))
        }
        for i in t..<x.count { out[i + t] = x[i] }
        return x.count + t
    }
}
