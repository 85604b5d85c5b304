import Foundation
import Party
import Synchronization
import Transport
import Voice

/// What a party member heard of one speaker.
public struct PartySpeakerReport: Sendable, Equatable {
    public var member: MemberID
    /// How the speaker encodes (as it said; else as this member does):
    /// the playout figures count its frames, at its rate.
    public var codec: CodecConfiguration
    public var playout: PlayoutStatistics
    /// The speaker's frames that arrived (after the relay's speaker selection), all
    /// of them: also before it left and came back to its seat (a lost session, a
    /// relay restart), or changed its format. The playout figures are its current
    /// jitter buffer's.
    public var packetsReceived: Int
    /// The jitter buffers the speaker had: one, and one more each time it came back
    /// after leaving or changed to a format another decoder reads.
    public var jitterBuffers: Int
}

/// A party's voice on one member: one real-time thread ticks every 5 ms; at
/// each frame boundary it reads the source, encodes, measures the level
/// (RFC 6464) and sends the frame through the ``PartyConnection``; every tick it
/// pulls each speaker's jitter buffer, mixes them (``Mixer``, no clipping) and
/// writes the mix to the sink. The mix is also the echo canceller's reference.
///
/// Each speaker is decoded as it encodes: it says its codec, rate and frame duration,
/// sealed as its sender keys are (``PartyAudioFormat``, ``announcedFormat``), and a speaker at
/// another rate is resampled into the mix. A room may mix Opus, Speex and L16 at 10
/// and 20 ms. A speaker that says nothing is decoded as this member encodes; one
/// whose format this build cannot decode is left out, with the reason
/// (``undecodableSpeakers``, ``onUndecodableSpeaker``).
///
/// Make it before connecting, pass ``audioHandler`` as the connection's audio
/// handler (speakers get a jitter buffer each, on their first frame), then
/// ``start(sending:)`` once in a room.
public final class PartyVoice: @unchecked Sendable {
    public let codec: CodecConfiguration
    private let sender: VoiceSender
    private let receivers = Mutex<[MemberID: Speaker]>([:])
    /// Each speaker's frames that arrived and the jitter buffers it had, since it was first heard.
    private let received = Mutex<[MemberID: (packets: Int, buffers: Int)]>([:])
    /// Speakers whose format this build cannot decode: the format and why (their
    /// frames are dropped without another try until the format changes).
    private let undecodable = Mutex<[MemberID: (format: PartyAudioFormat?, why: String)]>([:])
    /// What was heard of speakers who left, as they left (``forget(_:)``).
    private let departed = Mutex<(reports: [MemberID: PartySpeakerReport], order: [MemberID])>(([:], []))
    private let source: FrameSource?
    private let sink: AudioSink?
    private let sinkResampler: Resampler?
    /// Whether a sound card is on the clock (a live microphone or speaker): only then is
    /// the audio thread raised ahead of ordinary work (files and tests are not real time).
    private let live: Bool
    /// The sound card whose clock the voice clock follows (``DeviceClockFollower``), when one is live.
    private let cardClock: CardClock?
    private let playout: PlayoutConfiguration
    private let running = Atomic<Bool>(false)
    private let sent = Atomic<Int>(0)
    private let ended = Atomic<Bool>(false)
    private let failure = Mutex<String?>(nil)
    /// Whether the failure ends the member's stay: a source's or a speaker's does,
    /// a recording's (a full disk) does not (``AudioSink/failureEndsCall``).
    private let failureLeaves = Atomic<Bool>(false)
    /// When the clock started (the room joined) and when a speaker's first packet played (monotonic ns, 0 before).
    private let startedAt = Atomic<Int64>(0)
    private let firstPlayed = AtomicBox()
    private let threadExit = Mutex<(ended: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))
    private var connection: PartyConnection?
    /// Called once on the audio thread when the source has no more audio.
    public var onSourceEnded: (@Sendable () -> Void)?
    /// Called on the connection's event loop, once per speaker and format, when a
    /// speaker says it encodes in a way this build cannot decode (it is not heard).
    public var onUndecodableSpeaker: (@Sendable (MemberID, String) -> Void)?

    /// - Parameter playout: each speaker's jitter buffer (rate and frame come from
    ///   `codec`); by default ``defaultPlayout(for:)``.
    public init(
        codec: CodecConfiguration, source: AudioSource?, sink: AudioSink?, echoCancellation: Bool = false,
        playout: PlayoutConfiguration? = nil
    ) throws(VoiceError) {
        self.codec = codec
        let playout = playout ?? Self.defaultPlayout(for: codec)
        self.playout = playout
        _ = try VoiceReceiver(codec: codec, playout: playout)  // a bad configuration fails here, not at a speaker's first frame
        sender = try VoiceSender(
            codec: codec, capture: echoCancellation ? .echoCancelling(source: source, sink: sink) : nil, taps: nil)
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
    }

    /// How this member encodes, as it tells the others
    /// (``PartyMember/Configuration/audioFormat``): give it to the connection.
    public var announcedFormat: PartyAudioFormat? {
        PartyAudioFormat(
            codec: codec.kind.rawValue, sampleRate: codec.sampleRate, frameMilliseconds: codec.frameDuration.rawValue)
    }

    /// The speakers whose announced format this build cannot decode, and why.
    public var undecodableSpeakers: [MemberID: String] { undecodable.withLock { $0.mapValues(\.why) } }

    /// The connection's audio handler: each speaker's frames into its own jitter buffer,
    /// a decoder of the speaker's format.
    public var audioHandler: PartyConnection.AudioHandler {
        { [self] member, header, audio, format in
            let now = monotonicNanoseconds()
            if let known = undecodable.withLock({ $0[member] }) {
                guard known.format != format else { return }
                undecodable.withLock { $0[member] = nil }
            }
            let existing = receivers.withLock { $0[member] }
            var receiver = existing.flatMap { $0.format == format ? $0.receiver : nil }
            if receiver == nil {
                do {
                    let codec = try Speaker.codec(format, listener: self.codec, playout: self.playout)
                    if let existing, existing.format == nil, codec.kind == existing.receiver.codec.kind,
                        codec.sampleRate == existing.receiver.codec.sampleRate,
                        codec.frameDuration == existing.receiver.codec.frameDuration
                    {
                        // A speaker that said nothing of its format before says it now, and it
                        // decodes as its frames were decoded so far: the same buffer.
                        existing.format = format
                        receiver = existing.receiver
                    } else {
                        // A new speaker, or one whose format changed: its decoder is made here, on
                        // the connection's loop, not under the lock the audio thread takes each tick.
                        let made = try Speaker(
                            format: format, codec: codec, listener: self.codec, playout: self.playout,
                            firstPlayed: self.firstPlayed, chunk: self.codec.sampleRate * Self.renderMilliseconds / 1000)
                        receivers.withLock { $0[member] = made }
                        received.withLock { $0[member, default: (0, 0)].buffers += 1 }
                        receiver = made.receiver
                    }
                } catch {
                    receivers.withLock { $0[member] = nil }
                    undecodable.withLock { $0[member] = (format, "\(error)") }
                    onUndecodableSpeaker?(member, "\(error)")
                    return
                }
            }
            guard let receiver else { return }
            audio.withUnsafeBytes {
                _ = receiver.receive(sequence: header.sequence, timestamp: header.timestamp, payload: $0, arrivalNanoseconds: now)
            }
            received.withLock { $0[member, default: (0, 0)].packets += 1 }
        }
    }

    /// A party's jitter buffers play as early as a call's (a packet one 5 ms pull after
    /// the fastest arrive), but delay a late packet added (the frame concealed while it
    /// was waited for, cut short when it came) comes off in the speaker's next pause,
    /// not by speeding speech up, up to 60 ms over the target; past that (a pile-up
    /// after a TCP stall) speech plays up to 2× faster until it is back under, and past
    /// the 400 ms maximum audio is dropped
    /// (``PlayoutConfiguration/shrinkInPausesUpToMilliseconds``). A party's member runs
    /// a mixer, several streams and, as often as not, a game: time-stretching speech
    /// back after each packet a few ms late cost pairs of the four-member party 0.1-1.1
    /// PESQ beside two CPU hogs; now none (`Benchmarks/party-starvation.sh`).
    /// `tusa party --min-delay` holds more.
    public static func defaultPlayout(for codec: CodecConfiguration) -> PlayoutConfiguration {
        PlayoutConfiguration(minimumDelayMilliseconds: 0, shrinkInPausesUpToMilliseconds: 60)
    }

    /// Starts the audio clock, sending through `connection`.
    public func start(sending connection: PartyConnection) {
        guard !running.exchange(true, ordering: .acquiringAndReleasing) else { return }
        self.connection = connection
        startedAt.store(monotonicNanoseconds(), ordering: .relaxed)
        let t = Thread { [self] in
            loop(connection)
            let waiter = threadExit.withLock { exit in
                exit.ended = true
                defer { exit.waiter = nil }
                return exit.waiter
            }
            waiter?.resume()
        }
        t.name = "tusa.party.voice"
        t.qualityOfService = .userInteractive
        t.start()
    }

    /// Stops the clock (within a tick) and closes the sink.
    public func stop() async {
        guard running.exchange(false, ordering: .acquiringAndReleasing) else { return }
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let ended = threadExit.withLock { exit in
                if !exit.ended { exit.waiter = c }
                return exit.ended
            }
            if ended { c.resume() }
        }
        sink?.close()
    }

    public var framesSent: Int { sent.load(ordering: .relaxed) }
    /// From ``start(sending:)`` (the room joined) to the first packet of anyone's audio
    /// played out of its jitter buffer into the mix, in ms; nil while nobody has been
    /// heard. Joining a room where someone talks, this is how long the joiner waits
    /// for them after the join: their keys and the jitter buffer included, the join's
    /// own round trip and the speaker's queue not.
    public var startToFirstAudioMilliseconds: Double? {
        let first = firstPlayed.current
        let started = startedAt.load(ordering: .relaxed)
        guard first != 0, started != 0 else { return nil }
        return Double(max(0, first - started)) / 1e6
    }
    public var sourceEnded: Bool { ended.load(ordering: .relaxed) }
    /// The first error reading the source or writing the sink.
    public var audioError: String? { failure.withLock { $0 } }
    /// Whether ``audioError`` ends the member's stay in the room (a recording's does not).
    public var audioErrorLeaves: Bool { failureLeaves.load(ordering: .relaxed) }

    /// Each speaker heard so far, by member id: those in the room, and those who left
    /// as they were when they did (the most recent ``departedKept``).
    public var speakers: [PartySpeakerReport] {
        let counts = received.withLock { $0 }
        var all = departed.withLock { $0.reports }
        receivers.withLock { r in
            for (m, speaker) in r {
                all[m] = PartySpeakerReport(
                    member: m, codec: speaker.receiver.codec, playout: speaker.receiver.statistics,
                    packetsReceived: counts[m]?.packets ?? 0, jitterBuffers: counts[m]?.buffers ?? 0)
            }
        }
        return all.keys.sorted().compactMap { all[$0] }
    }

    /// `member` left the room: its jitter buffer and decoder go (kept, a relay that
    /// cycled members through the room would have the audio thread render each one
    /// for good), and what it heard of it stays in ``speakers``. One that comes back
    /// to its seat (it left as its session was lost) gets a new jitter buffer, and its
    /// frames go on being counted.
    public func forget(_ member: MemberID) {
        let report = speakers.first { $0.member == member }
        receivers.withLock { _ = $0.removeValue(forKey: member) }
        undecodable.withLock { _ = $0.removeValue(forKey: member) }
        guard let report else { return }
        departed.withLock { d in
            d.reports[member] = report
            d.order.removeAll { $0 == member }
            d.order.append(member)
            while d.order.count > Self.departedKept { d.reports[d.order.removeFirst()] = nil }
        }
    }

    /// How many speakers who left ``speakers`` keeps.
    public static let departedKept = 256

    /// RFC 6464's level of a frame: its power in −dBov, 0 (full scale) … 127 (silence).
    public static func level(of samples: UnsafeBufferPointer<Int16>) -> UInt8 {
        guard !samples.isEmpty else { return 127 }
        var sum = 0.0
        for s in samples { sum += Double(s) * Double(s) }
        let rms = (sum / Double(samples.count)).squareRoot()
        guard rms > 0 else { return 127 }
        let dBov = 20 * log10(rms / 32768)
        return UInt8(max(0, min(127, (-dBov).rounded())))
    }

    static let renderMilliseconds = 5
    /// A speaker none of whose packets played for this long is left out of the mix:
    /// concealment covers shorter gaps, longer ones are the relay's silence suppression.
    static let quietAfterNanoseconds: Int64 = 200_000_000
    /// Frames louder than −50 dBov count as voice (the relay forwards voice and drops
    /// silence, after a few frames' tail)…
    static let voicedLevel: UInt8 = 50
    /// …and so do quieter frames for 300 ms after one that was (the ends of words).
    static let hangoverMilliseconds = 300
    /// After voice, this many silent frames go out (the relay forwards as many), then
    /// none until voice again (DTX: frames numbered without gaps, so a listener's jitter
    /// buffer takes the timestamp jump for a pause, not for loss to wait for).
    static let silentTail = SpeakerSelector.Configuration().silentFramesForwarded

    private func loop(_ connection: PartyConnection) {
        if live { raiseAudioThreadPriority() }
        let spf = codec.samplesPerFrame
        let chunk = codec.sampleRate * Self.renderMilliseconds / 1000
        let chunksPerFrame = max(1, spf / chunk)
        let tickNs = Int64(Self.renderMilliseconds) * 1_000_000
        let mixer = Mixer(frameSize: chunk)
        var captured = [Int16](repeating: 0, count: spf)
        var played = [Int16](repeating: 0, count: spf)
        var playing = [Int16](repeating: 0, count: spf)
        var pulled = [Int16](repeating: 0, count: chunk)
        var out = [Int16](repeating: 0, count: chunk)
        var resampled = [Int16](repeating: 0, count: sinkResampler.map { $0.outputCapacity(forInput: chunk) } ?? 0)
        var payload = [UInt8](repeating: 0, count: sender.maximumPayloadSize)
        var next = monotonicNanoseconds()
        var cardClock = self.cardClock
        var sourceDone = source == nil
        var sinkFailed = false
        var tick = 0
        let hangoverFrames = Self.hangoverMilliseconds / codec.frameDuration.rawValue
        var hangover = 0
        var silentRun = 0
        while running.load(ordering: .acquiring) {
            next += Int64(Double(tickNs) * (cardClock?.scale ?? 1))
            let slot = tick % chunksPerFrame
            tick += 1
            cardClock?.pulled(.playback)
            if slot == 0, !sourceDone, let source {
                let got = captured.withUnsafeMutableBufferPointer { source.next(into: $0) }
                cardClock?.pulled(.capture)
                if got {
                    let level = captured.withUnsafeBufferPointer { Self.level(of: $0) }
                    let frame = captured.withUnsafeBufferPointer { c in
                        played.withUnsafeBufferPointer { p in
                            payload.withUnsafeMutableBytes { o in try? sender.encode(captured: c, reference: p, into: o) }
                        }
                    }
                    // Voiced: the capture chain's detector says so (when it runs) and the
                    // frame is louder than the threshold, or was within the hangover.
                    if level <= Self.voicedLevel { hangover = hangoverFrames } else if hangover > 0 { hangover -= 1 }
                    let voiced = (frame?.voiceActivity ?? false) && (level <= Self.voicedLevel || hangover > 0)
                    silentRun = voiced ? 0 : silentRun + 1
                    if let frame, frame.byteCount > 0, silentRun <= Self.silentTail {
                        connection.send(
                            Array(payload[0..<frame.byteCount]), timestamp: frame.timestamp,
                            level: AudioLevel(level: level, voiced: voiced))
                        sent.add(1, ordering: .relaxed)
                    }
                } else {
                    sourceDone = true
                    ended.store(true, ordering: .relaxed)
                    if let error = source.error {
                        failure.withLock { $0 = $0 ?? "cannot read the audio to send: \(error)" }
                        failureLeaves.store(true, ordering: .relaxed)
                    }
                    onSourceEnded?()
                }
            }
            // Every speaker's next pull; the mix takes those who spoke lately (a speaker
            // the relay stopped forwarding is silence, not its concealment's comfort noise).
            let now = monotonicNanoseconds()
            let speakers = receivers.withLock { Array($0.values) }
            mixer.begin()
            for speaker in speakers {
                pulled.withUnsafeMutableBufferPointer { speaker.render(nowNanoseconds: now, into: $0) }
                if now - speaker.lastPlayed.load(ordering: .relaxed) < Self.quietAfterNanoseconds {
                    pulled.withUnsafeBufferPointer { mixer.add($0) }
                }
            }
            out.withUnsafeMutableBufferPointer { mixer.finish(into: $0) }
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
                    failure.withLock { $0 = $0 ?? "cannot write the audio received: \(error)" }
                    if sink.failureEndsCall { failureLeaves.store(true, ordering: .relaxed) }
                }
            }
            sleepToTick(&next, tick: tickNs)
        }
    }
}

