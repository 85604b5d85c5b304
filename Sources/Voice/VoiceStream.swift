/// The two halves of a voice stream, as a call uses them: a `VoiceSender` turns
/// captured frames into RTP-ready payloads (echo cancellation, preprocessing,
/// encoding, sequence and timestamp), and a `VoiceReceiver` turns arriving
/// payloads into sound at the playout clock (a lock-free packet ring between the
/// network thread and the audio clock, then the jitter buffer and the decoder).
///
/// Both keep every buffer they need from `init` on: a frame allocates nothing.
/// Neither knows about sockets; the call layer moves the bytes.

/// One encoded frame, ready for an RTP header.
public struct EncodedFrame: Sendable, Hashable {
    /// Bytes written to the payload buffer; 0 when DTX chose to send nothing.
    public var byteCount: Int
    public var sequence: UInt16
    public var timestamp: UInt32
    /// The preprocessor's voice activity decision for this frame (true without VAD).
    public var voiceActivity: Bool
}

/// How captured audio is cleaned before encoding.
public struct CaptureConfiguration: Sendable, Hashable {
    /// Run the echo canceller against the played reference (off when nothing is played, e.g. a file source).
    public var echoCancellation: Bool
    /// The echo canceller's filter length.
    public var tailMilliseconds: Int
    public var preprocessor: PreprocessorConfiguration

    public init(echoCancellation: Bool = true, tailMilliseconds: Int = 128, preprocessor: PreprocessorConfiguration = .init()) {
        self.echoCancellation = echoCancellation
        self.tailMilliseconds = tailMilliseconds
        self.preprocessor = preprocessor
    }
}

/// Captured frames in, encoded payloads out. Not thread-safe: one audio clock drives it.
public final class VoiceSender {
    public let codec: CodecConfiguration
    public let encoder: any VoiceEncoder
    private let processor: CaptureProcessor?
    private let taps: PCMTaps?
    private let cleaned: UnsafeMutableBufferPointer<Int16>
    private let silence: UnsafeMutableBufferPointer<Int16>
    private var nextSequence: UInt16
    private var nextTimestamp: UInt32
    private var lossHint: Int

    /// - Parameters:
    ///   - capture: the cleaning chain, or nil to encode the captured audio as it is.
    ///   - initialSequence/initialTimestamp: RTP starts at random values in a call (RFC 3550 §5.1).
    public init(
        codec: CodecConfiguration,
        capture: CaptureConfiguration? = CaptureConfiguration(),
        taps: PCMTaps? = nil,
        initialSequence: UInt16 = 0,
        initialTimestamp: UInt32 = 0
    ) throws(VoiceError) {
        self.codec = codec
        self.encoder = try makeEncoder(codec)
        if let capture {
            self.processor = try CaptureProcessor(
                frameSize: codec.samplesPerFrame, sampleRate: codec.sampleRate,
                echoCancellation: capture.echoCancellation, tailMilliseconds: capture.tailMilliseconds,
                preprocessor: capture.preprocessor)
        } else {
            self.processor = nil
        }
        self.taps = taps
        self.cleaned = .allocate(capacity: codec.samplesPerFrame)
        self.cleaned.initialize(repeating: 0)
        self.silence = .allocate(capacity: codec.samplesPerFrame)
        self.silence.initialize(repeating: 0)
        self.nextSequence = initialSequence
        self.nextTimestamp = initialTimestamp
        self.lossHint = codec.packetLossPercent
    }

    deinit {
        cleaned.deallocate()
        silence.deallocate()
    }

    /// The largest payload `encode` writes.
    public var maximumPayloadSize: Int { encoder.maximumPacketSize }

    /// Encodes one frame of `codec.samplesPerFrame` captured samples. `reference` is
    /// the far-end audio played at the time the frame was captured (nil: nothing played).
    public func encode(
        captured: UnsafeBufferPointer<Int16>,
        reference: UnsafeBufferPointer<Int16>?,
        into payload: UnsafeMutableRawBufferPointer
    ) throws(VoiceError) -> EncodedFrame {
        let n = codec.samplesPerFrame
        guard captured.count == n else { throw .bufferTooSmall(needed: n, available: captured.count) }
        taps?.write(.captured, captured)
        var voice = true
        let toEncode: UnsafeBufferPointer<Int16>
        if let processor {
            let ref = reference ?? UnsafeBufferPointer(silence)
            guard ref.count == n else { throw .bufferTooSmall(needed: n, available: ref.count) }
            voice = try processor.process(captured: captured, reference: ref, into: cleaned)
            toEncode = UnsafeBufferPointer(cleaned)
            taps?.write(.echoCancelled, toEncode)
        } else {
            toEncode = captured
        }
        taps?.write(.sent, toEncode)
        let bytes = try encoder.encode(toEncode, into: payload)
        let frame = EncodedFrame(byteCount: bytes, sequence: nextSequence, timestamp: nextTimestamp, voiceActivity: voice)
        // A DTX frame sends nothing but its time still passes: the timestamp moves,
        // the sequence number does not (RFC 3550: sequence counts packets sent).
        if bytes > 0 { nextSequence &+= 1 }
        nextTimestamp &+= codec.timestampStep
        return frame
    }

