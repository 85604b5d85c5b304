import ArgumentParser
import Transport
import TusaBase

/// `--rendezvous HOST:PORT[,HOST:PORT…]`: a relay's rendezvous, or the nodes of a
/// directory serving as one, tried in order; a client whose node dies moves to the next.
enum RendezvousServers {
    /// What the option's help adds about a list.
    static let listHelp =
        "Several, comma-separated, for directory nodes serving as one: the first that answers is used, the next when it dies."

    static func parse(_ text: String) throws -> [TransportAddress] { try addresses(text, option: "--rendezvous") }

    /// The addresses of a comma-separated list for `option`, each once, in order
    /// (port 3480 when none is given; names resolved); an error naming the first
    /// part that is not one.
    static func addresses(_ text: String, option: String) throws(ValidationError) -> [TransportAddress] {
        var servers: [TransportAddress] = []
        for part in text.split(separator: ",", omittingEmptySubsequences: false) {
            let trimmed = String(part.drop(while: { $0 == " " }).reversed().drop(while: { $0 == " " }).reversed())
            let address = try HostAndPort.resolve(trimmed, option: option, defaultPort: 3480)
            if !servers.contains(address) { servers.append(address) }
        }
        return servers
    }
}

/// `HOST[:PORT]` on the command line: an IP literal (`192.0.2.1:3480`,
/// `[2001:db8::1]:3480`) as it is, a name (`relay.example.org:3480`) resolved
/// once, as the command starts.
enum HostAndPort {
    static func resolve(_ text: String, option: String, defaultPort: UInt16?) throws(ValidationError) -> TransportAddress {
        do {
            return try AddressResolver.resolve(text, defaultPort: defaultPort)
        } catch {
            switch error {
            case .unresolvable(let host): throw ValidationError("\(option) '\(text)': cannot resolve '\(host)'")
            case .badPort, .missingPort:
                throw ValidationError("\(option) '\(text)' is not HOST\(defaultPort == nil ? ":PORT" : "[:PORT]")")
            }
        }
    }
}
