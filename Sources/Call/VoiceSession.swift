import Foundation
import Secure
import Synchronization
import Transport
import Voice

/// Monotonic nanoseconds: the clock media arrivals and the audio clock share.
public func monotonicNanoseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}

/// Hands authenticated media from the endpoint's event loop to the call's receiver
/// (a lock-free ring behind it). Make it before binding the endpoint, pass
/// `handler` as the endpoint's media handler, attach the receiver when the call starts.
public final class MediaRouter: Sendable {
    private let target = Mutex<(peer: PeerID, receiver: VoiceReceiver, payloadType: UInt8, redundant: UInt8)?>(nil)
    private let counters = Mutex<(packets: Int, bytes: Int, other: Int, first: Int64?)>((0, 0, 0, nil))
    private let last = Atomic<Int64>(0)

    public init() {}

    public var handler: SecureUDPEndpoint.MediaHandler {
        { [self] peer, header, payload in
            let now = monotonicNanoseconds()
            let accepted = target.withLock { t -> Bool in
                guard let t, t.peer == peer, t.payloadType == header.payloadType || t.redundant == header.payloadType else {
                    return false
                }
                t.receiver.receive(
                    sequence: header.sequenceNumber, timestamp: header.timestamp, payload: payload, arrivalNanoseconds: now,
                    redundant: header.payloadType == t.redundant)
                return true
            }
            if accepted { last.store(now, ordering: .relaxed) }
            counters.withLock { c in
                if accepted {
                    c.packets += 1
                    c.bytes += payload.count
                    if c.first == nil { c.first = now }
                } else {
                    c.other += 1
                }
            }
        }
    }

    /// Media of `payloadType` from `peer` goes to `receiver`; of `redundant`, as redundant audio.
    func attach(_ receiver: VoiceReceiver, peer: PeerID, payloadType: UInt8, redundant: UInt8) {
        target.withLock { $0 = (peer, receiver, payloadType, redundant) }
    }
    func detach() { target.withLock { $0 = nil } }
    var received: (packets: Int, bytes: Int, other: Int, first: Int64?) { counters.withLock { $0 } }
    /// When the first packet of the call's audio arrived (monotonic ns).
    public var firstArrival: Int64? { counters.withLock { $0.first } }
    /// When the latest packet of the call's audio arrived (monotonic ns).
    public var lastArrival: Int64? {
        let ns = last.load(ordering: .relaxed)
        return ns == 0 ? nil : ns
    }
}

/// A live snapshot of a call's voice.
public struct VoiceSessionStatistics: Sendable, Equatable {
    public var packetsSent = 0
    public var packetsReceived = 0
    /// The peer's latest report: share of our packets it lost, its jitter estimate.
    public var remoteLossPercent = 0.0
    public var remoteJitterMilliseconds = 0.0
    /// Round-trip time from the control reports, when known.
    public var roundTripMilliseconds: Double?
    public var playout = PlayoutStatistics()
    /// The loss hint the encoder follows now.
    public var encoderLossHint = 0
    /// The encoder's bitrate now (the configured one, lowered under heavy loss).
    public var encoderBitrate = 0
    /// Previous frames each packet carries again (``RedundancyPolicy``, from the peer's reports).
    public var redundancy = 0
    public var sourceEnded = false
    /// The first error reading the audio to send or writing the audio received
    /// (an unplugged device, a full disk, a file size limit); the call ends on it,
    /// unless it was a recording's (``AudioSink/failureEndsCall``): that one stops.
    public var audioError: String?

    /// ITU-T G.107 E-model estimate for the path as we receive it: one-way delay =
    /// RTT/2 + jitter buffer + codec framing, packet loss = ours as the playout saw it.
    public func estimatedMOS(frameMilliseconds: Int) -> Double {
        // What the listener lost: frames neither played nor rebuilt by FEC (a late
        // packet was already counted lost when its turn came).
        let expected = max(1, playout.packetsPlayed + playout.lostPackets)
        let lossPercent = 100 * Double(max(0, playout.lostPackets - playout.framesRecoveredByFEC)) / Double(expected)
        let oneWay = (roundTripMilliseconds ?? 0) / 2 + playout.delayMeanMilliseconds + Double(frameMilliseconds) + 5
        return EModel.mos(oneWayDelayMilliseconds: oneWay, lossPercent: lossPercent, fec: playout.framesRecoveredByFEC > 0)
    }
}

