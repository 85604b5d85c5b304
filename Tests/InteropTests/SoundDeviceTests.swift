import Foundation
import Testing
import Voice

/// Calls and parties on real sound devices: a private PulseAudio (scripts/sound.sh, as
/// an ordinary user with its own runtime folder), null sinks as each side's microphone
/// and speaker (a sink's monitor hears what is played into it), `--in device:NAME
/// --out device:NAME`, speech played into the microphones with paplay and the speakers
/// recorded with parec, scored with PESQ against what was played.
@Suite(.serialized) struct SoundDeviceTests {
    static let speech = CallCommandTests.speech
    static let otherSpeech = "/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav"
    static let thirdSpeech = "/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0930.wav"
    static let tools = ["pulseaudio", "pactl", "paplay", "parec"].allSatisfy { Harness.which($0) != nil }
    static let ready =
        tools && Harness.tusa != nil && Harness.python != nil && FileManager.default.fileExists(atPath: speech)
        && FileManager.default.fileExists(atPath: otherSpeech) && FileManager.default.fileExists(atPath: thirdSpeech)
    static let needs =
        "needs PulseAudio and its tools, .build/debug/tusa, .venv with pesq and pocketsphinx-testdata (make test installs them)"
    static let scorer = Harness.packageRoot.appendingPathComponent("Tests/InteropTests/peers/heard_pesq.py").path

    /// A private sound server for one test, stopped at the end.
    final class SoundServer: @unchecked Sendable {
        let directory: String
        let address: String
        private var keepers: [Harness.Background] = []
        private var sinks: [String] = []

        /// Starts a server in a folder of its own. The sound server is the test's
        /// equipment, not what it tests: a start that fails is told on standard error
        /// and tried once more in a fresh folder; two failures fail the test with both reasons.
        init() async throws {
            var failures: [String] = []
            for _ in 0..<2 {
                let directory = NSTemporaryDirectory() + "tusa-sound-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
                let started = try await Harness.run("/bin/bash", [Self.script, "start", directory], timeout: 30)
                if started.status == 0, let line = started.stdout.split(separator: "\n").last {
                    self.directory = directory
                    address = String(line)
                    return
                }
                let failure =
                    "scripts/sound.sh start \(directory) "
                    + (started.timedOut ? "timed out after 30 s" : "exited with \(started.status)") + ": \(started.stderr)"
                FileHandle.standardError.write(Data("tusa: \(failure)\n".utf8))
                failures.append(failure)
                _ = try? await Harness.run("/bin/bash", [Self.script, "stop", directory], timeout: 15)
                try? FileManager.default.removeItem(atPath: directory)
            }
            throw HarnessError("PulseAudio did not start twice: " + failures.joined(separator: "; "))
        }

        static let script = Harness.packageRoot.appendingPathComponent("scripts/sound.sh").path

        /// `command` with PULSE_SERVER naming this server.
        func command(_ executable: String, _ arguments: [String]) -> (String, [String]) {
            ("/usr/bin/env", ["PULSE_SERVER=\(address)", executable] + arguments)
        }

        func run(_ executable: String, _ arguments: [String], timeout: Double = 10) async throws -> Harness.Result {
            let (e, a) = command(executable, arguments)
            return try await Harness.run(e, a, timeout: timeout)
        }

        func background(_ executable: String, _ arguments: [String]) throws -> Harness.Background {
            let (e, a) = command(executable, arguments)
            return try Harness.Background(e, a)
        }

        /// A null sink at `rate` Hz: a speaker, and through its monitor a microphone.
        /// A null sink renders in blocks as long as the shortest latency any of its
        /// streams asks, two seconds when none does: a listener asking 10 ms keeps it
        /// running as a sound card runs at its period.
        @discardableResult
        func sink(_ name: String, rate: Int) async throws -> Int {
            let loaded = try await run(
                "pactl", ["load-module", "module-null-sink", "sink_name=\(name)", "rate=\(rate)"])
            guard loaded.status == 0, let module = Int(loaded.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) else {
                throw HarnessError("pactl load-module \(name): \(loaded.stderr)")
            }
            keepers.append(try background("pacat", ["--record", "-d", "\(name).monitor", "--latency-msec=10", "/dev/null"]))
            sinks.append(name)
            return module
        }

        /// Waits until every sink made with ``sink(_:rate:)`` renders at a low latency (its keeper took effect).
        func settle() async throws {
            let names = Set(sinks)
            var last = ""
            let settled = await eventually(within: .seconds(15), poll: .milliseconds(200)) {
                guard let listing = try? await self.run("pactl", ["list", "sinks"]), listing.status == 0 else { return false }
                last = listing.stdout
                var name = ""
                var latencies: [String: Int] = [:]
                for line in listing.stdout.split(separator: "\n") {
                    let words = line.split(separator: " ")
                    if line.contains("Name:"), words.count > 1 { name = String(words[1]) }
                    if line.contains("Latency:"), words.count > 1, names.contains(name) { latencies[name] = Int(words[1]) }
                }
                return latencies.count == names.count && latencies.values.allSatisfy { $0 < 60_000 }
            }
            if !settled { throw HarnessError("the null sinks did not settle to a low latency: \(last)") }
        }

