import Testing
import Voice

/// The voice clock following a card's (``DeviceClockFollower``), on a virtual clock: a
/// microphone and a speaker on one crystal ±200 ppm (or 500) off the machine's, for
/// ten minutes, and the queues between them and the voice clock.
@Suite("The voice clock follows the sound card")
struct DeviceClockFollowerTests {
    struct Run {
        var capture: DeviceFIFO
        var playback: DeviceFIFO
        /// Each queue's statistics a minute in (the control settled).
        var captureStart: DeviceFIFO.Statistics
        var playbackStart: DeviceFIFO.Statistics
        var scale: Double
    }

    /// One card at `rate × (1 + ppm)`: its microphone delivers 10 ms chunks, its speaker
    /// takes 10 ms chunks; the voice clock ticks every 5 ms (× the follower's scale, or
    /// the nominal period when `follow` is off), writing a tick's samples to the speaker,
    /// and every fourth tick pulls a 20 ms frame from the microphone, as a call's voice
    /// loop does. Events in time order.
    static func simulate(ppm: Double, follow: Bool, seconds: Double = 600, rate: Int = 8000) -> Run {
        let chunk = rate / 100
        let tickSamples = rate / 200
        let frame = rate / 50
        var capture = DeviceFIFO(target: rate * 15 / 1000, capacity: rate * 5, pullsPerSecond: 50)
        var playback = DeviceFIFO(target: rate * 10 / 1000, capacity: rate * 2, pullsPerSecond: 100)
        // The band's middle: one and a half margins after a pull, and half a chunk.
        var follower = DeviceClockFollower(
            queue: .capture, sampleRate: rate, pullsPerSecond: 50, setpoint: Double(capture.target) * 1.5 + Double(chunk) / 2)
        let cardChunk = 0.01 / (1 + ppm / 1e6)
        var nextCard = 0.003
        var lastPush = 0.0
        var nextVoice = 0.05
        var tick = 0
        var captureStart: DeviceFIFO.Statistics?
        var playbackStart: DeviceFIFO.Statistics?
        var captured = [Int16](repeating: 0, count: chunk)
        var phase = 0
        var heard = [Int16](repeating: 0, count: chunk)
        var pulled = [Int16](repeating: 0, count: frame)
        let written = [Int16](repeating: 1000, count: tickSamples)
        while min(nextCard, nextVoice) < seconds {
            if nextCard <= nextVoice {
                // The card: a chunk captured (a tone, so that quiet never counts as a pause), a chunk played.
                for i in 0..<chunk {
                    captured[i] = Int16(3000 * ((phase / 20) % 2 == 0 ? 1 : -1))
                    phase += 1
                }
                captured.withUnsafeBufferPointer { capture.push($0) }
                lastPush = nextCard
                _ = heard.withUnsafeMutableBufferPointer { playback.pull(into: $0) }
                nextCard += cardChunk
            } else {
                if tick % 4 == 0 {
                    let primed = pulled.withUnsafeMutableBufferPointer { capture.pull(into: $0) }
                    // What the queue holds, and what the card made since its last chunk.
                    let level = Double(capture.count) + (nextVoice - lastPush) * Double(rate) * (1 + ppm / 1e6)
                    if follow {
                        if capture.catchingUp { follower.hold() } else { follower.observe(level: primed ? level : nil) }
                    }
                }
                written.withUnsafeBufferPointer { playback.push($0) }
                tick += 1
                nextVoice += 0.005 * (follow ? follower.scale : 1)
                if captureStart == nil, nextVoice >= 60 {
                    captureStart = capture.statistics
                    playbackStart = playback.statistics
                }
            }
        }
        return Run(
            capture: capture, playback: playback, captureStart: captureStart ?? capture.statistics,
            playbackStart: playbackStart ?? playback.statistics, scale: follower.scale)
    }

    @Test(arguments: [200.0, -200.0, 500.0, -500.0])
    func followingTheCardNeitherQueueSlipsASampleInTenMinutes(ppm: Double) {
        let run = Self.simulate(ppm: ppm, follow: true)
        for (name, fifo, start) in [
            ("capture", run.capture, run.captureStart), ("playback", run.playback, run.playbackStart),
        ] {
            let s = fifo.statistics
            #expect(s.underruns == start.underruns && s.overflowed == 0, "\(name): \(start) then \(s)")
            #expect(s.dropped == start.dropped && s.repeated == start.repeated, "\(name): \(start) then \(s)")
        }
        // The voice clock ticks at the card's pace: 200 ppm faster is a period 200 ppm shorter.
        #expect(abs((1 - run.scale) * 1e6 - ppm) < 20, "scale \(run.scale) for \(ppm) ppm")
    }

    /// The control: on the machine's own clock, the same card makes both queues slip
    /// (the drift, 200 ppm of 590 s at 8 kHz: about 944 samples each).
    @Test func onTheMachinesClockBothQueuesSlip() {
        let run = Self.simulate(ppm: 200, follow: false)
        let captureSlips = run.capture.statistics.dropped - run.captureStart.dropped
        let playbackSlips = run.playback.statistics.repeated - run.playbackStart.repeated
        #expect(captureSlips > 800 && playbackSlips > 800, "\(run.capture.statistics) \(run.playback.statistics)")
    }

    @Test func aQueueNotPrimedStopsTheControlAndABacklogHoldsIt() {
        var follower = DeviceClockFollower(queue: .playback, sampleRate: 8000, pullsPerSecond: 10, setpoint: 100)
        for _ in 0..<10 { follower.observe(level: 100) }
        #expect(follower.scale == 1)
        // The speaker's queue grows: the voice clock is the faster, and slows down.
        for _ in 0..<10 { follower.observe(level: 180) }
        let slower = follower.scale
        #expect(slower > 1)
        // A backlog being taken back says nothing of the clocks: the course is held.
        for _ in 0..<30 { follower.hold() }
        #expect(follower.scale == slower)
        follower.observe(level: nil)
        #expect(follower.scale == 1)
    }
}