/// ITU-T G.107 simplified (defaults for everything but delay and loss).
public enum EModel {
    /// - Parameters:
    ///   - fec: Opus with in-band FEC: a higher packet-loss robustness factor.
    public static func mos(oneWayDelayMilliseconds d: Double, lossPercent: Double, fec: Bool = true) -> Double {
        let id = 0.024 * d + (d > 177.3 ? 0.11 * (d - 177.3) : 0)
        // Opus narrowband at 24 kb/s: equipment impairment about that of G.729 (11);
        // Bpl about 20 with FEC and concealment, 10 with concealment alone.
        let ie = 11.0
        let bpl = fec ? 20.0 : 10.0
        let ieEff = ie + (95 - ie) * lossPercent / (lossPercent + bpl)
        let r = max(0, min(100, 93.2 - id - ieEff))
        return 1 + 0.035 * r + r * (r - 60) * (100 - r) * 7e-6
    }
}

/// Voice both ways over an established secure peer: one real-time thread ticks
/// every frame, reads the source, encodes, sends, and renders the jitter buffer
/// into the sink. Control reports from the peer drive the encoder's loss hint.
public final class VoiceSession: @unchecked Sendable {
    public let codec: CodecConfiguration
    public static let payloadType: UInt8 = 111
    /// Redundant audio (RFC 2198 "red", ``RedundantAudio``) around the codec's frames.
    public static let redundantPayloadType: UInt8 = 63
    private let endpoint: SecureUDPEndpoint
    private let peer: PeerID
    private let router: MediaRouter
    private let sender: VoiceSender
    private let receiver: VoiceReceiver
    private let source: FrameSource?
    private let sink: AudioSink?
    private let sinkResampler: Resampler?
    /// Whether a sound card is on the clock (a live microphone or speaker): only then is
    /// the audio thread raised ahead of ordinary work (files and tests are not real time).
    private let live: Bool
    /// The sound card whose clock the voice clock follows (``DeviceClockFollower``), when one is live.
    private let cardClock: CardClock?
    private let running = Atomic<Bool>(false)
    private let finished = Mutex<Bool>(false)
    private let stats = Mutex(VoiceSessionStatistics())
    private let pendingHint = Atomic<Int>(-1)
    private let pendingBitrate = Atomic<Int>(-1)
    private let pendingRedundancy = Atomic<Int>(-1)
    private let bitrate: Mutex<BitrateController?>
    private let redundancy = Mutex(RedundancyPolicy())
    private let firstPlayed = AtomicBox()
    private var thread: Thread?
    /// The audio thread's end, and whoever awaits it in ``stop()``.
    private let threadExit = Mutex<(ended: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))
    /// Called once on the audio thread when the source has no more audio.
    public var onSourceEnded: (@Sendable () -> Void)?
    /// Called once on the audio thread when writing the audio received failed
    /// (``VoiceSessionStatistics/audioError`` says how), with whether that ends
    /// the call (``AudioSink/failureEndsCall``).
    public var onSinkFailed: (@Sendable (Bool) -> Void)?

    public init(
        endpoint: SecureUDPEndpoint, peer: PeerID, codec: CodecConfiguration, router: MediaRouter,
        source: AudioSource?, sink: AudioSink?, echoCancellation: Bool = false, taps: PCMTaps? = nil
    ) throws(VoiceError) {
        self.codec = codec
        self.endpoint = endpoint
        self.peer = peer
        self.router = router
        var sequence: UInt16 = 0
        var timestamp: UInt32 = 0
        withUnsafeMutableBytes(of: &sequence) { Sodium.randomBytes($0) }
        withUnsafeMutableBytes(of: &timestamp) { Sodium.randomBytes($0) }
        sender = try VoiceSender(
            codec: codec, capture: echoCancellation ? .echoCancelling(source: source, sink: sink) : nil, taps: taps,
            initialSequence: sequence, initialTimestamp: timestamp, blockPayloadType: Self.payloadType)
        receiver = try VoiceReceiver(codec: codec, taps: taps)
        self.source = try source.map { s throws(VoiceError) in
            try FrameSource(s, rate: codec.sampleRate, frame: codec.samplesPerFrame)
        }
        self.sink = sink
        live = AudioDevices.areLive(source: source, sink: sink)
        cardClock = CardClock(
            source: source, sink: sink, framesPerSecond: 1000 / codec.frameDuration.milliseconds,
            ticksPerSecond: 1000 / Self.renderMilliseconds)
        sinkResampler = try sink.flatMap { s throws(VoiceError) in
            s.sampleRate == codec.sampleRate ? nil : try Resampler(from: codec.sampleRate, to: s.sampleRate)
        }
        stats.withLock {
            $0.encoderLossHint = codec.packetLossPercent
            $0.encoderBitrate = codec.bitrate
        }
        // (L16 has one bitrate.)
        bitrate = Mutex(codec.kind == .l16 ? nil : BitrateController(maximum: codec.bitrate))
        let first = firstPlayed
        receiver.onPacketPlayed = { _, playNs in first.setOnce(playNs) }
    }

    /// When the first packet of the peer's audio was played (monotonic ns), 0 before.
    public var firstPlayedNanoseconds: Int64? {
        let v = firstPlayed.current
        return v == 0 ? nil : v
    }

    /// Starts the audio clock.
    public func start() {
        guard !running.exchange(true, ordering: .acquiringAndReleasing) else { return }
        router.attach(receiver, peer: peer, payloadType: Self.payloadType, redundant: Self.redundantPayloadType)
        // A thread of its own, not a task: the audio clock must never wait for the cooperative pool.
        let t = Thread { [self] in
            self.loop()
            let waiter = threadExit.withLock { exit in
                exit.ended = true
                defer { exit.waiter = nil }
                return exit.waiter
            }
            waiter?.resume()
        }
        t.name = "tusa.voice"
        t.qualityOfService = .userInteractive
        thread = t
        t.start()
    }

    /// Stops the clock (within a frame) and closes the sink.
    public func stop() async {
        guard running.exchange(false, ordering: .acquiringAndReleasing) else { return }
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let ended = threadExit.withLock { exit in
                if !exit.ended { exit.waiter = c }
                return exit.ended
            }
            if ended { c.resume() }
        }
        router.detach()
        sink?.close()
    }

    /// A control report from the peer (the endpoint's `.control` event).
    public func handle(report: ControlReport) {
        guard report.kind == .report else { return }
        stats.withLock { s in
            s.remoteLossPercent = Double(report.fractionLost) * 100 / 256
            s.remoteJitterMilliseconds = Double(report.jitter) * 1000 / Double(codec.sampleRate)
        }
        pendingHint.store(Int(report.lossHint), ordering: .releasing)
        // Redundant audio, sized by how the peer loses our packets (L16 is sent as it
        // is; a peer whose reports are version 1 predates redundant audio and reads none).
        if codec.kind != .l16, report.version >= 2 {
            let depth = redundancy.withLock {
                $0.report(lossPercent: Double(report.lossHint), meanBurstLength: Double(report.meanBurstLength) / 16)
            }
            pendingRedundancy.store(depth, ordering: .releasing)
        }
        if let b = bitrate.withLock({ $0?.report(lossFraction: Double(report.fractionLost) / 256) }) {
            pendingBitrate.store(b, ordering: .releasing)
        }
    }

    /// The secure layer's round-trip time, measured when each report arrived.
    public func setRoundTrip(_ rtt: Duration?) {
        guard let rtt else { return }
        stats.withLock {
            $0.roundTripMilliseconds = Double(rtt.components.seconds) * 1000 + Double(rtt.components.attoseconds) / 1e15
        }
    }

    public var statistics: VoiceSessionStatistics {
        var s = stats.withLock { $0 }
        s.packetsReceived = router.received.packets
        return s
    }

    /// The audio clock's pull, in ms: the playout can play a packet one pull after it
    /// arrives, so this, not the codec frame, is the jitter buffer's floor (as a sound
    /// card with 5 ms periods would pull).
    public static let renderMilliseconds = 5

    private func loop() {
        if live { raiseAudioThreadPriority() }
        let spf = codec.samplesPerFrame
        let chunk = codec.sampleRate * Self.renderMilliseconds / 1000
        let chunksPerFrame = max(1, spf / chunk)
        let tickNs = Int64(Self.renderMilliseconds) * 1_000_000
        var captured = [Int16](repeating: 0, count: spf)
        var played = [Int16](repeating: 0, count: spf)  // the last whole frame played: the echo reference
        var playing = [Int16](repeating: 0, count: spf)  // the frame being played, chunk by chunk
        var out = [Int16](repeating: 0, count: chunk)
        var resampled = [Int16](repeating: 0, count: sinkResampler.map { $0.outputCapacity(forInput: chunk) } ?? 0)
        var payload = [UInt8](repeating: 0, count: sender.maximumPayloadSize)
        var next = monotonicNanoseconds()
        var cardClock = self.cardClock
        var sourceDone = source == nil
        var sinkFailed = false
        var sent = 0
        var tick = 0
        while running.load(ordering: .acquiring) {
            next += Int64(Double(tickNs) * (cardClock?.scale ?? 1))
            let slot = tick % chunksPerFrame
            tick += 1
            // A frame boundary: the captured frame is complete; encode and send it.
            if slot == 0, !sourceDone, let source {
                let got = captured.withUnsafeMutableBufferPointer { source.next(into: $0) }
                cardClock?.pulled(.capture)
                if got {
                    let hint = pendingHint.exchange(-1, ordering: .acquiringAndReleasing)
                    if hint >= 0 {
                        try? sender.adapt(lossPercent: hint)
                        stats.withLock { $0.encoderLossHint = hint }
                    }
                    let depth = pendingRedundancy.exchange(-1, ordering: .acquiringAndReleasing)
                    if depth >= 0 {
                        sender.adapt(redundancy: depth)
                        stats.withLock { $0.redundancy = depth }
                    }
                    let rate = pendingBitrate.exchange(-1, ordering: .acquiringAndReleasing)
                    if rate > 0, (try? sender.adapt(bitrate: rate)) != nil {
                        stats.withLock { $0.encoderBitrate = rate }
                    }
                    let frame = captured.withUnsafeBufferPointer { c in
                        played.withUnsafeBufferPointer { p in
                            payload.withUnsafeMutableBytes { o in try? sender.encode(captured: c, reference: p, into: o) }
                        }
                    }
                    if let frame, frame.byteCount > 0 {
                        endpoint.send(
                            Array(payload[0..<frame.byteCount]), to: peer,
                            payloadType: frame.redundant ? Self.redundantPayloadType : Self.payloadType,
                            timestamp: frame.timestamp)
                        sent += 1
                    }
                } else {
                    sourceDone = true
                    stats.withLock { s in
                        s.sourceEnded = true
                        if let error = source.error, s.audioError == nil {
                            s.audioError = "cannot read the audio to send: \(error)"
                        }
                    }
                    onSourceEnded?()
                }
            }
            cardClock?.pulled(.playback)
            // Play one pull.
            let now = monotonicNanoseconds()
            out.withUnsafeMutableBufferPointer { receiver.render(nowNanoseconds: now, into: $0) }
            for i in 0..<chunk where slot * chunk + i < spf { playing[slot * chunk + i] = out[i] }
            if slot == chunksPerFrame - 1 { swap(&played, &playing) }
            if let sink, !sinkFailed {
                do {
                    if let sinkResampler {
                        let n = out.withUnsafeBufferPointer { p in
                            resampled.withUnsafeMutableBufferPointer { (try? sinkResampler.process(p, into: $0)) ?? 0 }
                        }
                        try resampled.withUnsafeBufferPointer { b throws(VoiceError) in
                            try sink.write(UnsafeBufferPointer(rebasing: b[0..<n]))
                        }
                    } else {
                        try out.withUnsafeBufferPointer { b throws(VoiceError) in try sink.write(b) }
                    }
                } catch {
                    sinkFailed = true
                    stats.withLock { s in if s.audioError == nil { s.audioError = "cannot write the audio received: \(error)" } }
                    onSinkFailed?(sink.failureEndsCall)
                }
            }
            if slot == chunksPerFrame - 1 {
                let playout = receiver.statistics
                stats.withLock {
                    $0.packetsSent = sent
                    $0.playout = playout
                }
            }
            sleepToTick(&next, tick: tickNs)
        }
    }
}

