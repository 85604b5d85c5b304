/// Anything that turns arriving packets into a continuous stream of PCM at a playout clock.
public protocol PlayoutBuffer: AnyObject {
    /// A packet arrived (any order, duplicates possible). Copies the payload; never allocates per call after init.
    func insert(sequence: UInt16, timestamp: UInt32, payload: UnsafeRawBufferPointer, arrivalNanoseconds: Int64)
    /// The playout clock needs output.count samples now. Always fills all of them (speech, FEC, concealment,
    /// comfort noise or silence).
    func pull(nowNanoseconds: Int64, into output: UnsafeMutableBufferPointer<Int16>)
    var statistics: PlayoutStatistics { get }
    /// A previous frame carried again in a later packet (``RedundantAudio``), `back`
    /// packets after its own: taken only when its own packet is not here and its
    /// time has not passed.
    func insertRedundant(
        sequence: UInt16, timestamp: UInt32, back: Int, payload: UnsafeRawBufferPointer, arrivalNanoseconds: Int64)
}

extension PlayoutBuffer {
    /// A buffer that knows nothing of redundancy takes a redundant frame as a packet (a duplicate when it has it).
    public func insertRedundant(
        sequence: UInt16, timestamp: UInt32, back: Int, payload: UnsafeRawBufferPointer, arrivalNanoseconds: Int64
    ) {
        insert(sequence: sequence, timestamp: timestamp, payload: payload, arrivalNanoseconds: arrivalNanoseconds)
    }
}

public struct PlayoutConfiguration: Sendable, Hashable {
    public var sampleRate: Int
    /// The codec frame (packet) duration.
    public var frameDuration: FrameDuration
    /// Packets held.
    public var capacity: Int
    public var maximumPayloadSize: Int
    public var minimumDelayMilliseconds: Int
    /// Hard maximum: beyond it, fast catch-up.
    public var maximumDelayMilliseconds: Int
    /// The quantile of recent relative delays the target follows (0.95: about 5 % late at most).
    public var targetQuantile: Double
    /// Time-stretch limited to this fraction of speech time.
    public var maximumStretch: Double
    /// Concealment fades to comfort noise after this many missing frames.
    public var comfortNoiseAfterFrames: Int
    /// Delay over the target up to this much comes off only in pauses (silent frames
    /// dropped), never by speeding speech up; above it (a pile-up: a TCP stall, a
    /// frozen sender) speech plays faster, up to 2× and past `maximumStretch`, until
    /// the excess is back under it; past `maximumDelayMilliseconds` audio is dropped.
    /// 0 (the default, a call's): speech is sped up from half a frame over the target,
    /// within `maximumStretch`.
    public var shrinkInPausesUpToMilliseconds: Int

    public init(
        sampleRate: Int = voiceSampleRate, frameDuration: FrameDuration = .ms20, capacity: Int = 64,
        maximumPayloadSize: Int = 1500, minimumDelayMilliseconds: Int = 0, maximumDelayMilliseconds: Int = 400,
        targetQuantile: Double = 0.95, maximumStretch: Double = 0.05, comfortNoiseAfterFrames: Int = 8,
        shrinkInPausesUpToMilliseconds: Int = 0
    ) {
        self.sampleRate = sampleRate
        self.frameDuration = frameDuration
        self.capacity = capacity
        self.maximumPayloadSize = maximumPayloadSize
        self.minimumDelayMilliseconds = minimumDelayMilliseconds
        self.maximumDelayMilliseconds = maximumDelayMilliseconds
        self.targetQuantile = targetQuantile
        self.maximumStretch = maximumStretch
        self.comfortNoiseAfterFrames = comfortNoiseAfterFrames
        self.shrinkInPausesUpToMilliseconds = shrinkInPausesUpToMilliseconds
    }

    func validate() throws(VoiceError) {
        guard [8000, 16000, 24000, 48000].contains(sampleRate) else {
            throw .invalidConfiguration("sampleRate \(sampleRate) not in 8000/16000/24000/48000")
        }
        guard (4...4096).contains(capacity) else { throw .invalidConfiguration("capacity \(capacity) not in 4...4096") }
        guard (1...65536).contains(maximumPayloadSize) else { throw .invalidConfiguration("maximumPayloadSize not in 1...65536") }
        guard minimumDelayMilliseconds >= 0, maximumDelayMilliseconds > minimumDelayMilliseconds, maximumDelayMilliseconds <= 2000
        else { throw .invalidConfiguration("delays need 0 ≤ minimum < maximum ≤ 2000 ms") }
        guard targetQuantile > 0.5, targetQuantile < 1 else { throw .invalidConfiguration("targetQuantile not in (0.5, 1)") }
        guard maximumStretch >= 0, maximumStretch <= 0.5 else { throw .invalidConfiguration("maximumStretch not in 0...0.5") }
        guard comfortNoiseAfterFrames >= 1 else { throw .invalidConfiguration("comfortNoiseAfterFrames must be ≥ 1") }
        guard (0...maximumDelayMilliseconds).contains(shrinkInPausesUpToMilliseconds) else {
            throw .invalidConfiguration("shrinkInPausesUpToMilliseconds not in 0...maximumDelayMilliseconds")
        }
    }
}