/// One speaker heard: its format, its jitter buffer (a decoder of its format),
/// when it last played a packet, and, for a speaker at another rate than the
/// listener's, the resampler into the listener's rate.
///
/// ``render(nowNanoseconds:into:)`` is for the audio thread alone (its buffers are its own).
private final class Speaker: @unchecked Sendable {
    /// As the speaker said it (read and changed on the connection's loop only).
    var format: PartyAudioFormat?
    let receiver: VoiceReceiver
    let lastPlayed = Atomic<Int64>(0)
    private let resampler: Resampler?
    /// One render's worth at the speaker's rate, and what the resampler made of it.
    private var own: [Int16]
    private var converted: [Int16]
    /// Samples at the listener's rate not yet mixed (the resampler's output does not
    /// fall on the listener's chunks).
    private var pending: [Int16]
    private var pendingCount = 0

    /// - Parameters:
    ///   - codec: how `format` decodes (``codec(_:listener:playout:)``).
    ///   - chunk: the listener's samples per render.
    init(
        format: PartyAudioFormat?, codec: CodecConfiguration, listener: CodecConfiguration, playout: PlayoutConfiguration,
        firstPlayed: AtomicBox, chunk: Int
    ) throws(VoiceError) {
        self.format = format
        receiver = try VoiceReceiver(codec: codec, playout: playout)
        if codec.sampleRate == listener.sampleRate {
            resampler = nil
            own = []
            converted = []
            pending = []
        } else {
            let r = try Resampler(from: codec.sampleRate, to: listener.sampleRate)
            resampler = r
            let ownChunk = max(1, codec.sampleRate * PartyVoice.renderMilliseconds / 1000)
            own = [Int16](repeating: 0, count: ownChunk)
            converted = [Int16](repeating: 0, count: r.outputCapacity(forInput: ownChunk))
            pending = [Int16](repeating: 0, count: chunk + converted.count)
        }
        receiver.onPacketPlayed = { [weak self] _, playNs in
            self?.lastPlayed.store(playNs, ordering: .relaxed)
            firstPlayed.setOnce(playNs)
        }
    }

