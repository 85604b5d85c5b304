import Foundation
import Logging
import Relay
import Testing

@Suite("Memory guard")
struct MemoryGuardTests {
    private func use(_ bytes: UInt64, of limit: UInt64, _ source: MemoryLimit.Source = .option) -> MemoryUse {
        MemoryUse(bytes: bytes, limit: MemoryLimit(bytes: limit, source: source))
    }

    @Test func newWorkStopsAt90PercentOfTheFullestLimitAndStartsAgainBelow80() {
        var pressure = MemoryPressure()
        #expect(pressure.update([]) == nil)
        #expect(pressure.update([use(50, of: 100), use(800, of: 1000)]) == nil)
        // The cgroup's is the fullest: it decides, and it is what a refusal names.
        let cgroup = use(91, of: 100, .cgroup(path: "/sys/fs/cgroup/memory.max"))
        #expect(pressure.update([use(100, of: 1000), cgroup]) == .began(cgroup))
        #expect(pressure.shortage == cgroup)
        // Between the marks nothing changes; the shortage follows the use.
        #expect(pressure.update([use(85, of: 100)]) == nil)
        #expect(pressure.shortage?.bytes == 85)
        #expect(pressure.update([use(79, of: 100)]) == .ended(use(79, of: 100)))
        #expect(pressure.shortage == nil)
        #expect(pressure.update([use(85, of: 100)]) == nil)
    }

    /// Work admitted between two samples counts as it comes: thousands of allocations
    /// a second must not run past the mark before the next sample shows them.
    @Test func workAdmittedBetweenSamplesCounts() {
        var pressure = MemoryPressure()
        #expect(pressure.charge(4096) == nil, "nothing sampled yet: nothing to add to")
        #expect(pressure.update([use(80 << 20, of: 100 << 20)]) == nil)
        for _ in 0..<(10 << 20) / 4096 - 1 { #expect(pressure.charge(4096) == nil) }
        guard case .began(let reached)? = pressure.charge(4096) else {
            Issue.record("90 MiB of 100 reached and not short: \(String(describing: pressure.fullest))")
            return
        }
        #expect(reached.bytes == 90 << 20)
        // The next sample says what is really used.
        #expect(pressure.update([use(70 << 20, of: 100 << 20)]) == .ended(use(70 << 20, of: 100 << 20)))
    }

    @Test func aRefusalNamesTheUseAndTheLimit() {
        let address = use(950 << 20, of: 1 << 30, .addressSpace)
        #expect(
            address.description == "950 MiB in use of the 1 GiB limit (ulimit -v, RLIMIT_AS, counts the address space)")
        let group = use(3 << 19, of: 2 << 20, .cgroup(path: "/sys/fs/cgroup/memory/x/memory.limit_in_bytes"))
        #expect(group.description == "1.5 MiB in use of the 2 MiB limit (cgroup /sys/fs/cgroup/memory/x/memory.limit_in_bytes)")
    }

    @Test(arguments: [
        ("512M", UInt64(512) << 20), ("2G", 2 << 30), ("1.5G", 3 << 29), ("300MiB", 300 << 20), ("65536", 65536),
        ("64k", 64 << 10),
    ])
    func sizesAreRead(_ text: String, _ bytes: UInt64) {
        #expect(MemoryLimit.parse(text) == bytes)
    }

    @Test(arguments: ["", "M", "-1G", "0", "lots", "1T", "nan", "1e30"])
    func notSizesAreRefused(_ text: String) {
        #expect(MemoryLimit.parse(text) == nil)
    }

    /// On Linux at least the machine's RAM bounds the process, and what it uses is read.
    @Test func thisProcessHasALimitAndAUse() throws {
        let uses = MemoryProbe.sample(option: 1 << 40)
        let ram = try #require(uses.first { $0.limit.source == .physical })
        #expect(ram.bytes > 1 << 20 && ram.bytes < ram.limit.bytes)
        let option = try #require(uses.first { $0.limit.source == .option })
        #expect(option.bytes == ram.bytes && option.limit.bytes == 1 << 40)
    }

    /// A limit below what the process already uses: the guard stops new work at
    /// its first sample, counts each refusal, and tells its observers.
    @Test func theGuardStopsNewWorkAndTellsItsObservers() {
        let memory = MemoryGuard(option: 1 << 20, logger: Logger(label: "test"))
        let told = ManagedBox<[Bool]>([])
        let token = memory.observe { told.value.append($0) }
        memory.check()
        #expect(memory.shortage?.limit == MemoryLimit(bytes: 1 << 20, source: .option))
        #expect(memory.admit() != nil && memory.admit() != nil)
        #expect(memory.refusals == 2)
        memory.stopObserving(token)
        #expect(told.value == [false, true])
    }
}

/// A value shared with a `@Sendable` closure in a test.
private final class ManagedBox<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: Value
    init(_ value: Value) { stored = value }
    var value: Value {
        get { lock.withLock { stored } }
        set { lock.withLock { stored = newValue } }
    }
}