/// An audio thread's sleep to its next tick at `next` (absolute, so jitter does
/// not accumulate); after a stall of more than 20 ticks it re-anchors instead
/// of bursting.
///
/// When the absolute sleep is refused (a clock shim such as libfaketime answers
/// `EINVAL`), the rest of the tick is slept relatively: a sleep that returns at
/// once would run the thread free, sending and writing audio as fast as it is made.
func sleepToTick(_ next: inout Int64, tick: Int64) {
    let remaining = next - monotonicNanoseconds()
    if remaining < -20 * tick {
        next = monotonicNanoseconds()
    } else if remaining > 0 {
        var ts = timespec(tv_sec: Int(next / 1_000_000_000), tv_nsec: Int(next % 1_000_000_000))
        var status: Int32
        repeat { status = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nil) } while status == EINTR
        guard status != 0 else { return }
        let left = next - monotonicNanoseconds()
        guard left > 0 else { return }
        var relative = timespec(tv_sec: Int(left / 1_000_000_000), tv_nsec: Int(left % 1_000_000_000))
        var rest = timespec()
        while nanosleep(&relative, &rest) == -1 && errno == EINTR { relative = rest }
    }
}

/// Exactly one frame of samples at the codec rate from any source.
final class FrameSource {
    private let source: AudioSource
    private let resampler: Resampler?
    private var input: [Int16]
    private var converted: [Int16]
    private var fifo: [Int16] = []
    private var ended = false
    /// Why the source ended early, if it failed.
    private(set) var error: VoiceError?

