import Testing

@testable import Voice

/// The queue between a sound device's clock and the voice clock, on a virtual clock:
/// the two run ±200 ppm apart for ten minutes, with the scheduling jitter of real threads.
@Suite struct DeviceFIFOTests {
    /// A small deterministic generator for the threads' wake-up jitter.
    struct Jitter {
        var state: UInt64
        mutating func next(upTo maximum: Double) -> Double {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Double(state >> 11) / Double(1 << 53) * maximum
        }
    }

    struct Run {
        var fifo: DeviceFIFO
        /// The queue's delay (``DeviceFIFO/Statistics/level``), once per simulated second.
        var levels: [Int] = []
        /// The figures after the first ten seconds: what the start cost.
        var start = DeviceFIFO.Statistics()
        var silentPulls = 0
        /// The least and the most one sample moved from the one before, after the first
        /// ten seconds (the input counts up by 16): about 16 when no sample was cut out or
        /// doubled with a step (which moves 32 or 0).
        var steps = (least: Int.max, most: Int.min)
    }

    /// `producerChunk` samples pushed every `producerChunk / producerRate` s, `consumerChunk`
    /// pulled every `consumerChunk / consumerRate` s, for `seconds`, each wake-up up to
    /// `jitter` s late. The samples count up by 16, so a gap, a drop or a repeat shows.
    static func simulate(
        producerRate: Double, producerChunk: Int, consumerRate: Double, consumerChunk: Int, seconds: Double,
        jitter: Double = 0.002, target: Int = 80, pullsPerSecond: Int = 50
    ) -> Run {
        var run = Run(fifo: DeviceFIFO(target: target, capacity: 16_000, pullsPerSecond: pullsPerSecond))
        var random = Jitter(state: 7)
        var pushes = 0
        var pulls = 0
        var value: Int16 = 0
        var out = [Int16](repeating: 0, count: consumerChunk)
        var nextPush = random.next(upTo: jitter)
        var nextPull = 0.05 + random.next(upTo: jitter)
        var lastSecond = -1
        var previous: Int16?
        while min(nextPush, nextPull) < seconds {
            if nextPush <= nextPull {
                let chunk = (0..<producerChunk).map { _ -> Int16 in
                    value &+= 16
                    return value
                }
                chunk.withUnsafeBufferPointer { run.fifo.push($0) }
                pushes += 1
                nextPush = Double(pushes * producerChunk) / producerRate + random.next(upTo: jitter)
            } else {
                let played = out.withUnsafeMutableBufferPointer { run.fifo.pull(into: $0) }
                if !played { run.silentPulls += 1 }
                if played, nextPull > 10 {
                    for sample in out {
                        // (Across the counter's wrap from 32767 to -32768 a stretched pull
                        // interpolates between the two: not a step of the queue's making.)
                        if let previous, abs(Int(previous)) < 32_000, abs(Int(sample)) < 32_000 {
                            let step = Int(sample) - Int(previous)
                            run.steps = (min(run.steps.least, step), max(run.steps.most, step))
                        }
                        previous = sample
                    }
                }
                pulls += 1
                let second = Int(nextPull)
                if second != lastSecond {
                    run.levels.append(run.fifo.statistics.level)
                    if second == 10 { run.start = run.fifo.statistics }
                    lastSecond = second
                }
                nextPull = 0.05 + Double(pulls * consumerChunk) / consumerRate + random.next(upTo: jitter)
            }
        }
        return run
    }

    @Test(arguments: [200.0, -200.0])
    func aMicrophoneDriftingFromTheVoiceClockKeepsItsDelayForTenMinutes(ppm: Double) {
        // Capture: the device delivers 10 ms chunks on its own crystal; the voice clock takes 20 ms frames.
        let run = Self.simulate(
            producerRate: 8000 * (1 + ppm / 1e6), producerChunk: 80, consumerRate: 8000, consumerChunk: 160, seconds: 600)
        Self.expectDriftFollowed(run, ppm: ppm, slipIsDrop: ppm > 0)
        #expect(run.silentPulls <= 3, "only the pulls before the first chunk are silent: \(run.silentPulls)")
    }

    @Test(arguments: [200.0, -200.0])
    func aSpeakerDriftingFromTheVoiceClockNeverRunsDry(ppm: Double) {
        // Playback: the voice clock writes 5 ms pulls; the device takes 10 ms chunks on its own crystal.
        let run = Self.simulate(
            producerRate: 8000, producerChunk: 40, consumerRate: 8000 * (1 + ppm / 1e6), consumerChunk: 80, seconds: 600,
            pullsPerSecond: 100)
        Self.expectDriftFollowed(run, ppm: ppm, slipIsDrop: ppm < 0)
    }