    /// The encoder's bitrate from now on (``BitrateController`` decides it).
    public func adapt(bitrate: Int) throws(VoiceError) {
        try encoder.setBitrate(bitrate)
    }

    /// Follows the receiver's loss reports: the encoder's loss hint, and in-band FEC
    /// on whenever loss is expected (Opus; Speex ignores both).
    public func adapt(lossPercent: Int) throws(VoiceError) {
        let hint = min(max(lossPercent, 0), 100)
        guard hint != lossHint else { return }
        lossHint = hint
        try encoder.setPacketLossPercent(hint)
        if codec.inbandFEC { try encoder.setInbandFEC(true) }
    }
}

/// Arriving payloads in (from the network thread), PCM out (on the audio clock).
///
/// `receive` only copies the packet into a single-producer/single-consumer ring:
/// the network side never waits for the audio side. `render` drains the ring into
/// the jitter buffer and pulls exactly the samples the clock asks for.
public final class VoiceReceiver: PlayoutBuffer, PlayoutTimingReporting, @unchecked Sendable {
    public let codec: CodecConfiguration
    private let ring: PacketRing
    private let playout: any PlayoutBuffer
    private let taps: PCMTaps?

    /// - Parameters:
    ///   - baseline: use speexdsp's jitter buffer with plain concealment instead of
    ///     Tusa's adaptive playout (for comparisons).
    public init(
        codec: CodecConfiguration,
        playout configuration: PlayoutConfiguration? = nil,
        baseline: Bool = false,
        taps: PCMTaps? = nil,
        ringSlots: Int = 128
    ) throws(VoiceError) {
        self.codec = codec
        var config = configuration ?? PlayoutConfiguration()
        config.sampleRate = codec.sampleRate
        config.frameDuration = codec.frameDuration
        let decoder = try makeDecoder(codec)
        self.playout =
            baseline
            ? try SpeexJitterPlayout(decoder: decoder, configuration: config)
            : try Playout(decoder: decoder, configuration: config)
        self.ring = PacketRing(slots: ringSlots, maximumPacketSize: config.maximumPayloadSize)
        self.taps = taps
    }

    /// Network side: queue one packet. False when the ring is full or the payload too large (counted).
    @discardableResult
    public func receive(sequence: UInt16, timestamp: UInt32, payload: UnsafeRawBufferPointer, arrivalNanoseconds: Int64) -> Bool {
        return ring.push(sequence: sequence, timestamp: timestamp, arrivalNanoseconds: arrivalNanoseconds, payload: payload)
    }

    /// Audio side: fills `output` with the next `output.count` samples at the codec rate.
    public func render(nowNanoseconds: Int64, into output: UnsafeMutableBufferPointer<Int16>) {
        let playout = self.playout
        while ring.pop({ sequence, timestamp, arrival, payload in
            playout.insert(sequence: sequence, timestamp: timestamp, payload: payload, arrivalNanoseconds: arrival)
        }) {}
        playout.pull(nowNanoseconds: nowNanoseconds, into: output)
        taps?.write(.received, UnsafeBufferPointer(output))
    }

    /// Packets the ring refused (full or oversized): audio clock too slow or stalled.
    public var droppedPackets: Int { ring.droppedPackets }

    // PlayoutBuffer, so a receiver can stand wherever a bare jitter buffer can (simulation, mixing).
    public func insert(sequence: UInt16, timestamp: UInt32, payload: UnsafeRawBufferPointer, arrivalNanoseconds: Int64) {
        receive(sequence: sequence, timestamp: timestamp, payload: payload, arrivalNanoseconds: arrivalNanoseconds)
    }

    public func pull(nowNanoseconds: Int64, into output: UnsafeMutableBufferPointer<Int16>) {
        render(nowNanoseconds: nowNanoseconds, into: output)
    }

    public var statistics: PlayoutStatistics { playout.statistics }

    /// When each packet's first sample is played (forwarded to the jitter buffer; for delay measurement).
    public var onPacketPlayed: ((UInt32, Int64) -> Void)? {
        get { (playout as? PlayoutTimingReporting)?.onPacketPlayed }
        set { (playout as? PlayoutTimingReporting)?.onPacketPlayed = newValue }
    }
}
