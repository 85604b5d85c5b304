import Foundation
import STUN
import TURN
import Testing
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// `tusa relay` short of memory: the limit tightened under a running relay (its
// RLIMIT_AS with prlimit, or its memory cgroup's limit), then loosened again.

private let loopback = IPAddress.v4(0x7F00_0001)
private let turnFlags = ["-u", "alice:wonderland", "-r", "example.org", "--allow-loopback-peers"]

@Suite("tusa relay short of memory", .serialized)
struct RelayMemoryTests {
    /// RLIMIT_AS lowered to just above the relay's address space: it refuses new
    /// allocations (508) and says why, naming the limit; the allocation it holds is
    /// refreshed and relays both ways; with the limit lifted it allocates again.
    @Test(
        "a relay near its RLIMIT_AS refuses new allocations, keeps the ones it has, and takes them again when it is lifted",
        .enabled(if: Harness.tusa != nil && Harness.which("prlimit") != nil, "needs the tusa binary and util-linux's prlimit"))
    func addressSpaceLimit() async throws {
        let prlimit = try #require(Harness.which("prlimit"))
        let (relay, port) = try #require(try await Harness.startRelay(["--listen", "127.0.0.1:0"] + turnFlags))
        defer { relay.kill() }
        let pid = try #require(relay.pid)
        try await Self.shortOfMemory(relay: relay, port: port, names: "RLIMIT_AS") {
            let size = try #require(Self.status(pid, "VmSize"), "no VmSize for \(pid)")
            let soft = size * 100 / 95
            let result = try await Harness.run(prlimit, ["--pid", "\(pid)", "--as=\(soft):unlimited"])
            #expect(result.status == 0, "\(result.stderr)")
        } loosen: {
            let result = try await Harness.run(prlimit, ["--pid", "\(pid)", "--as=unlimited:unlimited"])
            #expect(result.status == 0, "\(result.stderr)")
        }
    }

    /// The same with the limit the kernel's OOM killer enforces: the relay runs in a
    /// memory cgroup of its own (cgroup v1 or v2; root), whose limit is lowered to
    /// just above its working set.
    @Test(
        "a relay near its memory cgroup's limit refuses new allocations and is not killed",
        .enabled(
            if: Harness.tusa != nil && getuid() == 0 && MemoryCgroup.hierarchy != nil,
            "needs the tusa binary, root and a memory cgroup hierarchy to make a group in"))
    func cgroupLimit() async throws {
        let binary = try #require(Harness.tusa)
        let group = try #require(MemoryCgroup(), "cannot make a memory cgroup")
        defer { group.remove() }
        try group.setLimit(1 << 30)
        let command = ([binary, "relay", "--listen", "127.0.0.1:0"] + turnFlags).joined(separator: " ")
        let relay = try Harness.Background("/bin/sh", ["-c", "echo $$ > \(group.directory)/cgroup.procs && exec \(command)"])
        defer { relay.kill() }
        let line = try #require(
            await relay.waitForMatch(#"listening udp 127\.0\.0\.1:[0-9]+"#), "\(relay.stdout) \(relay.stderr)")
        let port = try #require(line.split(separator: ":").last.flatMap { UInt16($0) })
        #expect(
            await relay.waitFor(timeout: 10) { _, err in err.contains("in use of the 1 GiB limit (cgroup \(group.directory)") },
            "the relay does not name its cgroup's limit: \(relay.stderr.suffix(1500))")
        try await Self.shortOfMemory(relay: relay, port: port, names: "cgroup \(group.directory)") {
            // Lowering the limit makes the kernel reclaim the group's page cache, and
            // the working set can fall with it (its active file pages) below the 90 %
            // the relay acts on: then the relay is right not to be short, and the
            // limit is lowered again from the new working set, a few times at most.
            for _ in 0..<5 {
                let used = try #require(group.workingSet, "cannot read the group's use")
                try group.setLimit(used * 100 / 93)
                if await relay.waitFor(timeout: 3, { _, err in err.contains("memory short: ") }) { break }
            }
        } loosen: {
            try group.setLimit(1 << 30)
        }
        #expect(group.oomKills == 0, "the relay met the OOM killer")
    }