    /// No gap in ten minutes; after the start, the drift (200 ppm of 590 s at 8 kHz: 944
    /// samples) taken out or put in one sample at a time, and nothing the other way; the
    /// delay level, at most 30 ms, where it was after ten seconds rather than 120 ms more.
    static func expectDriftFollowed(_ run: Run, ppm: Double, slipIsDrop: Bool) {
        let s = run.fifo.statistics
        #expect(s.underruns == 0, "\(s)")
        #expect(s.overflowed == 0)
        let slipped = slipIsDrop ? s.dropped - run.start.dropped : s.repeated - run.start.repeated
        let against = slipIsDrop ? s.repeated - run.start.repeated : s.dropped - run.start.dropped
        #expect((850...1_050).contains(slipped), "\(run.start) then \(s)")
        #expect(against < 50, "\(run.start) then \(s)")
        let after = run.levels.dropFirst(10)
        #expect(after.allSatisfy { $0 <= 240 }, "\(after)")
        #expect(abs((run.levels.suffix(60).max() ?? 0) - (run.levels[10..<70].max() ?? 0)) <= 80, "\(run.levels)")
        #expect(run.steps.least >= 14 && run.steps.most <= 18, "a step in the waveform: \(run.steps)")
    }

    /// A speaker's thread as ``LiveAudioDevice`` runs it, against a sound server that
    /// keeps three chunks: it pulls a chunk as soon as its last write returns, and when
    /// the queue is short it waits up to a chunk's time for the voice loop's write
    /// (the server still holds two). Returns the times the server ran out (a check of
    /// the model: a blocking write keeps it from running out for less than a chunk's
    /// wait), the waits, and the queue's figures, after `seconds` with the device `ppm`
    /// fast and the voice loop's writes up to `jitter` samples late.
    static func speakerAgainstServer(ppm: Double, seconds: Int, jitter: Double, toldWaits: Bool) -> (
        serverUnderruns: Int, waits: Int, fifo: DeviceFIFO
    ) {
        let chunk = 80  // 10 ms at 8 kHz
        var fifo = DeviceFIFO(target: 80, capacity: 16_000, pullsPerSecond: 100)
        fifo.followed = true
        var random = Jitter(state: 11)
        var out = [Int16](repeating: 0, count: chunk)
        let voice = [Int16](repeating: 1_000, count: chunk)
        var server = 0  // samples queued at the server
        var serverUnderruns = 0
        var dry = false
        var playing = false  // (the server starts with its first chunk: PulseAudio's prebuf)
        var pending = false  // a pulled chunk waiting for room at the server
        var waitingSince: Int?
        var waits = 0
        var nextPush = 0.0
        var deviceClock = 0.0
        for n in 0..<(seconds * 8000) {
            let now = Double(n)
            // The voice loop writes a chunk every 10 ms, a little late at times.
            if now >= nextPush {
                voice.withUnsafeBufferPointer { fifo.push($0) }
                nextPush = Double((Int(nextPush) / chunk + 1) * chunk) + random.next(upTo: jitter)
            }
            // The thread: pull (or wait for the write, a chunk's time at most), then write when there is room.
            if !pending {
                let short = fifo.primed && fifo.count < chunk
                if short, waitingSince == nil {
                    waitingSince = n
                    waits += 1
                }
                if !short || n - (waitingSince ?? n) >= chunk {
                    let waited = toldWaits ? n - (waitingSince ?? n) : 0
                    _ = out.withUnsafeMutableBufferPointer { fifo.pull(into: $0, waited: waited) }
                    waitingSince = nil
                    pending = true
                }
            }
            if pending, server + chunk <= 3 * chunk {
                server += chunk
                pending = false
            }
            // The device plays on its own clock.
            playing = playing || server > 0
            deviceClock += playing ? 1 + ppm / 1e6 : 0
            while deviceClock >= 1 {
                deviceClock -= 1
                if server > 0 {
                    server -= 1
                    dry = false
                } else if !dry {
                    dry = true
                    serverUnderruns += 1
                }
            }
        }
        return (serverUnderruns, waits, fifo)
    }

