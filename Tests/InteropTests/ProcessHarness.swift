import Foundation
import STUN
import Secure
import TestSupport
import TusaBase

#if canImport(Glibc)
    import Glibc
#endif

/// Runs real programs (tusa, coturn's tools, tshark, aioice) for the interop
/// tests: every wait is bounded, every process is stopped at the end.
enum Harness {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()

    /// The built `tusa`: $TUSA_BIN, else the one beside this test bundle (as
    /// fresh as the tests), else .build/debug/tusa.
    static let tusa: String? = {
        var candidates: [String] = []
        if let p = ProcessInfo.processInfo.environment["TUSA_BIN"] { candidates.append(p) }
        let selfExe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        candidates.append(selfExe.deletingLastPathComponent().appendingPathComponent("tusa").path)
        candidates.append(packageRoot.appendingPathComponent(".build/debug/tusa").path)
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
    }()

    static var python: String? {
        let p = packageRoot.appendingPathComponent(".venv/bin/python").path
        return FileManager.default.isExecutableFile(atPath: p) ? p : nil
    }

    /// The full path of a program on PATH (also /usr/sbin, where Debian puts some).
    static func which(_ name: String) -> String? {
        let path = (ProcessInfo.processInfo.environment["PATH"] ?? "") + ":/usr/sbin:/usr/bin:/sbin:/bin"
        for dir in path.split(separator: ":") {
            let candidate = "\(dir)/\(name)"
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return nil
    }

    static var isRoot: Bool { getuid() == 0 }

    /// A loopback port free for UDP and TCP, where no other test's port-0 socket or
    /// relay allocation can take it before the server that asked for it binds it.
    static func freePort() -> UInt16 { QuietPort.draw() }

    /// Two consecutive free ports p, p+1 on both 127.0.0.1 and 127.0.0.2 (for RFC 5780 setups).
    static func freePortPair() -> UInt16 {
        for _ in 0..<50 {
            let p = freePort()
            guard p < 65000 else { continue }
            if [("127.0.0.1", p + 1), ("127.0.0.2", p), ("127.0.0.2", p + 1)].allSatisfy({ isFree(ip: $0.0, port: $0.1) }) {
                return p
            }
        }
        return freePort()
    }

    static func isFree(ip: String, port: UInt16) -> Bool {
        guard let address = IPAddress(ip) else { return false }
        return (try? TestSocket.udp(bindingTo: address, port: port)) != nil
    }

    struct Result {
        var status: Int32
        var stdout: String
        var stderr: String
        var timedOut: Bool
    }

    /// Runs a program to completion, killing it after `timeout` seconds.
    /// Waits without holding a thread: Swift's cooperative pool has as many
    /// threads as cores (two here), and a test that blocks one stalls every
    /// other suite's async tests in a parallel run.
    static func run(_ executable: String, _ arguments: [String], timeout: Double = 20) async throws -> Result {
        let p = try Background(executable, arguments)
        let finished = await p.waitForExit(timeout: timeout)
        if !finished { await p.stop() }
        return Result(status: p.status, stdout: p.stdout, stderr: p.stderr, timedOut: !finished)
    }

    /// ``run(_:_:timeout:)`` that blocks its thread: only for skip conditions
    /// (static, evaluated before tests run), never inside a test.
    static func runBlocking(_ executable: String, _ arguments: [String], timeout: Double = 20) throws -> Result {
        let p = try Background(executable, arguments)
        let finished = eventuallyBlocking(within: .seconds(timeout)) { !p.process.isRunning }
        if !finished { p.kill() }
        p.process.waitUntilExit()
        _ = eventuallyBlocking(within: .seconds(2)) { p.drained }  // everything it wrote is read
        return Result(status: p.status, stdout: p.stdout, stderr: p.stderr, timedOut: !finished)
    }

    /// Runs blocking work (a blocking socket read, a poll loop) on a Dispatch
    /// thread, off the cooperative pool (see ``run(_:_:timeout:)``).
    static func offPool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global().async { continuation.resume(with: Swift.Result { try body() }) }
        }
    }

    /// A program running in the background, its output collected.
    final class Background: @unchecked Sendable {
        let process = Process()
        private let lock = NSLock()
        /// What came on standard output (0) and error (1), and whether each reached end of file.
        private var streams = [(data: Data(), closed: false), (data: Data(), closed: false)]

        /// The test runner's threads block SIGINT and SIGTERM, and Process hands
        /// that mask to its children, which then cannot be stopped gracefully.
        /// Children start through this exec wrapper, which unblocks them and
        /// restores the default handlers (Python ignores SIGPIPE and SIGXFSZ, and an
        /// ignored signal stays ignored across exec: the child must start as it would
        /// from a shell).
        static let unblockSignals = """
            import os, signal, sys
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ): signal.signal(s, signal.SIG_DFL)
            os.execv(sys.argv[1], sys.argv[1:])
            """

        private var input: Pipe?

        /// - Parameter withInput: give the program a pipe on its standard input (see ``send(_:)``).
        init(_ executable: String, _ arguments: [String], withInput: Bool = false) throws {
            if let python = Harness.which("python3") {
                process.executableURL = URL(fileURLWithPath: python)
                process.arguments = ["-c", Self.unblockSignals, executable] + arguments
            } else {
                process.executableURL = URL(fileURLWithPath: executable)
                process.arguments = arguments
            }
            let o = Pipe()
            let e = Pipe()
            process.standardOutput = o
            process.standardError = e
            if withInput {
                let i = Pipe()
                input = i
                process.standardInput = i
            } else {
                process.standardInput = FileHandle.nullDevice
            }
            collect(o, into: 0)
            collect(e, into: 1)
            try process.run()
        }

        /// Appends what comes through `pipe` to `streams[index]` until end of file.
        private func collect(_ pipe: Pipe, into index: Int) {
            pipe.fileHandleForReading.readabilityHandler = { [weak self] h in
                let d = h.availableData
                if d.isEmpty { h.readabilityHandler = nil }
                guard let self else { return }
                self.lock.withLock {
                    if d.isEmpty { self.streams[index].closed = true } else { self.streams[index].data.append(d) }
                }
            }
        }

        /// Writes `text` to the program's standard input (started `withInput`).
        /// (A program that already exited must not take the test runner down with SIGPIPE.)
        func send(_ text: String) {
            signal(SIGPIPE, SIG_IGN)
            try? input?.fileHandleForWriting.write(contentsOf: Data(text.utf8))
        }

        var stdout: String { lock.withLock { String(decoding: streams[0].data, as: UTF8.self) } }
        var stderr: String { lock.withLock { String(decoding: streams[1].data, as: UTF8.self) } }
        var status: Int32 { process.isRunning ? -1 : process.terminationStatus }

        /// Polls until `condition` holds on stdout+stderr, the process ends, or
        /// time runs out; sleeps between polls without holding a thread.
        func waitFor(timeout: Double, _ condition: (String, String) -> Bool) async -> Bool {
            _ = await eventually(within: .seconds(timeout), poll: .milliseconds(20)) {
                !process.isRunning || condition(stdout, stderr)
            }
            return condition(stdout, stderr)
        }

        /// The first capture of `pattern` in stdout, waiting for it.
        func waitForMatch(_ pattern: String, timeout: Double = 10) async -> String? {
            var found: String?
            _ = await waitFor(timeout: timeout) { out, _ in
                guard let r = out.range(of: pattern, options: .regularExpression) else { return false }
                found = String(out[r])
                return true
            }
            return found
        }

        func waitForExit(timeout: Double) async -> Bool {
            guard await eventually(within: .seconds(timeout), { !process.isRunning }) else { return false }
            // Everything it wrote is read once both pipes reach end of file (bounded:
            // a grandchild may still hold them).
            _ = await eventually(within: .seconds(2)) { drained }
            return true
        }

        /// Whether both pipes reached end of file.
        var drained: Bool { lock.withLock { streams.allSatisfy(\.closed) } }

        /// SIGTERM (or `signal`), then SIGKILL after `grace` seconds. Returns the exit status.
        @discardableResult
        func stop(signal: Int32 = SIGTERM, grace: Double = 5) async -> Int32 {
            if process.isRunning { Glibc.kill(process.processIdentifier, signal) }
            if await !waitForExit(timeout: grace) {
                Glibc.kill(process.processIdentifier, SIGKILL)
                _ = await waitForExit(timeout: 2)
            }
            return status
        }

        /// The process id while it runs.
        var pid: Int32? { process.isRunning ? process.processIdentifier : nil }

        /// SIGKILL now, without waiting (for `defer`, which cannot await; Process
        /// reaps the child).
        func kill() {
            if process.isRunning { Glibc.kill(process.processIdentifier, SIGKILL) }
        }

        deinit { kill() }
    }

    /// Starts `tusa relay` with the given arguments and returns it with its UDP port;
    /// nil without the binary. A relay that does not start throws what it said.
    static func startRelay(_ arguments: [String]) async throws -> (Background, UInt16)? {
        guard let tusa else { return nil }
        let relay = try Background(tusa, ["relay"] + arguments)
        guard let line = await relay.waitForMatch(#"listening udp 127\.0\.0\.1:[0-9]+"#),
            let port = line.split(separator: ":").last.flatMap({ UInt16($0) })
        else {
            relay.kill()
            _ = await relay.waitForExit(timeout: 2)
            throw HarnessError("tusa relay \(arguments.joined(separator: " ")) did not start: \(relay.stderr.suffix(800))")
        }
        return (relay, port)
    }

    /// Starts coturn's turnserver on loopback with no config file (`-n`), as a
    /// STUN-only server (`-z -S`) unless other flags are given; waits until it answers.
    static func startTurnserver(port: UInt16, listen: [String] = ["127.0.0.1"], extra: [String] = ["-z", "-S"]) async throws
        -> Background?
    {
        guard let turnserver = which("turnserver"), let stunclient = which("turnutils_stunclient") else { return nil }
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tusa-turn-\(UUID())").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        var args = [
            "-n", "-p", "\(port)", "-m", "0", "--no-tls", "--no-dtls", "--no-cli", "--log-file", "\(dir)/turn.log",
            "--simple-log", "--no-stdout-log", "-b", "\(dir)/turndb", "--pidfile", "\(dir)/turn.pid",
        ]
        for l in listen { args += ["-L", l] }
        let server = try Background(turnserver, args + extra)
        // Ready when a probe gets an answer.
        let ready = await eventually(within: .seconds(20), poll: .milliseconds(100)) {
            guard let r = try? await run("/usr/bin/timeout", ["0.3", stunclient, "-p", "\(port)", "127.0.0.1"], timeout: 2) else {
                return false
            }
            return r.status == 0 && r.stdout.contains("reflexive addr")
        }
        if ready { return server }
        server.kill()
        return nil
    }
}

