/// One end of a UDP or TCP flow: an IP address in textual form and a port.
public struct CaptureEndpoint: Hashable, Sendable, CustomStringConvertible, Comparable {
    /// The address as text: dotted quad for IPv4 (`"127.0.0.1"`), RFC 5952 form for IPv6 (`"::1"`).
    public var address: String
    /// The transport-layer port.
    public var port: UInt16

    /// Creates an endpoint from an address string and a port.
    public init(address: String, port: UInt16) {
        self.address = address
        self.port = port
    }

    /// Whether ``address`` is an IPv6 address.
    public var isIPv6: Bool { address.contains(":") }

    /// `"127.0.0.1:3478"` for IPv4, `"[::1]:3478"` for IPv6.
    public var description: String {
        isIPv6 ? "[\(address)]:\(port)" : "\(address):\(port)"
    }

    /// Orders by address text, then port; used only to give flows a stable orientation.
    public static func < (lhs: CaptureEndpoint, rhs: CaptureEndpoint) -> Bool {
        (lhs.address, lhs.port) < (rhs.address, rhs.port)
    }
}
