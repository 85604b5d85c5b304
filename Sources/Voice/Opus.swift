import COpus

private func opusMessage(_ code: Int32) -> String {
    String(cString: opus_strerror(code))
}

/// Opus in VOIP mode with the voice signal hint; bandwidth capped to the rate
/// (narrowband at 8 kHz, wideband at 16 kHz). CBR by default.
///
/// With DTX on, frames Opus codes as "nothing to send" (1–2 byte packets) come
/// back as 0 bytes: the receiver conceals the gap, which Opus turns into comfort noise.
public final class OpusVoiceEncoder: VoiceEncoder {
    public private(set) var configuration: CodecConfiguration
    public let maximumPacketSize = CodecLimits.maximumPacket
    private let state: OpaquePointer

    public init(_ configuration: CodecConfiguration) throws(VoiceError) {
        guard configuration.kind == .opus else {
            throw .invalidConfiguration("OpusVoiceEncoder needs kind .opus, got .\(configuration.kind.rawValue)")
        }
        try Self.validate(configuration)
        var error: Int32 = OPUS_OK
        guard let state = opus_encoder_create(Int32(configuration.sampleRate), 1, OPUS_APPLICATION_VOIP, &error),
            error == OPUS_OK
        else { throw .library("opus_encoder_create: \(opusMessage(error))", code: error) }
        self.state = state
        self.configuration = configuration
        let bandwidth = configuration.sampleRate == 16_000 ? OPUS_BANDWIDTH_WIDEBAND : OPUS_BANDWIDTH_NARROWBAND
        try set(OPUS_SET_SIGNAL_REQUEST, OPUS_SIGNAL_VOICE, "OPUS_SET_SIGNAL")
        try set(OPUS_SET_MAX_BANDWIDTH_REQUEST, bandwidth, "OPUS_SET_MAX_BANDWIDTH")
        try set(OPUS_SET_BITRATE_REQUEST, Int32(configuration.bitrate), "OPUS_SET_BITRATE")
        try set(OPUS_SET_COMPLEXITY_REQUEST, Int32(configuration.complexity), "OPUS_SET_COMPLEXITY")
        try set(OPUS_SET_VBR_REQUEST, configuration.constantBitrate ? 0 : 1, "OPUS_SET_VBR")
        try set(OPUS_SET_DTX_REQUEST, configuration.discontinuousTransmission ? 1 : 0, "OPUS_SET_DTX")
        try set(OPUS_SET_INBAND_FEC_REQUEST, configuration.inbandFEC ? 1 : 0, "OPUS_SET_INBAND_FEC")
        try set(OPUS_SET_PACKET_LOSS_PERC_REQUEST, Int32(configuration.packetLossPercent), "OPUS_SET_PACKET_LOSS_PERC")
    }

    deinit { opus_encoder_destroy(state) }

    static func validate(_ c: CodecConfiguration) throws(VoiceError) {
        guard CodecLimits.opusSampleRates.contains(c.sampleRate) else {
            throw .invalidConfiguration("Opus sampleRate \(c.sampleRate) Hz is not 8000 (narrowband) or 16000 (wideband)")
        }
        try CodecLimits.check(c.bitrate, in: CodecLimits.opusBitrate, "Opus bitrate", unit: " b/s")
        try CodecLimits.checkCommon(c)
    }

    private func set(_ request: Int32, _ value: Int32, _ name: String) throws(VoiceError) {
        let result = copus_encoder_set(state, request, value)
        guard result == OPUS_OK else { throw .library("\(name)(\(value)): \(opusMessage(result))", code: result) }
    }

    /// The encoder's algorithmic delay in samples at the codec rate (OPUS_GET_LOOKAHEAD).
    public var lookahead: Int {
        var value: Int32 = 0
        return copus_encoder_get(state, OPUS_GET_LOOKAHEAD_REQUEST, &value) == OPUS_OK ? Int(value) : 0
    }

    public func encode(_ pcm: UnsafeBufferPointer<Int16>, into packet: UnsafeMutableRawBufferPointer) throws(VoiceError) -> Int {
        try CodecLimits.checkPCM(pcm.count, configuration)
        guard let input = pcm.baseAddress else { throw .bufferTooSmall(needed: configuration.samplesPerFrame, available: 0) }
        guard let output = packet.baseAddress, packet.count > 0 else {
            throw .invalidConfiguration("packet buffer is empty; size it with maximumPacketSize (\(maximumPacketSize))")
        }
        let capacity = Int32(min(packet.count, maximumPacketSize))
        let written = opus_encode(
            state, input, Int32(configuration.samplesPerFrame),
            output.assumingMemoryBound(to: UInt8.self), capacity)
        guard written >= 0 else { throw .library("opus_encode: \(opusMessage(written))", code: written) }
        if configuration.discontinuousTransmission && written <= 2 { return 0 }
        return Int(written)
    }

    public func setPacketLossPercent(_ percent: Int) throws(VoiceError) {
        try CodecLimits.check(percent, in: CodecLimits.packetLossPercent, "packetLossPercent", unit: "%")
        try set(OPUS_SET_PACKET_LOSS_PERC_REQUEST, Int32(percent), "OPUS_SET_PACKET_LOSS_PERC")
        configuration.packetLossPercent = percent
    }