    /// The waits a speaker's thread makes for a late write take from what the server
    /// holds; told to the queue, the margin is restored, and ten minutes of a device
    /// 200 ppm fast with writes up to 8 ms late never run the queue dry, with about the
    /// drift's worth of samples repeated (200 ppm of 600 s at 8 kHz: 960) rather than a
    /// correction for every wait; untold, the thread paced by the writes hides the
    /// drift, the waits grow until they run out, and the queue runs dry again and again
    /// (as a live 44.1 kHz speaker's did every 100 s).
    @Test func aSpeakersWaitsForLateWritesNeverRunItsQueueDry() {
        let told = Self.speakerAgainstServer(ppm: 200, seconds: 600, jitter: 64, toldWaits: true)
        #expect(told.waits > 0, "the writes came late enough to be waited for")
        #expect(told.fifo.statistics.underruns == 0, "\(told.waits) waits, \(told.fifo.statistics)")
        #expect(told.fifo.statistics.repeated < 3_000, "\(told.fifo.statistics)")
        #expect(told.serverUnderruns == 0, "the model's server ran out \(told.serverUnderruns) times")
        let untold = Self.speakerAgainstServer(ppm: 200, seconds: 600, jitter: 64, toldWaits: false)
        #expect(untold.fifo.statistics.underruns > 0, "\(untold.fifo.statistics)")
    }

    @Test func withoutDriftNothingIsDroppedOrRepeatedAfterTheStart() {
        let run = Self.simulate(
            producerRate: 8000, producerChunk: 80, consumerRate: 8000, consumerChunk: 160, seconds: 120)
        let s = run.fifo.statistics
        #expect(s.underruns == 0)
        #expect(s.dropped == run.start.dropped && s.repeated == run.start.repeated, "\(run.start) then \(s)")
    }

    @Test func audioQueuedBeforeTheFirstPullIsCutToTheMargin() {
        var fifo = DeviceFIFO(target: 80, capacity: 16_000, pullsPerSecond: 50)
        let backlog = (0..<4_000).map { Int16(truncatingIfNeeded: $0) }
        backlog.withUnsafeBufferPointer { fifo.push($0) }
        var out = [Int16](repeating: 0, count: 160)
        #expect(out.withUnsafeMutableBufferPointer { fifo.pull(into: $0) })
        // The newest samples but a margin and a half: 4000 - 160 - 120 = 3720 dropped.
        #expect(out.first == 3_720)
        #expect(fifo.count == 120)
        #expect(fifo.statistics.dropped == 3_720)
    }

    @Test func whatACallerSaidBeforeTheFirstPullIsKeptAndThenCaughtUp() {
        // 8 kHz, 20 ms pulls: 4,000 samples queued, 1,000 of them (125 ms) to be kept.
        var fifo = DeviceFIFO(target: 120, capacity: 40_000, pullsPerSecond: 50, keepBeforeFirstPull: 1_000)
        var value: Int16 = 0
        func speech(_ n: Int) -> [Int16] {
            (0..<n).map { _ in
                value &+= 16
                return value
            }
        }
        speech(4_000).withUnsafeBufferPointer { fifo.push($0) }
        var out = [Int16](repeating: 0, count: 160)
        #expect(out.withUnsafeMutableBufferPointer { fifo.pull(into: $0) })
        #expect(out.first == Int16(truncatingIfNeeded: 16 * (4_000 - 160 - 1_000 + 1)))
        #expect(fifo.count == 1_000)
        // Speech goes on at the pull's pace, without a pause: after ten seconds the backlog
        // is played up to 1 % faster, back within the band in well under a minute, never
        // running dry.
        for _ in 0..<2_500 {
            speech(160).withUnsafeBufferPointer { fifo.push($0) }
            #expect(out.withUnsafeMutableBufferPointer { fifo.pull(into: $0) })
        }
        #expect(fifo.statistics.level <= 240, "\(fifo.statistics)")
        #expect(fifo.statistics.underruns == 0)
    }

    @Test func aQueueThatRunsDryPlaysSilenceAndPrimesAgain() {
        var fifo = DeviceFIFO(target: 80, capacity: 1_000, pullsPerSecond: 50)
        var out = [Int16](repeating: 7, count: 160)
        #expect(!out.withUnsafeMutableBufferPointer { fifo.pull(into: $0) })
        #expect(out.allSatisfy { $0 == 0 })
        #expect(fifo.statistics.underruns == 0, "not primed yet: no underrun")
        let chunk = [Int16](repeating: 1, count: 240)
        chunk.withUnsafeBufferPointer { fifo.push($0) }
        #expect(out.withUnsafeMutableBufferPointer { fifo.pull(into: $0) })
        #expect(!out.withUnsafeMutableBufferPointer { fifo.pull(into: $0) })
        #expect(fifo.statistics.underruns == 1)
        #expect(!fifo.primed)
        // Over capacity: the oldest go.
        let flood = [Int16](repeating: 2, count: 1_200)
        flood.withUnsafeBufferPointer { fifo.push($0) }
        #expect(fifo.count == 1_000)
        #expect(fifo.statistics.overflowed == 280)
    }