extension Harness {
    /// Starts coturn's turnutils_peer, a UDP echo on `port` and `port + 1`, and
    /// waits until both echo a probe (a port found free can be taken by another
    /// test's socket before the peer binds it: then it exits, or a stranger holds
    /// the port and nothing echoes). Nil if it is not ready within `limit`.
    static func startEchoPeer(port: UInt16, within limit: Duration = .seconds(10)) async throws -> Background? {
        guard let tool = which("turnutils_peer") else { return nil }
        let peer = try Background(tool, ["-L", "127.0.0.1", "-p", "\(port)"])
        let probe = try TestSocket.udp(bindingTo: .v4(0x7F00_0001))
        let marker = Array("tusa-peer-probe-\(UUID())".utf8)
        let ready = try await offPool {
            eventuallyBlocking(within: limit, poll: .milliseconds(20)) {
                guard peer.process.isRunning else { return true }
                return [port, port + 1].allSatisfy { p in
                    guard (try? probe.sendDatagram(marker, to: TransportAddress(ip: .v4(0x7F00_0001), port: p))) != nil else {
                        return false
                    }
                    // Earlier probes' late echoes are skipped.
                    while let (bytes, from) = try? probe.receive(timeout: 0.2) {
                        if bytes == marker && from.port == p { return true }
                    }
                    return false
                }
            } && peer.process.isRunning
        }
        if ready { return peer }
        await peer.stop(signal: SIGKILL)
        return nil
    }