/// The adaptive jitter buffer: plays by RTP timestamp at a target delay from `DelayEstimator`,
/// conceals (FEC, codec concealment, comfort noise) and adapts the delay by pitch-synchronous
/// time-stretch in speech and by dropping/inserting frames in silence, with a hard maximum.
///
/// All storage (packet slots, scratch frames, output FIFO, histograms) is allocated in `init`;
/// `insert` and `pull` allocate nothing.
public final class Playout: PlayoutBuffer, PlayoutTimingReporting {
    public let configuration: PlayoutConfiguration
    private let decoder: any VoiceDecoder
    private let spf: Int
    private let rate: Double
    private let frameMs: Double
    /// The playout point's floor: the duration of the latest pull (at most a frame).
    /// A packet is needed when the pull holding its first sample runs, so it must be
    /// here one pull before it plays: an audio clock that pulls 5 ms at a time can
    /// play a packet 5 ms after it arrives, one pulling a whole frame only a frame after.
    private var floorMs: Double
    private let minLag: Int, maxLag: Int
    // slots
    private let payloads: UnsafeMutablePointer<UInt8>
    private var slotTs: [Int64]
    private var slotLength: [Int]
    private var slotArrivalMs: [Double]
    private var slotPlayed: [Bool]
    // clocks
    private var haveFirst = false
    private var lastRawTs: UInt32 = 0
    private var lastExtTs: Int64 = 0
    private var newestExtTs: Int64 = 0
    private var playing = false
    private var nextTs: Int64 = 0
    private var estimator: DelayEstimator
    // audio
    private let frame: UnsafeMutableBufferPointer<Int16>
    private let concealFrame: UnsafeMutableBufferPointer<Int16>
    private let stretched: UnsafeMutableBufferPointer<Int16>
    private let fifo: UnsafeMutableBufferPointer<Int16>
    private var fifoStart = 0, fifoCount = 0
    /// What the FIFO holds is a frame concealed while the playout point waits for the
    /// packet at `nextTs` (an underrun). Should that packet come while some of the frame
    /// is still unplayed, the rest goes and the packet plays at the next pull: a packet
    /// 5 ms late costs 5 ms of concealment and delay on a 5 ms audio clock, not a frame.
    private var waitingInFifo = false
    /// Samples of concealment so dropped, at the start of `concealFrame`, for the packet
    /// to cross-fade from (the concealment's own continuation).
    private var resumeFade = 0
    private var concealRun = 0
    private var noiseFloor = 30.0
    private var noiseState: UInt64 = 0x9E37_79B9_7F4A_7C15
    private var noiseLow = 0.0
    private var speechSamples = 0
    /// Consecutive silent frames played: on a lossy stream whole frames are dropped or
    /// inserted only in a pause this long, between talk spurts, not in the short gaps
    /// between words (a delay change inside an utterance is audible, and PESQ punishes it hard).
    private var silentRun = 0
    /// The timestamp last waited for (an underrun), so a missing packet is waited for once.
    private var waitedTs: Int64 = .min
    /// Frames concealed while the playout point waited for a missing packet. When that
    /// packet turns out lost (a later one arrives first), those frames already stood in
    /// for it: the playout point moves past that many lost frames without concealing
    /// them again, so a burst of losses neither doubles its concealment nor adds delay.
    private var waitedFrames = 0
    /// Recent share of packets missing from the arriving sequence (gaps not filled by a
    /// reordered packet), exponentially weighted over about 200 packets.
    private var missingShare = 0.0
    /// Above this recent loss a missing packet is more likely lost than late.
    private let lossyShare = 0.03
    private var pauseFrames: Int { max(1, 200 / Int(frameMs)) }
    /// When the last gap in the arriving stream was seen (ms), for the FEC look-ahead.
    private var lastGapMs = -Double.infinity
    /// The newest packet's sequence number: a timestamp jump under the next sequence
    /// number is a pause the sender made (DTX: nothing sent in silence), not a loss.
    private var newestSequence: UInt16?
    /// The latest such pause: the timestamps the sender skipped, `from..<to`.
    private var senderPause: Range<Int64> = 0..<0
    /// Frames concealed since the last packet played while the playout point waited
    /// for the next one. When what it waited for turns out to be a sender's pause,
    /// those frames already stood for as much of the pause: on every path, steady or
    /// jittery, a pause costs no delay and is never counted as loss.
    private var underrunFrames = 0
    /// When the current run of packets too late to play began (arrival, ms): a run
    /// that lasts is the sender's timeline moved, not jitter (``behindRunMs``).
    private var behindSinceMs: Double?
    /// Packets this far behind the playout point (more than the largest delay the
    /// buffer would take) for this long, with nothing to play ahead of them, come from
    /// a sender that stopped and went on where it was (a process frozen and resumed,
    /// a stalled audio clock): every later packet would be as late, so the buffer
    /// anchors on them instead, as on a jump forward. A delay spike's backlog arrives
    /// in a burst, and on-time packets follow it.
    static let behindRunMs = 200.0
    /// How long after a delay spike a missing packet is waited for even on a lossy stream.
    static let spikeMemoryMs = 60_000.0
    /// How long after a gap the buffer keeps one frame of look-ahead for FEC.
    private let fecHoldMs = 30_000.0
    /// The largest relative delay (over the minimum) each of the last ten seconds saw,
    /// to tell a steady path (where a missing packet is lost) from a jittery one.
    private var secondMaxima = [Double](repeating: -.infinity, count: 10)
    private var secondMaximaAt = [Int64](repeating: .min, count: 10)
    private var stats = PlayoutStatistics()
    private var delays = DelayHistogram()