    @Test func aDeviceThatStallsAndThenDeliversItsBacklogIsCutBackWithinTwoSeconds() {
        // Primed and running, then 2 s of audio at once (a sound server's first block).
        var fifo = DeviceFIFO(target: 80, capacity: 16_000, pullsPerSecond: 50)
        var out = [Int16](repeating: 0, count: 160)
        let frame = [Int16](repeating: 3, count: 160)
        frame.withUnsafeBufferPointer { fifo.push($0) }
        frame.withUnsafeBufferPointer { fifo.push($0) }
        _ = out.withUnsafeMutableBufferPointer { fifo.pull(into: $0) }
        let backlog = [Int16](repeating: 4, count: 16_000)
        backlog.withUnsafeBufferPointer { fifo.push($0) }
        for _ in 0..<100 {
            frame.withUnsafeBufferPointer { fifo.push($0) }
            #expect(out.withUnsafeMutableBufferPointer { fifo.pull(into: $0) })
        }
        #expect(fifo.count < 400, "\(fifo.count) samples still queued")
    }

    /// The voice clock stalls for 100 ms and then makes up its ticks at once (a machine
    /// that froze): a speaker's queue holds 100 ms more than its margin. Returns the
    /// queue's level each second and the least and most a sample moved from the one
    /// before after the stall (speech is a ramp counting up by 16; a pause is ±50).
    static func stall(speech: Bool) -> (levels: [Int], steps: (Int, Int), fifo: DeviceFIFO) {
        // A 48 kHz speaker: 10 ms margin, 10 ms pulls.
        var fifo = DeviceFIFO(target: 480, capacity: 96_000, pullsPerSecond: 100)
        var value: Int16 = 0
        var out = [Int16](repeating: 0, count: 480)
        var levels: [Int] = []
        var steps = (Int.max, Int.min)
        var previous: Int16?
        func produce(_ n: Int) {
            let chunk = (0..<n).map { _ -> Int16 in
                value &+= 16
                return speech ? value : value % 100 - 50
            }
            chunk.withUnsafeBufferPointer { fifo.push($0) }
        }
        // 5 ms ticks: the voice clock writes 240 samples a tick, the device takes 480 every other.
        for tick in 0..<6_400 {
            produce(tick == 1_000 ? 240 + 4_800 : 240)
            guard tick % 2 == 1 else { continue }
            let played = out.withUnsafeMutableBufferPointer { fifo.pull(into: $0) }
            #expect(played || tick < 10, "a gap at tick \(tick)")
            if tick > 1_000, speech {
                for sample in out {
                    if let previous, abs(Int(previous)) < 32_000, abs(Int(sample)) < 32_000 {
                        steps = (min(steps.0, Int(sample) - Int(previous)), max(steps.1, Int(sample) - Int(previous)))
                    }
                    previous = sample
                }
            }
            if tick % 200 == 199 { levels.append(fifo.statistics.level) }
        }
        return (levels, steps, fifo)
    }

    @Test func aStallsBacklogInSpeechWithoutPausesIsPlayedBackToTheMarginWithinAHalfMinute() {
        let run = Self.stall(speech: true)
        // The stall at 5 s: held ten seconds for a pause, then back in the band (at
        // most two margins) by 28 s, never dry.
        #expect(run.levels[5...6].contains { $0 > 960 }, "\(run.levels)")
        #expect(run.levels[14] > 4_000, "speech was hurried before ten seconds: \(run.levels)")
        #expect(run.levels[28...].allSatisfy { $0 <= 960 }, "\(run.levels)")
        #expect(run.fifo.statistics.underruns == 0)
        // Played at most 1 % faster, with no step in the waveform (a cut would move 4,800 at once).
        #expect(run.steps.0 >= 15 && run.steps.1 <= 17, "\(run.steps)")
    }

    @Test func aStallsBacklogInAPauseIsLeftOutWithinASecond() {
        let run = Self.stall(speech: false)
        // Seen within a fifth of a second and left out a pull at a time: never a whole window above the band.
        #expect(run.levels[5...].allSatisfy { $0 <= 960 }, "\(run.levels)")
        #expect(run.fifo.statistics.dropped >= 4_000)
        #expect(run.fifo.statistics.underruns == 0)
    }
}