    public func setBitrate(_ bitsPerSecond: Int) throws(VoiceError) {
        try CodecLimits.check(bitsPerSecond, in: CodecLimits.opusBitrate, "Opus bitrate", unit: " b/s")
        try set(OPUS_SET_BITRATE_REQUEST, Int32(bitsPerSecond), "OPUS_SET_BITRATE")
        configuration.bitrate = bitsPerSecond
    }

    public func setInbandFEC(_ enabled: Bool) throws(VoiceError) {
        try set(OPUS_SET_INBAND_FEC_REQUEST, enabled ? 1 : 0, "OPUS_SET_INBAND_FEC")
        configuration.inbandFEC = enabled
    }
}

/// Opus decoder. A packet holding less audio than the configured frame (a 10 ms
/// packet into a 20 ms decoder) is completed with concealment, so every call
/// still yields exactly one frame; a packet holding more is rejected before decoding.
public final class OpusVoiceDecoder: VoiceDecoder {
    public let configuration: CodecConfiguration
    private let state: OpaquePointer

    public init(_ configuration: CodecConfiguration) throws(VoiceError) {
        guard configuration.kind == .opus else {
            throw .invalidConfiguration("OpusVoiceDecoder needs kind .opus, got .\(configuration.kind.rawValue)")
        }
        guard CodecLimits.opusSampleRates.contains(configuration.sampleRate) else {
            throw .invalidConfiguration(
                "Opus sampleRate \(configuration.sampleRate) Hz is not 8000 (narrowband) or 16000 (wideband)")
        }
        var error: Int32 = OPUS_OK
        guard let state = opus_decoder_create(Int32(configuration.sampleRate), 1, &error), error == OPUS_OK else {
            throw .library("opus_decoder_create: \(opusMessage(error))", code: error)
        }
        self.state = state
        self.configuration = configuration
    }

    deinit { opus_decoder_destroy(state) }

    /// Opus can rebuild a lost frame from the in-band FEC of the next packet (when the sender enabled it).
    public var recoversFromNextPacket: Bool { true }

    private func output(_ pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> UnsafeMutablePointer<Int16> {
        let needed = configuration.samplesPerFrame
        guard pcm.count >= needed, let base = pcm.baseAddress else {
            throw .bufferTooSmall(needed: needed, available: pcm.count)
        }
        return base
    }

    private func fail(_ function: String, _ code: Int32) -> VoiceError {
        if code == OPUS_INVALID_PACKET || code == OPUS_BUFFER_TOO_SMALL || code == OPUS_BAD_ARG {
            return .invalidPacket("\(function): \(opusMessage(code))")
        }
        return .library("\(function): \(opusMessage(code))", code: code)
    }

    public func decode(_ packet: UnsafeRawBufferPointer, into pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        let out = try output(pcm)
        try CodecLimits.checkPacket(packet)
        guard let data = packet.baseAddress?.assumingMemoryBound(to: UInt8.self) else { throw .invalidPacket("empty packet") }
        let length = Int32(packet.count)
        let frame = Int32(configuration.samplesPerFrame)
        let samples = opus_packet_get_nb_samples(data, length, Int32(configuration.sampleRate))
        guard samples >= 0 else { throw fail("opus_packet_get_nb_samples", samples) }
        guard samples <= frame else {
            throw .invalidPacket("packet holds \(samples) samples, more than the \(frame)-sample frame")
        }
        let decoded = opus_decode(state, data, length, out, frame, 0)
        guard decoded >= 0 else { throw fail("opus_decode", decoded) }
        if decoded < frame {
            let rest = opus_decode(state, nil, 0, out + Int(decoded), frame - decoded, 0)
            guard rest >= 0 else { throw fail("opus_decode (concealment)", rest) }
            if decoded + rest < frame { (out + Int(decoded + rest)).update(repeating: 0, count: Int(frame - decoded - rest)) }
        }
        return Int(frame)
    }

    public func decodeRedundancy(from nextPacket: UnsafeRawBufferPointer, into pcm: UnsafeMutableBufferPointer<Int16>)
        throws(VoiceError) -> Int
    {
        let out = try output(pcm)
        try CodecLimits.checkPacket(nextPacket)
        guard let data = nextPacket.baseAddress?.assumingMemoryBound(to: UInt8.self) else { throw .invalidPacket("empty packet") }
        let length = Int32(nextPacket.count)
        let samples = opus_packet_get_nb_samples(data, length, Int32(configuration.sampleRate))
        guard samples >= 0 else { throw fail("opus_packet_get_nb_samples", samples) }
        let frame = Int32(configuration.samplesPerFrame)
        let decoded = opus_decode(state, data, length, out, frame, 1)
        guard decoded >= 0 else { throw fail("opus_decode (FEC)", decoded) }
        if decoded < frame { (out + Int(decoded)).update(repeating: 0, count: Int(frame - decoded)) }
        return Int(frame)
    }

    public func conceal(into pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        let out = try output(pcm)
        let frame = Int32(configuration.samplesPerFrame)
        let decoded = opus_decode(state, nil, 0, out, frame, 0)
        guard decoded >= 0 else { throw fail("opus_decode (concealment)", decoded) }
        if decoded < frame { (out + Int(decoded)).update(repeating: 0, count: Int(frame - decoded)) }
        return Int(frame)
    }

    public func reset() { _ = copus_decoder_reset(state) }
}
