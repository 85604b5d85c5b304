import NIOCore
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Why `HOST[:PORT]` text did not give an address.
public enum AddressResolutionError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The text after the host's colon is not a port number (0–65535).
    case badPort(String)
    /// No port in the text, and no default port.
    case missingPort(String)
    /// The host name did not resolve (getaddrinfo found nothing).
    case unresolvable(host: String)

    public var description: String {
        switch self {
        case .badPort(let text): "'\(text)': bad port"
        case .missingPort(let text): "'\(text)' needs a port (ADDR:PORT)"
        case .unresolvable(let host): "cannot resolve '\(host)'"
        }
    }
}

/// Turns user-given `HOST[:PORT]` text into a ``TransportAddress``.
public enum AddressResolver {
    /// `1.2.3.4:5`, `[::1]:5`, `HOST:5`; without a port, `defaultPort`. An IP
    /// literal is taken as is; a name is resolved with getaddrinfo (the call
    /// blocks): its first IPv4 address, else its first IPv6 one. (IPv4 first: the
    /// sockets that use these are IPv4 ones unless told otherwise, and `localhost`
    /// is often `::1` first.)
    public static func resolve(_ text: String, defaultPort: UInt16?) throws(AddressResolutionError) -> TransportAddress {
        if let address = TransportAddress(text, defaultPort: defaultPort) { return address }
        var host = text
        var port = defaultPort
        if !text.contains("]"), text.filter({ $0 == ":" }).count == 1, let colon = text.lastIndex(of: ":") {
            guard let p = UInt16(text[text.index(after: colon)...]) else { throw .badPort(text) }
            host = String(text[..<colon])
            port = p
        }
        guard let port else { throw .missingPort(text) }
        for family in [AF_INET, AF_INET6] {
            if let ip = firstAddress(of: host, family: family) { return TransportAddress(ip: ip, port: port) }
        }
        throw .unresolvable(host: host)
    }

    /// The first address getaddrinfo gives for `host` in `family`.
    private static func firstAddress(of host: String, family: Int32) -> IPAddress? {
        var hints = addrinfo()
        hints.ai_family = family
        hints.ai_socktype = Int32(SOCK_DGRAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, nil, &hints, &list) == 0, let first = list else { return nil }
        defer { freeaddrinfo(list) }
        var entry: UnsafeMutablePointer<addrinfo>? = first
        while let e = entry {
            // (Read as NIO reads a socket's address, then as every NIO address here is.)
            if let raw = e.pointee.ai_addr {
                let address: SocketAddress? =
                    switch Int32(raw.pointee.sa_family) {
                    case AF_INET: SocketAddress(UnsafeRawPointer(raw).loadUnaligned(as: sockaddr_in.self), host: host)
                    case AF_INET6: SocketAddress(UnsafeRawPointer(raw).loadUnaligned(as: sockaddr_in6.self), host: host)
                    default: nil
                    }
                if let ip = address.flatMap(TransportAddress.init)?.ip { return ip }
            }
            entry = e.pointee.ai_next
        }
        return nil
    }
}