        /// parec of `sink`'s monitor into `path` (8 kHz mono WAV) until stopped.
        func record(_ sink: String, into path: String) throws -> Harness.Background {
            try background(
                "parec",
                [
                    "-d", "\(sink).monitor", "--rate=8000", "--channels=1", "--format=s16le", "--file-format=wav",
                    "--latency-msec=10", path,
                ])
        }

        func play(_ file: String, into sink: String) throws -> Harness.Background {
            try background("paplay", ["-d", sink, file])
        }

        /// `file` played into `sink` over and over until killed.
        func playOnLoop(_ file: String, into sink: String) throws -> Harness.Background {
            try background("/bin/sh", ["-c", "while paplay -d \"$0\" \"$1\"; do :; done", sink, file])
        }

        /// Every device unplugged: each null sink (and so its monitor) unloaded, the default one too.
        func unplugEverything() async throws {
            let modules = try await run("pactl", ["list", "short", "modules"])
            for row in modules.stdout.split(separator: "\n") where row.contains("module-null-sink") {
                let unloaded = try await run("pactl", ["unload-module", String(row.split(separator: "\t")[0])])
                #expect(unloaded.status == 0, "\(unloaded.stderr)")
            }
        }

        func stop() async {
            for k in keepers { k.kill() }
            _ = try? await Harness.run("/bin/bash", [Self.script, "stop", directory], timeout: 15)
            // TUSA_KEEP_RECORDINGS=1 keeps what was played and heard, to listen to a failure.
            if ProcessInfo.processInfo.environment["TUSA_KEEP_RECORDINGS"] != nil {
                print("tusa: recordings kept in \(directory)")
            } else {
                try? FileManager.default.removeItem(atPath: directory)
            }
        }
    }

    /// `REF` (speech at 8 kHz, as Tusa resamples it) found in a recording and scored.
    static func pesq(reference: String, heard: String) async throws -> Double {
        try await score(reference: reference, heard: heard).pesq
    }

