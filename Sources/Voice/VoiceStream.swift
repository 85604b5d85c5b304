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
    /// The payload is redundant audio (``RedundantAudio``: the previous frames
    /// beside this one), to be sent under the "red" payload type.
    public var redundant = false
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

    /// The echo canceller for what `source` captures while `sink` plays: with a live
    /// device at either end the echo comes back through the devices' own queues and the
    /// sound server's (60-150 ms before the room adds its own, more on a busy machine),
    /// so the filter spans 256 ms; 128 ms otherwise.
    public static func echoCancelling(source: AudioSource?, sink: AudioSink?) -> CaptureConfiguration {
        CaptureConfiguration(tailMilliseconds: AudioDevices.areLive(source: source, sink: sink) ? 256 : 128)
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
    /// Previous frames each payload carries again (0: plain payloads).
    public private(set) var redundancy = 0
    /// The payload type the redundant blocks name (the codec's, as the call sends it).
    public let blockPayloadType: UInt8
    /// The primary frame, encoded before the redundant payload is built around it.
    private let primary: UnsafeMutableRawBufferPointer
    /// The last two frames sent (the newest at `newest`), their lengths and timestamps.
    private let history: UnsafeMutableRawBufferPointer
    private var historyLength = [0, 0]
    private var historyTimestamp: [UInt32] = [0, 0]
    private var newest = 0
    /// The largest redundant payload: blocks that would pass it are left out.
    public static let redundantPayloadLimit = 1200

    /// - Parameters:
    ///   - capture: the cleaning chain, or nil to encode the captured audio as it is.
    ///   - initialSequence/initialTimestamp: RTP starts at random values in a call (RFC 3550 §5.1).
    public init(
        codec: CodecConfiguration,
        capture: CaptureConfiguration? = CaptureConfiguration(),
        taps: PCMTaps? = nil,
        initialSequence: UInt16 = 0,
        initialTimestamp: UInt32 = 0,
        blockPayloadType: UInt8 = 111
    ) throws(VoiceError) {
        self.codec = codec
        self.encoder = try makeEncoder(codec)
        self.blockPayloadType = blockPayloadType
        primary = .allocate(byteCount: encoder.maximumPacketSize, alignment: 16)
        history = .allocate(byteCount: 2 * encoder.maximumPacketSize, alignment: 16)
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
        primary.deallocate()
        history.deallocate()
    }

    /// The largest payload `encode` writes.
    public var maximumPayloadSize: Int {
        max(encoder.maximumPacketSize + RedundantAudio.overhead(redundant: 0), Self.redundantPayloadLimit)
    }

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
        let bytes = try encoder.encode(toEncode, into: primary)
        var written = bytes
        if bytes > 0 {
            written = try redundancy > 0 ? writeRedundant(bytes, into: payload) : copyPrimary(bytes, into: payload)
            remember(bytes)
        }
        var frame = EncodedFrame(byteCount: written, sequence: nextSequence, timestamp: nextTimestamp, voiceActivity: voice)
        frame.redundant = bytes > 0 && redundancy > 0
        // A DTX frame sends nothing but its time still passes: the timestamp moves,
        // the sequence number does not (RFC 3550: sequence counts packets sent).
        if bytes > 0 { nextSequence &+= 1 }
        nextTimestamp &+= codec.timestampStep
        return frame
    }

    private func copyPrimary(_ bytes: Int, into payload: UnsafeMutableRawBufferPointer) throws(VoiceError) -> Int {
        guard payload.count >= bytes else { throw .bufferTooSmall(needed: bytes, available: payload.count) }
        payload.copyMemory(from: UnsafeRawBufferPointer(rebasing: primary[0..<bytes]))
        return bytes
    }

    /// The primary behind the last `redundancy` frames sent (those within reach of
    /// a header, and of ``redundantPayloadLimit``).
    private func writeRedundant(_ bytes: Int, into payload: UnsafeMutableRawBufferPointer) throws(VoiceError) -> Int {
        let size = encoder.maximumPacketSize
        func block(_ back: Int) -> RedundantAudio.Block? {
            let index = back == 1 ? newest : 1 - newest
            let length = historyLength[index]
            let offset = nextTimestamp &- historyTimestamp[index]
            guard back <= redundancy, length > 0, length <= RedundantAudio.maximumBlockLength, offset > 0,
                offset <= RedundantAudio.maximumOffset
            else { return nil }
            return RedundantAudio.Block(
                offset: offset, bytes: UnsafeRawBufferPointer(rebasing: history[(index * size)..<(index * size + length)]))
        }
        var previous = block(1)
        var older = previous == nil ? nil : block(2)
        let limit = Self.redundantPayloadLimit - RedundantAudio.overhead(redundant: 2) - bytes
        if (older?.bytes.count ?? 0) + (previous?.bytes.count ?? 0) > limit { older = nil }
        if (previous?.bytes.count ?? 0) > limit { previous = nil }
        return try RedundantAudio.write(
            primary: UnsafeRawBufferPointer(rebasing: primary[0..<bytes]), payloadType: blockPayloadType, older: older,
            previous: previous, into: payload)
    }

    /// Keeps the frame just encoded as the newest of the two previous frames.
    private func remember(_ bytes: Int) {
        let size = encoder.maximumPacketSize
        newest = 1 - newest
        UnsafeMutableRawBufferPointer(rebasing: history[(newest * size)..<(newest * size + bytes)])
            .copyMemory(from: UnsafeRawBufferPointer(rebasing: primary[0..<bytes]))
        historyLength[newest] = bytes
        historyTimestamp[newest] = nextTimestamp
    }

    /// Carries the previous `depth` frames (0–2) in every payload from now on
    /// (``RedundantAudio``); 0 sends plain payloads.
    public func adapt(redundancy depth: Int) {
        redundancy = min(max(depth, 0), RedundantAudio.maximumDepth)
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

    /// Network side: queue one packet (`redundant`: its payload is ``RedundantAudio``,
    /// sent under the "red" payload type). False when the ring is full or the payload
    /// too large (counted).
    @discardableResult
    public func receive(
        sequence: UInt16, timestamp: UInt32, payload: UnsafeRawBufferPointer, arrivalNanoseconds: Int64, redundant: Bool = false
    ) -> Bool {
        return ring.push(
            sequence: sequence, timestamp: timestamp, arrivalNanoseconds: arrivalNanoseconds, payload: payload,
            redundant: redundant)
    }

    /// Whether ``insert(sequence:timestamp:payload:arrivalNanoseconds:)`` (the
    /// `PlayoutBuffer` path: simulations, mixing) takes its payloads as redundant audio.
    public var redundantPayloads = false

    /// Redundant-audio payloads that did not parse (dropped).
    public private(set) var malformedRedundant = 0

    /// Audio side: fills `output` with the next `output.count` samples at the codec rate.
    public func render(nowNanoseconds: Int64, into output: UnsafeMutableBufferPointer<Int16>) {
        let playout = self.playout
        var malformed = 0
        while ring.popPacket({ sequence, timestamp, arrival, payload, redundant in
            guard redundant else {
                playout.insert(sequence: sequence, timestamp: timestamp, payload: payload, arrivalNanoseconds: arrival)
                return
            }
            // The previous frames first, as if their packets had come now; then the packet's own.
            do {
                try RedundantAudio.forEachBlock(payload) { offset, back, bytes in
                    guard !bytes.isEmpty else { return }
                    if back == 0 {
                        playout.insert(sequence: sequence, timestamp: timestamp, payload: bytes, arrivalNanoseconds: arrival)
                    } else {
                        playout.insertRedundant(
                            sequence: sequence &- UInt16(truncatingIfNeeded: back), timestamp: timestamp &- offset,
                            back: back, payload: bytes, arrivalNanoseconds: arrival)
                    }
                }
            } catch {
                malformed += 1
            }
        }) {}
        malformedRedundant += malformed
        playout.pull(nowNanoseconds: nowNanoseconds, into: output)
        taps?.write(.received, UnsafeBufferPointer(output))
    }

    /// Packets the ring refused (full or oversized): audio clock too slow or stalled.
    public var droppedPackets: Int { ring.droppedPackets }

    // PlayoutBuffer, so a receiver can stand wherever a bare jitter buffer can (simulation, mixing).
    public func insert(sequence: UInt16, timestamp: UInt32, payload: UnsafeRawBufferPointer, arrivalNanoseconds: Int64) {
        receive(
            sequence: sequence, timestamp: timestamp, payload: payload, arrivalNanoseconds: arrivalNanoseconds,
            redundant: redundantPayloads)
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
