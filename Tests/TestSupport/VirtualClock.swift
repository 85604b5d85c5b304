import TusaBase

/// The time a test runs on: a `Timestamp` that moves only when told (never
/// backwards). Cores take it as their `now`; ``VirtualNetwork`` advances it
/// from one delivery or deadline to the next.
public final class VirtualClock {
    public private(set) var now: Timestamp

    public init(_ start: Timestamp = .seconds(1000)) { now = start }

    /// Moves the clock forward by `duration`.
    public func advance(by duration: Duration) { now = now + duration }

    /// Moves the clock to `time` (no-op when `time` has passed).
    public func advance(to time: Timestamp) { if now < time { now = time } }
}