    /// Allocation A before `tighten`, a refused one after it, A still working, and a
    /// new one once `loosen` has been seen.
    private static func shortOfMemory(
        relay: Harness.Background, port: UInt16, names limit: String, tighten: () async throws -> Void,
        loosen: () async throws -> Void
    ) async throws {
        let server = TransportAddress(ip: loopback, port: port)
        let configuration = TURNClient.Configuration(username: "alice", password: "wonderland")
        let peer = try TestSocket.udp(bindingTo: loopback)
        let peerAddress = peer.localAddress
        let held = try await TURNClientConnection.connect(to: server, over: .udp, configuration: configuration)
        let allocation = try await held.allocate(timeout: .seconds(5))
        try await held.createPermission(for: peerAddress, timeout: .seconds(5))

        try await tighten()
        #expect(
            await relay.waitFor(timeout: 10) { _, err in err.contains("memory short: ") && err.contains(limit) },
            "the relay did not see its memory short: \(relay.stderr.suffix(1500))")
        let refused = try await TURNClientConnection.connect(to: server, over: .udp, configuration: configuration)
        let outcome: Result<TURNClientAllocation, TURNClientError>
        do { outcome = .success(try await refused.allocate(timeout: .seconds(5))) } catch { outcome = .failure(error) }
        #expect(Self.code(of: outcome) == 508, "\(outcome)")
        try? await refused.close(timeout: .seconds(2))
        #expect(
            await relay.waitFor(timeout: 5) { _, err in
                err.contains("allocation refused (508): memory short") && err.contains(limit)
            },
            "\(relay.stderr.suffix(1500))")

        // What the relay holds goes on: a refresh, and data both ways.
        let refreshed = try await held.refresh(timeout: .seconds(5))
        #expect(refreshed.relayed == allocation.relayed)
        try await held.send([1, 2, 3], to: peerAddress)
        let (bytes, from) = try #require(
            try await Harness.offPool { try peer.receive(timeout: 5) }, "nothing relayed to the peer")
        #expect(bytes == [1, 2, 3] && from == allocation.relayed)
        try peer.sendDatagram([4, 5], to: allocation.relayed)
        let back = try await TURNClientPeerTests.collect(1, from: held, within: .seconds(5))
        #expect(back.map(\.payload) == [[4, 5]])

        try await loosen()
        #expect(
            await relay.waitFor(timeout: 10) { _, err in err.contains("taking new allocations, rooms, joins and posts again") },
            "\(relay.stderr.suffix(1500))")
        let later = try await TURNClientConnection.connect(to: server, over: .udp, configuration: configuration)
        _ = try await later.allocate(timeout: .seconds(5))
        try await later.close(timeout: .seconds(2))
        try await held.close(timeout: .seconds(2))
        #expect(await relay.stop() == 0, "the relay did not stop cleanly: \(relay.stderr.suffix(1500))")
    }

    /// The error code an Allocate was answered with.
    private static func code(of outcome: Result<TURNClientAllocation, TURNClientError>) -> Int? {
        guard case .failure(let error) = outcome, case .errorResponse(_, let value) = error else { return nil }
        return value.code
    }

    /// A field of /proc/PID/status in bytes (`VmSize:  123 kB`).
    static func status(_ pid: Int32, _ field: String) -> UInt64? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix(field + ":") {
            let parts = line.split(separator: " ", omittingEmptySubsequences: true)
            if parts.count >= 2, let kib = UInt64(parts[1]) { return kib * 1024 }
        }
        return nil
    }
}

/// A memory cgroup made for one test (v1's memory hierarchy, or v2's unified
/// one with the memory controller), removed afterwards.
struct MemoryCgroup {
    enum Version { case v1, v2 }
    let directory: String
    let version: Version

    /// Where groups with a memory limit can be made, if anywhere.
    static let hierarchy: (String, Version)? = {
        let manager = FileManager.default
        if manager.isWritableFile(atPath: "/sys/fs/cgroup/memory"),
            manager.fileExists(atPath: "/sys/fs/cgroup/memory/memory.limit_in_bytes")
        {
            return ("/sys/fs/cgroup/memory", .v1)
        }
        if let controllers = try? String(contentsOfFile: "/sys/fs/cgroup/cgroup.subtree_control", encoding: .utf8),
            controllers.split(separator: " ").contains(where: { $0.trimmingCharacters(in: .whitespacesAndNewlines) == "memory" }),
            manager.isWritableFile(atPath: "/sys/fs/cgroup")
        {
            return ("/sys/fs/cgroup", .v2)
        }
        return nil
    }()

    init?() {
        guard let (root, version) = Self.hierarchy else { return nil }
        directory = "\(root)/tusa-test-\(getpid())-\(UInt32.random(in: 0 ... .max))"
        self.version = version
        guard mkdir(directory, 0o755) == 0 else { return nil }
    }

    private var limitFile: String { directory + (version == .v1 ? "/memory.limit_in_bytes" : "/memory.max") }

    func setLimit(_ bytes: UInt64) throws {
        try "\(bytes)\n".write(toFile: limitFile, atomically: false, encoding: .utf8)
    }

    /// Use less the page cache the kernel can drop, as the relay counts it.
    var workingSet: UInt64? {
        let usageFile = directory + (version == .v1 ? "/memory.usage_in_bytes" : "/memory.current")
        guard let text = try? String(contentsOfFile: usageFile, encoding: .utf8),
            let usage = UInt64(text.trimmingCharacters(in: .whitespacesAndNewlines))
        else { return nil }
        let cache = stat(version == .v1 ? "total_inactive_file" : "inactive_file") ?? 0
        return usage > cache ? usage - cache : 0
    }

    /// Processes of the group the OOM killer ended.
    var oomKills: UInt64 {
        let file = directory + (version == .v1 ? "/memory.oom_control" : "/memory.events")
        guard let text = try? String(contentsOfFile: file, encoding: .utf8) else { return 0 }
        for line in text.split(separator: "\n") where line.hasPrefix("oom_kill ") {
            return UInt64(line.split(separator: " ").last ?? "") ?? 0
        }
        return 0
    }

    private func stat(_ name: String) -> UInt64? {
        guard let text = try? String(contentsOfFile: directory + "/memory.stat", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: " ")
            if parts.count == 2, parts[0] == name { return UInt64(parts[1]) }
        }
        return nil
    }

    /// Waits for the group to empty (its processes killed), then removes it.
    func remove() {
        for _ in 0..<50 {
            if rmdir(directory) == 0 || errno == ENOENT { return }
            usleep(100_000)
        }
    }
}
