/// What a datagram on Tusa's single UDP port carries, from its first byte
/// (RFC 7983 / RFC 9443 demultiplexing).
public enum PacketKind: Hashable, Sendable {
    /// 0–3: STUN.
    case stun
    /// 16–19: ZRTP.
    case zrtp
    /// 20–63: DTLS.
    case dtls
    /// 64–79: TURN ChannelData.
    case channelData
    /// 128–191: RTP or RTCP (tell them apart with ``isRTCP(_:)``).
    case rtp
    /// 4–15, 80–127 and 192–255: left unassigned by those RFCs. Tusa's own
    /// handshake messages take their first byte from 4–15: 80–127 carries
    /// RFC 5766 channels 0x5000–0x7FFF, which coturn still binds.
    case unassigned
    /// An empty datagram.
    case empty

    /// Classifies a datagram by its first byte.
    public static func classify(_ bytes: some Collection<UInt8>) -> PacketKind {
        guard let b = bytes.first else { return .empty }
        switch b {
        case 0...3: return .stun
        case 16...19: return .zrtp
        case 20...63: return .dtls
        case 64...79: return .channelData
        case 128...191: return .rtp
        default: return .unassigned
        }
    }

    /// RTP and RTCP share 128–191; RTCP packet types 192–223 sit in the second
    /// byte where RTP has marker bit and payload type (RFC 5761 §4).
    public static func isRTCP(_ bytes: [UInt8]) -> Bool {
        bytes.count >= 2 && (192...223).contains(bytes[1])
    }
}
