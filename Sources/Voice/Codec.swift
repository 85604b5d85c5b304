/// The voice engine's codec interface. Opus and Speex narrowband sit behind it;
/// the jitter buffer and the pipeline know only these protocols.
///
/// Audio is mono signed 16-bit PCM. A frame is 10 or 20 ms at the codec's rate.

/// The voice engine's native rate: the DSP chain (echo canceller, preprocessor)
/// and narrowband codecs run at 8 kHz.
public let voiceSampleRate = 8000

public enum CodecKind: String, Sendable, CaseIterable, Hashable {
    case opus
    case speex
    /// Uncompressed 16-bit PCM (RTP L16): for LAN use, references and tests.
    case l16
}

public enum FrameDuration: Int, Sendable, CaseIterable, Hashable {
    case ms10 = 10
    case ms20 = 20

    public var milliseconds: Int { rawValue }

    /// Whole samples per frame at `sampleRate` (8000 → 80 / 160).
    public func samples(atRate sampleRate: Int) -> Int { sampleRate * rawValue / 1000 }
}

/// How an encoder is set up; a decoder needs only `kind`, `sampleRate` and `frameDuration`.
public struct CodecConfiguration: Sendable, Hashable {
    public var kind: CodecKind
    /// 8000 (narrowband, the default) or 16000 (Opus wideband). Speex supports 8000 only.
    public var sampleRate: Int
    public var frameDuration: FrameDuration
    /// Bits per second. Opus carries in-band FEC at narrowband only from about
    /// 24 kb/s, hence that default. Speex narrowband maps it to the nearest mode.
    public var bitrate: Int
    /// 0...10.
    public var complexity: Int
    /// Constant bitrate (the default), so packet sizes do not leak speech.
    public var constantBitrate: Bool
    /// Discontinuous transmission: the encoder may return empty frames in silence.
    public var discontinuousTransmission: Bool
    /// Opus in-band forward error correction (the previous frame at low rate, carried in the next packet).
    public var inbandFEC: Bool
    /// The expected packet loss in percent (0...100), the encoder's FEC hint.
    public var packetLossPercent: Int

    public init(
        kind: CodecKind = .opus,
        sampleRate: Int = voiceSampleRate,
        frameDuration: FrameDuration = .ms20,
        bitrate: Int = 24_000,
        complexity: Int = 5,
        constantBitrate: Bool = true,
        discontinuousTransmission: Bool = false,
        inbandFEC: Bool = true,
        packetLossPercent: Int = 10
    ) {
        self.kind = kind
        self.sampleRate = sampleRate
        self.frameDuration = frameDuration
        self.bitrate = bitrate
        self.complexity = complexity
        self.constantBitrate = constantBitrate
        self.discontinuousTransmission = discontinuousTransmission
        self.inbandFEC = inbandFEC
        self.packetLossPercent = packetLossPercent
    }

    /// Samples in one frame at the codec's rate.
    public var samplesPerFrame: Int { frameDuration.samples(atRate: sampleRate) }

    /// The RTP timestamp step per frame (the RTP clock is the codec rate).
    public var timestampStep: UInt32 { UInt32(samplesPerFrame) }
}

/// Turns PCM frames into packets. One instance per stream; not thread-safe.
public protocol VoiceEncoder: AnyObject {
    var configuration: CodecConfiguration { get }
    /// The largest packet `encode` can produce; size the output buffer with it.
    var maximumPacketSize: Int { get }
    /// Encodes exactly `configuration.samplesPerFrame` samples. Returns the bytes
    /// written to `packet`; 0 means DTX decided there is nothing to send.
    func encode(_ pcm: UnsafeBufferPointer<Int16>, into packet: UnsafeMutableRawBufferPointer) throws(VoiceError) -> Int
    /// The receiver's loss estimate, in percent: tunes Opus's FEC. Ignored by Speex.
    func setPacketLossPercent(_ percent: Int) throws(VoiceError)
    func setBitrate(_ bitsPerSecond: Int) throws(VoiceError)
    func setInbandFEC(_ enabled: Bool) throws(VoiceError)
}

/// Turns packets (or their absence) back into PCM. One instance per stream; not thread-safe.
/// Every call writes exactly `configuration.samplesPerFrame` samples (the frame
/// duration the decoder was configured with) and returns that count.
public protocol VoiceDecoder: AnyObject {
    var configuration: CodecConfiguration { get }
    /// Decodes one packet.
    func decode(_ packet: UnsafeRawBufferPointer, into pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int
    /// Rebuilds the frame *before* `nextPacket` from the redundancy it carries
    /// (Opus in-band FEC). Without redundancy this is the codec's concealment.
    func decodeRedundancy(from nextPacket: UnsafeRawBufferPointer, into pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError)
        -> Int
    /// The codec's packet-loss concealment for one missing frame.
    func conceal(into pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int
    /// Whether `decodeRedundancy` can recover anything for this codec and configuration.
    var recoversFromNextPacket: Bool { get }
    /// Forget the stream's history (after a long gap or a new sender).
    func reset()
}