    public var onPacketPlayed: ((UInt32, Int64) -> Void)?

    public init(decoder: any VoiceDecoder, configuration: PlayoutConfiguration = .init()) throws(VoiceError) {
        try configuration.validate()
        guard decoder.configuration.samplesPerFrame == configuration.frameDuration.samples(atRate: configuration.sampleRate)
        else {
            throw .invalidConfiguration(
                "decoder frame (\(decoder.configuration.samplesPerFrame) samples) differs from the playout frame")
        }
        self.configuration = configuration
        self.decoder = decoder
        spf = configuration.frameDuration.samples(atRate: configuration.sampleRate)
        rate = Double(configuration.sampleRate)
        frameMs = Double(configuration.frameDuration.milliseconds)
        floorMs = frameMs
        minLag = configuration.sampleRate / 400
        maxLag = min(spf / 2, configuration.sampleRate / 100)
        let cap = configuration.capacity
        payloads = .allocate(capacity: cap * configuration.maximumPayloadSize)
        slotTs = Array(repeating: Int64.min, count: cap)
        slotLength = Array(repeating: 0, count: cap)
        slotArrivalMs = Array(repeating: 0, count: cap)
        slotPlayed = Array(repeating: false, count: cap)
        estimator = DelayEstimator(quantile: configuration.targetQuantile)
        frame = .allocate(capacity: spf)
        frame.initialize(repeating: 0)
        concealFrame = .allocate(capacity: spf)
        concealFrame.initialize(repeating: 0)
        stretched = .allocate(capacity: 2 * spf)
        stretched.initialize(repeating: 0)
        fifo = .allocate(capacity: 4 * spf)
        fifo.initialize(repeating: 0)
    }

    deinit {
        payloads.deallocate()
        frame.deallocate()
        concealFrame.deallocate()
        stretched.deallocate()
        fifo.deallocate()
    }

    public func reset() {
        for i in 0..<slotTs.count {
            slotTs[i] = .min
            slotPlayed[i] = false
        }
        haveFirst = false
        playing = false
        fifoStart = 0
        fifoCount = 0
        waitingInFifo = false
        resumeFade = 0
        concealRun = 0
        forgetPathDelays()
        stats = PlayoutStatistics()
        delays.reset()
        speechSamples = 0
        lastGapMs = -.infinity
        newestSequence = nil
        senderPause = 0..<0
        underrunFrames = 0
        missingShare = 0
        waitedTs = .min
        silentRun = 0
        waitedFrames = 0
        behindSinceMs = nil
        decoder.reset()
    }

    /// Playout waits for the start delay again from `ext`, a new talk spurt's or a new
    /// timeline's first packet; the old timeline's pause and underruns mean nothing on it.
    private func reanchor(at ext: Int64) {
        playing = false
        nextTs = ext
        fifoCount = 0
        senderPause = 0..<0
        underrunFrames = 0
    }

    /// The path's delays as measured so far (their minima and quantile, each second's maximum) are forgotten.
    private func forgetPathDelays() {
        estimator.reset()
        for i in 0..<secondMaxima.count {
            secondMaxima[i] = -.infinity
            secondMaximaAt[i] = .min
        }
    }

    public var statistics: PlayoutStatistics {
        var s = stats
        s.takeDelays(from: delays)
        let unique = stats.packetsReceived - stats.duplicates
        s.lateLossRate = unique > 0 ? Double(stats.latePackets) / Double(unique) : 0
        return s
    }

