import TusaBase

/// A budget that refills at `perSecond` up to `burst`, and is spent one at a time:
/// a connection's requests, a key's posts, a key's strangers.
struct TokenBucket: Sendable {
    let burst: Double
    let perSecond: Double
    private(set) var tokens: Double
    private var at: Timestamp

    /// A full bucket at `now`.
    init(burst: Double, perSecond: Double, now: Timestamp) {
        self.burst = burst
        self.perSecond = perSecond
        tokens = burst
        at = now
    }

    /// What it holds at `now` (what it held, and what the time since gave back).
    func level(at now: Timestamp) -> Double {
        let elapsed = now - at
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        return min(burst, tokens + max(0, seconds) * perSecond)
    }

    /// Whether one is left at `now`, without taking it.
    func hasOne(at now: Timestamp) -> Bool { level(at: now) >= 1 }

    /// Takes one at `now`; false (and nothing taken) when none is left.
    mutating func take(at now: Timestamp) -> Bool {
        tokens = level(at: now)
        at = now
        guard tokens >= 1 else { return false }
        tokens -= 1
        return true
    }

    /// One spent elsewhere (at another node, or before a restart) at `then`, taken
    /// here too: at `then`, or at the last time the bucket was used if that is later.
    /// An empty bucket stays empty.
    mutating func spend(at then: Timestamp) {
        let t = max(then, at)
        tokens = max(0, level(at: t) - 1)
        at = t
    }

    /// Whether it is full again at `now` (the same as no bucket at all).
    func isFull(at now: Timestamp) -> Bool { level(at: now) >= burst }
}
