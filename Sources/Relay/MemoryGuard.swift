import Foundation
import Logging
import NIOConcurrencyHelpers
import ServiceLifecycle

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A bound on the memory the relay may use, and where it comes from.
public struct MemoryLimit: Sendable, Equatable, CustomStringConvertible {
    public enum Source: Sendable, Equatable {
        /// `tusa relay --memory-limit`.
        case option
        /// A control group's limit, with the file it was read from (`…/memory.max`,
        /// `…/memory.limit_in_bytes`): what the kernel's OOM killer enforces.
        case cgroup(path: String)
        /// RLIMIT_AS (`ulimit -v`): bounds the address space, not what is resident.
        case addressSpace
        /// The machine's RAM, when nothing smaller is set.
        case physical
    }

    public var bytes: UInt64
    public var source: Source

    public init(bytes: UInt64, source: Source) {
        self.bytes = bytes
        self.source = source
    }

    public var description: String { "\(MemoryLimit.format(bytes)) limit (\(sourceText))" }

    var sourceText: String {
        switch source {
        case .option: "--memory-limit"
        case .cgroup(let path): "cgroup \(path)"
        case .addressSpace: "ulimit -v, RLIMIT_AS, counts the address space"
        case .physical: "the machine's RAM"
        }
    }

    /// `1.5 GiB`, `300 MiB`, `12 KiB`.
    public static func format(_ bytes: UInt64) -> String {
        let units: [(String, UInt64)] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        for (name, size) in units where bytes >= size {
            let value = Double(bytes) / Double(size)
            return value >= 100 || value == value.rounded()
                ? "\(Int(value.rounded())) \(name)" : "\(String(format: "%.1f", value)) \(name)"
        }
        return "\(bytes) B"
    }

    /// `512M`, `2G`, `1.5G`, `65536` (bytes), `300MiB`: nil when not a size.
    public static func parse(_ text: String) -> UInt64? {
        var number = text.trimmingCharacters(in: .whitespaces)
        var scale: Double = 1
        let (g, m, k) = (Double(1 << 30), Double(1 << 20), Double(1 << 10))
        let suffixes: [(String, Double)] = [
            ("GiB", g), ("MiB", m), ("KiB", k), ("GB", g), ("MB", m), ("KB", k), ("G", g), ("M", m), ("K", k), ("g", g),
            ("m", m), ("k", k),
        ]
        for (suffix, size) in suffixes where number.hasSuffix(suffix) {
            number.removeLast(suffix.count)
            scale = size
            break
        }
        guard let value = Double(number), value.isFinite, value > 0 else { return nil }
        let bytes = value * scale
        guard bytes >= 1, bytes < 1.8e19 else { return nil }
        return UInt64(bytes)
    }
}

/// What counts against one limit, sampled: resident memory against most, the
/// address space against RLIMIT_AS, the control group's working set (its use
/// less the page cache it can drop) against a cgroup's.
public struct MemoryUse: Sendable, Equatable, CustomStringConvertible {
    public var bytes: UInt64
    public var limit: MemoryLimit

    public init(bytes: UInt64, limit: MemoryLimit) {
        self.bytes = bytes
        self.limit = limit
    }

    public var ratio: Double { limit.bytes == 0 ? .infinity : Double(bytes) / Double(limit.bytes) }

    public var description: String { "\(MemoryLimit.format(bytes)) in use of the \(limit)" }
}

/// Whether the relay takes new work, from sampled memory use, sans-IO: it stops
/// when any limit is `high` full and starts again when every one is below `low`.
public struct MemoryPressure: Sendable {
    public var high: Double
    public var low: Double
    /// The use that made the relay stop taking new work; nil while it takes it.
    public private(set) var shortage: MemoryUse?

    public enum Change: Sendable, Equatable {
        case began(MemoryUse)
        case ended(MemoryUse)
    }

    public init(high: Double = 0.9, low: Double = 0.8) {
        self.high = high
        self.low = low
    }