    private func slot(_ ext: Int64) -> Int {
        let n = Int64(slotTs.count)
        return Int(((ext / Int64(spf)) % n + n) % n)
    }

    /// Whether the buffer holds a frame of look-ahead for FEC (the stream lost packets lately).
    private func fecHeld(_ nowMs: Double) -> Bool {
        (decoder.recoversFromNextPacket || redundancy(nowMs) > 0) && nowMs - lastGapMs < fecHoldMs
    }

    /// How many packets back the sender's redundant frames reach (``RedundantAudio``),
    /// while such packets keep coming (0: none lately).
    private func redundancy(_ nowMs: Double) -> Int { nowMs - redundancySeenMs < 2000 ? redundancyDepth : 0 }
    private var redundancyDepth = 0
    private var redundancySeenMs = -Double.infinity

    /// The largest relative delay seen in the last ten seconds (ms over the minimum).
    private func recentMaximumDelay(_ nowMs: Double) -> Double {
        let now = Int64((nowMs / 1000).rounded(.down))
        var m = -Double.infinity
        for i in 0..<secondMaxima.count where secondMaximaAt[i] > now &- 10 { m = max(m, secondMaxima[i]) }
        return m
    }

    private func targetMs(_ nowMs: Double) -> Double {
        var t = estimator.target(nowMs: nowMs) + frameMs / 4
        // FEC rebuilds a lost frame from the next packet, which must then already be
        // here: while the stream is losing packets, hold one more frame of delay.
        // Packets come a frame at a time, so the look-ahead is a whole frame above the
        // one-frame floor of the playout point.
        // Redundant audio carries a frame up to `depth` packets later: hold that many
        // frames (one more, for FEC to rebuild the frame before the oldest copy, gained
        // 0.06 PESQ on 20 % bursty loss for 20 ms more delay: not held).
        let depth = redundancy(nowMs)
        let held = max(1, depth)
        // (From the first redundant packet on: the sender adds redundancy once the path
        // is known to lose, and the delay is best set before speech needs stretching.)
        if fecHeld(nowMs) || depth > 0 { t = max(t, floorMs) + frameMs * Double(held) }
        return min(
            Double(configuration.maximumDelayMilliseconds) - frameMs,
            max(Double(configuration.minimumDelayMilliseconds), t))
    }

    public func insert(sequence: UInt16, timestamp: UInt32, payload: UnsafeRawBufferPointer, arrivalNanoseconds: Int64) {
        store(
            sequence: sequence, timestamp: timestamp, payload: payload, arrivalNanoseconds: arrivalNanoseconds, redundant: false)
    }