    /// The decoder's configuration for a speaker's format (the listener's own when it said none).
    static func codec(
        _ format: PartyAudioFormat?, listener: CodecConfiguration, playout: PlayoutConfiguration
    ) throws(VoiceError) -> CodecConfiguration {
        guard let format else { return listener }
        let codec: CodecConfiguration
        do {
            codec = try decoderConfiguration(
                codec: format.codec, sampleRate: format.sampleRate, frameMilliseconds: format.frameMilliseconds)
        } catch {
            let why = if case .unavailable(let what) = error { what } else { "\(error)" }
            throw .invalidConfiguration("it sends \(format), which this build does not decode (\(why))")
        }
        // (Opus and Speex packets are at most 1,275 bytes; L16's grow with the rate and frame.)
        let limit = playout.maximumPayloadSize
        if codec.kind == .l16, 2 * codec.samplesPerFrame > limit {
            throw .invalidConfiguration(
                "it sends \(format), frames of \(2 * codec.samplesPerFrame) bytes, more than the \(limit) a jitter buffer holds")
        }
        return codec
    }

    /// The speaker's next `output.count` samples at the listener's rate.
    func render(nowNanoseconds now: Int64, into output: UnsafeMutableBufferPointer<Int16>) {
        guard let resampler else { return receiver.render(nowNanoseconds: now, into: output) }
        while pendingCount < output.count {
            own.withUnsafeMutableBufferPointer { receiver.render(nowNanoseconds: now, into: $0) }
            let n = own.withUnsafeBufferPointer { o in
                converted.withUnsafeMutableBufferPointer { (try? resampler.process(o, into: $0)) ?? 0 }
            }
            guard n > 0 else { break }
            for i in 0..<min(n, pending.count - pendingCount) { pending[pendingCount + i] = converted[i] }
            pendingCount = min(pending.count, pendingCount + n)
        }
        let taken = min(output.count, pendingCount)
        for i in 0..<taken { output[i] = pending[i] }
        for i in taken..<output.count { output[i] = 0 }
        for i in 0..<(pendingCount - taken) { pending[i] = pending[taken + i] }
        pendingCount -= taken
    }
}
