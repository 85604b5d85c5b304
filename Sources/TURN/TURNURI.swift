import TusaBase

/// Why text is not a TURN URI (RFC 7065).
public enum TURNURIError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The scheme is not `turn:` or `turns:`.
    case unknownScheme(String)
    /// Nothing between the scheme and the port or query.
    case missingHost(String)
    /// An IPv6 literal without its closing `]`, or with something other than `:PORT` after it.
    case badIPv6Literal(String)
    /// The port is not a number from 0 to 65535.
    case badPort(String)
    /// The query is not `transport=udp` or `transport=tcp`.
    case badQuery(String)

    public var description: String {
        switch self {
        case .unknownScheme(let text): "'\(text)' is not a turn: or turns: URI"
        case .missingHost(let text): "'\(text)' names no host"
        case .badIPv6Literal(let text): "'\(text)' has a malformed [IPv6] host"
        case .badPort(let text): "'\(text)' has a bad port"
        case .badQuery(let text): "'\(text)' has a query other than ?transport=udp or ?transport=tcp"
        }
    }
}

/// A TURN server's URI (RFC 7065): `turn:HOST[:PORT][?transport=udp|tcp]`, or
/// `turns:` for TURN over TLS (or DTLS). What a rendezvous hands out with TURN
/// credentials, e.g. `turn:198.51.100.7:3478?transport=udp`.
public struct TURNURI: Hashable, Sendable, CustomStringConvertible {
    /// `turn` (plain UDP or TCP) or `turns` (over TLS or DTLS).
    public enum Scheme: String, Hashable, Sendable {
        case turn, turns

        /// The port when the URI names none: 3478, or 5349 for `turns` (RFC 7065 §3).
        public var defaultPort: UInt16 { self == .turn ? 3478 : 5349 }
    }

    /// The `?transport=` value: how the client reaches the server.
    public enum Transport: String, Hashable, Sendable {
        case udp, tcp
    }

    public var scheme: Scheme
    /// An IP literal (IPv6 without its brackets) or a host name.
    public var host: String
    /// The port, when the URI names one.
    public var port: UInt16?
    /// The `?transport=` value, when the URI has one (RFC 7065 leaves the choice
    /// to the client otherwise; UDP is the usual first try).
    public var transport: Transport?

    public init(scheme: Scheme = .turn, host: String, port: UInt16? = nil, transport: Transport? = nil) {
        self.scheme = scheme
        self.host = host
        self.port = port
        self.transport = transport
    }

    /// The URI of a server socket: its IP and port, and the transport.
    public init(scheme: Scheme = .turn, address: TransportAddress, transport: Transport?) {
        self.init(scheme: scheme, host: "\(address.ip)", port: address.port, transport: transport)
    }

    /// Parses `turn:` and `turns:` URIs. The scheme and the transport are matched
    /// without regard to case (RFC 3986 §3.1; RFC 7065's ABNF strings); the host
    /// is kept as written.
    public init(parsing text: String) throws(TURNURIError) {
        guard let colon = text.firstIndex(of: ":"),
            let scheme = Scheme(rawValue: text[..<colon].lowercased())
        else { throw .unknownScheme(text) }
        var rest = text[text.index(after: colon)...]
        var transport: Transport?
        if let question = rest.firstIndex(of: "?") {
            let query = rest[rest.index(after: question)...]
            let prefix = "transport="
            guard query.lowercased().hasPrefix(prefix),
                let value = Transport(rawValue: query.dropFirst(prefix.count).lowercased())
            else { throw .badQuery(text) }
            transport = value
            rest = rest[..<question]
        }
        var host: Substring
        var portText: Substring?
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { throw .badIPv6Literal(text) }
            host = rest[rest.index(after: rest.startIndex)..<close]
            let after = rest[rest.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { throw .badIPv6Literal(text) }
                portText = after.dropFirst()
            }
            guard IPAddress(String(host)) != nil else { throw .badIPv6Literal(text) }
        } else if let portColon = rest.firstIndex(of: ":") {
            host = rest[..<portColon]
            portText = rest[rest.index(after: portColon)...]
        } else {
            host = rest
        }
        guard !host.isEmpty else { throw .missingHost(text) }
        var port: UInt16?
        if let portText {
            guard !portText.isEmpty, portText.allSatisfy({ $0.isASCII && $0.isNumber }), let value = UInt16(portText) else {
                throw .badPort(text)
            }
            port = value
        }
        self.init(scheme: scheme, host: String(host), port: port, transport: transport)
    }

    /// The server's address when the host is an IP literal, with the scheme's
    /// default port when the URI names none; nil for a host name (resolve it).
    public var address: TransportAddress? {
        guard let ip = IPAddress(host) else { return nil }
        return TransportAddress(ip: ip, port: port ?? scheme.defaultPort)
    }

    /// The URI as text: IPv6 hosts in brackets, the port and query only when set.
    public var description: String {
        var text = "\(scheme.rawValue):"
        text += host.contains(":") ? "[\(host)]" : host
        if let port { text += ":\(port)" }
        if let transport { text += "?transport=\(transport.rawValue)" }
        return text
    }
}
