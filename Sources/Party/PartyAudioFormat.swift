import TusaBase

/// How a member encodes its voice: the codec, its sample rate (the RTP clock of
/// its frames) and its frame duration. Each member tells each other member its
/// own once (again after a rejoin), sealed end to end as its sender keys are and sent before the
/// first of them, so that each listener decodes each speaker as that speaker
/// encodes: a room may mix codecs and frame lengths, and the relay neither reads
/// nor changes what anyone uses.
///
/// On the wire it ends the sealed message `tusa-party-format-v1 ‖ the room id's
/// length (1) ‖ the room id ‖ the KID of the key it goes with (8) ‖ format`
/// (``PartyMember``), the format being
/// ```
///  0      n: the codec name's length (1...15)
///  1…n    the codec name, lowercase ASCII ("opus", "speex", "l16")
///  n+1…4  the sample rate in Hz (big-endian)
///  n+5…2  the frame duration in ms (big-endian)
/// ```
/// A member that says nothing of its format (one from before formats) is decoded
/// by each listener as the listener encodes.
public struct PartyAudioFormat: Hashable, Sendable, CustomStringConvertible {
    /// The codec's name as the voice engine spells it ("opus", "speex", "l16").
    public let codec: String
    public let sampleRate: Int
    public let frameMilliseconds: Int

    public static let maximumCodecNameLength = 15
    public static let sampleRates = 1_000...384_000
    public static let frameDurations = 1...120

    /// A format, or nil when a field is outside what the wire carries.
    public init?(codec: String, sampleRate: Int, frameMilliseconds: Int) {
        guard Self.isCodecName(Array(codec.utf8)), Self.sampleRates.contains(sampleRate),
            Self.frameDurations.contains(frameMilliseconds)
        else { return nil }
        self.codec = codec
        self.sampleRate = sampleRate
        self.frameMilliseconds = frameMilliseconds
    }

    public var description: String { "\(codec) \(sampleRate) Hz \(frameMilliseconds) ms" }

    public func encode(into out: inout [UInt8]) {
        let name = Array(codec.utf8)
        out.append(UInt8(name.count))
        out += name
        out.appendUInt32(UInt32(sampleRate))
        out.appendUInt16(UInt16(frameMilliseconds))
    }

    /// Reads a format that fills `bytes` exactly.
    public static func decode(_ bytes: ArraySlice<UInt8>) throws(PartyWireError) -> PartyAudioFormat {
        let b = Array(bytes)
        guard let n = b.first.map(Int.init), b.count == 1 + n + 6 else {
            throw .truncated("audio format")
        }
        let name = Array(b[1..<(1 + n)])
        let rate = Int(b.readUInt32(at: 1 + n))
        let frame = Int(b.readUInt16(at: 5 + n))
        guard isCodecName(name),
            let format = PartyAudioFormat(
                codec: String(decoding: name, as: UTF8.self), sampleRate: rate, frameMilliseconds: frame)
        else { throw .malformed("audio format: codec \(name.count) bytes, \(rate) Hz, \(frame) ms") }
        return format
    }

    private static func isCodecName(_ name: [UInt8]) -> Bool {
        (1...maximumCodecNameLength).contains(name.count)
            && name.allSatisfy {
                (UInt8(ascii: "a")...UInt8(ascii: "z")).contains($0) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0)
            }
    }
}
