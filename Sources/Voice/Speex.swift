import CSpeex

/// The highest Speex narrowband quality (0...10) whose CBR bit rate is at most `bitrate`
/// (speex 1.2: 2150, 3950, 5950, 8000 ×2, 11000 ×2, 15000 ×2, 18200, 24600 b/s), for VBR.
private func speexQuality(atMost bitrate: Int32) -> Float {
    switch bitrate {
    case ..<3_950: return 0
    case ..<5_950: return 1
    case ..<8_000: return 2
    case ..<11_000: return 4
    case ..<15_000: return 6
    case ..<18_200: return 8
    case ..<24_600: return 9
    default: return 10
    }
}

private func speexNarrowbandMode() -> UnsafePointer<SpeexMode>? {
    speex_lib_get_mode(SPEEX_MODEID_NB)
}

/// Speex narrowband: 8 kHz, 20 ms frames only.
///
/// `bitrate` goes through SPEEX_SET_BITRATE (the nearest mode not above it) and is
/// read back, so `configuration.bitrate` is the rate actually used. CBR turns VBR off;
/// VBR uses the quality of that mode. DTX turns on Speex's VAD as well: silent frames
/// come back as 0 bytes (in CBR too — the other frames keep the mode's size).
/// Speex has no FEC: `inbandFEC` is accepted and ignored; `packetLossPercent`
/// sets SPEEX_SET_PLC_TUNING. Complexity 0 is used as 1 (Speex's minimum).
public final class SpeexVoiceEncoder: VoiceEncoder {
    public private(set) var configuration: CodecConfiguration
    public let maximumPacketSize = 200
    private let state: UnsafeMutableRawPointer
    private let bits: UnsafeMutablePointer<SpeexBits>
    private let scratch: UnsafeMutablePointer<Int16>

    public init(_ configuration: CodecConfiguration) throws(VoiceError) {
        guard configuration.kind == .speex else {
            throw .invalidConfiguration("SpeexVoiceEncoder needs kind .speex, got .\(configuration.kind.rawValue)")
        }
        try SpeexVoiceDecoder.validateFormat(configuration)
        try CodecLimits.check(configuration.bitrate, in: CodecLimits.speexBitrate, "Speex narrowband bitrate", unit: " b/s")
        try CodecLimits.checkCommon(configuration)
        guard let mode = speexNarrowbandMode(), let state = speex_encoder_init(mode) else {
            throw .library("speex_encoder_init failed", code: -1)
        }
        self.state = state
        self.configuration = configuration
        bits = .allocate(capacity: 1)
        speex_bits_init(bits)
        scratch = .allocate(capacity: configuration.samplesPerFrame)
        var complexity = Int32(max(1, configuration.complexity))
        _ = speex_encoder_ctl(state, SPEEX_SET_COMPLEXITY, &complexity)
        var dtx: Int32 = configuration.discontinuousTransmission ? 1 : 0
        _ = speex_encoder_ctl(state, SPEEX_SET_VAD, &dtx)
        _ = speex_encoder_ctl(state, SPEEX_SET_DTX, &dtx)
        var loss = Int32(configuration.packetLossPercent)
        _ = speex_encoder_ctl(state, SPEEX_SET_PLC_TUNING, &loss)
        applyBitrate(configuration.bitrate)
    }

    deinit {
        speex_bits_destroy(bits)
        bits.deallocate()
        scratch.deallocate()
        speex_encoder_destroy(state)
    }

    /// Sets the mode nearest `bitrate`, then VBR on/off (with that mode's quality), and records the rate in use.
    private func applyBitrate(_ bitrate: Int) {
        var vbrOff: Int32 = 0
        _ = speex_encoder_ctl(state, SPEEX_SET_VBR, &vbrOff)
        var requested = Int32(bitrate)
        _ = speex_encoder_ctl(state, SPEEX_SET_BITRATE, &requested)
        var actual: Int32 = 0
        _ = speex_encoder_ctl(state, SPEEX_GET_BITRATE, &actual)
        if !configuration.constantBitrate {
            var quality = speexQuality(atMost: actual)
            var on: Int32 = 1
            _ = speex_encoder_ctl(state, SPEEX_SET_VBR, &on)
            _ = speex_encoder_ctl(state, SPEEX_SET_VBR_QUALITY, &quality)
        }
        configuration.bitrate = actual > 0 ? Int(actual) : bitrate
    }

    public func encode(_ pcm: UnsafeBufferPointer<Int16>, into packet: UnsafeMutableRawBufferPointer) throws(VoiceError) -> Int {
        try CodecLimits.checkPCM(pcm.count, configuration)
        guard let input = pcm.baseAddress else { throw .bufferTooSmall(needed: configuration.samplesPerFrame, available: 0) }
        guard let output = packet.baseAddress, packet.count > 0 else {
            throw .invalidConfiguration("packet buffer is empty; size it with maximumPacketSize (\(maximumPacketSize))")
        }
        // speex_encode_int may overwrite its input.
        scratch.update(from: input, count: configuration.samplesPerFrame)
        speex_bits_reset(bits)
        let transmit = speex_encode_int(state, scratch, bits)
        if transmit == 0 && configuration.discontinuousTransmission { return 0 }
        let needed = Int(speex_bits_nbytes(bits))
        guard needed <= packet.count else {
            throw .invalidConfiguration("packet buffer of \(packet.count) bytes is smaller than the \(needed)-byte Speex frame")
        }
        return Int(speex_bits_write(bits, output.assumingMemoryBound(to: CChar.self), Int32(packet.count)))
    }

