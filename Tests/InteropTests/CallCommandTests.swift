import Foundation
import Secure
import Testing
import Voice

/// `tusa call` and `tusa answer` as users run them: a relay with its rendezvous, two
/// processes, real speech in, a WAV of what the other side heard, reports, exit codes.
@Suite(.serialized) struct CallCommandTests {
    static let speech = "/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.wav"
    static let ready = Harness.tusa != nil && FileManager.default.fileExists(atPath: speech)
    static let needs = "needs .build/debug/tusa and Debian's pocketsphinx-testdata (make test installs it)"

    /// A relay with its rendezvous on loopback (and `extra` arguments): (process, rendezvous port).
    static func relay(_ extra: [String] = []) async throws -> (Harness.Background, UInt16) {
        let (relay, _) = try #require(
            try await Harness.startRelay(["--listen", "127.0.0.1:0", "--rendezvous-port", "0"] + extra))
        let line = try #require(
            await relay.waitForMatch(#"rendezvous tcp 127\.0\.0\.1:[0-9]+"#), "\(relay.stdout) \(relay.stderr)")
        return (relay, try #require(line.split(separator: ":").last.flatMap { UInt16($0) }))
    }

    /// `tusa answer` in the background (run by `wrapper`, e.g. prlimit, when given), and the key it answers as.
    static func answer(_ port: UInt16, _ extra: [String], wrapper: [String] = []) async throws -> (Harness.Background, String) {
        let tusa = try #require(Harness.tusa)
        let command =
            wrapper + [tusa, "answer", "--rendezvous", "127.0.0.1:\(port)", "--timeout", "20", "--json", "--quiet"] + extra
        let a = try Harness.Background(command[0], Array(command.dropFirst()))
        let line = try #require(await a.waitForMatch(#"answering as [A-Za-z0-9+/=]{44}"#), "\(a.stdout) \(a.stderr)")
        return (a, String(line.dropFirst("answering as ".count)))
    }

    /// Both sides exited 0 (the callee within 10 s of the caller); their JSON reports.
    static func reports(caller: Harness.Result, answerer: Harness.Background) async throws -> (
        caller: [String: Any], callee: [String: Any]
    ) {
        #expect(caller.status == 0, "\(caller.stdout) \(caller.stderr)")
        _ = await answerer.waitForExit(timeout: 10)
        #expect(answerer.status == 0, "\(answerer.stdout) \(answerer.stderr)")
        return (
            try #require(Self.json(caller.stdout), "\(caller.stdout)"),
            try #require(Self.json(answerer.stdout), "\(answerer.stdout)")
        )
    }

    static func json(_ text: String) -> [String: Any]? {
        guard let start = text.firstIndex(of: "{") else { return nil }
        return try? JSONSerialization.jsonObject(with: Data(text[start...].utf8)) as? [String: Any]
    }

    /// Per-20 ms RMS envelope at 8 kHz.
    static func envelope(_ s: [Int16]) -> [Double] {
        stride(from: 0, to: s.count - 160, by: 160).map { i in
            (s[i..<(i + 160)].reduce(0.0) { $0 + Double($1) * Double($1) } / 160).squareRoot()
        }
    }

    /// Pearson's correlation of two equally long runs; nil when either is flat.
    static func correlation(_ x: ArraySlice<Double>, _ y: ArraySlice<Double>) -> Double? {
        let n = Double(x.count)
        let mx = x.reduce(0, +) / n
        let my = y.reduce(0, +) / n
        var sxy = 0.0
        var sxx = 0.0
        var syy = 0.0
        for (u, v) in zip(x, y) {
            sxy += (u - mx) * (v - my)
            sxx += (u - mx) * (u - mx)
            syy += (v - my) * (v - my)
        }
        guard sxx > 0, syy > 0 else { return nil }
        return sxy / (sxx * syy).squareRoot()
    }

    /// How well `b` (what was heard) follows `a` (what was said), window by window:
    /// `a` cut into windows of `window` frames (each starting half a window after the
    /// one before), each window compared with `b` at a shift of 0...`maxShift` frames,
    /// the shifts of neighbouring windows at most `drift` frames apart, chosen together
    /// for the best sum. A far end's jitter buffer may move its playout delay by a few
    /// frames mid-call (on a busy machine it does), which one shift for the whole call
    /// would count as speech lost; carried speech does not jump further than `drift`.
    /// Each window's correlation at its shift, in order (-1 where `b` is flat there).
    static func windowedCorrelation(_ a: [Double], _ b: [Double], window: Int, maxShift: Int, drift: Int) -> [Double] {
        let starts = Array(stride(from: 0, through: a.count - window, by: window / 2))
        // r[w][s]: window w against b shifted by s (nil: b too short or flat there).
        let r: [[Double]] = starts.map { start in
            (0...maxShift).map { shift in
                guard start + shift + window <= b.count else { return -1 }
                return correlation(a[start..<(start + window)], b[(start + shift)..<(start + shift + window)]) ?? -1
            }
        }
        guard let first = r.first else { return [] }
        // Best sum of correlations ending in each shift, and where each came from.
        var best = first
        var from: [[Int]] = []
        for w in r.dropFirst() {
            var next = [Double](repeating: -.infinity, count: maxShift + 1)
            var back = [Int](repeating: 0, count: maxShift + 1)
            for s in 0...maxShift {
                for p in max(0, s - drift)...min(maxShift, s + drift) where best[p] + w[s] > next[s] {
                    next[s] = best[p] + w[s]
                    back[s] = p
                }
            }
            best = next
            from.append(back)
        }
        var shift = best.indices.max { best[$0] < best[$1] } ?? 0
        var shifts = [shift]
        for back in from.reversed() {
            shift = back[shift]
            shifts.append(shift)
        }
        return zip(r, shifts.reversed()).map { $0[$1] }
    }

    @Test(.enabled(if: ready, "\(needs)"))
    func aCallCarriesSpeechAndBothSidesReport() async throws {
        let (relay, port) = try await Self.relay()
        defer { relay.kill() }
        let heard = NSTemporaryDirectory() + "tusa-call-\(getpid())-heard.wav"
        defer { unlink(heard) }
        let (answerer, key) = try await Self.answer(port, ["--out", heard])
        defer { answerer.kill() }
        let caller = try await TURNClientPeerTests.tusa(
            [
                "call", key, "--rendezvous", "127.0.0.1:\(port)", "--in", Self.speech, "--json", "--quiet",
            ], timeout: 40)
        let (c, a) = try await Self.reports(caller: caller, answerer: answerer)
        #expect(c["ended"] as? String == "local-hangup")
        #expect(a["ended"] as? String == "remote-hangup")
        #expect(c["path"] as? String == "direct" && a["path"] as? String == "direct")
        let sent = try #require(c["packetsSent"] as? Int)
        #expect(sent > 300)  // 7.1 s of speech in 20 ms frames
        #expect(try #require(a["packetsReceived"] as? Int) >= sent - 5)
        #expect(try #require(a["dialToFirstAudioMilliseconds"] as? Double) > 0)
        #expect(try #require(a["estimatedMOS"] as? Double) > 3.5)

        // What the callee heard is the caller's speech (envelopes line up).
        let input = try WAVFile.read(path: Self.speech)
        let reference = try Resampler.resampleAll(input.samples, from: input.sampleRate, to: 8000)
        let out = try WAVFile.read(path: heard)
        #expect(out.sampleRate == 8000)
        // 7.1 s: 6 windows of 2 s, each starting 1 s after the one before.
        let windows = Self.windowedCorrelation(
            Self.envelope(reference), Self.envelope(out.samples), window: 100, maxShift: 150, drift: 25)
        #expect(windows.count >= 5 && windows.allSatisfy { $0 > 0.8 }, "envelope correlation per window \(windows)")
    }

    /// Ctrl-C (SIGINT) on a call under way hangs up: the caller reports and exits 0, and
    /// the callee ends at once on the hang-up (it waited 30 s for a peer that vanished).
    /// Ctrl-C while a call still rings stops it with exit 130 and tells the callee, and
    /// an answerer waiting for a call stops the same way.
    @Test(.enabled(if: ready, "\(needs)"))
    func ctrlCHangsUpAndTheOtherSideKnowsAtOnce() async throws {
        let tusa = try #require(Harness.tusa)
        let (relay, port) = try await Self.relay()
        defer { relay.kill() }
        let (answerer, key) = try await Self.answer(port, [])
        defer { answerer.kill() }
        let caller = try Harness.Background(
            tusa, ["call", key, "--rendezvous", "127.0.0.1:\(port)", "--in", Self.speech, "--loop", "--json"])
        defer { caller.kill() }
        // Connected, and talking: the caller's live status line says so on standard error.
        #expect(
            await caller.waitFor(timeout: 30) { _, err in
                (err.components(separatedBy: "sent ").last?.split(separator: " ").first).flatMap { Int($0) } ?? 0 > 60
            }, "\(caller.stderr)")
        let interrupted = ContinuousClock.now
        #expect(await caller.stop(signal: SIGINT, grace: 10) == 0, "\(caller.stdout) \(caller.stderr)")
        #expect(await answerer.waitForExit(timeout: 10), "the callee did not hear the hang-up: \(answerer.stderr)")
        #expect(interrupted.duration(to: .now) < .seconds(15))
        let c = try #require(Self.json(caller.stdout), "\(caller.stdout)")
        let a = try #require(Self.json(answerer.stdout), "\(answerer.stdout)")
        #expect(c["ended"] as? String == "local-hangup")
        #expect(a["ended"] as? String == "remote-hangup", "\(a)")
        #expect(try #require(c["packetsSent"] as? Int) > 50)

        // Ringing: nobody answers this key (registered by tusa party watch, which takes
        // no calls).
        let watcher = try Harness.Background(tusa, ["party", "watch", "--rendezvous", "127.0.0.1:\(port)"])
        defer { watcher.kill() }
        let watching = try #require(await watcher.waitForMatch(#"watching as [A-Za-z0-9+/=]{44}"#), "\(watcher.stderr)")
        let ringing = try Harness.Background(
            tusa,
            ["call", String(watching.dropFirst("watching as ".count)), "--rendezvous", "127.0.0.1:\(port)", "--quiet"],
            withInput: false)
        defer { ringing.kill() }
        // Ringing: the watcher's rendezvous has passed it the offer (it ignores offers).
        // (The handler is in place from the start; a second is enough to be past it.)
        try await Task.sleep(for: .seconds(2))
        #expect(await ringing.stop(signal: SIGINT, grace: 10) == 130, "\(ringing.stderr)")
        #expect(ringing.stderr.contains("hung up before the call was set up"), "\(ringing.stderr)")
        // An answerer waiting for a call stops the same way.
        let (idle, _) = try await Self.answer(port, [])
        defer { idle.kill() }
        #expect(await idle.stop(signal: SIGINT, grace: 10) == 130, "\(idle.stderr)")
    }

