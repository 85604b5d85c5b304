/// The link-layer header types the capture reader decodes, and how to find the IP packet
/// behind each header.
enum LinkLayer: Sendable, Equatable {
    /// DLT_EN10MB (1): Ethernet II, with up to two 802.1Q / 802.1ad VLAN tags.
    case ethernet
    /// DLT_LINUX_SLL (113): Linux "cooked" capture, 16-byte header.
    case linuxCooked
    /// DLT_LINUX_SLL2 (276): Linux "cooked" capture v2, 20-byte header.
    case linuxCooked2
    /// DLT_RAW (12, 14) / LINKTYPE_RAW (101): a bare IPv4 or IPv6 packet.
    case rawIP
    /// LINKTYPE_IPV4 (228): a bare IPv4 packet.
    case rawIPv4
    /// LINKTYPE_IPV6 (229): a bare IPv6 packet.
    case rawIPv6
    /// DLT_NULL (0): BSD loopback, 4-byte address family in the capturing host's byte order.
    case bsdNull
    /// DLT_LOOP (108): BSD loopback, 4-byte address family in network byte order.
    case bsdLoop

    /// The layer for a libpcap DLT value, or `nil` when it is not supported.
    init?(dlt: Int32) {
        switch dlt {
        case 1: self = .ethernet
        case 113: self = .linuxCooked
        case 276: self = .linuxCooked2
        case 12, 14, 101: self = .rawIP
        case 228: self = .rawIPv4
        case 229: self = .rawIPv6
        case 0: self = .bsdNull
        case 108: self = .bsdLoop
        default: return nil
        }
    }

    /// What the link layer carries.
    enum Payload {
        case ipv4(ByteWindow)
        case ipv6(ByteWindow)
        /// Not IP (ARP, LLC, …): ignored silently.
        case other
        /// The link header itself is cut short or invalid.
        case bad(String)
    }

    /// Strips the link-layer header from a frame.
    func payload(of frame: ByteWindow) -> Payload {
        switch self {
        case .ethernet:
            return Self.ethernet(frame)
        case .linuxCooked:
            guard let arphrd = frame.u16(2), let proto = frame.u16(14), let rest = frame.dropping(16) else {
                return .bad("Linux cooked header shorter than 16 bytes")
            }
            return arphrd == Self.arphrdNetlink ? .other : Self.byEtherType(proto, rest)
        case .linuxCooked2:
            guard let proto = frame.u16(0), let arphrd = frame.u16(8), let rest = frame.dropping(20) else {
                return .bad("Linux cooked v2 header shorter than 20 bytes")
            }
            return arphrd == Self.arphrdNetlink ? .other : Self.byEtherType(proto, rest)
        case .rawIP:
            guard let first = frame.u8(0) else { return .bad("empty raw IP packet") }
            switch first >> 4 {
            case 4: return .ipv4(frame)
            case 6: return .ipv6(frame)
            default: return .bad("raw IP packet with IP version \(first >> 4)")
            }
        case .rawIPv4:
            return .ipv4(frame)
        case .rawIPv6:
            return .ipv6(frame)
        case .bsdNull, .bsdLoop:
            guard var family = self == .bsdLoop ? frame.u32(0) : frame.u32LE(0), let rest = frame.dropping(4) else {
                return .bad("loopback header shorter than 4 bytes")
            }
            // DLT_NULL uses the capturing host's byte order; families are small numbers,
            // so a value with high bits set was written big-endian.
            if self == .bsdNull && family > 0xFFFF { family = family.byteSwapped }
            switch family {
            case 2: return .ipv4(rest)
            case 24, 28, 30: return .ipv6(rest)  // AF_INET6 on NetBSD/OpenBSD, FreeBSD, Darwin
            default: return .other
            }
        }
    }

    private static let arphrdNetlink: UInt16 = 824

    private static func ethernet(_ frame: ByteWindow) -> Payload {
        guard var etherType = frame.u16(12) else { return .bad("Ethernet header shorter than 14 bytes") }
        var offset = 14
        var tags = 0
        while etherType == 0x8100 || etherType == 0x88A8 || etherType == 0x9100 {
            tags += 1
            guard tags <= 2 else { return .bad("more than two VLAN tags") }
            guard let inner = frame.u16(offset + 2) else { return .bad("VLAN tag cut short") }
            etherType = inner
            offset += 4
        }
        guard let rest = frame.dropping(offset) else { return .bad("Ethernet header cut short") }
        return byEtherType(etherType, rest)
    }

    private static func byEtherType(_ type: UInt16, _ rest: ByteWindow) -> Payload {
        switch type {
        case 0x0800: return .ipv4(rest)
        case 0x86DD: return .ipv6(rest)
        default: return .other
        }
    }
}