    /// Speex has no FEC; the value is validated and stored for SPEEX_SET_PLC_TUNING.
    public func setPacketLossPercent(_ percent: Int) throws(VoiceError) {
        try CodecLimits.check(percent, in: CodecLimits.packetLossPercent, "packetLossPercent", unit: "%")
        var loss = Int32(percent)
        _ = speex_encoder_ctl(state, SPEEX_SET_PLC_TUNING, &loss)
        configuration.packetLossPercent = percent
    }

    public func setBitrate(_ bitsPerSecond: Int) throws(VoiceError) {
        try CodecLimits.check(bitsPerSecond, in: CodecLimits.speexBitrate, "Speex narrowband bitrate", unit: " b/s")
        applyBitrate(bitsPerSecond)
    }

    /// Speex has no in-band FEC: recorded only.
    public func setInbandFEC(_ enabled: Bool) throws(VoiceError) {
        configuration.inbandFEC = enabled
    }
}

/// Speex narrowband decoder with the perceptual enhancer on. Decodes the first
/// frame of each packet. No FEC: `decodeRedundancy` conceals.
public final class SpeexVoiceDecoder: VoiceDecoder {
    public let configuration: CodecConfiguration
    private var state: UnsafeMutableRawPointer
    private let bits: UnsafeMutablePointer<SpeexBits>

    public init(_ configuration: CodecConfiguration) throws(VoiceError) {
        guard configuration.kind == .speex else {
            throw .invalidConfiguration("SpeexVoiceDecoder needs kind .speex, got .\(configuration.kind.rawValue)")
        }
        try Self.validateFormat(configuration)
        guard let mode = speexNarrowbandMode(), let state = speex_decoder_init(mode) else {
            throw .library("speex_decoder_init failed", code: -1)
        }
        self.state = state
        self.configuration = configuration
        bits = .allocate(capacity: 1)
        speex_bits_init(bits)
        Self.enableEnhancer(state)
    }

    private static func enableEnhancer(_ state: UnsafeMutableRawPointer) {
        var enhancer: Int32 = 1
        _ = speex_decoder_ctl(state, SPEEX_SET_ENH, &enhancer)
    }

    deinit {
        speex_bits_destroy(bits)
        bits.deallocate()
        speex_decoder_destroy(state)
    }

    static func validateFormat(_ c: CodecConfiguration) throws(VoiceError) {
        guard c.sampleRate == 8_000 else {
            throw .invalidConfiguration(
                "Speex supports narrowband only: sampleRate must be 8000 Hz, not \(c.sampleRate) (use Opus for wideband)")
        }
        guard c.frameDuration == .ms20 else {
            throw .invalidConfiguration("Speex narrowband frames are 20 ms; \(c.frameDuration.milliseconds) ms is not supported")
        }
    }

    public var recoversFromNextPacket: Bool { false }

    private func output(_ pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> UnsafeMutablePointer<Int16> {
        let needed = configuration.samplesPerFrame
        guard pcm.count >= needed, let base = pcm.baseAddress else {
            throw .bufferTooSmall(needed: needed, available: pcm.count)
        }
        return base
    }

    public func decode(_ packet: UnsafeRawBufferPointer, into pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        let out = try output(pcm)
        try CodecLimits.checkPacket(packet)
        guard let data = packet.baseAddress?.assumingMemoryBound(to: CChar.self) else { throw .invalidPacket("empty packet") }
        // A narrowband frame starts with a 0 (no wideband layer first) and a mode of
        // 0...8. Anything else libspeex calls corrupt too, but writes a line saying so
        // to standard error for each one: a peer sending garbage would fill the user's
        // terminal. (Modes 13-15, in-band signalling and the terminator, no encoder of
        // ours sends.)
        let first = packet[0]
        guard first & 0x80 == 0, (first >> 3) & 0x0F <= 8 else {
            out.update(repeating: 0, count: configuration.samplesPerFrame)
            throw .invalidPacket("Speex: not a narrowband frame (first byte \(first))")
        }
        speex_bits_read_from(bits, data, Int32(packet.count))
        let result = speex_decode_int(state, bits, out)
        switch result {
        case 0: return configuration.samplesPerFrame
        case -1:
            out.update(repeating: 0, count: configuration.samplesPerFrame)
            throw .invalidPacket("Speex: no frame in the packet (end of stream marker)")
        default:
            out.update(repeating: 0, count: configuration.samplesPerFrame)
            throw .invalidPacket("Speex: corrupt frame (speex_decode_int returned \(result))")
        }
    }

    /// Speex carries no redundancy: this is `conceal` (the packet is only checked for size).
    public func decodeRedundancy(from nextPacket: UnsafeRawBufferPointer, into pcm: UnsafeMutableBufferPointer<Int16>)
        throws(VoiceError) -> Int
    {
        _ = try output(pcm)
        try CodecLimits.checkPacket(nextPacket)
        return try conceal(into: pcm)
    }

    public func conceal(into pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        let out = try output(pcm)
        _ = speex_decode_int(state, nil, out)
        return configuration.samplesPerFrame
    }

    /// A fresh decoder state: SPEEX_RESET_STATE leaves some history (the decoder's
    /// output after it differs from a new decoder's), so the state is recreated. Not a per-frame call.
    public func reset() {
        speex_bits_reset(bits)
        if let mode = speexNarrowbandMode(), let fresh = speex_decoder_init(mode) {
            speex_decoder_destroy(state)
            state = fresh
            Self.enableEnhancer(state)
        } else {
            var unused: Int32 = 0
            _ = speex_decoder_ctl(state, SPEEX_RESET_STATE, &unused)
        }
    }
}