    /// An answerer that takes one caller (`--from`) refuses others at once (they rang
    /// until their timeout), and a call to one's own key is a usage error.
    @Test(.enabled(if: ready, "\(needs)"))
    func anAnswererForAnotherCallerRefusesAtOnce() async throws {
        let tusa = try #require(Harness.tusa)
        let (relay, port) = try await Self.relay()
        defer { relay.kill() }
        let (answerer, key) = try await Self.answer(port, ["--from", PrivateKey.generate().publicKey.base64])
        defer { answerer.kill() }
        let started = ContinuousClock.now
        let refused = try await Harness.run(tusa, ["call", key, "--rendezvous", "127.0.0.1:\(port)", "--quiet"], timeout: 30)
        #expect(refused.status == 2, "\(refused.stderr)")
        #expect(refused.stderr.contains("the call was refused: not taking calls from this key now"), "\(refused.stderr)")
        #expect(started.duration(to: .now) < .seconds(20))

        let dir = NSTemporaryDirectory() + "tusa-call-self-\(getpid())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let identity = Identity.generate()
        try identity.write(to: "\(dir)/me.key")
        let me = try await Harness.run(
            tusa,
            ["call", identity.publicKey.base64, "--rendezvous", "127.0.0.1:\(port)", "--identity", "\(dir)/me.key"],
            timeout: 20)
        #expect(me.status == 64 && me.stderr.contains("PEER is this identity's own key"), "\(me.stderr)")
        #expect(
            try await Harness.run(
                tusa, ["call", key, "--rendezvous", "127.0.0.1:\(port)", "--codec", "speex", "--frame", "10"], timeout: 20
            ).stderr.contains("--codec speex --frame 10: invalid configuration: Speex narrowband frames are 20 ms"))
    }

    /// Both sides offer only the relay's candidate (`--relay-only`): ICE selects the
    /// relay-to-relay pair, voice flows both ways through the relay's TURN sockets
    /// (its own count says so), sealed end to end.
    @Test(.enabled(if: ready, "\(needs)"))
    func relayOnlyCallsGoThroughTheRelayBothWays() async throws {
        let (relay, port) = try await Self.relay([
            "--use-auth-secret", "--static-auth-secret", "s3cret", "--realm", "tusa.test", "--allow-loopback-peers",
        ])
        defer { relay.kill() }
        let (c, a) = try await Self.relayOnlyCall(port)
        #expect(c["candidatePair"] as? String == "relay -> relay", "\(c)")
        let sentByCaller = try #require(c["packetsSent"] as? Int)
        let sentByCallee = try #require(a["packetsSent"] as? Int)
        #expect(sentByCaller > 100 && sentByCallee > 100)
        #expect(try #require(a["packetsReceived"] as? Int) >= sentByCaller - 10)
        // The callee talks on after the caller's hang-up.
        #expect(try #require(c["packetsReceived"] as? Int) >= sentByCallee - 60)
        #expect(try #require(c["connectMilliseconds"] as? Double) < 2000)
        // The relay carried it: both directions, every packet once more through a relayed socket.
        let counts = try await Self.turnCounts(stopping: relay)
        #expect(counts.count >= 3 && counts[0] == 2 && counts[1] > sentByCaller && counts[2] > sentByCaller, "\(counts)")
    }

    /// `tusa answer --relay-only` and a 3 s `tusa call --relay-only` through the
    /// rendezvous on `port`, a tone each way; their reports, both paths relayed.
    static func relayOnlyCall(_ port: UInt16) async throws -> (caller: [String: Any], callee: [String: Any]) {
        let (answerer, key) = try await Self.answer(port, ["--relay-only", "--in", "tone"])
        defer { answerer.kill() }
        let caller = try await TURNClientPeerTests.tusa(
            [
                "call", key, "--rendezvous", "127.0.0.1:\(port)", "--in", "tone", "--duration", "3", "--relay-only", "--json",
                "--quiet",
            ], timeout: 40)
        let (c, a) = try await Self.reports(caller: caller, answerer: answerer)
        #expect(c["path"] as? String == "relayed" && a["path"] as? String == "relayed", "\(c) \(a)")
        return (c, a)
    }

    /// A relay stopped with SIGTERM: the figures of the `turn:` line it prints
    /// (allocations, then packets each way, …).
    static func turnCounts(stopping relay: Harness.Background) async throws -> [Int] {
        _ = await relay.stop(signal: SIGTERM)
        let turn = try #require(relay.stdout.split(separator: "\n").first { $0.hasPrefix("turn: ") }, "\(relay.stdout)")
        return turn.split(separator: " ").compactMap { Int($0) }
    }

    /// The same call through `tusa directory`: its two relays report their TURN URIs,
    /// each side is given credentials for the least loaded one, and the call is
    /// relayed through them.
    @Test(.enabled(if: ready, "\(needs)"))
    func aRelayOnlyCallGoesThroughADirectorysRelay() async throws {
        let tusa = try #require(Harness.tusa)
        let folder = NSTemporaryDirectory() + "tusa-directory-call-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let directory = try Harness.Background(
            tusa,
            [
                "directory", "--listen", "127.0.0.1:0", "--database", "sqlite:\(folder)/d.sqlite", "--relay-secret", "r3lays",
                "--static-auth-secret", "s3cret",
            ])
        defer { directory.kill() }
        let line = try #require(
            await directory.waitForMatch(#"directory tcp 127\.0\.0\.1:[0-9]+"#), "\(directory.stderr)")
        let port = try #require(line.split(separator: ":").last.flatMap { UInt16($0) })
        var relays: [Harness.Background] = []
        defer { for relay in relays { relay.kill() } }
        for _ in 0..<2 {
            let relay = try Harness.Background(
                tusa,
                [
                    "relay", "--listen", "127.0.0.1:0", "--use-auth-secret", "--static-auth-secret", "s3cret", "--realm",
                    "tusa.test", "--allow-loopback-peers", "--directory", "127.0.0.1:\(port)", "--directory-secret", "r3lays",
                ])
            relays.append(relay)
            #expect(
                await relay.waitFor(timeout: 15) { _, err in err.contains("reporting load to the directory") }, "\(relay.stderr)")
        }
        let (c, a) = try await Self.relayOnlyCall(port)
        let sentByCaller = try #require(c["packetsSent"] as? Int)
        #expect(sentByCaller > 100 && (a["packetsReceived"] as? Int ?? 0) >= sentByCaller - 10, "\(c) \(a)")
        // The relays carried the two allocations between them (both idle: each side's
        // is on either, the directory picking among equals at random).
        var allocations: [Int] = []
        for relay in relays {
            let counts = try await Self.turnCounts(stopping: relay)
            allocations.append(try #require(counts.first, "\(counts)"))
        }
        #expect(allocations.reduce(0, +) == 2, "allocations per relay: \(allocations)")
    }

    @Test(.enabled(if: ready, "\(needs)"))
    func theCalleeHangsUpAndTheCallerSeesIt() async throws {
        let (relay, port) = try await Self.relay()
        defer { relay.kill() }
        let (answerer, key) = try await Self.answer(port, ["--duration", "1.5", "--in", "tone"])
        defer { answerer.kill() }
        let caller = try await TURNClientPeerTests.tusa(
            ["call", key, "--rendezvous", "127.0.0.1:\(port)", "--json", "--quiet"], timeout: 30)
        #expect(caller.status == 0, "\(caller.stderr)")
        #expect(Self.json(caller.stdout)?["ended"] as? String == "remote-hangup", "\(caller.stdout)")
        _ = await answerer.waitForExit(timeout: 10)
        #expect(Self.json(answerer.stdout)?["ended"] as? String == "time-limit", "\(answerer.stdout)")
        // Even a 1.5 s call knows its round trip on both sides (the first reports are answered at once).
        #expect(Self.json(answerer.stdout)?["roundTripMilliseconds"] as? Double != nil, "\(answerer.stdout)")
        #expect(Self.json(caller.stdout)?["roundTripMilliseconds"] as? Double != nil, "\(caller.stdout)")
    }

    /// A recording that cannot be written mid-call, here for a file size limit
    /// (`prlimit --fsize`): the recording stops, the call goes on to its end. The
    /// callee says which limit stopped it (at once and in its report) and exits
    /// 2; what it wrote is still a valid WAV file, up to its last second.
    @Test(.enabled(if: ready && Harness.which("prlimit") != nil, "\(needs), and util-linux's prlimit"))
    func aRecordingThatCannotBeWrittenStopsAndTheCallGoesOn() async throws {
        let heard = NSTemporaryDirectory() + "tusa-call-\(getpid())-limited.wav"
        defer { unlink(heard) }
        let prlimit = try #require(Harness.which("prlimit"))
        // 8 kHz 16-bit mono: about 2 s fit in 32 KiB.
        try await Self.recordingMeetsALimit(
            heard, wrapper: [prlimit, "--fsize=32768", "--"], named: "the file size limit (ulimit -f) is reached")
    }

    /// Whether this process may mount a tmpfs (root with CAP_SYS_ADMIN, as CI runs), tried once.
    static let canMountTmpfs: Bool = {
        guard getuid() == 0, let mount = Harness.which("mount"), let umount = Harness.which("umount") else { return false }
        let probe = NSTemporaryDirectory() + "tusa-mount-probe-\(getpid())"
        guard (try? FileManager.default.createDirectory(atPath: probe, withIntermediateDirectories: true)) != nil else {
            return false
        }
        defer { try? FileManager.default.removeItem(atPath: probe) }
        guard (try? Harness.runBlocking(mount, ["-t", "tmpfs", "-o", "size=4k", "tmpfs", probe]))?.status == 0 else {
            return false
        }
        _ = try? Harness.runBlocking(umount, [probe])
        return true
    }()

    /// The same on a disk that is really full: a 32 KiB tmpfs.
    @Test(.enabled(if: ready && canMountTmpfs, "\(needs), and the right to mount a tmpfs (root)"))
    func aRecordingOnAFullDiskStopsAndTheCallGoesOn() async throws {
        let mount = try #require(Harness.which("mount"))
        let umount = try #require(Harness.which("umount"))
        let disk = NSTemporaryDirectory() + "tusa-full-disk-\(getpid())"
        try FileManager.default.createDirectory(atPath: disk, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: disk) }
        let mounted = try await Harness.run(mount, ["-t", "tmpfs", "-o", "size=32k", "tmpfs", disk])
        try #require(mounted.status == 0, "cannot mount a tmpfs: \(mounted.stderr)")
        // (Lazily: a callee killed by a failed expectation may still hold the file open.)
        defer { _ = try? Harness.runBlocking(umount, ["-l", disk]) }
        try await Self.recordingMeetsALimit(disk + "/heard.wav", wrapper: [], named: "the disk is full")
    }

    static func recordingMeetsALimit(_ heard: String, wrapper: [String], named limit: String) async throws {
        let (relay, port) = try await Self.relay()
        defer { relay.kill() }
        let (answerer, key) = try await Self.answer(port, ["--out", heard], wrapper: wrapper)
        defer { answerer.kill() }
        let caller = try await TURNClientPeerTests.tusa(
            [
                "call", key, "--rendezvous", "127.0.0.1:\(port)", "--in", "tone", "--duration", "5", "--json", "--quiet",
            ], timeout: 30)
        #expect(caller.status == 0, "\(caller.stderr)")
        let c = try #require(Self.json(caller.stdout), "\(caller.stdout)")
        #expect(c["ended"] as? String == "time-limit", "the call went on to its end: \(c)")
        #expect((c["durationSeconds"] as? Double ?? 0) >= 4.5, "\(c)")
        _ = await answerer.waitForExit(timeout: 10)
        #expect(answerer.status == 2, "\(answerer.stdout) \(answerer.stderr)")
        let a = try #require(Self.json(answerer.stdout), "\(answerer.stdout) \(answerer.stderr)")
        #expect(a["ended"] as? String == "remote-hangup", "\(a)")
        let error = a["audioError"] as? String ?? ""
        #expect(error.hasPrefix("cannot write the audio received: \(heard)"), "\(a)")
        #expect(error.contains(limit), "\(a)")
        #expect(answerer.stderr.contains("the recording stopped; the call goes on"), "\(answerer.stderr)")
        #expect(answerer.stderr.contains("tusa answer: cannot write the audio received: \(heard)"), "\(answerer.stderr)")
        let kept = try WAVFile.read(path: heard)
        #expect(kept.sampleRate == 8000 && kept.samples.count >= 8000, "\(kept.samples.count) samples kept")
    }

    @Test(.enabled(if: ready, "\(needs)"))
    func theImpairmentLayerLosesWhatItSaysAndFECRecovers() async throws {
        let (relay, port) = try await Self.relay()
        defer { relay.kill() }
        let (answerer, key) = try await Self.answer(port, [])
        defer { answerer.kill() }
        let caller = try await TURNClientPeerTests.tusa(
            [
                "call", key, "--rendezvous", "127.0.0.1:\(port)", "--in", Self.speech, "--impair", "loss=20%,seed=3", "--json",
                "--quiet",
            ], timeout: 40)
        #expect(caller.status == 0, "\(caller.stderr)")
        _ = await answerer.waitForExit(timeout: 10)
        let c = try #require(Self.json(caller.stdout), "\(caller.stdout)")
        let a = try #require(Self.json(answerer.stdout), "\(answerer.stdout)")
        // The callee's reports carry the loss back to the caller; the callee rebuilt frames from FEC
        // and, once the caller carried each previous frame again (redundant audio, sized by those
        // reports), from the next packet's copy.
        let seen = try #require(c["remoteLossPercent"] as? Double)
        #expect(seen > 8 && seen < 35, "peer saw \(seen) %")
        let rebuilt = try #require(a["framesRecoveredByFEC"] as? Int) + (try #require(a["framesRecoveredByRedundancy"] as? Int))
        #expect(rebuilt > 0, "\(a)")
        #expect(try #require(c["sendRedundancy"] as? Int) >= 1, "\(c)")
        #expect(try #require(a["framesRecoveredByRedundancy"] as? Int) > 0, "\(a)")
        #expect(try #require(a["sendRedundancy"] as? Int) == 0, "\(a)")  // the way back was clean
        // What the callee missed at its turn: less than the path lost, by what was rebuilt.
        let missed = try #require(a["lossPercent"] as? Double)
        #expect(missed < seen, "the callee missed \(missed) % of frames, the path lost \(seen) %")
        // The caller's encoder followed the callee's reports of heavy loss down from 24 kb/s.
        #expect(try #require(c["sendBitrate"] as? Int) < 22_000, "\(c)")
        #expect(try #require(a["sendBitrate"] as? Int) == 24_000, "\(a)")  // the way back was clean
        // Bad specifications are refused before anything starts.
        let bad = try await TURNClientPeerTests.tusa(["call", key, "--rendezvous", "127.0.0.1:\(port)", "--impair", "loss=150%"])
        #expect(bad.status == 64 && bad.stderr.contains("--impair: impairment loss=150%: at most 100%"), "\(bad.stderr)")
    }

    @Test(.enabled(if: Harness.tusa != nil, "needs .build/debug/tusa"))
    func badInputAndUnreachablePeersGetClearErrors() async throws {
        let (relay, port) = try await Self.relay()
        defer { relay.kill() }
        let key = "pff0qqk+bzRQowAbetno+hYsaE+bCVScYebJTtIJDBg="
        let cases: [([String], Int32, String)] = [
            (["call", "not-a-key", "--rendezvous", "127.0.0.1:\(port)"], 64, "not a 32-byte base64 public key"),
            (["call", key, "--rendezvous", "127.0.0.1:\(port)", "--codec", "mp3"], 64, "--codec must be opus, speex or l16"),
            // Values past what a number of its kind holds (they trapped).
            (["call", key, "--rendezvous", "127.0.0.1:\(port)", "--impair", "seed=1e20"], 64, "a whole number from 0 to"),
            (["call", key, "--rendezvous", "127.0.0.1:\(port)", "--impair", "delay=1e17ms"], 64, "at most 60000ms"),
            (["call", key, "--rendezvous", "127.0.0.1:\(port)", "--in", "/nonexistent.wav"], 64, "/nonexistent.wav"),
            // Times that make no Duration (they trapped).
            (
                ["call", key, "--rendezvous", "127.0.0.1:\(port)", "--duration", "1e300"], 64,
                "--duration must be a number of seconds"
            ),
            (
                ["call", key, "--rendezvous", "127.0.0.1:\(port)", "--duration", "nan"], 64,
                "--duration must be a number of seconds"
            ),
            (["answer", "--rendezvous", "127.0.0.1:\(port)", "--timeout", "inf"], 64, "--timeout must be a number of seconds"),
            (["party", "watch", "--rendezvous", "127.0.0.1:\(port)", "--timeout", "inf"], 64, "--timeout must be a number of"),
            (["party", "create", "game", "--rendezvous", "127.0.0.1:\(port)", "--duration", "1e300"], 64, "--duration must be"),
            (["call", key, "--rendezvous", "127.0.0.1:9"], 2, "cannot reach the rendezvous"),
            (["call", key, "--rendezvous", "127.0.0.1:\(port)", "--quiet"], 2, "no peer registered under"),
            // A name is resolved (it was refused as "not HOST:PORT").
            (["call", key, "--rendezvous", "localhost:\(port)", "--quiet"], 2, "no peer registered under"),
            (["answer", "--rendezvous", "127.0.0.1:\(port)", "--timeout", "0.5", "--quiet"], 2, "no call within"),
            (
                ["call", key, "--rendezvous", "127.0.0.1:\(port)", "--relay-only", "--quiet"], 2,
                "relay-only, but no relay: the rendezvous gave no TURN credentials"
            ),
            (
                ["call", key, "--rendezvous", "127.0.0.1:\(port)", "--stun", "not an address"], 64,
                "--stun 'not an address': cannot resolve 'not an address'"
            ),
        ]
        for (arguments, status, message) in cases {
            let r = try await TURNClientPeerTests.tusa(arguments, timeout: 20)
            #expect(r.status == status, "\(arguments): \(r.status) \(r.stderr)")
            #expect(r.stderr.contains(message), "\(arguments): \(r.stderr)")
        }
    }
}
