import TURN
import TusaBase

extension RelayService {
    /// The TURN URIs (RFC 7065) of the bound UDP and TCP sockets, in their order,
    /// each IP replaced by the configured external IP of its family (behind 1:1
    /// NAT): what a rendezvous hands registered peers with their credentials.
    /// Waits, like ``boundSockets()``, until every socket is bound.
    public func turnURIs() async throws -> [TURNURI] {
        let external = configuration.turn?.externalIP ?? [:]
        return try await boundSockets().compactMap { socket -> TURNURI? in
            let transport: TURNURI.Transport
            switch socket.kind {
            case .udp: transport = .udp
            case .tcp: transport = .tcp
            default: return nil
            }
            var address = socket.address
            if let advertised = external[address.ip.family] { address = TransportAddress(ip: advertised, port: address.port) }
            return TURNURI(address: address, transport: transport)
        }
    }
}