    /// The fullest limit's use at the last sample, with what was charged since.
    public private(set) var fullest: MemoryUse?

    /// The sample's fullest limit decides; a change is returned when the state flips.
    public mutating func update(_ uses: [MemoryUse]) -> Change? {
        guard let fullest = uses.max(by: { $0.ratio < $1.ratio }) else { return nil }
        self.fullest = fullest
        return decide(fullest)
    }

    /// New work about to use `bytes` (an estimate) before the next sample shows it: work
    /// admitted thousands a second between two samples is counted as it comes.
    public mutating func charge(_ bytes: UInt64) -> Change? {
        guard var use = fullest else { return nil }
        use.bytes &+= bytes
        fullest = use
        return decide(use)
    }

    private mutating func decide(_ fullest: MemoryUse) -> Change? {
        if shortage == nil, fullest.ratio >= high {
            shortage = fullest
            return .began(fullest)
        }
        if shortage != nil, fullest.ratio < low {
            shortage = nil
            return .ended(fullest)
        }
        if shortage != nil { shortage = fullest }
        return nil
    }
}

/// Reads this process's memory limits and use from /proc and /sys.
public enum MemoryProbe {
    /// Every limit that applies now, with what counts against each; `option` is
    /// `--memory-limit`'s. Limits that cannot be read are left out.
    public static func sample(option: UInt64?) -> [MemoryUse] {
        var uses: [MemoryUse] = []
        let (size, resident) = statm()
        if let option, let resident {
            uses.append(MemoryUse(bytes: resident, limit: MemoryLimit(bytes: option, source: .option)))
        }
        if let group = cgroup() { uses.append(group) }
        var limit = rlimit()
        if getrlimit(Int32(RLIMIT_AS.rawValue), &limit) == 0, limit.rlim_cur != rlim_t.max, let size {
            uses.append(MemoryUse(bytes: size, limit: MemoryLimit(bytes: UInt64(limit.rlim_cur), source: .addressSpace)))
        }
        if let total = meminfo("MemTotal"), let resident {
            uses.append(MemoryUse(bytes: resident, limit: MemoryLimit(bytes: total, source: .physical)))
        }
        return uses
    }

