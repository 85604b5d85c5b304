/// Samples between two clocks: a sound device's and the voice engine's. The device
/// captures (or plays) at its own pace, in its own chunks; the voice clock takes (or
/// gives) whole frames at its own. Neither waits for the other.
///
/// The queue keeps a small margin left after every pull (between `target` and twice
/// that), and no more: the least it held after a pull over each second is the delay
/// it adds. The margin must cover one of the producer's chunks and its wake-up jitter.
/// When the two clocks drift apart (two crystals are easily 200 ppm apart: 0.2 ms a
/// second, 120 ms in ten minutes) the queue would grow without end or run dry;
/// instead, over the next second it plays some pulls one sample shorter or longer
/// (the pull resampled by a part in a few hundred, no step in the waveform) until the
/// margin is back. That is not heard; a queue that ran dry would be.
///
/// A pure core: no lock, no clock; the caller serialises push and pull.
public struct DeviceFIFO: Sendable {
    /// What the queue did, for reports and tests.
    public struct Statistics: Sendable, Equatable {
        /// Pulls that found less than asked for after the queue was primed: a gap was played.
        public var underruns = 0
        /// Samples thrown away because the queue was full (the consumer stalled).
        public var overflowed = 0
        /// Samples dropped to bring the delay down (drift, or audio queued before the first pull).
        public var dropped = 0
        /// Samples repeated to keep the margin (the consumer's clock is the faster).
        public var repeated = 0
        /// The least the queue held after a pull in the last whole second, in samples: the delay beyond the frame.
        public var level = 0
        /// The most `level` has been since the queue was primed.
        public var maximumLevel = 0
    }

    public let target: Int
    public let capacity: Int
    /// Pulls per second, the window over which the level is measured.
    public let window: Int
    public private(set) var statistics = Statistics()
    public private(set) var count = 0
    /// Whether the queue has had enough to start playing (and not run dry since).
    public private(set) var primed = false
    private var ring: [Int16]
    private var head = 0
    private var pulls = 0
    private var windowMinimum = Int.max
    /// Samples still to drop (positive) or repeat (negative), one per pull.
    private var correction = 0

    /// - Parameters:
    ///   - target: the least margin kept after each pull, in samples (at least a producer's chunk).
    ///   - capacity: the most it holds; older samples are dropped beyond it. A queue
    ///     more than a tenth of it above the margin for a whole second is cut back at once.
    ///   - pullsPerSecond: how often the consumer pulls (the level's window).
    public init(target: Int, capacity: Int, pullsPerSecond: Int) {
        self.target = max(0, target)
        self.capacity = max(1, capacity)
        window = max(1, pullsPerSecond)
        ring = [Int16](repeating: 0, count: self.capacity)
    }

    public mutating func push(_ samples: UnsafeBufferPointer<Int16>) {
        for sample in samples {
            if count == capacity {
                head = (head + 1) % capacity
                count -= 1
                statistics.overflowed += 1
            }
            ring[(head + count) % capacity] = sample
            count += 1
        }
    }

    /// Fills `out`: true with queued audio, false with silence (not primed yet, or
    /// run dry, which counts as an underrun and primes again).
    public mutating func pull(into out: UnsafeMutableBufferPointer<Int16>) -> Bool {
        let wanted = out.count
        if !primed {
            guard count >= wanted + target else {
                for i in 0..<wanted { out[i] = 0 }
                return false
            }
            primed = true
            // What queued before the first pull (a device opened before the call) is
            // stale: start in the middle of the margin's band.
            discard(count - wanted - target * 3 / 2)
            windowMinimum = Int.max
            pulls = 0
        }
        guard count >= wanted else {
            for i in 0..<wanted { out[i] = 0 }
            primed = false
            statistics.underruns += 1
            correction = 0
            return false
        }
        if correction > 0, count > wanted, wanted > 1 {
            // One sample fewer: wanted + 1 samples played as wanted.
            stretch(into: out, taking: wanted + 1)
            statistics.dropped += 1
            correction -= 1
        } else if correction < 0, wanted > 2 {
            // One sample more: wanted - 1 samples played as wanted.
            stretch(into: out, taking: wanted - 1)
            statistics.repeated += 1
            correction += 1
        } else {
            for i in 0..<wanted { out[i] = ring[(head + i) % capacity] }
            advance(wanted)
        }
        windowMinimum = min(windowMinimum, count)
        pulls += 1
        if pulls >= window {
            statistics.level = windowMinimum
            statistics.maximumLevel = max(statistics.maximumLevel, windowMinimum)
            // Keep the least held after a pull between one and two margins (aiming at one
            // and a half), at most half a window's worth of samples a second, so that the
            // phase of the two clocks' chunks is not taken for drift.
            let excess = windowMinimum - target
            if excess > capacity / 10 {
                // Far more than drift makes (a device that stalled, then delivered its
                // backlog at once): back to the margin now, not over minutes.
                discard(excess)
                correction = 0
            } else if windowMinimum > 2 * target {
                correction = min(windowMinimum - target * 3 / 2, window / 2)
            } else if windowMinimum < target {
                correction = -min(target * 3 / 2 - windowMinimum, window / 2)
            } else {
                correction = 0
            }
            pulls = 0
            windowMinimum = Int.max
        }
        return true
    }

    /// Plays `taken` queued samples as `out.count`, read at evenly spaced points between
    /// the first and the last (linear interpolation): the chunk is a part in a few hundred
    /// faster or slower, with no step in the waveform where a sample was left out or
    /// played twice. Consumes `taken`.
    private mutating func stretch(into out: UnsafeMutableBufferPointer<Int16>, taking taken: Int) {
        let last = out.count - 1
        for i in 0...last {
            let numerator = i * (taken - 1)
            let index = numerator / last
            let fraction = numerator % last
            let a = Int(ring[(head + index) % capacity])
            let b = fraction == 0 ? a : Int(ring[(head + index + 1) % capacity])
            out[i] = Int16(clamping: a + (b - a) * fraction / last)
        }
        advance(taken)
    }

    private mutating func advance(_ n: Int) {
        head = (head + n) % capacity
        count -= n
    }

    private mutating func discard(_ n: Int) {
        guard n > 0 else { return }
        advance(n)
        statistics.dropped += n
    }
}