    init(_ source: AudioSource, rate: Int, frame: Int) throws(VoiceError) {
        self.source = source
        resampler = source.sampleRate == rate ? nil : try Resampler(from: source.sampleRate, to: rate)
        let inputFrame = max(1, source.sampleRate * frame / rate)
        input = [Int16](repeating: 0, count: inputFrame)
        converted = [Int16](repeating: 0, count: resampler?.outputCapacity(forInput: inputFrame) ?? inputFrame)
        fifo.reserveCapacity(4 * frame + converted.count)
    }

    /// Fills `out` (one frame); false once the source has ended and nothing is left.
    func next(into out: UnsafeMutableBufferPointer<Int16>) -> Bool {
        while fifo.count < out.count && !ended {
            let n: Int
            do { n = try input.withUnsafeMutableBufferPointer { b throws(VoiceError) in try source.read(into: b) } } catch {
                self.error = error
                ended = true
                break
            }
            if n == 0 {
                ended = true
                break
            }
            if let resampler {
                let m = input.withUnsafeBufferPointer { i in
                    converted.withUnsafeMutableBufferPointer {
                        (try? resampler.process(UnsafeBufferPointer(rebasing: i[0..<n]), into: $0)) ?? 0
                    }
                }
                fifo.append(contentsOf: converted[0..<m])
            } else {
                fifo.append(contentsOf: input[0..<n])
            }
        }
        guard !fifo.isEmpty else { return false }
        let n = min(out.count, fifo.count)
        for i in 0..<n { out[i] = fifo[i] }
        for i in n..<out.count { out[i] = 0 }
        fifo.removeFirst(n)
        return true
    }
}

/// An Int64 atomic that closures can capture (Atomic itself is not copyable).
final class AtomicBox: Sendable {
    private let value = Atomic<Int64>(0)
    /// Stores `desired` only while the value is still 0.
    func setOnce(_ desired: Int64) { _ = value.compareExchange(expected: 0, desired: desired, ordering: .relaxed) }
    var current: Int64 { value.load(ordering: .relaxed) }
}