    /// PESQ, and whether the first words were heard: the recording's level over the
    /// first 300 ms of speech against its level over the whole, about 1 when the start
    /// was heard as the rest, near 0 when device start-up or joining took it (heard_pesq.py).
    static func score(reference: String, heard: String) async throws -> (pesq: Double, onset: Double) {
        let python = try #require(Harness.python)
        let result = try await Harness.run(python, [scorer, reference, heard], timeout: 60)
        let json = try #require(CallCommandTests.json(result.stdout), "\(result.stdout) \(result.stderr)")
        return (try #require(json["pesq"] as? Double), try #require(json["onset"] as? Double))
    }

    /// `file` (a WAV) `times` over, one after the other, into `path`.
    static func repeated(_ file: String, times: Int, into path: String) async throws {
        let python = try #require(Harness.python)
        let script = """
            import sys, wave
            r = wave.open(sys.argv[1]); frames = r.readframes(r.getnframes())
            w = wave.open(sys.argv[2], "wb"); w.setparams(r.getparams()); w.writeframes(frames * int(sys.argv[3])); w.close()
            """
        let made = try await Harness.run(python, ["-c", script, file, path, "\(times)"])
        #expect(made.status == 0, "\(made.stderr)")
    }

    /// The 8 kHz reference of `speech`.
    static func reference(_ speech: String, into path: String) async throws {
        let tusa = try #require(Harness.tusa)
        let made = try await Harness.run(
            tusa, ["voice", "simulate", "--in", speech, "--out", path, "--codec", "l16", "--playout", "ideal"], timeout: 60)
        #expect(made.status == 0, "\(made.stderr)")
    }

    /// The lines a process printed on stderr that are not Tusa's own (library probe noise).
    static func foreignLines(_ stderr: String) -> [Substring] {
        stderr.split(whereSeparator: { $0 == "\n" || $0 == "\r" }).filter { line in
            !line.hasPrefix("tusa") && !line.hasPrefix("direct") && !line.hasPrefix("relayed")
                && !line.trimmingCharacters(in: .whitespaces).isEmpty
        }
    }

    @Test(.enabled(if: ready, "\(needs)"))
    func aCallThroughRealSoundDevicesCarriesSpeechBothWaysFromItsFirstMoment() async throws {
        let tusa = try #require(Harness.tusa)
        let sound = try await SoundServer()
        let dir = sound.directory
        // Each side's devices at its own rate, as two machines' sound cards would be.
        try await sound.sink("caller_mic", rate: 48_000)
        try await sound.sink("caller_speaker", rate: 48_000)
        try await sound.sink("callee_mic", rate: 44_100)
        try await sound.sink("callee_speaker", rate: 44_100)
        do {
            try await sound.settle()
            try await Self.reference(Self.speech, into: "\(dir)/ref-caller.wav")
            try await Self.reference(Self.otherSpeech, into: "\(dir)/ref-callee.wav")
            let (relay, port) = try await CallCommandTests.relay()
            defer { relay.kill() }
            let heardByCallee = try sound.record("callee_speaker", into: "\(dir)/heard-by-callee.wav")
            let heardByCaller = try sound.record("caller_speaker", into: "\(dir)/heard-by-caller.wav")
            let answerer = try sound.background(
                tusa,
                [
                    "answer", "--rendezvous", "127.0.0.1:\(port)", "--timeout", "20", "--json", "--quiet",
                    "--in", "device:callee_mic.monitor", "--out", "device", "--out-device", "callee_speaker",
                ])
            defer { answerer.kill() }
            let line = try #require(
                await answerer.waitForMatch(#"answering as [A-Za-z0-9+/=]{44}"#), "\(answerer.stdout) \(answerer.stderr)")
            let key = String(line.dropFirst("answering as ".count))
            // The caller starts talking as the call is placed: nothing may be lost to opening
            // the devices. The callee answers when the caller is done (in turn: two people
            // talking at once are double talk to the echo cancellers, on by default here).
            let caller = try sound.background(
                tusa,
                [
                    "call", key, "--rendezvous", "127.0.0.1:\(port)", "--duration", "13", "--json", "--quiet",
                    "--in", "device", "--in-device", "caller_mic.monitor", "--out", "device:caller_speaker",
                ])
            defer { caller.kill() }
            let callerTalks = try sound.play(Self.speech, into: "caller_mic")
            var talkers = [callerTalks]
            // Between the two talkers the caller's machine freezes for 70 ms (SIGSTOP), as a
            // loaded machine does: its voice clock then makes up the ticks at once, and its
            // speaker's queue must give that backlog back before the callee speaks. Between
            // them: once the caller's speech has been played in (paplay ends) and has had
            // 300 ms to reach the callee's speaker (at a fixed time after the start, a slow
            // start put the freeze in the speech's last words).
            #expect(await callerTalks.waitForExit(timeout: 15), "paplay did not end")
            try await Task.sleep(for: .seconds(0.3))
            kill(caller.process.processIdentifier, SIGSTOP)
            usleep(70_000)
            kill(caller.process.processIdentifier, SIGCONT)
            try await Task.sleep(for: .seconds(0.3))
            talkers.append(try sound.play(Self.otherSpeech, into: "callee_mic"))
            #expect(await caller.waitForExit(timeout: 40))
            #expect(await answerer.waitForExit(timeout: 10))
            for t in talkers { _ = await t.waitForExit(timeout: 5) }
            await heardByCallee.stop(signal: SIGINT)
            await heardByCaller.stop(signal: SIGINT)
            #expect(caller.status == 0, "\(caller.stdout) \(caller.stderr)")
            #expect(answerer.status == 0, "\(answerer.stdout) \(answerer.stderr)")
            // A clean terminal: nothing from ALSA, JACK or the sound server.
            #expect(Self.foreignLines(caller.stderr).isEmpty, "\(caller.stderr)")
            #expect(Self.foreignLines(answerer.stderr).isEmpty, "\(answerer.stderr)")

            let (calleeScore, onset) = try await Self.score(
                reference: "\(dir)/ref-caller.wav", heard: "\(dir)/heard-by-callee.wav")
            let callerScore = try await Self.pesq(reference: "\(dir)/ref-callee.wav", heard: "\(dir)/heard-by-caller.wav")
            for (name, text) in [("caller", caller.stdout), ("callee", answerer.stdout)] {
                let report = try #require(CallCommandTests.json(text), "\(text)")
                let connect = try #require(report["connectMilliseconds"] as? Double)
                let firstAudio = try #require(report["dialToFirstAudioMilliseconds"] as? Double)
                let capture = try #require(report["captureDevice"] as? [String: Any], "\(report)")
                let playback = try #require(report["playbackDevice"] as? [String: Any], "\(report)")
                print(
                    "tusa \(name) on devices: connected in \(connect) ms, first audio \(firstAudio - connect) ms later; capture \(capture); playback \(playback)"
                )
                // Opening devices never delays the call: the first audio plays within 100 ms of the path.
                #expect(firstAudio - connect < 100, "\(name): \(report)")
                #expect(try #require(capture["openMilliseconds"] as? Double) < 1_000, "\(name): \(capture)")
                // (One 20 ms gap is allowed a debug build on a shared machine, and the caller one
                // more where the freeze ends: its voice clock's made-up ticks may outrun the
                // microphone's backlog. PESQ below tells what they cost.)
                #expect(try #require(capture["underruns"] as? Int) <= (name == "caller" ? 2 : 1), "\(name): \(capture)")
                // The speaker's queue ends at its margin: a stall's backlog (the machine froze,
                // then made up its ticks at once) is taken back within seconds, not kept.
                #expect(try #require(playback["queueMilliseconds"] as? Double) <= 40, "\(name): \(playback)")
            }
            print(
                "tusa call on devices: PESQ \(calleeScore) heard by the callee (onset \(onset)), \(callerScore) by the caller")
            #expect(calleeScore > 3.6)
            // The caller's first words, said as the call was placed, were heard.
            #expect(onset > 0.5, "the callee did not hear the caller's first words")
            #expect(callerScore > 3.6)
        } catch {
            await sound.stop()
            throw error
        }
        await sound.stop()
    }

    /// `tusa voice devices` lists the server's devices with their rates and channels;
    /// a name picks one, a wrong or ambiguous name is a usage error before anything is
    /// dialled; without a sound server PortAudio answers, and ALSA's and JACK's probes
    /// print nothing.
    @Test(.enabled(if: ready, "\(needs)"))
    func devicesAreListedAndPickedByNameOnAQuietTerminal() async throws {
        let tusa = try #require(Harness.tusa)
        let sound = try await SoundServer()
        do {
            try await sound.sink("usb_headset", rate: 48_000)
            try await sound.sink("usb_speakers", rate: 44_100)
            let listed = try await sound.run(tusa, ["voice", "devices", "--json"])
            #expect(listed.status == 0, "\(listed.stderr)")
            let json = try #require(CallCommandTests.json(listed.stdout), "\(listed.stdout)")
            #expect(json["backend"] as? String == "PulseAudio")
            let devices = try #require(json["devices"] as? [[String: Any]])
            let headset = try #require(devices.first { $0["name"] as? String == "usb_headset.monitor" }, "\(devices)")
            #expect(headset["direction"] as? String == "capture")
            #expect(headset["sampleRate"] as? Int == 48_000)
            #expect(headset["channels"] as? Int == 2)
            let speakers = try #require(devices.first { $0["name"] as? String == "usb_speakers" }, "\(devices)")
            #expect(speakers["direction"] as? String == "playback")
            #expect(speakers["sampleRate"] as? Int == 44_100)
            let text = try await sound.run(tusa, ["voice", "devices"])
            #expect(text.stdout.contains("usb_headset.monitor  48000 Hz, 2 ch"), "\(text.stdout)")
            #expect(text.stderr.isEmpty, "\(text.stderr)")

            // Names are checked before the call is placed (the rendezvous here is never reached).
            let someKey = String(repeating: "A", count: 43) + "="
            for (arguments, message) in [
                (["--in", "device:no_such_mic"], "no capture device named \"no_such_mic\""),
                (["--out", "device", "--out-device", "usb"], "\"usb\" names 2 playback devices"),
                (["--in", "tone", "--in-device", "usb_headset"], "--in-device 'usb_headset' picks a device for --in device"),
                (["--in", "device:usb_headset.monitor", "--in-device", "usb_speakers"], "give one"),
            ] {
                let r = try await sound.run(tusa, ["call", someKey, "--rendezvous", "127.0.0.1:9"] + arguments)
                #expect(r.status == 64, "\(arguments): \(r.stderr)")
                #expect(r.stderr.contains(message), "\(arguments): \(r.stderr)")
            }
            // A part of the name is enough when it names one device, and --in-device alone means --in device.
            for arguments in [["--in", "device:headset"], ["--in-device", "headset", "--out-device", "speakers"]] {
                let one = try await sound.run(tusa, ["call", someKey, "--rendezvous", "127.0.0.1:9", "--quiet"] + arguments)
                #expect(one.status == 2 && one.stderr.contains("cannot reach the rendezvous"), "\(arguments): \(one.stderr)")
            }
        } catch {
            await sound.stop()
            throw error
        }
        await sound.stop()

        // No sound server: PortAudio's probes of ALSA and JACK stay off the terminal.
        let bare = try await Harness.run(
            "/usr/bin/env", ["PULSE_SERVER=unix:/nonexistent/native", tusa, "voice", "devices"], timeout: 30)
        #expect(bare.status == 0 || bare.stderr.contains("PortAudio"), "\(bare.stderr)")
        #expect(!bare.stderr.contains("ALSA lib") && !bare.stderr.contains("jack"), "\(bare.stderr)")
        if bare.status == 0 { #expect(bare.stdout.hasPrefix("PortAudio:"), "\(bare.stdout)") }
    }

    /// The RMS of a recording's samples from `from` seconds on (8 kHz mono WAV).
    static func rms(_ path: String, from seconds: Double) throws -> Double {
        let wav = try WAVFile.read(path: path)
        let start = min(wav.samples.count, Int(seconds * Double(wav.sampleRate)))
        let tail = wav.samples[start...]
        guard !tail.isEmpty else { return 0 }
        return (tail.reduce(0.0) { $0 + Double($1) * Double($1) } / Double(tail.count)).squareRoot()
    }

    /// A headset unplugged mid-call (its sink unloaded): the sound server moves the
    /// call's audio to the default device and the call goes on. With every device
    /// gone, the call ends at once with the reason, never a hang.
    @Test(.enabled(if: ready, "\(needs)"))
    func aDeviceUnpluggedMidCallFallsBackOrEndsTheCallWithItsReason() async throws {
        let tusa = try #require(Harness.tusa)
        let sound = try await SoundServer()
        let dir = sound.directory
        do {
            let headset = try await sound.sink("headset", rate: 48_000)
            try await sound.sink("caller_mic", rate: 48_000)
            try await sound.settle()
            let (relay, port) = try await CallCommandTests.relay()
            defer { relay.kill() }
            let onDefault = try sound.record("default_speaker", into: "\(dir)/default.wav")
            let answerer = try sound.background(
                tusa,
                [
                    "answer", "--rendezvous", "127.0.0.1:\(port)", "--timeout", "20", "--json", "--quiet", "--in", "silence",
                    "--out", "device:headset",
                ])
            defer { answerer.kill() }
            let line = try #require(
                await answerer.waitForMatch(#"answering as [A-Za-z0-9+/=]{44}"#), "\(answerer.stdout) \(answerer.stderr)")
            let key = String(line.dropFirst("answering as ".count))
            let caller = try sound.background(
                tusa,
                [
                    "call", key, "--rendezvous", "127.0.0.1:\(port)", "--duration", "8", "--json", "--quiet", "--in",
                    "device:caller_mic.monitor",
                ])
            defer { caller.kill() }
            let talker = try sound.play(Self.speech, into: "caller_mic")
            try await Task.sleep(for: .seconds(2))
            let unplugged = try await sound.run("pactl", ["unload-module", "\(headset)"])
            #expect(unplugged.status == 0, "\(unplugged.stderr)")
            #expect(await caller.waitForExit(timeout: 30))
            #expect(await answerer.waitForExit(timeout: 10))
            _ = await talker.waitForExit(timeout: 5)
            await onDefault.stop(signal: SIGINT)
            #expect(caller.status == 0, "\(caller.stderr)")
            #expect(answerer.status == 0, "\(answerer.stdout) \(answerer.stderr)")
            // The speech went on, on the default speaker, after the headset was gone.
            let level = try Self.rms("\(dir)/default.wav", from: 3)
            print("tusa: after the headset was unplugged, the default speaker played speech at RMS \(level)")
            #expect(level > 300, "the default speaker stayed silent after the unplug")

            // Every device gone: the callee's speaker fails, and the call ends saying so.
            try await sound.sink("lonely", rate: 48_000)
            let alone = try sound.background(
                tusa,
                [
                    "answer", "--rendezvous", "127.0.0.1:\(port)", "--timeout", "20", "--json", "--quiet", "--in", "tone",
                    "--out", "device:lonely",
                ])
            defer { alone.kill() }
            let aloneLine = try #require(
                await alone.waitForMatch(#"answering as [A-Za-z0-9+/=]{44}"#), "\(alone.stdout) \(alone.stderr)")
            let second = try sound.background(
                tusa,
                [
                    "call", String(aloneLine.dropFirst("answering as ".count)), "--rendezvous", "127.0.0.1:\(port)",
                    "--duration", "20", "--json", "--quiet", "--in", "tone",
                ])
            defer { second.kill() }
            try await Self.unplugEverything(sound, ending: alone, naming: "the playback device \"lonely\"", peer: second)
        } catch {
            await sound.stop()
            throw error
        }
        await sound.stop()
    }

    /// Every device unplugged two seconds into `call`: it ends within 5 s, exit 2, saying
    /// `device` stopped, never a hang; its `peer` then ends too.
    static func unplugEverything(
        _ sound: SoundServer, ending call: Harness.Background, naming device: String, peer: Harness.Background
    ) async throws {
        try await Task.sleep(for: .seconds(2))
        try await sound.unplugEverything()
        let gone = ContinuousClock.now
        #expect(await call.waitForExit(timeout: 5), "the call hung once \(device) was gone")
        print("tusa: the call ended \(ContinuousClock.now - gone) after every device was unplugged")
        #expect(call.status == 2, "\(call.stdout) \(call.stderr)")
        #expect(call.stderr.contains("\(device) stopped"), "\(call.stderr)")
        #expect(await peer.waitForExit(timeout: 10))
    }

    /// A microphone unplugged mid-call (the sink whose monitor it is, unloaded): the
    /// sound server moves the capture to the default microphone and the far end goes on
    /// hearing it. With every microphone gone, the call ends at once with the reason.
    @Test(.enabled(if: ready, "\(needs)"))
    func aMicrophoneUnpluggedMidCallFallsBackOrEndsTheCallWithItsReason() async throws {
        let tusa = try #require(Harness.tusa)
        let sound = try await SoundServer()
        let dir = sound.directory
        do {
            let headset = try await sound.sink("headset_mic", rate: 48_000)
            try await sound.sink("room_mic", rate: 44_100)
            try await sound.settle()
            let defaulted = try await sound.run("pactl", ["set-default-source", "room_mic.monitor"])
            #expect(defaulted.status == 0, "\(defaulted.stderr)")
            let (relay, port) = try await CallCommandTests.relay()
            defer { relay.kill() }
            let (answerer, key) = try await CallCommandTests.answer(port, ["--in", "silence", "--out", "\(dir)/heard.wav"])
            defer { answerer.kill() }
            let caller = try sound.background(
                tusa,
                [
                    "call", key, "--rendezvous", "127.0.0.1:\(port)", "--duration", "8", "--json", "--quiet", "--in",
                    "device:headset_mic.monitor",
                ])
            defer { caller.kill() }
            // The headset hears one talker, the room's default microphone another, all along.
            let talkers = [
                try sound.playOnLoop(Self.speech, into: "headset_mic"), try sound.playOnLoop(Self.otherSpeech, into: "room_mic"),
            ]
            defer { for t in talkers { t.kill() } }
            try await Task.sleep(for: .seconds(2))
            let unplugged = try await sound.run("pactl", ["unload-module", "\(headset)"])
            #expect(unplugged.status == 0, "\(unplugged.stderr)")
            #expect(await caller.waitForExit(timeout: 30))
            #expect(await answerer.waitForExit(timeout: 10))
            #expect(caller.status == 0, "\(caller.stderr)")
            #expect(answerer.status == 0, "\(answerer.stdout) \(answerer.stderr)")
            // What the callee heard after the unplug is the room's microphone: speech, not silence.
            let level = try Self.rms("\(dir)/heard.wav", from: 3)
            print("tusa: after the headset's microphone was unplugged, the callee heard RMS \(level)")
            #expect(level > 300, "the callee heard silence after the microphone was unplugged")

            // Every microphone gone: the caller's capture fails, and the call ends saying so.
            try await sound.sink("lonely_mic", rate: 48_000)
            let (other, otherKey) = try await CallCommandTests.answer(port, ["--in", "tone"])
            defer { other.kill() }
            let alone = try sound.background(
                tusa,
                [
                    "call", otherKey, "--rendezvous", "127.0.0.1:\(port)", "--duration", "20", "--json", "--quiet",
                    "--in", "device:lonely_mic.monitor",
                ])
            defer { alone.kill() }
            try await Self.unplugEverything(
                sound, ending: alone, naming: "the capture device \"lonely_mic.monitor\"", peer: other)
        } catch {
            await sound.stop()
            throw error
        }
        await sound.stop()
    }

    /// A party of two on real devices: each member's microphone and speaker are the
    /// sound server's. Bob joins while Alice talks and hears her within 100 ms of
    /// joining; he talks from his first moment in the room, and Alice hears him from his first word; then
    /// Alice speaks. Each hears the other's speech, scored with PESQ.
    @Test(.enabled(if: ready, "\(needs)"))
    func aPartyOnRealSoundDevicesCarriesSpeechBothWaysFromTheJoin() async throws {
        let tusa = try #require(Harness.tusa)
        let sound = try await SoundServer()
        let dir = sound.directory
        for (name, rate) in [("alice_mic", 48_000), ("alice_speaker", 48_000), ("bob_mic", 44_100), ("bob_speaker", 44_100)] {
            try await sound.sink(name, rate: rate)
        }
        do {
            try await sound.settle()
            try await Self.reference(Self.speech, into: "\(dir)/ref-alice.wav")
            try await Self.reference(Self.otherSpeech, into: "\(dir)/ref-bob.wav")
            let (relay, address, key) = try await PartyCommandTests.relay()
            defer { relay.kill() }
            let heardByBob = try sound.record("bob_speaker", into: "\(dir)/heard-by-bob.wav")
            let heardByAlice = try sound.record("alice_speaker", into: "\(dir)/heard-by-alice.wav")
            let common = ["--relay", address, "--relay-key", key, "--duration", "16", "--json", "--quiet"]
            let alice = try sound.background(
                tusa,
                ["party", "create", "Factorio", "--in", "device:alice_mic.monitor", "--out", "device:alice_speaker"] + common)
            defer { alice.kill() }
            let room = try await PartyCommandTests.room(createdBy: alice, named: "Factorio")
            // Alice talks (an utterance over and over, not scored) and Bob joins while she
            // does. Once he is in she stops, and Bob talks from his first moment in the
            // room; when he is done, Alice says her piece.
            try await Self.repeated(Self.thirdSpeech, times: 5, into: "\(dir)/warm-up.wav")
            let warmUp = try sound.play("\(dir)/warm-up.wav", into: "alice_mic")
            defer { warmUp.kill() }
            try await Task.sleep(for: .seconds(1))
            let bob = try sound.background(
                tusa, ["party", "join", room, "--in", "device:bob_mic.monitor", "--out", "device:bob_speaker"] + common)
            defer { bob.kill() }
            _ = try #require(await bob.waitForMatch(#"party [a-z0-9]{12} "Factorio" as #[0-9]+"#), "\(bob.stdout) \(bob.stderr)")
            let bobTalks = try sound.play(Self.otherSpeech, into: "bob_mic")
            var talkers = [bobTalks]
            try await Task.sleep(for: .seconds(0.1))
            warmUp.kill()
            #expect(await bobTalks.waitForExit(timeout: 15), "paplay did not end")
            try await Task.sleep(for: .seconds(1))
            talkers.append(try sound.play(Self.speech, into: "alice_mic"))
            #expect(await alice.waitForExit(timeout: 40))
            #expect(await bob.waitForExit(timeout: 40))
            for t in talkers { _ = await t.waitForExit(timeout: 5) }
            await heardByBob.stop(signal: SIGINT)
            await heardByAlice.stop(signal: SIGINT)
            #expect(alice.status == 0, "\(alice.stdout) \(alice.stderr)")
            #expect(bob.status == 0, "\(bob.stdout) \(bob.stderr)")
            #expect(Self.foreignLines(alice.stderr).isEmpty, "\(alice.stderr)")
            #expect(Self.foreignLines(bob.stderr).isEmpty, "\(bob.stderr)")
            let bobScore = try await Self.pesq(reference: "\(dir)/ref-alice.wav", heard: "\(dir)/heard-by-bob.wav")
            let (aliceScore, onset) = try await Self.score(
                reference: "\(dir)/ref-bob.wav", heard: "\(dir)/heard-by-alice.wav")
            print("tusa party on devices: PESQ \(bobScore) heard by Bob, \(aliceScore) by Alice (onset \(onset))")
            #expect(bobScore > 3.6, "what Bob heard: \(bob.stdout)")
            #expect(aliceScore > 3.6, "what Alice heard: \(alice.stdout)")
            // Bob's first words, said as he joined, were heard: his joining took none.
            #expect(onset > 0.5, "Alice did not hear Bob's first words")
            // Joining while Alice talked, Bob heard her within 100 ms of being in the room.
            let bobReport = try #require(CallCommandTests.json(bob.stdout), "\(bob.stderr)")
            let firstAudio = try #require(bobReport["joinToFirstAudioMilliseconds"] as? Double, "\(bobReport)")
            print("tusa party on devices: Bob heard Alice \(firstAudio) ms after joining")
            #expect(firstAudio < 100, "\(bobReport)")
            // The stay's report gives each device's figures, as a call's does.
            for (name, member, text) in [("alice", alice, alice.stdout), ("bob", bob, bob.stdout)] {
                let report = try #require(CallCommandTests.json(text), "\(member.stderr)")
                let capture = try #require(report["captureDevice"] as? [String: Any], "\(name): \(report)")
                let playback = try #require(report["playbackDevice"] as? [String: Any], "\(name): \(report)")
                #expect(capture["device"] as? String == "\(name)_mic.monitor", "\(capture)")
                #expect(playback["device"] as? String == "\(name)_speaker", "\(playback)")
                #expect(try #require(capture["openMilliseconds"] as? Double) < 1_000, "\(name): \(capture)")
                #expect(try #require(playback["queueMilliseconds"] as? Double) <= 40, "\(name): \(playback)")
            }
        } catch {
            await sound.stop()
            throw error
        }
        await sound.stop()
    }

    /// A party member's headset unplugged mid-party (its sink unloaded): the sound
    /// server moves the member's speaker to the default device and the member goes on
    /// hearing the room. With every device gone, each member leaves at once with the
    /// reason, never a hang.
    @Test(.enabled(if: ready, "\(needs)"))
    func aPartyMembersHeadsetUnpluggedFallsBackOrLeavesWithItsReason() async throws {
        let tusa = try #require(Harness.tusa)
        let sound = try await SoundServer()
        let dir = sound.directory
        do {
            try await sound.sink("alice_mic", rate: 48_000)
            let headset = try await sound.sink("bob_headset", rate: 44_100)
            try await sound.settle()
            let (relay, address, key) = try await PartyCommandTests.relay()
            defer { relay.kill() }
            let onDefault = try sound.record("default_speaker", into: "\(dir)/default.wav")
            let common = ["--relay", address, "--relay-key", key, "--duration", "20", "--json", "--quiet"]
            let alice = try sound.background(
                tusa, ["party", "create", "Factorio", "--in", "device:alice_mic.monitor", "--out", "none"] + common)
            defer { alice.kill() }
            let room = try await PartyCommandTests.room(createdBy: alice, named: "Factorio")
            let bob = try sound.background(
                tusa, ["party", "join", room, "--in", "silence", "--out", "device:bob_headset"] + common)
            defer { bob.kill() }
            let talker = try sound.playOnLoop(Self.speech, into: "alice_mic")
            defer { talker.kill() }
            try await Task.sleep(for: .seconds(2))
            let unplugged = try await sound.run("pactl", ["unload-module", "\(headset)"])
            #expect(unplugged.status == 0, "\(unplugged.stderr)")
            try await Task.sleep(for: .seconds(3))
            await onDefault.stop(signal: SIGINT)
            // Bob still hears Alice, on the default speaker, after his headset was gone.
            let level = try Self.rms("\(dir)/default.wav", from: 3)
            print("tusa: after Bob's headset was unplugged, the default speaker played the party at RMS \(level)")
            #expect(level > 300, "the default speaker stayed silent after the unplug")
            #expect(bob.process.isRunning, "\(bob.stdout) \(bob.stderr)")

            // Every device gone: Alice's microphone and Bob's speaker fail; each leaves saying so.
            try await sound.unplugEverything()
            let gone = ContinuousClock.now
            #expect(await alice.waitForExit(timeout: 5), "Alice stayed once her microphone was gone")
            #expect(await bob.waitForExit(timeout: 5), "Bob stayed once his speaker was gone")
            print("tusa: the party's members left \(ContinuousClock.now - gone) after every device was unplugged")
            #expect(alice.status == 2, "\(alice.stdout) \(alice.stderr)")
            #expect(alice.stderr.contains("the capture device \"alice_mic.monitor\" stopped"), "\(alice.stderr)")
            #expect(bob.status == 2, "\(bob.stdout) \(bob.stderr)")
            #expect(bob.stderr.contains("the playback device \"bob_headset\" stopped"), "\(bob.stderr)")
        } catch {
            await sound.stop()
            throw error
        }
        await sound.stop()
    }

    /// Mean power in dB of a recording's samples between two times (8 kHz mono WAV).
    static func power(_ path: String, from start: Double, to end: Double) throws -> Double {
        let wav = try WAVFile.read(path: path)
        let a = min(wav.samples.count, Int(start * Double(wav.sampleRate)))
        let b = min(wav.samples.count, Int(end * Double(wav.sampleRate)))
        guard b > a else { return 0 }
        let mean = wav.samples[a..<b].reduce(0.0) { $0 + Double($1) * Double($1) } / Double(b - a)
        return 10 * log10(mean + 1)
    }

    /// One call whose callee hears its own speaker: the sound server loops the callee's
    /// speaker back into its microphone 60 ms late (module-loopback). The caller talks
    /// from 1 s, the callee from 5 s (double talk to 8 s). Returns the callee's
    /// microphone and what the caller heard from it, as recordings.
    static func echoCall(_ sound: SoundServer, port: UInt16, echoCancel: String) async throws -> (mic: String, sent: String) {
        let tusa = try #require(Harness.tusa)
        let dir = sound.directory
        let mic = "\(dir)/mic-\(echoCancel).wav"
        let sent = "\(dir)/sent-\(echoCancel).wav"
        let micRecorder = try sound.record("near_mic", into: mic)
        let sentRecorder = try sound.record("far_speaker", into: sent)
        let answerer = try sound.background(
            tusa,
            [
                "answer", "--rendezvous", "127.0.0.1:\(port)", "--timeout", "20", "--json", "--quiet",
                "--in", "device:near_mic.monitor", "--out", "device:near_speaker", "--echo-cancel", echoCancel,
            ])
        defer { answerer.kill() }
        let line = try #require(
            await answerer.waitForMatch(#"answering as [A-Za-z0-9+/=]{44}"#), "\(answerer.stdout) \(answerer.stderr)")
        let caller = try sound.background(
            tusa,
            [
                "call", String(line.dropFirst("answering as ".count)), "--rendezvous", "127.0.0.1:\(port)",
                "--duration", "11", "--json", "--quiet", "--in", "device:far_mic.monitor", "--out", "device:far_speaker",
                "--echo-cancel", "off",
            ])
        defer { caller.kill() }
        try await Task.sleep(for: .seconds(1))
        let far = try sound.play(Self.speech, into: "far_mic")
        try await Task.sleep(for: .seconds(4))
        let near = try sound.play(Self.otherSpeech, into: "near_mic")
        #expect(await caller.waitForExit(timeout: 40))
        #expect(await answerer.waitForExit(timeout: 10))
        _ = await far.waitForExit(timeout: 5)
        _ = await near.waitForExit(timeout: 5)
        await micRecorder.stop(signal: SIGINT)
        await sentRecorder.stop(signal: SIGINT)
        #expect(caller.status == 0, "\(caller.stderr)")
        #expect(answerer.status == 0, "\(answerer.stdout) \(answerer.stderr)")
        // What the callee's device queues did: a slip (a sample dropped or repeated for
        // drift) moves the echo path under the canceller.
        if let report = CallCommandTests.json(answerer.stdout) {
            let slips = ["captureDevice", "playbackDevice"].map { name in
                let d = report[name] as? [String: Any] ?? [:]
                let dropped = d["droppedSamples"] ?? "-"
                let repeated = d["repeatedSamples"] ?? "-"
                return "\(name) dropped \(dropped) repeated \(repeated) underruns \(d["underruns"] ?? "-")"
            }
            print("echo call (\(echoCancel)): the callee's \(slips.joined(separator: ", "))")
        }
        return (mic, sent)
    }

    /// Echo through a real device path: with two devices the echo canceller is on by
    /// default, cuts the echo once converged, and does not cut the near-end talker in
    /// double talk; with it off (the control), the echo goes through.
    @Test(.enabled(if: ready, "\(needs)"))
    func theEchoOfARealSpeakerIsCancelledAndTheNearTalkerKept() async throws {
        let sound = try await SoundServer()
        let dir = sound.directory
        for name in ["far_mic", "far_speaker", "near_mic", "near_speaker"] { try await sound.sink(name, rate: 48_000) }
        do {
            let loop = try await sound.run(
                "pactl",
                ["load-module", "module-loopback", "source=near_speaker.monitor", "sink=near_mic", "latency_msec=60"])
            #expect(loop.status == 0, "\(loop.stderr)")
            try await sound.settle()
            try await Self.reference(Self.otherSpeech, into: "\(dir)/ref-near.wav")
            let (relay, port) = try await CallCommandTests.relay()
            defer { relay.kill() }
            var erle: [String: Double] = [:]
            var near: [String: Double] = [:]
            for mode in ["auto", "off"] {
                let (mic, sent) = try await Self.echoCall(sound, port: port, echoCancel: mode)
                // Far end alone, after three seconds to converge: the echo in the microphone against what was sent.
                erle[mode] = try Self.power(mic, from: 3.5, to: 5) - Self.power(sent, from: 3.5, to: 5)
                near[mode] = try await Self.pesq(reference: "\(dir)/ref-near.wav", heard: sent)
            }
            print(
                "tusa echo through a 60 ms loopback: ERLE \(erle["auto"] ?? 0) dB cancelled, \(erle["off"] ?? 0) dB off; near-end talker in double talk PESQ \(near["auto"] ?? 0) cancelled, \(near["off"] ?? 0) off"
            )
            // Issue 19 asks 25 dB. Through this path it is 39-43 dB (15 runs of 15, three
            // beside two CPU hogs) since the voice clock follows the card
            // (``DeviceClockFollower``): before, a queue's slip for drift moved the echo
            // path under the filter, and 6 runs in 16 got 7-17 dB.
            #expect(try #require(erle["auto"]) >= 25)
            #expect(try #require(erle["off"]) < 3, "the control call heard no echo: the loopback is not in place")
            // The near-end talker is not cut with the echo: clearer than with the echo left
            // in (PESQ 2.4-3.0 against 1.45-1.5; before the card's clock was followed,
            // 1.4-3.1 from run to run: the canceller re-adapting in double talk).
            #expect(try #require(near["auto"]) >= (near["off"] ?? 0) + 0.5)
        } catch {
            await sound.stop()
            throw error
        }
        await sound.stop()
    }
}
