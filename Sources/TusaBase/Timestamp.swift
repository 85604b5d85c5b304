/// A point on a monotonic clock, in nanoseconds since an arbitrary origin.
/// Sans-IO cores take it as input; drivers read the real clock, tests a virtual one.
public struct Timestamp: Hashable, Comparable, Sendable, CustomStringConvertible {
    public var nanoseconds: UInt64

    @inlinable
    public init(nanoseconds: UInt64) { self.nanoseconds = nanoseconds }

    public static let zero = Timestamp(nanoseconds: 0)

    /// `s` seconds after zero (for virtual clocks).
    @inlinable
    public static func seconds(_ s: UInt64) -> Timestamp { Timestamp(nanoseconds: s * 1_000_000_000) }

    @inlinable
    public static func < (a: Timestamp, b: Timestamp) -> Bool { a.nanoseconds < b.nanoseconds }

    @inlinable
    public static func + (t: Timestamp, d: Duration) -> Timestamp {
        let ns = d.nanoseconds
        if ns >= 0 {
            let (sum, overflow) = t.nanoseconds.addingReportingOverflow(UInt64(ns))
            return Timestamp(nanoseconds: overflow ? .max : sum)
        }
        let magnitude = ns.magnitude
        return Timestamp(nanoseconds: t.nanoseconds > magnitude ? t.nanoseconds - magnitude : 0)
    }

    @inlinable
    public static func - (a: Timestamp, b: Timestamp) -> Duration {
        a >= b
            ? .nanoseconds(Int64(clamping: a.nanoseconds - b.nanoseconds))
            : .nanoseconds(-Int64(clamping: b.nanoseconds - a.nanoseconds))
    }

    public var description: String { "\(Double(nanoseconds) / 1e9)s" }
}

extension Duration {
    /// The duration in whole nanoseconds, saturating.
    @inlinable
    public var nanoseconds: Int64 {
        let (s, a) = components
        let (ns, o1) = s.multipliedReportingOverflow(by: 1_000_000_000)
        let (sum, o2) = ns.addingReportingOverflow(a / 1_000_000_000)
        if o1 || o2 { return s < 0 ? .min : .max }
        return sum
    }
}
