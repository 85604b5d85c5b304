/// Samples between two clocks: a sound device's and the voice engine's. The device
/// captures (or plays) at its own pace, in its own chunks; the voice clock takes (or
/// gives) whole frames at its own. Neither waits for the other.
///
/// The queue keeps a small margin left after every pull (between `target` and twice
/// that), and no more: the least it held after a pull over each second is the delay
/// it adds. The margin must cover one of the producer's chunks and its wake-up jitter.
/// When the two clocks drift apart (two crystals are easily 200 ppm apart: 0.2 ms a
/// second, 120 ms in ten minutes) the queue would grow without end or run dry;
/// instead, over the next second it plays some pulls one sample shorter or longer (the pull
/// resampled by a part in a few hundred, no step in the waveform), until the margin
/// is back (up to 1,000 ppm at 48 kHz in 10 ms pulls; PulseAudio's 44.1 kHz null
/// sink runs 160-360 ppm fast). That is not heard; a queue that ran dry would be.
///
/// A stall is another matter: a machine that froze for 100 ms and then made up its
/// lost ticks at once leaves 100 ms more in the queue than the margin, far more than
/// any drift makes in a second. That backlog is seen within a fifth of a second and
/// taken back at the next pause, at once (a pause cut short is not heard); speech is
/// not hurried for it (a listener, and PESQ, hear a voice that moves in time), unless
/// ten seconds go by without a pause: then pulls play up to 1 % faster until it is gone.
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
    /// The most of what queued before the first pull that is kept (the rest is stale).
    public let keepBeforeFirstPull: Int
    /// Pulls per second, the window over which the level is measured.
    public let window: Int
    public private(set) var statistics = Statistics()
    public private(set) var count = 0
    /// Whether the other clock follows this queue's level (``DeviceClockFollower``): the
    /// drift is then its to take up, and the queue slips a sample only when its level
    /// leaves a wider band (half a margin to three), so that a device's uneven delivery
    /// is not taken for drift and the echo path does not move.
    public var followed = false
    /// Whether the queue has had enough to start playing (and not run dry since).
    public private(set) var primed = false
    private var ring: [Int16]
    private var head = 0
    private var pulls = 0
    private var windowMinimum = Int.max
    /// The least held after a pull in the window, not lowered by waits: the delay the queue adds, for `statistics`.
    private var windowHeld = Int.max
    /// The least held after a pull in the last fifth of a window: a backlog shows there first.
    private var recentMinimum = Int.max
    /// Samples still to drop (positive) or repeat (negative), one per pull.
    private var correction = 0
    /// Whether `correction` is a stall's backlog (taken back in pauses), not drift.
    public private(set) var catchingUp = false
    /// Pulls since the backlog was seen.
    private var catchingUpPulls = 0
    /// Pulls in a row that played only quiet samples: a pause under way.
    private var quietPulls = 0
    /// The loudest sample (absolute) of a pause, where a backlog is left out at once: -42 dBFS.
    static let quiet = 256

    /// - Parameters:
    ///   - target: the least margin kept after each pull, in samples (at least a producer's chunk).
    ///   - capacity: the most it holds; older samples are dropped beyond it. A queue
    ///     more than a tenth of it above the margin for a whole second is cut back at once.
    ///   - pullsPerSecond: how often the consumer pulls (the level's window).
    ///   - keepBeforeFirstPull: how much of what queued before the first pull is played
    ///     rather than dropped (a caller's first words, said as the call was placed),
    ///     then taken back as a backlog is; at most a tenth of `capacity`.
    public init(target: Int, capacity: Int, pullsPerSecond: Int, keepBeforeFirstPull: Int = 0) {
        self.target = max(0, target)
        self.capacity = max(1, capacity)
        self.keepBeforeFirstPull = min(max(0, keepBeforeFirstPull), self.capacity / 10)
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
    /// - Parameter waited: samples the device played while this pull waited for the
    ///   producer (a speaker whose sound server still held some): the device is that
    ///   far ahead of the queue, so the level this pull leaves counts that much lower
    ///   for the margin, which is restored as drift's is, instead of the shortfall
    ///   growing unseen until a wait runs out and the queue runs dry. (The delay
    ///   reported, `statistics.level`, is what the queue held.)
    public mutating func pull(into out: UnsafeMutableBufferPointer<Int16>, waited: Int = 0) -> Bool {
        let wanted = out.count
        if !primed {
            guard count >= wanted + target else {
                for i in 0..<wanted { out[i] = 0 }
                return false
            }
            primed = true
            // What queued before the first pull (a device opened before the call) is
            // stale, but for what is to be kept: start in the middle of the margin's band.
            discard(count - wanted - max(target * 3 / 2, keepBeforeFirstPull))
            windowMinimum = Int.max
            windowHeld = Int.max
            recentMinimum = Int.max
            pulls = 0
        }
        guard count >= wanted else {
            for i in 0..<wanted { out[i] = 0 }
            primed = false
            statistics.underruns += 1
            correction = 0
            catchingUp = false
            return false
        }
        // A backlog is left out at once in a pause (a fifth of a second of quiet so far:
        // between sentences, not words): quiet cut short is not heard, and the voice on
        // either side keeps its timing. Drift is taken a sample a pull, resampled: the
        // echo canceller follows a path that creeps, not one that jumps.
        if correction > 0, catchingUp, quietPulls >= max(1, window / 5) {
            let quiet = quietPrefix(upTo: min(count, correction + wanted))
            let n = min(correction, quiet - wanted, count - wanted - target)
            if n > 0 {
                discard(n)
                correction -= n
            }
        }
        if catchingUp { catchingUpPulls += 1 }
        // One sample fewer (a backlog with no pause for ten seconds: up to one in 100).
        let step =
            !catchingUp ? 1 : catchingUpPulls > 10 * window ? max(1, min(correction, wanted / 100, count - wanted)) : 0
        if correction > 0, count > wanted, wanted > 1, step > 0 {
            // wanted + step samples played as wanted.
            stretch(into: out, taking: wanted + step)
            statistics.dropped += step
            correction -= step
        } else if correction < 0, !catchingUp, wanted > 2 {
            // One sample more: wanted - 1 samples played as wanted.
            stretch(into: out, taking: wanted - 1)
            statistics.repeated += 1
            correction += 1
        } else {
            copy(into: out)
        }
        if correction == 0 { catchingUp = false }
        quietPulls = out.allSatisfy { abs(Int($0)) <= Self.quiet } ? quietPulls + 1 : 0
        let left = count - max(0, waited)
        windowMinimum = min(windowMinimum, left)
        windowHeld = min(windowHeld, count)
        recentMinimum = min(recentMinimum, left)
        pulls += 1
        if pulls % max(1, window / 5) == 0 {
            // A fifth of a second well above the band: a stall's backlog, taken back from now.
            if !catchingUp, recentMinimum > 4 * target, recentMinimum - target <= capacity / 10 {
                correction = recentMinimum - target * 3 / 2
                catchingUp = true
                catchingUpPulls = 0
            }
            recentMinimum = Int.max
        }
        if pulls >= window {
            statistics.level = windowHeld
            statistics.maximumLevel = max(statistics.maximumLevel, statistics.level)
            // Keep the least held after a pull between one and two margins (aiming at one
            // and a half), at most half a window's worth of samples a second, so that the
            // phase of the two clocks' chunks is not taken for drift.
            let excess = windowMinimum - target
            if excess > capacity / 10 {
                // Far more than drift makes (a device that stalled, then delivered its
                // backlog at once): back to the margin now, not over minutes.
                discard(excess)
                correction = 0
                catchingUp = false
            } else if catchingUp, correction > 0 {
                // A backlog still being taken back (a whole window above four margins was
                // seen as one a fifth of a second in).
            } else if windowMinimum > (followed ? 3 * target : 2 * target) {
                correction = min(windowMinimum - target * 3 / 2, window / 2)
                catchingUp = false
            } else if windowMinimum < (followed ? target / 2 : target) {
                correction = -min(target * 3 / 2 - windowMinimum, window / 2)
                catchingUp = false
            } else {
                correction = 0
                catchingUp = false
            }
            pulls = 0
            windowMinimum = Int.max
            windowHeld = Int.max
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

    private mutating func copy(into out: UnsafeMutableBufferPointer<Int16>) {
        for i in 0..<out.count { out[i] = ring[(head + i) % capacity] }
        advance(out.count)
    }

    /// How many of the next queued samples, up to `limit`, are within ``quiet`` (a pause).
    private func quietPrefix(upTo limit: Int) -> Int {
        for i in 0..<max(0, min(limit, count)) where abs(Int(ring[(head + i) % capacity])) > Self.quiet { return i }
        return max(0, min(limit, count))
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