    /// A packet, or (`redundant`) a frame a later packet carried again: that one says
    /// nothing of the path's delay or loss (it is as late as the redundancy makes it),
    /// so it is kept out of the delay estimate and the loss tracking.
    private func store(
        sequence: UInt16, timestamp: UInt32, payload: UnsafeRawBufferPointer, arrivalNanoseconds: Int64, redundant: Bool
    ) {
        stats.packetsReceived += 1
        let ext: Int64
        if haveFirst {
            ext = extended(timestamp)
        } else {
            ext = Int64(timestamp)
            haveFirst = true
            newestExtTs = ext
        }
        if ext > lastExtTs || stats.packetsReceived == 1 {
            lastExtTs = ext
            lastRawTs = timestamp
        }
        let arrivalMs = Double(arrivalNanoseconds) / 1e6
        let s = slot(ext)
        if slotTs[s] == ext {
            stats.duplicates += 1
            return
        }
        if playing && ext < nextTs {
            let behindMs = Double(nextTs - ext) * 1000 / rate
            if behindMs > Double(configuration.maximumDelayMilliseconds), !anyBuffered(after: nextTs - 1) {
                let since = behindSinceMs ?? arrivalMs
                behindSinceMs = since
                if arrivalMs - since >= Self.behindRunMs {
                    reanchor(at: ext)
                    behindSinceMs = nil
                    // A new timeline behind the old (a sender restarted with a new random
                    // initial timestamp): the newest packet, the extension's reference and
                    // the path's delays are the new one's. Kept, the old newest had the
                    // catch-up walk the playout point back up to it, dropping the new
                    // stream, until the old minimum delay aged out (16 s).
                    newestExtTs = ext
                    lastExtTs = ext
                    lastRawTs = timestamp
                    newestSequence = nil
                    missingShare = 0
                    forgetPathDelays()
                }
            } else {
                behindSinceMs = nil
            }
            if playing {
                stats.latePackets += 1
                stats.concealedByCause.late += 1
                estimator.observeLate(absoluteDelayMs: arrivalMs - Double(ext) * 1000 / rate, arrivalMs: arrivalMs)
                return
            }
        } else {
            behindSinceMs = nil
        }
        guard payload.count <= configuration.maximumPayloadSize, payload.count > 0 else { return }
        if playing && ext >= nextTs + Int64(slotTs.count * spf) {
            // Too far ahead for the slots. With nothing buffered it is a new talk spurt after a
            // timestamp jump (DTX, sender restart): re-anchor and wait for the start delay again.
            guard !anyBuffered(after: nextTs - 1) else { return }
            reanchor(at: ext)
        }
        if redundant {
            keep(ext, slot: s, payload: payload, arrivalMs: arrivalMs)
            return
        }
        let paused = ext > newestExtTs + Int64(spf) && newestSequence.map { sequence == $0 &+ 1 } == true
        if ext > newestExtTs + Int64(spf), !paused { lastGapMs = arrivalMs }  // a packet (or more) missing before this one
        if paused { senderPause = (newestExtTs + Int64(spf))..<ext }
        if ext > newestExtTs {
            // (Whole frames between the two: none when the step is under a frame, a
            // sender's shorter frames or a peer's odd timestamps, never fewer.)
            let missing = paused ? 0 : max(0, min((ext - newestExtTs) / Int64(spf) - 1, 50))
            for _ in 0..<missing { missingShare += (1 - missingShare) / 200 }
            missingShare -= missingShare / 200
        } else if ext < newestExtTs {
            missingShare = max(0, missingShare - 1.0 / 200)  // a gap filled late: it was jitter
        }
        let absolute = arrivalMs - Double(ext) * 1000 / rate
        estimator.add(absoluteDelayMs: absolute, arrivalMs: arrivalMs)
        let second = Int64((arrivalMs / 1000).rounded(.down))
        let k = Int((second % 10 + 10) % 10)
        let relative = absolute - estimator.minimumDelay
        if secondMaximaAt[k] != second {
            secondMaximaAt[k] = second
            secondMaxima[k] = relative
        } else if relative > secondMaxima[k] {
            secondMaxima[k] = relative
        }
        keep(ext, slot: s, payload: payload, arrivalMs: arrivalMs)
        if ext > newestExtTs || newestSequence == nil {
            newestExtTs = max(newestExtTs, ext)
            newestSequence = sequence
        }
        if !playing && ext < nextTs || !playing && stats.packetsReceived - stats.duplicates == 1 { nextTs = ext }
    }

    public func insertRedundant(
        sequence: UInt16, timestamp: UInt32, back: Int, payload: UnsafeRawBufferPointer, arrivalNanoseconds: Int64
    ) {
        guard haveFirst else { return }
        let ext = extended(timestamp)
        // How far back the sender's redundancy reaches now (a packet's blocks come
        // oldest first): the delay to hold for it.
        let arrivalMs = Double(arrivalNanoseconds) / 1e6
        let depth = min(max(back, 1), RedundantAudio.maximumDepth)
        redundancyDepth = arrivalMs == redundancySeenMs ? max(redundancyDepth, depth) : depth
        redundancySeenMs = arrivalMs
        // Its own packet came, or its time has passed: nothing to rebuild.
        guard slotTs[slot(ext)] != ext, !(playing && ext < nextTs) else { return }
        let before = stats.packetsReceived
        store(sequence: sequence, timestamp: timestamp, payload: payload, arrivalNanoseconds: arrivalNanoseconds, redundant: true)
        // A frame rebuilt, not a packet received.
        stats.packetsReceived = before
        if slotTs[slot(ext)] == ext { stats.framesRecoveredByRedundancy += 1 }
    }

    /// `timestamp` on the extended timeline, against the newest one seen.
    private func extended(_ timestamp: UInt32) -> Int64 { lastExtTs + Int64(Int32(bitPattern: timestamp &- lastRawTs)) }

    /// Copies a payload into its slot.
    private func keep(_ ext: Int64, slot s: Int, payload: UnsafeRawBufferPointer, arrivalMs: Double) {
        if let base = payload.baseAddress {
            (payloads + s * configuration.maximumPayloadSize).update(
                from: base.assumingMemoryBound(to: UInt8.self), count: payload.count)
        }
        slotTs[s] = ext
        slotLength[s] = payload.count
        slotArrivalMs[s] = arrivalMs
        slotPlayed[s] = false
    }

    private func present(_ ext: Int64) -> Int? {
        let s = slot(ext)
        return slotTs[s] == ext && !slotPlayed[s] ? s : nil
    }

