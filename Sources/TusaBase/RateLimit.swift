// Rate limits shared by the TURN server core and the secure-session responder.

/// A token bucket: `rate` tokens per second, at most `burst` saved.
public struct TokenBucket: Sendable {
    public var rate: Double
    public var burst: Double
    public private(set) var tokens: Double
    var last: Timestamp

    public init(rate: Double, burst: Double, now: Timestamp) {
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.last = now
    }

    public mutating func take(_ n: Double, now: Timestamp) -> Bool {
        if now > last {
            tokens = min(burst, tokens + Double(now.nanoseconds - last.nanoseconds) / 1e9 * rate)
            last = now
        }
        guard tokens >= n else { return false }
        tokens -= n
        return true
    }
}

/// Per-source rate limits in a fixed table: sources hash into 4096 buckets, so
/// strangers cannot make the table grow (two sources sharing a bucket share its budget).
public struct SourceLimiter: Sendable {
    private var buckets: [TokenBucket?]
    public let rate: Double
    public let burst: Double

    public init(rate: Double, burst: Double, slots: Int = 4096) {
        self.rate = rate
        self.burst = burst
        self.buckets = Array(repeating: nil, count: slots)
    }

    public mutating func allow(_ source: IPAddress, now: Timestamp) -> Bool {
        guard rate > 0 else { return true }
        var h = Hasher()
        h.combine(source)
        let slot = Int(UInt(bitPattern: h.finalize()) % UInt(buckets.count))
        var bucket = buckets[slot] ?? TokenBucket(rate: rate, burst: burst, now: now)
        let ok = bucket.take(1, now: now)
        buckets[slot] = bucket
        return ok
    }
}
