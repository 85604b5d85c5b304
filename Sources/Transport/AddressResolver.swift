import NIOCore
import TusaBase

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
    /// blocks), its first address used.
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
        guard let resolved = try? SocketAddress.makeAddressResolvingHost(host, port: Int(port)),
            let address = TransportAddress(resolved)
        else { throw .unresolvable(host: host) }
        return address
    }
}
