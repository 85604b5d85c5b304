import ArgumentParser
import TusaBase

/// `--rendezvous HOST:PORT[,HOST:PORT…]`: a relay's rendezvous, or the nodes of a
/// directory serving as one, tried in order; a client whose node dies moves to the next.
enum RendezvousServers {
    /// What the option's help adds about a list.
    static let listHelp =
        "Several, comma-separated, for directory nodes serving as one: the first that answers is used, the next when it dies."

    static func parse(_ text: String) throws -> [TransportAddress] {
        switch addresses(text) {
        case .success(let servers): return servers
        case .failure(let bad): throw ValidationError("--rendezvous '\(bad.part)' is not HOST:PORT")
        }
    }

    /// A part that is not HOST:PORT.
    struct BadPart: Error {
        let part: String
    }

    /// The addresses of a comma-separated list, each once, in order (port 3480
    /// when none is given); the first part that is not one.
    static func addresses(_ text: String) -> Result<[TransportAddress], BadPart> {
        var servers: [TransportAddress] = []
        for part in text.split(separator: ",", omittingEmptySubsequences: false) {
            let trimmed = String(part.drop(while: { $0 == " " }).reversed().drop(while: { $0 == " " }).reversed())
            guard let address = TransportAddress(trimmed, defaultPort: 3480) else { return .failure(BadPart(part: trimmed)) }
            if !servers.contains(address) { servers.append(address) }
        }
        return .success(servers)
    }
}
