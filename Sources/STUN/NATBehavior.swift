import TusaBase

/// NAT mapping behaviour (RFC 4787 §4.1, discovered as in RFC 5780 §4.3).
public enum MappingBehavior: String, Hashable, Sendable {
    /// The mapped address is the client's own: no NAT on the path.
    case noNAT = "no NAT"
    case endpointIndependent = "endpoint-independent"
    case addressDependent = "address-dependent"
    case addressAndPortDependent = "address-and-port-dependent"

    /// Classifies from the mapped addresses of RFC 5780's tests I–III: `x1`
    /// from the primary address, `x2` from the alternate IP and primary port,
    /// `x3` from the alternate IP and port (nil when not needed).
    public static func classify(local: TransportAddress?, x1: TransportAddress, x2: TransportAddress, x3: TransportAddress?)
        -> MappingBehavior?
    {
        if let local, local == x1 { return .noNAT }
        if x1 == x2 { return .endpointIndependent }
        guard let x3 else { return nil }
        return x3 == x2 ? .addressDependent : .addressAndPortDependent
    }
}

/// NAT filtering behaviour (RFC 4787 §5, discovered as in RFC 5780 §4.4).
public enum FilteringBehavior: String, Hashable, Sendable {
    case endpointIndependent = "endpoint-independent"
    case addressDependent = "address-dependent"
    case addressAndPortDependent = "address-and-port-dependent"

    /// Classifies from whether the answers to test II (change IP and port)
    /// and test III (change port) came through.
    public static func classify(changedIPAndPortAnswered: Bool, changedPortAnswered: Bool) -> FilteringBehavior {
        if changedIPAndPortAnswered { return .endpointIndependent }
        return changedPortAnswered ? .addressDependent : .addressAndPortDependent
    }
}

/// What RFC 5780 discovery found, and the classic name for it.
public struct NATBehavior: Hashable, Sendable {
    public var mapping: MappingBehavior
    public var filtering: FilteringBehavior

    public init(mapping: MappingBehavior, filtering: FilteringBehavior) {
        self.mapping = mapping
        self.filtering = filtering
    }

    /// The RFC 3489-era name (full cone, restricted cone, port-restricted cone, symmetric).
    public var classicName: String {
        switch (mapping, filtering) {
        case (.noNAT, .endpointIndependent): "open internet (no NAT)"
        case (.noNAT, _): "no NAT, firewall with \(filtering.rawValue) filtering"
        case (.endpointIndependent, .endpointIndependent): "full cone"
        case (.endpointIndependent, .addressDependent): "restricted cone"
        case (.endpointIndependent, .addressAndPortDependent): "port-restricted cone"
        default: "symmetric"
        }
    }

    /// Whether two peers behind NATs like this can usually reach each other directly.
    public var allowsDirectPaths: Bool { mapping == .noNAT || mapping == .endpointIndependent }
}
