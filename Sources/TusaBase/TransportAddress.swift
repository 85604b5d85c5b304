#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// An IPv4 or IPv6 address, as carried in STUN address attributes.
public enum IPAddress: Hashable, Sendable, CustomStringConvertible {
    case v4(UInt32)
    /// 16 bytes, network order, as two big-endian halves.
    case v6(high: UInt64, low: UInt64)

    // Written out (not synthesized) so that the relay's per-packet lookups, in
    // other modules, inline them.
    @inlinable
    public static func == (a: IPAddress, b: IPAddress) -> Bool {
        switch (a, b) {
        case (.v4(let x), .v4(let y)): x == y
        case (.v6(let h1, let l1), .v6(let h2, let l2)): h1 == h2 && l1 == l2
        default: false
        }
    }

    @inlinable
    public func hash(into hasher: inout Hasher) {
        switch self {
        case .v4(let a): hasher.combine(a)
        case .v6(let high, let low):
            hasher.combine(high)
            hasher.combine(low)
        }
    }

    /// The STUN address family number (RFC 8489 §14.1): 0x01 IPv4, 0x02 IPv6.
    @inlinable
    public var family: UInt8 {
        switch self {
        case .v4: 0x01
        case .v6: 0x02
        }
    }

    /// The address in network byte order.
    public var bytes: [UInt8] {
        var b: [UInt8] = []
        switch self {
        case .v4(let a):
            b.reserveCapacity(4)
            b.appendUInt32(a)
        case .v6(let h, let l):
            b.reserveCapacity(16)
            b.appendUInt64(h)
            b.appendUInt64(l)
        }
        return b
    }

    /// Builds an address from 4 or 16 bytes in network order.
    public init?(bytes: [UInt8]) {
        switch bytes.count {
        case 4: self = .v4(bytes.readUInt32(at: 0))
        case 16:
            let h = UInt64(bytes.readUInt32(at: 0)) << 32 | UInt64(bytes.readUInt32(at: 4))
            let l = UInt64(bytes.readUInt32(at: 8)) << 32 | UInt64(bytes.readUInt32(at: 12))
            self = .v6(high: h, low: l)
        default: return nil
        }
    }

    /// Parses dotted-quad IPv4 or RFC 4291 IPv6 text (no brackets, no zone).
    public init?(_ text: String) {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 {
            self = .v4(UInt32(bigEndian: v4.s_addr))
            return
        }
        var v6 = [UInt8](repeating: 0, count: 16)
        if inet_pton(AF_INET6, text, &v6) == 1, let a = IPAddress(bytes: v6) {
            self = a
            return
        }
        return nil
    }

    public var isIPv4: Bool { if case .v4 = self { true } else { false } }

    public var description: String {
        let b = bytes
        var out = [CChar](repeating: 0, count: 64)
        let ok = b.withUnsafeBytes { raw in
            inet_ntop(isIPv4 ? AF_INET : AF_INET6, raw.baseAddress, &out, socklen_t(out.count)) != nil
        }
        guard ok else { return "?" }
        return String(decoding: out.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// An IP address and port.
public struct TransportAddress: Hashable, Sendable, CustomStringConvertible {
    public var ip: IPAddress
    public var port: UInt16

    @inlinable
    public init(ip: IPAddress, port: UInt16) {
        self.ip = ip
        self.port = port
    }

    @inlinable
    public static func == (a: TransportAddress, b: TransportAddress) -> Bool { a.port == b.port && a.ip == b.ip }

    @inlinable
    public func hash(into hasher: inout Hasher) {
        ip.hash(into: &hasher)
        hasher.combine(port)
    }

    /// Parses `1.2.3.4:5`, `[::1]:5`; with `defaultPort`, also `1.2.3.4` and `::1` / `[::1]`.
    public init?(_ text: String, defaultPort: UInt16? = nil) {
        var host = Substring(text)
        var port = defaultPort
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return nil }
            let rest = host[host.index(after: close)...]
            host = host[host.index(after: host.startIndex)..<close]
            if !rest.isEmpty {
                guard rest.hasPrefix(":"), let p = UInt16(rest.dropFirst()) else { return nil }
                port = p
            }
        } else if host.filter({ $0 == ":" }).count == 1, let colon = host.firstIndex(of: ":") {
            guard let p = UInt16(host[host.index(after: colon)...]) else { return nil }
            port = p
            host = host[..<colon]
        }
        guard let ip = IPAddress(String(host)), let port else { return nil }
        self.init(ip: ip, port: port)
    }

    public var description: String {
        switch ip {
        case .v4: "\(ip):\(port)"
        case .v6: "[\(ip)]:\(port)"
        }
    }
}
