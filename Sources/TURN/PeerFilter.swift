import STUN
import TusaBase

/// A CIDR range of IPv4 or IPv6 addresses, such as `10.0.0.0/8` or `fe80::/10`.
public struct IPRange: Hashable, Sendable, CustomStringConvertible {
    public let network: IPAddress
    public let prefixLength: Int

    /// A range from a network address and prefix length; host bits are cleared.
    public init?(network: IPAddress, prefixLength: Int) {
        let bits = network.isIPv4 ? 32 : 128
        guard prefixLength >= 0, prefixLength <= bits else { return nil }
        self.network = IPRange.mask(network, prefixLength)
        self.prefixLength = prefixLength
    }

    /// Parses `ADDR/LEN`, a single `ADDR`, or coturn's `FIRST-LAST` form when
    /// it is exactly one CIDR block.
    public init?(_ text: String) {
        if let slash = text.firstIndex(of: "/") {
            guard let ip = IPAddress(String(text[..<slash])), let len = Int(text[text.index(after: slash)...]) else { return nil }
            self.init(network: ip, prefixLength: len)
        } else if let ip = IPAddress(text) {
            self.init(network: ip, prefixLength: ip.isIPv4 ? 32 : 128)
        } else {
            return nil
        }
    }

    /// Parses `ADDR`, `ADDR/LEN`, or coturn's `FIRST-LAST` (split into the
    /// CIDR blocks that cover exactly that range).
    public static func parseList(_ text: String) -> [IPRange]? {
        let parts = text.split(separator: "-", maxSplits: 1).map(String.init)
        guard parts.count == 2, !text.contains("/") else { return IPRange(text).map { [$0] } }
        guard let first = IPAddress(parts[0]), let last = IPAddress(parts[1]),
            case .v4(var lo) = first, case .v4(let hi) = last, lo <= hi
        else { return nil }
        var out: [IPRange] = []
        while true {
            // The largest block starting at lo that stays within hi.
            var length = 32
            while length > 0 {
                let size = UInt64(1) << UInt64(32 - (length - 1))
                guard UInt64(lo) % size == 0, UInt64(lo) + size - 1 <= UInt64(hi) else { break }
                length -= 1
            }
            guard let block = IPRange(network: .v4(lo), prefixLength: length) else { return nil }
            out.append(block)
            let next = UInt64(lo) + (UInt64(1) << UInt64(32 - length))
            if next > UInt64(hi) { break }
            lo = UInt32(next)
        }
        return out
    }

    public func contains(_ address: IPAddress) -> Bool {
        guard address.isIPv4 == network.isIPv4 else { return false }
        return IPRange.mask(address, prefixLength) == network
    }

    public var description: String { "\(network)/\(prefixLength)" }

    static func mask(_ address: IPAddress, _ length: Int) -> IPAddress {
        switch address {
        case .v4(let a):
            let m: UInt32 = length == 0 ? 0 : ~UInt32(0) << UInt32(32 - length)
            return .v4(a & m)
        case .v6(let h, let l):
            let mh: UInt64 = length == 0 ? 0 : (length >= 64 ? ~0 : ~UInt64(0) << UInt64(64 - length))
            let ml: UInt64 = length <= 64 ? 0 : (length == 128 ? ~0 : ~UInt64(0) << UInt64(128 - length))
            return .v6(high: h & mh, low: l & ml)
        }
    }
}

extension IPAddress {
    /// `0.0.0.0` or `::`: a listen address that means every interface.
    public var isUnspecified: Bool {
        switch self {
        case .v4(let v): v == 0
        case .v6(let high, let low): high == 0 && low == 0
        }
    }

    /// The IPv4 address inside an IPv4-mapped (`::ffff:a.b.c.d`),
    /// IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) or 6to4
    /// (`2002:AABB:CCDD::`) IPv6 address, if it is one.
    public var embeddedIPv4: IPAddress? {
        guard case .v6(let h, let l) = self else { return nil }
        // NAT64 well-known prefix 64:ff9b::/96 (RFC 6052): reaches the IPv4 address through a translator.
        if h == 0x0064_FF9B_0000_0000 && l >> 32 == 0 { return .v4(UInt32(truncatingIfNeeded: l)) }
        // 6to4 2002:V4ADDR::/48 (RFC 3056).
        if h >> 48 == 0x2002 { return .v4(UInt32(truncatingIfNeeded: h >> 16)) }
        guard h == 0 else { return nil }
        let top = l >> 32
        guard top == 0xFFFF || (top == 0 && l > 1) else { return nil }
        return .v4(UInt32(truncatingIfNeeded: l))
    }
}

/// Which peer addresses a TURN relay may talk to (RFC 8656 §21.3 advice; the
/// coturn options `--allow-loopback-peers`, `--allowed-peer-ip`, `--denied-peer-ip`).
///
/// By default every address that reaches into the operator's own networks is
/// refused: loopback, RFC 1918, 100.64/10, link-local, unique-local,
/// multicast, 0.0.0.0/8, broadcast, `::` and `::1`, and the IPv4-mapped forms
/// of all of these. An allowed range overrides a denied one.
public struct PeerFilter: Hashable, Sendable {
    public var denied: [IPRange]
    public var allowed: [IPRange]

    public static let loopback: [IPRange] = ["127.0.0.0/8", "::1/128"].compactMap(IPRange.init)

    /// The ranges denied unless the operator allows them.
    public static let defaultDenied: [IPRange] = [
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
        "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
        "::/128", "::1/128", "fe80::/10", "fc00::/7", "ff00::/8", "64:ff9b:1::/48",
    ].compactMap(IPRange.init)

    /// The safe default, optionally with loopback peers allowed (for tests and
    /// single-host setups).
    public init(allowLoopback: Bool = false, allowed: [IPRange] = [], denied: [IPRange] = []) {
        self.denied = Self.defaultDenied + denied
        self.allowed = (allowLoopback ? Self.loopback : []) + allowed
    }

    /// A filter that lets every address through (only for explicit opt-out).
    public static let permitAll = PeerFilter(allowed: ["0.0.0.0/0", "::/0"].compactMap(IPRange.init))

    /// Whether a peer at `address` may be reached through the relay.
    public func permits(_ address: IPAddress) -> Bool {
        let candidates = [address] + (address.embeddedIPv4.map { [$0] } ?? [])
        // An address is refused when it, or the IPv4 address it embeds, is denied and not allowed.
        for a in candidates where denied.contains(where: { $0.contains(a) }) {
            if !allowed.contains(where: { $0.contains(a) }) { return false }
        }
        return true
    }
}