    public func pull(nowNanoseconds: Int64, into output: UnsafeMutableBufferPointer<Int16>) {
        var filled = 0
        let nowMs = Double(nowNanoseconds) / 1e6
        floorMs = min(frameMs, max(1, Double(output.count) * 1000 / rate))
        stats.targetDelayMilliseconds = targetMs(nowMs)
        while filled < output.count {
            if waitingInFifo && fifoCount > 0 && present(nextTs) != nil {
                resumeFade = min(fifoCount, spf / 2)
                for i in 0..<resumeFade { concealFrame[i] = fifo[(fifoStart + i) % fifo.count] }
                fifoCount = 0
            }
            if fifoCount == 0 {
                waitingInFifo = false
                let playMs = nowMs + Double(filled) * 1000 / rate
                if !playing {
                    if haveFirst
                        && playMs - (Double(nextTs) * 1000 / rate + estimator.minimumDelay) >= max(targetMs(playMs), floorMs)
                    {
                        playing = true
                    } else {
                        output[filled] = 0
                        filled += 1
                        continue
                    }
                }
                produce(playMs: playMs)
            }
            let n = min(fifoCount, output.count - filled)
            for i in 0..<n { output[filled + i] = fifo[(fifoStart + i) % fifo.count] }
            fifoStart = (fifoStart + n) % fifo.count
            fifoCount -= n
            filled += n
        }
    }

    private func push(_ p: UnsafeMutableBufferPointer<Int16>, _ n: Int) {
        for i in 0..<n { fifo[(fifoStart + fifoCount + i) % fifo.count] = p[i] }
        fifoCount += n
    }

    private func rms(_ p: UnsafeMutableBufferPointer<Int16>) -> Double {
        var e = 0.0
        for i in 0..<spf { e += Double(p[i]) * Double(p[i]) }
        return (e / Double(spf)).squareRoot()
    }

    private func comfortNoise(into p: UnsafeMutableBufferPointer<Int16>) {
        for i in 0..<spf {
            noiseState = noiseState &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let u = Double(Int64(bitPattern: noiseState) >> 11) / Double(1 << 52)  // -1...1
            noiseLow = 0.7 * noiseLow + 0.3 * u
            p[i] = Int16(clamping: Int(noiseLow * noiseFloor * 3))
        }
    }

    private func decode(slot s: Int, into p: UnsafeMutableBufferPointer<Int16>) -> Bool {
        let raw = UnsafeRawBufferPointer(start: payloads + s * configuration.maximumPayloadSize, count: slotLength[s])
        do {
            _ = try decoder.decode(raw, into: p)
            return true
        } catch { return false }
    }

    private func concealOne(into p: UnsafeMutableBufferPointer<Int16>) {
        if concealRun >= configuration.comfortNoiseAfterFrames {
            comfortNoise(into: p)
            stats.framesComfortNoise += 1
        } else {
            do { _ = try decoder.conceal(into: p) } catch { p.update(repeating: 0) }
            if concealRun == configuration.comfortNoiseAfterFrames - 1 {  // fade into comfort noise
                for i in 0..<spf {
                    let w = Double(i) / Double(spf)
                    p[i] = Int16(clamping: Int(Double(p[i]) * (1 - w)))
                }
            }
        }
        stats.framesConcealed += 1
        concealRun += 1
    }

    private func endConcealment() {
        if concealRun > 0 && Double(concealRun) * frameMs >= 150 {
            stats.interruptions += 1
            stats.interruptionMilliseconds += Int(Double(concealRun) * frameMs)
        }
        concealRun = 0
    }