    /// The address space and resident set, in bytes.
    static func statm() -> (size: UInt64?, resident: UInt64?) {
        guard let text = read("/proc/self/statm") else { return (nil, nil) }
        let fields = text.split(separator: " ").map { UInt64($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        let page = UInt64(max(1, sysconf(Int32(_SC_PAGESIZE))))
        guard fields.count >= 2 else { return (nil, nil) }
        return (fields[0].map { $0 * page }, fields[1].map { $0 * page })
    }

    /// The tightest limit of this process's memory control group (cgroup v2, or
    /// v1's memory controller), with its working set.
    static func cgroup() -> MemoryUse? {
        guard let text = read("/proc/self/cgroup") else { return nil }
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            guard parts.count == 3 else { continue }
            let path = String(parts[2])
            if parts[0] == "0", parts[1].isEmpty, let use = cgroupV2(path) { return use }
            if parts[1].split(separator: ",").contains("memory"), let use = cgroupV1(path) { return use }
        }
        return nil
    }

    /// The group's folder: the path /proc gives under the mount, or (a container that
    /// sees the host's path but has its own group mounted as the root) the root itself.
    private static func groupDirectory(_ root: String, _ path: String, holding file: String) -> String? {
        let joined = root + (path == "/" ? "" : path)
        if read(joined + "/" + file) != nil { return joined }
        return joined != root && read(root + "/" + file) != nil ? root : nil
    }

    private static func cgroupV2(_ path: String) -> MemoryUse? {
        let root = "/sys/fs/cgroup"
        guard let own = groupDirectory(root, path, holding: "memory.current") else { return nil }
        var directory = own
        guard let current = number(directory + "/memory.current") else { return nil }
        // The nearest limit up the tree binds first.
        var limit: MemoryLimit?
        while directory.hasPrefix(root) {
            if let bytes = number(directory + "/memory.max"), bytes < limit?.bytes ?? .max {
                limit = MemoryLimit(bytes: bytes, source: .cgroup(path: directory + "/memory.max"))
            }
            guard directory != root, let slash = directory.lastIndex(of: "/") else { break }
            directory = String(directory[..<slash])
        }
        guard let limit else { return nil }
        let cache = statField(own + "/memory.stat", "inactive_file") ?? 0
        return MemoryUse(bytes: current > cache ? current - cache : 0, limit: limit)
    }

    private static func cgroupV1(_ path: String) -> MemoryUse? {
        guard let directory = groupDirectory("/sys/fs/cgroup/memory", path, holding: "memory.usage_in_bytes"),
            let usage = number(directory + "/memory.usage_in_bytes")
        else { return nil }
        let file = directory + "/memory.stat"
        // v1 says the limit in force, its ancestors' included; named by the file it is set in where that is this group's.
        let own = number(directory + "/memory.limit_in_bytes")
        guard let bytes = statField(file, "hierarchical_memory_limit") ?? own, bytes < 1 << 62 else { return nil }
        let source = own == bytes ? directory + "/memory.limit_in_bytes" : "\(file) hierarchical_memory_limit (a parent's)"
        let cache = statField(file, "total_inactive_file") ?? 0
        return MemoryUse(
            bytes: usage > cache ? usage - cache : 0, limit: MemoryLimit(bytes: bytes, source: .cgroup(path: source)))
    }

    /// A file holding one number; nil for `max` (no limit) or anything else.
    private static func number(_ path: String) -> UInt64? {
        read(path).flatMap { UInt64($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    }

    private static func statField(_ path: String, _ name: String) -> UInt64? {
        guard let text = read(path) else { return nil }
        let key = name + " "
        // Only the named line is split (memory.stat has some forty).
        for line in text.split(separator: "\n") where line.hasPrefix(key) {
            let parts = line.split(separator: " ")
            if parts.count == 2, parts[0] == name { return UInt64(parts[1]) }
        }
        return nil
    }

    private static func meminfo(_ name: String) -> UInt64? {
        guard let text = read("/proc/meminfo") else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix(name + ":") {
            let parts = line.split(separator: " ", omittingEmptySubsequences: true)
            if parts.count >= 2, let kib = UInt64(parts[1]) { return kib * 1024 }
        }
        return nil
    }

    private static func read(_ path: String) -> String? { try? String(contentsOfFile: path, encoding: .utf8) }
}

/// Keeps the relay from being killed for memory: samples its limits four times
/// a second (forty near the mark) and, while any is 90 % full, has the relay refuse new work (TURN
/// allocations with 508, new rooms and joins, rendezvous posts) while what
/// exists goes on; it takes new work again below 80 %. Says so in the log,
/// naming the limit. A swift-service-lifecycle `Service`.
public final class MemoryGuard: Service, Sendable {
    /// `--memory-limit`, if given; the cgroup's, RLIMIT_AS and the machine's RAM are found.
    public let option: UInt64?
    public let interval: Duration
    private let logger: Logger
    private let state: NIOLockedValueBox<State>

    private struct State {
        var pressure: MemoryPressure
        var observers: [Int: @Sendable (Bool) -> Void] = [:]
        var nextObserver = 0
        var refusals = 0
        var lastSample: MemoryUse?
    }

    public init(
        option: UInt64? = nil, interval: Duration = .milliseconds(250), pressure: MemoryPressure = .init(), logger: Logger
    ) {
        self.option = option
        self.interval = interval
        self.logger = logger
        state = NIOLockedValueBox(State(pressure: pressure))
    }

    /// The use that stopped new work, while it is stopped.
    public var shortage: MemoryUse? { state.withLockedValue { $0.pressure.shortage } }

    /// The fullest limit at the last sample.
    public var lastSample: MemoryUse? { state.withLockedValue { $0.lastSample } }

    /// Work refused for memory so far (counted by ``admit(cost:)``).
    public var refusals: Int { state.withLockedValue { $0.refusals } }

    /// What a TURN allocation is taken to use until a sample shows it: its state (about
    /// 900 bytes) and its socket's kernel memory, which a cgroup counts (5.7 KiB of slab
    /// an allocation, measured by `turn-load --mode allocate`: socket, file, epoll
    /// entry). At 4 KiB, a burst of allocations between two samples overran a tight
    /// limit before the guard refused, and the kernel's OOM killer ended the relay.
    public static let allocationCost: UInt64 = 8192

    /// Admits new work that will use about `cost` bytes: nil, and the cost is counted
    /// until the next sample; or, while memory is short, the shortage (counted as a refusal).
    public func admit(cost: UInt64 = MemoryGuard.allocationCost) -> MemoryUse? {
        let (refused, change, low) = state.withLockedValue { state -> (MemoryUse?, MemoryPressure.Change?, Double) in
            if let shortage = state.pressure.shortage {
                state.refusals += 1
                return (shortage, nil, state.pressure.low)
            }
            let change = state.pressure.charge(cost)
            if let change { Self.tell(state.observers, change) }
            return (nil, change, state.pressure.low)
        }
        if let change { say(change, low: low) }
        return refused
    }

    /// `body` is told now whether memory is short, and again each time that changes,
    /// until ``stopObserving(_:)`` with the returned token. It is called with the
    /// guard's lock held: it must hand the news on (to an event loop), not call the guard.
    public func observe(_ body: @escaping @Sendable (Bool) -> Void) -> Int {
        state.withLockedValue { state in
            let token = state.nextObserver
            state.nextObserver += 1
            state.observers[token] = body
            body(state.pressure.shortage != nil)
            return token
        }
    }

    /// Once this returns, the observer is never called again.
    public func stopObserving(_ token: Int) {
        _ = state.withLockedValue { $0.observers.removeValue(forKey: token) }
    }

    /// Samples once and acts on a change.
    public func check() {
        let uses = MemoryProbe.sample(option: option)
        let (change, low) = state.withLockedValue { state in
            state.lastSample = uses.max(by: { $0.ratio < $1.ratio })
            let change = state.pressure.update(uses)
            if let change { Self.tell(state.observers, change) }
            return (change, state.pressure.low)
        }
        if let change { say(change, low: low) }
    }

    private static func tell(_ observers: [Int: @Sendable (Bool) -> Void], _ change: MemoryPressure.Change) {
        for observer in observers.values {
            if case .began = change { observer(true) } else { observer(false) }
        }
    }

    private func say(_ change: MemoryPressure.Change, low: Double) {
        switch change {
        case .began(let use):
            logger.warning(
                "memory short: \(use); new TURN allocations, rooms, joins and rendezvous posts are refused until use falls below \(percent(low)) of the limit"
            )
        case .ended(let use):
            logger.notice("memory: \(use); taking new allocations, rooms, joins and posts again")
        }
    }

    public func run() async throws {
        let uses = MemoryProbe.sample(option: option)
        let high = state.withLockedValue { $0.pressure.high }
        if let tightest = uses.max(by: { $0.ratio < $1.ratio }) {
            logger.info("memory: \(tightest); new work stops at \(percent(high)) of it")
        } else {
            logger.warning("memory: no limit could be read (no /proc?); new work is never refused for memory")
        }
        check()
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            // Near the mark, ten times as often: allocations at thousands a second
            // must not run far past it between two samples.
            let near = (lastSample?.ratio ?? 0) >= high * 0.85
            try? await Task.sleep(for: near ? interval / 10 : interval)
            check()
        }
    }

    private func percent(_ ratio: Double) -> String { "\(Int((ratio * 100).rounded())) %" }
}
