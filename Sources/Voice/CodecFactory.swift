import COpus
import CSpeex

/// An encoder for `configuration.kind`, validated and ready.
public func makeEncoder(_ configuration: CodecConfiguration) throws(VoiceError) -> any VoiceEncoder {
    switch configuration.kind {
    case .opus: return try OpusVoiceEncoder(configuration)
    case .speex: return try SpeexVoiceEncoder(configuration)
    case .l16:
        try checkL16(configuration)
        return L16Encoder(configuration)
    }
}

/// A decoder for `configuration.kind`; only `kind`, `sampleRate` and `frameDuration` matter.
public func makeDecoder(_ configuration: CodecConfiguration) throws(VoiceError) -> any VoiceDecoder {
    switch configuration.kind {
    case .opus: return try OpusVoiceDecoder(configuration)
    case .speex: return try SpeexVoiceDecoder(configuration)
    case .l16:
        try checkL16(configuration)
        return L16Decoder(configuration)
    }
}

/// The decoder's configuration for what a peer says it sends (a codec named as
/// ``CodecKind`` spells it, its rate, its frame in ms), or why this build cannot
/// decode it: `.unavailable` naming the codec or the frame, else the decoder's own refusal.
public func decoderConfiguration(codec name: String, sampleRate: Int, frameMilliseconds: Int) throws(VoiceError)
    -> CodecConfiguration
{
    guard let kind = CodecKind(rawValue: name) else { throw .unavailable("codec \(name)") }
    guard let frame = FrameDuration(rawValue: frameMilliseconds) else { throw .unavailable("\(frameMilliseconds) ms frames") }
    let configuration = CodecConfiguration(kind: kind, sampleRate: sampleRate, frameDuration: frame)
    _ = try makeDecoder(configuration)
    return configuration
}

private func checkL16(_ c: CodecConfiguration) throws(VoiceError) {
    guard (8000...48_000).contains(c.sampleRate) else {
        throw .invalidConfiguration("L16 sampleRate must be 8000...48000 Hz, not \(c.sampleRate)")
    }
}

/// The codec libraries linked in, e.g. "libopus 1.3.1, speex 1.2.1".
public func codecLibraryVersions() -> String {
    let opus = String(cString: opus_get_version_string())
    var speexVersion: UnsafePointer<CChar>? = nil
    _ = speex_lib_ctl(SPEEX_LIB_GET_VERSION_STRING, &speexVersion)
    let speex = speexVersion.map { String(cString: $0) } ?? "unknown"
    return "\(opus), speex \(speex)"
}

/// Range checks shared by the codecs; each message names the field and its range.
enum CodecLimits {
    static let complexity = 0...10
    static let packetLossPercent = 0...100
    static let opusBitrate = 6_000...510_000
    /// Speex narrowband's modes run from 2.15 kb/s (quality 0) to 24.6 kb/s (quality 10).
    static let speexBitrate = 2_150...24_600
    static let opusSampleRates = [8_000, 16_000]
    /// The largest Opus packet (RFC 6716 §3.2.1); used as the cap for Speex too.
    static let maximumPacket = 1275

    static func check(_ value: Int, in range: ClosedRange<Int>, _ field: String, unit: String = "") throws(VoiceError) {
        guard range.contains(value) else {
            throw .invalidConfiguration("\(field) \(value)\(unit) is outside \(range.lowerBound)...\(range.upperBound)\(unit)")
        }
    }

    static func checkCommon(_ c: CodecConfiguration) throws(VoiceError) {
        try check(c.complexity, in: complexity, "complexity")
        try check(c.packetLossPercent, in: packetLossPercent, "packetLossPercent", unit: "%")
    }

    static func checkPCM(_ count: Int, _ configuration: CodecConfiguration) throws(VoiceError) {
        guard count >= configuration.samplesPerFrame else {
            throw .bufferTooSmall(needed: configuration.samplesPerFrame, available: count)
        }
    }

    static func checkPacket(_ packet: UnsafeRawBufferPointer) throws(VoiceError) {
        guard packet.count > 0, packet.baseAddress != nil else { throw .invalidPacket("empty packet") }
        guard packet.count <= maximumPacket else {
            throw .invalidPacket("\(packet.count) bytes, more than the \(maximumPacket)-byte maximum")
        }
    }
}