    private func produce(playMs: Double) {
        var fade = resumeFade  // the concealment a packet that came while it played cut short
        resumeFade = 0
        while true {
            // Playout runs at no less than one pull of delay (see `floorMs`): shrinking
            // below that would only underrun and stretch speech back and forth.
            let target = max(targetMs(playMs), floorMs)
            let minD = estimator.minimumDelay
            var current = playMs - (Double(nextTs) * 1000 / rate + minD)
            if current > Double(configuration.maximumDelayMilliseconds) {
                if nextTs < newestExtTs { stats.catchUps += 1 }
                // Far behind the newest packet (the sender's timestamps jumped: a peer's
                // to choose), the frames but the slots' last go at once, not one by one:
                // 2^31 samples back is millions of frames, seconds of the loop below on
                // the audio thread. Only where the loop would have gone on past them.
                let far = (newestExtTs - nextTs) / Int64(spf) - Int64(slotTs.count)
                let over = Int64(min((current - target - frameMs) / frameMs, Double(Int64.max / 2))) - 1
                if min(far, over) > 0 {
                    let end = nextTs + min(far, over) * Int64(spf)
                    // (The frames the loop would have stepped on: on the playout point's grid.)
                    for i in slotTs.indices
                    where slotTs[i] >= nextTs && slotTs[i] < end && !slotPlayed[i] && (slotTs[i] - nextTs) % Int64(spf) == 0 {
                        slotPlayed[i] = true
                        stats.framesDroppedInCatchUp += 1
                    }
                    current -= Double(min(far, over)) * frameMs
                    nextTs = end
                }
                while current > target + frameMs && nextTs < newestExtTs {
                    if let s = present(nextTs) {
                        slotPlayed[s] = true
                        stats.framesDroppedInCatchUp += 1
                    }
                    nextTs += Int64(spf)
                    current -= frameMs
                }
            }
            if let s = present(nextTs) {
                waitedFrames = 0  // the wait, if any, was for this packet: it was late, not lost
                underrunFrames = 0
                let hadConcealed = concealRun > 0
                if hadConcealed && fade == 0 {  // continuation to cross-fade from
                    if concealRun >= configuration.comfortNoiseAfterFrames {
                        comfortNoise(into: concealFrame)
                    } else {
                        do { _ = try decoder.conceal(into: concealFrame) } catch { concealFrame.update(repeating: 0) }
                    }
                }
                slotPlayed[s] = true
                guard decode(slot: s, into: frame) else {
                    nextTs += Int64(spf)
                    stats.lostPackets += 1
                    stats.concealedByCause.lost += 1
                    concealOne(into: frame)
                    push(frame, spf)
                    return
                }
                stats.framesDecoded += 1
                if hadConcealed {
                    let n = fade > 0 ? fade : spf / 2
                    for i in 0..<n {
                        let w = Double(i) / Double(n)
                        frame[i] = Int16(clamping: Int(Double(concealFrame[i]) * (1 - w) + Double(frame[i]) * w))
                    }
                }
                fade = 0
                endConcealment()
                let level = rms(frame)
                let silent = level < max(3 * noiseFloor, 60)
                silentRun = silent ? silentRun + 1 : 0
                // While the stream loses packets, whole frames change only in real pauses
                // (the losses already cost quality; a warp inside an utterance adds to it).
                let careful = missingShare > lossyShare || fecHeld(playMs)
                let inPause = silent && (!careful || silentRun >= pauseFrames)
                if level < noiseFloor {
                    noiseFloor = max(1, level)
                } else if level < 4 * noiseFloor {
                    noiseFloor = min(300, noiseFloor * 1.01)
                } else {
                    noiseFloor = min(300, noiseFloor * 1.0005)
                }
                let late = current - target
                if !silent { speechSamples += spf }
                let budget =
                    configuration.maximumStretch * Double(speechSamples) + (configuration.maximumStretch > 0 ? Double(spf) : 0)
                let stretchedSoFar = Double(stats.accelerateSamples + stats.expandSamples)
                // Accelerate: too much delay.
                // Only with the next packet already buffered, so shortening never causes an underrun.
                // Shrinking speech: at half a frame over the target; while the stream loses
                // packets (FEC look-ahead held), only at a whole frame, as every stretch adds
                // to the loss's own artifacts — below that, wait for a pause. With
                // `shrinkInPausesUpToMilliseconds`, only past it, and then as fast as a pitch
                // period a frame allows (a pile-up to drain, not a drift to trim).
                let pausesFirst = Double(configuration.shrinkInPausesUpToMilliseconds)
                let pileUp = pausesFirst > 0 && late > pausesFirst
                let shrinkAt = pausesFirst > 0 ? pausesFirst : fecHeld(playMs) ? frameMs : frameMs / 2
                if (inPause ? late >= frameMs : late > shrinkAt) && present(nextTs + Int64(spf)) != nil {
                    // A whole silent frame goes only when a frame too much is buffered: dropping
                    // it earlier would land below the target and invite an insertion (oscillation).
                    if inPause {
                        stats.framesDroppedInSilence += 1
                        played(s, playMs)
                        nextTs += Int64(spf)
                        continue
                    }
                    if !silent && (pileUp || stretchedSoFar + Double(maxLag) <= budget) {
                        let n = TimeStretch.accelerate(
                            UnsafeBufferPointer(frame), into: stretched, minLag: minLag, maxLag: maxLag)
                        if n > 0 {
                            stats.accelerateSamples += spf - n
                            played(s, playMs)
                            nextTs += Int64(spf)
                            push(stretched, n)
                            return
                        }
                    }
                } else if inPause ? late < -frameMs / 4 : late < -frameMs {
                    if inPause {
                        played(s, playMs)
                        nextTs += Int64(spf)
                        push(frame, spf)
                        comfortNoise(into: concealFrame)
                        push(concealFrame, spf)
                        stats.framesInsertedInSilence += 1
                        return
                    }
                    if stretchedSoFar + Double(maxLag) <= budget {
                        let n = TimeStretch.expand(UnsafeBufferPointer(frame), into: stretched, minLag: minLag, maxLag: maxLag)
                        if n > 0 {
                            stats.expandSamples += n - spf
                            played(s, playMs)
                            nextTs += Int64(spf)
                            push(stretched, n)
                            return
                        }
                    }
                } else if inPause && late > frameMs / 4 && (late < frameMs || present(nextTs + Int64(spf)) != nil) {
                    // Less than a frame too much (a packet waited for a pull or two, or a
                    // sender whose clock runs fast) comes off in a pause too: the silent
                    // frame is cut short by it, whether the next packet is here yet or not
                    // (the target holds the margin for its jitter; waiting for it to be
                    // here held a fast sender's drift up to a frame, 15-21 ms at +300 ppm).
                    // A frame or more too much with the next one not here is a spike's
                    // backlog still coming: it waits for it, as a whole frame's drop does.
                    let cut = min(spf - 1, Int(late * rate / 1000))
                    stats.silenceTrimmedSamples += cut
                    played(s, playMs)
                    nextTs += Int64(spf)
                    push(frame, spf - cut)
                    return
                }
                played(s, playMs)
                nextTs += Int64(spf)
                push(frame, spf)
                return
            }
            // Missing. Lost (conceal or recover it, and move on) when a later packet is
            // already here. Otherwise it may just be late (jitter, a delay spike, a sender
            // whose clock runs slow): conceal and wait for it, which grows the delay,
            // NetEq-style. On a lossy stream (over 3 % missing lately) a missing packet is
            // more likely lost than late: past the delay the buffer aims at it is waited for
            // once on a jittery path and not at all on a steady one, so a burst of lost
            // packets is never waited for frame after frame. On a steady path the frames
            // concealed while waiting count for the lost ones (`waitedFrames`).
            let laterBuffered = newestExtTs > nextTs && anyBuffered(after: nextTs)
            if senderPause.contains(nextTs) && laterBuffered {
                // Nothing was sent for this frame: the sender paused. Frames already
                // played while waiting stand for it; past those, the pause plays on as
                // concealment fading to comfort noise, at the same delay. Neither is loss.
                waitedFrames = max(0, waitedFrames - 1)
                nextTs += Int64(spf)
                if underrunFrames > 0 {
                    underrunFrames -= 1
                    continue
                }
                concealOne(into: frame)
                push(frame, spf)
                return
            }
            let aim = max(targetMs(playMs), floorMs)
            // A path that held packets back in a delay spike within the last minute: a
            // missing packet with nothing after it is more likely held back again than
            // lost, however lossy the stream. Waiting for it is what plays the spike's
            // backlog instead of losing all of it; a burst of losses costs a wait only
            // until the next packet comes.
            let spiky = playMs - estimator.latestSpikeMs < Self.spikeMemoryMs
            let lossy = missingShare > lossyShare && !spiky
            // A steady path: no packet of the last ten seconds came even half a frame late.
            let steady = recentMaximumDelay(playMs) < frameMs / 2
            let mayWait = !lossy || current < aim || (!steady && current < aim + frameMs && waitedTs != nextTs)
            let overdue = !mayWait
            if !overdue && !laterBuffered { waitedTs = nextTs }
            if laterBuffered && waitedFrames > 0 {
                waitedFrames -= 1
                stats.lostPackets += 1
                stats.concealedByCause.bufferEmpty -= 1
                stats.concealedByCause.lost += 1  // it was lost, not late
                nextTs += Int64(spf)
                continue
            }
            if laterBuffered || overdue {
                stats.lostPackets += 1
                if decoder.recoversFromNextPacket, let n = present(nextTs + Int64(spf)) {
                    let raw = UnsafeRawBufferPointer(start: payloads + n * configuration.maximumPayloadSize, count: slotLength[n])
                    if (try? decoder.decodeRedundancy(from: raw, into: frame)) != nil {
                        stats.framesRecoveredByFEC += 1
                        endConcealment()
                        nextTs += Int64(spf)
                        push(frame, spf)
                        return
                    }
                }
                // Known lost when later packets came; otherwise the buffer simply ran dry.
                if laterBuffered { stats.concealedByCause.lost += 1 } else { stats.concealedByCause.bufferEmpty += 1 }
                nextTs += Int64(spf)
            } else {
                stats.concealedByCause.bufferEmpty += 1  // underrun: the playout point waits
                underrunFrames += 1
                waitingInFifo = true
                // On a steady path a missing packet is most likely lost: should a later one
                // come first, this frame stands in for it. On a jittery path the wait is the
                // delay growth the jitter asks for, whatever the packet turns out to be.
                if steady { waitedFrames += 1 }
            }
            concealOne(into: frame)
            push(frame, spf)
            return
        }
    }

    private func anyBuffered(after ext: Int64) -> Bool {
        for i in 0..<slotTs.count where slotTs[i] > ext && !slotPlayed[i] { return true }
        return false
    }

    private func played(_ s: Int, _ playMs: Double) {
        stats.packetsPlayed += 1
        delays.add(playMs - slotArrivalMs[s])
        onPacketPlayed?(UInt32(truncatingIfNeeded: nextTs), Int64(playMs * 1e6))
    }
}