    /// Makes sure a running capture (`tshark -w file`) has recorded everything
    /// sent before: sends a fresh marker datagram from `probe` to itself (the
    /// capture filter must match `probe`'s port) until the file holds it. Before
    /// the traffic it is the readiness signal ("Capturing on" comes a moment before
    /// the filter is live); after, the sentinel behind the last packets. Capture
    /// checkers ignore the marker: it is neither STUN, ChannelData nor RTP.
    static func syncCapture(_ file: String, probe: TestSocket, within limit: Duration = .seconds(15)) async -> Bool {
        let marker = Data("tusa-capture-probe-\(UUID())".utf8)
        return await eventually(within: limit, poll: .milliseconds(50)) {
            try? probe.sendDatagram(Array(marker), to: probe.localAddress)
            return FileManager.default.contents(atPath: file)?.range(of: marker) != nil
        }
    }
}

/// A file in the temporary directory (a config file for `tusa relay -c`),
/// removed when this goes away.
/// A test's helper could not do what it was asked, and says why.
struct HarnessError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

final class TemporaryFile: Sendable {
    let path: String

    init(_ text: String, suffix: String = ".conf") throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("tusa-\(UUID())\(suffix)").path
        try text.write(toFile: path, atomically: true, encoding: .utf8)
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

extension Harness {
    /// The next payload a rendezvous connection hears within `limit`, if any.
    static func next(
        _ incoming: AsyncStream<(from: PublicKey, payload: [UInt8])>, within limit: Duration
    ) async -> (from: PublicKey, payload: [UInt8])? {
        await withTaskGroup(of: (from: PublicKey, payload: [UInt8])?.self) { group in
            group.addTask {
                for await message in incoming { return message }
                return nil
            }
            group.addTask {
                try? await Task.sleep(for: limit)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
    }
}
