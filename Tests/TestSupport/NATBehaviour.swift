import TusaBase

/// How a NAT maps and filters (RFC 4787 §4.1 and §5): what a mapping, or a
/// permission to come in through it, depends on besides the inside address.
public enum NATBehaviour: Hashable, Sendable {
    /// Any destination (mapping) or any source (filtering).
    case endpointIndependent
    /// The remote IP address.
    case addressDependent
    /// The remote IP address and port.
    case addressAndPortDependent
}

/// A NAT box of a ``VirtualNetwork``: its public address and its behaviours.
public struct NAT: Hashable, Sendable {
    public var publicIP: IPAddress
    public var mapping: NATBehaviour
    public var filtering: NATBehaviour
    /// The first public port it hands out (then upwards).
    public var firstPort: UInt16

    public init(publicIP: IPAddress, mapping: NATBehaviour, filtering: NATBehaviour, firstPort: UInt16 = 40000) {
        self.publicIP = publicIP
        self.mapping = mapping
        self.filtering = filtering
        self.firstPort = firstPort
    }

    /// Endpoint-independent mapping and filtering ("full cone").
    public static func fullCone(_ ip: IPAddress) -> NAT {
        NAT(publicIP: ip, mapping: .endpointIndependent, filtering: .endpointIndependent)
    }
    /// Endpoint-independent mapping, address-dependent filtering ("restricted cone").
    public static func restrictedCone(_ ip: IPAddress) -> NAT {
        NAT(publicIP: ip, mapping: .endpointIndependent, filtering: .addressDependent)
    }
    /// Endpoint-independent mapping, address-and-port-dependent filtering ("port-restricted cone").
    public static func portRestrictedCone(_ ip: IPAddress) -> NAT {
        NAT(publicIP: ip, mapping: .endpointIndependent, filtering: .addressAndPortDependent)
    }
    /// Address-and-port-dependent mapping and filtering ("symmetric").
    public static func symmetric(_ ip: IPAddress) -> NAT {
        NAT(publicIP: ip, mapping: .addressAndPortDependent, filtering: .addressAndPortDependent)
    }
}

/// One NAT's state: its mappings and who has been contacted through each.
struct NATBox {
    struct Mapping {
        var inside: TransportAddress
        var external: TransportAddress
        /// The remote endpoint this mapping was made for (nil: endpoint-independent).
        var key: TransportAddress?
        /// Every remote endpoint contacted through it (for filtering).
        var contacted: Set<TransportAddress> = []
    }

    let nat: NAT
    var mappings: [Mapping] = []
    var nextPort: UInt16

    init(_ nat: NAT) {
        self.nat = nat
        nextPort = nat.firstPort
    }

    /// The external address for a datagram from `inside` to `remote`, made if new.
    mutating func outbound(from inside: TransportAddress, to remote: TransportAddress) -> TransportAddress {
        let key: TransportAddress? =
            switch nat.mapping {
            case .endpointIndependent: nil
            case .addressDependent: TransportAddress(ip: remote.ip, port: 0)
            case .addressAndPortDependent: remote
            }
        if let i = mappings.firstIndex(where: { $0.inside == inside && $0.key == key }) {
            mappings[i].contacted.insert(remote)
            return mappings[i].external
        }
        let external = TransportAddress(ip: nat.publicIP, port: nextPort)
        nextPort &+= 1
        mappings.append(Mapping(inside: inside, external: external, key: key, contacted: [remote]))
        return external
    }

    /// The inside address a datagram from `remote` to `external` goes to, or nil when filtered.
    func inbound(from remote: TransportAddress, to external: TransportAddress) -> TransportAddress? {
        guard let m = mappings.first(where: { $0.external == external }) else { return nil }
        let allowed =
            switch nat.filtering {
            case .endpointIndependent: true
            case .addressDependent: m.contacted.contains { $0.ip == remote.ip }
            case .addressAndPortDependent: m.contacted.contains(remote)
            }
        return allowed ? m.inside : nil
    }
}
