import Secure
import TusaBase

/// A member of a room, numbered by the relay in join order (never reused in a room).
public struct MemberID: Hashable, Sendable, Comparable, Codable, CustomStringConvertible {
    public var value: UInt16
    public init(_ value: UInt16) { self.value = value }
    public static func < (a: MemberID, b: MemberID) -> Bool { a.value < b.value }
    public var description: String { "#\(value)" }
}

/// An audio level as RFC 6464 means it: 0 is the loudest (0 dBov), 127 silence
/// (−127 dBov or less); `voiced` is the sender's voice-activity flag.
public struct AudioLevel: Hashable, Sendable {
    public var level: UInt8
    public var voiced: Bool

    public init(level: UInt8, voiced: Bool) {
        self.level = min(level, 127)
        self.voiced = voiced
    }

    public init(byte: UInt8) { self.init(level: byte & 0x7F, voiced: byte & 0x80 != 0) }
    public var byte: UInt8 { (voiced ? 0x80 : 0) | level }
    public static let silence = AudioLevel(level: 127, voiced: false)
}

/// How party packets ride the hop-by-hop secure session between a member and
/// the relay: as the payload of secure media packets of one RTP payload type
/// (voice frames keep their RTP timestamp, so a capture dissects as RTP).
public enum PartyHop {
    public static let payloadType: UInt8 = 111
}

/// The kinds of packet a member and the relay exchange inside their hop-by-hop
/// session: the first byte.
public enum PartyPacketType: UInt8, Sendable {
    /// A voice frame: a header the relay reads, then the end-to-end sealed audio.
    case media = 0x01
    /// A control message (``PartyControl``): a sequence number, then JSON (``ControlChannel``).
    case control = 0x02
    /// The acknowledgement of a control message (``ControlChannel``).
    case ack = 0x03
    /// A part of a control message too long for one packet: the message goes on in
    /// the packet with the next sequence number (``ControlChannel``).
    case controlPart = 0x04
    /// The last part of a control message that came in parts (``ControlChannel``).
    case controlLastPart = 0x05
}

/// A voice frame as it travels member → relay → members, unchanged by the relay.
///
/// ```
///  0      type (0x01)
///  1-2    sender's member id        ┐
///  3-4    sequence number           │ read by the relay: who sends, the order,
///  5-8    RTP timestamp             │ the timing and the level, never the audio
///  9      audio level (V | level)   ┘
///  10…    SFrame header (KID, CTR), then ChaCha20-Poly1305 ciphertext ‖ tag
/// ```
/// Everything before the ciphertext is the AEAD's associated data: a relay that
/// changes the sender, sequence, timing or level makes the frame unopenable.
public struct PartyFrameHeader: Hashable, Sendable {
    public static let fixedLength = 10

    public var sender: MemberID
    public var sequence: UInt16
    public var timestamp: UInt32
    public var level: AudioLevel
    public var sframe: SFrameHeader

    public init(sender: MemberID, sequence: UInt16, timestamp: UInt32, level: AudioLevel, sframe: SFrameHeader) {
        self.sender = sender
        self.sequence = sequence
        self.timestamp = timestamp
        self.level = level
        self.sframe = sframe
    }

    /// The header's length on the wire (the fixed part and the SFrame header).
    public var length: Int { Self.fixedLength + sframe.encodedLength }

    public func encode(into out: inout [UInt8]) {
        out.append(PartyPacketType.media.rawValue)
        out.appendUInt16(sender.value)
        out.appendUInt16(sequence)
        out.appendUInt32(timestamp)
        out.append(level.byte)
        sframe.encode(into: &out)
    }

    /// Reads the header of a media packet; the rest is the sealed payload.
    public static func decode(_ bytes: [UInt8]) throws(PartyWireError) -> PartyFrameHeader {
        guard bytes.count >= fixedLength else { throw .truncated("party frame") }
        guard bytes[0] == PartyPacketType.media.rawValue else { throw .unknownType(bytes[0]) }
        let (sframe, _) = try SFrameHeader.decode(bytes[fixedLength...])
        return PartyFrameHeader(
            sender: MemberID(bytes.readUInt16(at: 1)), sequence: bytes.readUInt16(at: 3), timestamp: bytes.readUInt32(at: 5),
            level: AudioLevel(byte: bytes[9]), sframe: sframe)
    }

    /// The RTP timestamp of a voice frame (nil for other packets).
    public static func peekTimestamp(_ bytes: [UInt8]) -> UInt32? {
        guard bytes.count > fixedLength, bytes[0] == PartyPacketType.media.rawValue else { return nil }
        return bytes.readUInt32(at: 5)
    }

    /// The sender id and level alone, for the relay's hot path (no SFrame parse).
    @inlinable
    public static func peek(_ bytes: [UInt8]) -> (sender: MemberID, level: AudioLevel)? {
        guard bytes.count > fixedLength, bytes[0] == PartyPacketType.media.rawValue else { return nil }
        return (MemberID(UInt16(bytes[1]) << 8 | UInt16(bytes[2])), AudioLevel(byte: bytes[9]))
    }
}

/// Why a frame did not open.
public enum FrameOpenError: Error, Hashable, Sendable {
    case malformed(PartyWireError)
    /// The KID's owner is not the member the relay says sent it.
    case senderMismatch
    /// No key for this KID: an unknown member, an epoch not (yet) handed to us,
    /// or a step behind what we hold (said before we could hear it).
    case noKey(SenderKeyID)
    case replayed
    case authenticationFailed
}

/// Sealing and opening of voice frames under sender keys.
public enum PartyFrame {
    public static let tagLength = AEAD.tagLength

    /// Seals `audio` under `key` at `counter`, with the relay-readable header in
    /// front: the packet a member sends.
    public static func seal(
        _ audio: [UInt8], key: SenderKey, counter: UInt64, sequence: UInt16, timestamp: UInt32, level: AudioLevel
    ) throws -> [UInt8] {
        let header = PartyFrameHeader(
            sender: key.id.member, sequence: sequence, timestamp: timestamp, level: level,
            sframe: SFrameHeader(keyID: key.id.kid, counter: counter))
        var out: [UInt8] = []
        out.reserveCapacity(header.length + audio.count + tagLength)
        header.encode(into: &out)
        let ad = out
        out += try AEAD.seal(key: key.key, nonce: key.nonce(counter), ad: ad, plaintext: audio)
        return out
    }

    /// Opens a frame with `key` (its KID must be the frame's).
    public static func open(_ bytes: [UInt8], header: PartyFrameHeader, key: SenderKey) throws(FrameOpenError) -> [UInt8] {
        let n = header.length
        guard bytes.count >= n + tagLength else { throw .malformed(.truncated("party frame")) }
        do {
            return try AEAD.open(
                key: key.key, nonce: key.nonce(header.sframe.counter), ad: Array(bytes[..<n]), ciphertext: Array(bytes[n...]))
        } catch {
            throw .authenticationFailed
        }
    }
}
