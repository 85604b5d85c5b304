import STUN

/// Names what a datagram is when it is neither STUN nor ChannelData, for the
/// reason of a failure on a STUN/TURN flow: a known older or other protocol
/// where its first bytes say so (RFC 7983's demultiplexing ranges, RFC 3489's
/// header, HTTP's request line), else its first byte.
enum ForeignDatagram {
    static func describe(_ p: [UInt8]) -> String {
        guard let first = p.first else { return "an empty datagram" }
        if first <= 3 {
            let length = p.count >= 4 ? Int(p[2]) << 8 | Int(p[3]) : -1
            if p.count >= 20, length % 4 == 0, 20 + length == p.count {
                return "classic STUN (RFC 3489: no magic cookie), type 0x\(hex(UInt16(p[0]) << 8 | UInt16(p[1]), digits: 4))"
            }
            if p.count < 20 { return "a STUN-like first byte but \(p.count) bytes, shorter than a STUN header" }
            return "a STUN-like first byte but no magic cookie and a length field (\(length)) that does not fit"
        }
        if let text = httpLine(p) { return "HTTP (\(text))" }
        switch PacketKind.classify(p) {
        case .zrtp: return "ZRTP (RFC 6189; RFC 7983 first byte 16–19)"
        case .dtls:
            let version = p.count >= 3 ? dtlsVersion(p[1], p[2]) : nil
            return "a DTLS record\(version.map { " (\($0))" } ?? "") (RFC 7983 first byte 20–63)"
        case .channelData: return "ChannelData on a flow where no TURN request was seen"
        case .rtp:
            guard p.count >= 12 else { return "RTP/RTCP-like first byte but \(p.count) bytes (RFC 7983 128–191)" }
            return PacketKind.isRTCP(p) ? "RTCP (RFC 3550), not STUN" : "RTP (RFC 3550), not STUN"
        case .unassigned:
            if (4...15).contains(first) { return "first byte \(first): Tusa's secure transport (handshake range 4–15), not STUN" }
            return "first byte 0x\(hex(UInt16(first), digits: 2)): no protocol that RFC 7983 multiplexes with STUN"
        case .stun, .empty: return "not STUN"
        }
    }

    private static func hex(_ value: UInt16, digits: Int) -> String {
        let text = String(value, radix: 16, uppercase: true)
        return String(repeating: "0", count: max(0, digits - text.count)) + text
    }

    private static func dtlsVersion(_ major: UInt8, _ minor: UInt8) -> String? {
        switch (major, minor) {
        case (0xFE, 0xFF): "DTLS 1.0"
        case (0xFE, 0xFD): "DTLS 1.2"
        case (0xFE, 0xFC): "DTLS 1.3"
        default: nil
        }
    }

    /// The request or status line of an HTTP message, if the datagram starts with one.
    private static func httpLine(_ p: [UInt8]) -> String? {
        let methods = ["GET ", "POST ", "HEAD ", "PUT ", "DELETE ", "OPTIONS ", "CONNECT ", "HTTP/"]
        let head = String(decoding: p.prefix(64), as: UTF8.self)
        guard methods.contains(where: { head.hasPrefix($0) }) else { return nil }
        let line = head.split(whereSeparator: \.isNewline).first.map(String.init) ?? head
        return line.count > 40 ? String(line.prefix(40)) + "…" : line
    }
}
