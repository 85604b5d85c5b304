import Synchronization
import TusaBase

/// One family's relay port range: which ports the relay holds, and where the
/// next allocation's port comes from.
///
/// RFC 8656 (§6.2) asks that relay ports be unpredictable, as RFC 6056 asks
/// of ephemeral ports, so that an off-path attacker cannot guess the relay
/// address of the next allocation. Each pick is a fresh uniform draw among
/// the ports that fit (even, or with port+1 also free for a reservation) and
/// are not held; when draws keep landing on held ports (the range nearly
/// full) the rest of the range is walked with a random stride from a random
/// start, so a free port is found whenever there is one. A port the relay
/// does not hold may still be taken by another process: `bind` says so, and
/// the search goes on.
///
/// Pure: no sockets and no clock; the caller passes the random source and
/// the bind attempt.
struct RelayPortRange: Sendable {
    let lo: Int
    let hi: Int
    /// One bit per port of the range, set while the relay holds it.
    private var held: [UInt64]
    /// Ports of the range the relay holds now.
    private(set) var heldCount = 0

    /// Uniform draws before the walk takes over.
    static let draws = 16

    init(minPort: UInt16, maxPort: UInt16) {
        lo = Int(minPort)
        hi = max(Int(maxPort), lo - 1)
        held = [UInt64](repeating: 0, count: (hi - lo + 1 + 63) / 64)
    }

    /// Ports in the range.
    var capacity: Int { hi - lo + 1 }
    var free: Int { capacity - heldCount }

    func isHeld(_ port: Int) -> Bool {
        guard port >= lo, port <= hi else { return false }
        let bit = port - lo
        return held[bit >> 6] & (1 << UInt64(bit & 63)) != 0
    }

    /// Marks `port` held; false if it is outside the range or already held.
    @discardableResult
    mutating func hold(_ port: Int) -> Bool {
        guard port >= lo, port <= hi, !isHeld(port) else { return false }
        let bit = port - lo
        held[bit >> 6] |= 1 << UInt64(bit & 63)
        heldCount += 1
        return true
    }

    /// Gives `port` back; false if the relay did not hold it.
    @discardableResult
    mutating func release(_ port: Int) -> Bool {
        guard isHeld(port) else { return false }
        let bit = port - lo
        held[bit >> 6] &= ~(1 << UInt64(bit & 63))
        heldCount -= 1
        return true
    }

    /// Picks a port that is not held (even with `even`; with `pair`, port+1
    /// not held either and inside the range), tries `bind` on it (which binds
    /// port+1 too with `pair`), and on success holds what was bound. Gives
    /// up after `attempts` failed binds or when no candidate is left.
    mutating func take(
        even: Bool, pair: Bool, attempts: Int = 4096, using random: inout some RandomNumberGenerator,
        bind: (Int) -> Bool
    ) -> Int? {
        let step = even ? 2 : 1
        let first = even ? lo + (lo & 1) : lo
        var last = pair ? hi - 1 : hi
        if even && last & 1 == 1 { last -= 1 }
        guard first <= last else { return nil }
        let count = (last - first) / step + 1
        // After the draws, a walk with a stride coprime with the count, which visits every candidate once.
        var index = Int.random(in: 0..<count, using: &random)
        var stride = count > 1 ? Int.random(in: 1..<count, using: &random) : 1
        while gcd(stride, count) != 1 { stride = stride % (count - 1) + 1 }
        var drawn = 0
        var walked = 0
        var failures = 0
        while true {
            let port: Int
            if drawn < Self.draws {
                port = first + Int.random(in: 0..<count, using: &random) * step
                drawn += 1
            } else if walked < count {
                port = first + index * step
                index = (index + stride) % count
                walked += 1
            } else {
                return nil
            }
            guard !isHeld(port), !(pair && isHeld(port + 1)) else { continue }
            if bind(port) {
                hold(port)
                if pair { hold(port + 1) }
                return port
            }
            failures += 1
            if failures >= attempts { return nil }
        }
    }

    private func gcd(_ a: Int, _ b: Int) -> Int {
        var (a, b) = (a, b)
        while b != 0 { (a, b) = (b, a % b) }
        return a
    }
}

/// The relay port ranges of one service, shared by its event loops' lanes
/// (each family has its own range: IPv4 and IPv6 ports are separate), so
/// that the accounting covers the whole service. Picks draw from the
/// system's random generator.
final class RelayPortPool: Sendable {
    private let ranges: Mutex<[UInt8: RelayPortRange]>

    init(plan: RelayAddressPlan) {
        var ranges: [UInt8: RelayPortRange] = [:]
        for ip in plan.ips { ranges[ip.family] = RelayPortRange(minPort: plan.minPort, maxPort: plan.maxPort) }
        self.ranges = Mutex(ranges)
    }

    /// See ``RelayPortRange/take(even:pair:attempts:using:bind:)``; nil also for a family without a range.
    func take(family: UInt8, even: Bool, pair: Bool, bind: (Int) -> Bool) -> Int? {
        ranges.withLock { ranges in
            var random = SystemRandomNumberGenerator()
            return ranges[family]?.take(even: even, pair: pair, using: &random, bind: bind)
        }
    }

    func release(family: UInt8, port: Int) {
        ranges.withLock { ranges in
            _ = ranges[family]?.release(port)
        }
    }

    /// Ports held and in the range, over every family.
    var usage: (held: Int, capacity: Int) {
        ranges.withLock { ranges in
            ranges.values.reduce((0, 0)) { ($0.0 + $1.heldCount, $0.1 + $1.capacity) }
        }
    }
}
