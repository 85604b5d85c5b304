import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// This machine's interface addresses: host candidates for calls, relay IPs
/// for a relay listening on a wildcard address.
///
/// Reads getifaddrs(3) itself rather than NIO's `System.enumerateDevices()`,
/// which does not say whether an interface is up or a loopback.
public enum NetworkInterfaces {
    /// An address family to list.
    public enum Family: Sendable {
        case ipv4, ipv6
    }

    /// The addresses of the interfaces that are up, in the system's order, without
    /// duplicates; loopback interfaces' addresses, when included, last (they reach
    /// only this machine). IPv6 link-local addresses (fe80::/10) are left out: they
    /// are useless without a scope. When the system cannot list its interfaces,
    /// loopback alone (or nothing).
    public static func addresses(_ family: Family = .ipv4, includeLoopback: Bool) -> [IPAddress] {
        let loopbackAddress: IPAddress = family == .ipv4 ? .v4(0x7F00_0001) : .v6(high: 0, low: 1)
        var result: [IPAddress] = []
        var loopbacks: [IPAddress] = []
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0 else { return includeLoopback ? [loopbackAddress] : [] }
        defer { freeifaddrs(list) }
        var p = list
        while let entry = p {
            defer { p = entry.pointee.ifa_next }
            guard let sa = entry.pointee.ifa_addr, entry.pointee.ifa_flags & UInt32(IFF_UP) != 0 else { continue }
            let ip: IPAddress
            switch (family, Int32(sa.pointee.sa_family)) {
            case (.ipv4, AF_INET):
                ip = .v4(
                    sa.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt32(bigEndian: $0.pointee.sin_addr.s_addr) })
            case (.ipv6, AF_INET6):
                let bytes = sa.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                    withUnsafeBytes(of: $0.pointee.sin6_addr) { Array($0) }
                }
                let high = bytes[0..<8].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
                let low = bytes[8..<16].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
                if high >> 54 == 0x3FA { continue }  // fe80::/10 needs a scope
                ip = .v6(high: high, low: low)
            default:
                continue
            }
            let loopback = entry.pointee.ifa_flags & UInt32(IFF_LOOPBACK) != 0
            guard !result.contains(ip), !loopbacks.contains(ip) else { continue }
            if loopback { loopbacks.append(ip) } else { result.append(ip) }
        }
        return result + (includeLoopback ? loopbacks : [])
    }
}
