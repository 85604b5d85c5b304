import Synchronization

/// Who may open one more connection on a listener: at most `total` open at
/// once, and at most `perSource` of them from one source, so that one host
/// holding idle connections cannot take every slot from the rest. A source is
/// an IPv4 address, or an IPv6 /64 (one host commonly holds a whole /64 and
/// picks addresses in it at will); IPv4-mapped IPv6 addresses count as IPv4.
/// Shared by a listener's event loops; each admitted connection is released
/// exactly once, when it closes.
public final class ConnectionAdmission: Sendable {
    public struct Limits: Hashable, Sendable {
        public var total: Int
        public var perSource: Int
        public init(total: Int, perSource: Int) {
            self.total = total
            self.perSource = perSource
        }
    }

    /// Why a connection was not admitted.
    public enum Refusal: String, Hashable, Sendable {
        case total
        case perSource = "per-source"
    }

    private struct State {
        var open = 0
        var bySource: [IPAddress: Int] = [:]
        var refused: [Refusal: Int] = [:]
    }

    public let limits: Limits
    private let state = Mutex(State())

    public init(limits: Limits) {
        self.limits = limits
    }

    /// Admits a connection from `source` (nil: unknown, counted against the
    /// total only), or says which limit it hit.
    public func admit(_ source: IPAddress?) -> Refusal? {
        state.withLock { state in
            guard state.open < limits.total else {
                state.refused[.total, default: 0] += 1
                return .total
            }
            if let source = source.map(Self.sourceKey) {
                let count = state.bySource[source, default: 0]
                guard count < limits.perSource else {
                    state.refused[.perSource, default: 0] += 1
                    return .perSource
                }
                state.bySource[source] = count + 1
            }
            state.open += 1
            return nil
        }
    }

    /// An admitted connection from `source` closed.
    public func release(_ source: IPAddress?) {
        state.withLock { state in
            state.open = max(0, state.open - 1)
            guard let source = source.map(Self.sourceKey), let count = state.bySource[source] else { return }
            state.bySource[source] = count > 1 ? count - 1 : nil
        }
    }

    /// What `ip` counts as: itself for IPv4, its IPv4 address when IPv4-mapped
    /// (::ffff:a.b.c.d), else its /64.
    static func sourceKey(_ ip: IPAddress) -> IPAddress {
        switch ip {
        case .v4: ip
        case .v6(let high, let low) where high == 0 && low >> 32 == 0xFFFF: .v4(UInt32(truncatingIfNeeded: low))
        case .v6(let high, _): .v6(high: high, low: 0)
        }
    }

    /// Connections open now, and from how many sources.
    public var open: (connections: Int, sources: Int) { state.withLock { ($0.open, $0.bySource.count) } }

    /// Connections refused so far, by the limit they hit.
    public var refused: [Refusal: Int] { state.withLock { $0.refused } }
}
