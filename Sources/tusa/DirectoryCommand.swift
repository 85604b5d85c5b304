import ArgumentParser
import Directory
import Foundation
import Logging
import Relay
import Rendezvous
import Secure
import ServiceLifecycle
import TURN
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// `tusa directory`: the rendezvous on its own, its posts and known keys in a database.
struct DirectoryCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "directory",
        abstract: "Serve the directory: presence, sealed signalling and invitations, kept in a database across restarts.",
        discussion: """
            Speaks the rendezvous protocol (what `tusa relay --rendezvous-port` serves): everything `tusa call`, \
            `answer` and `party` do with --rendezvous works against it. Invitations posted for a peer are \
            written to the database before they are acknowledged and are delivered at its next login for a \
            day, whatever happens to the directory in between. Several directories on one PostgreSQL \
            database serve as one (nodes): a peer registered at one reaches peers registered at the others, \
            and a post made at one is delivered at any. Prints 'directory tcp ADDRESS' and 'database …' \
            (with the node's number on PostgreSQL) to standard output, then serves until SIGTERM or SIGINT.
            """
    )

    @Option(help: ArgumentHelp("Where to listen (TCP).", valueName: "ip:port"))
    var listen = "0.0.0.0:3480"

    @Option(
        help: ArgumentHelp(
            "Where the rows are kept: sqlite:PATH, or postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE (?host=FOLDER for a Unix socket, ?sslmode=require for TLS).",
            valueName: "url"))
    var database = "sqlite:tusa-directory.sqlite"

    @Option(
        name: .customLong("static-auth-secret"),
        help: ArgumentHelp(
            "The relays' REST secret: registered peers get TURN credentials (with --turn-uri).", valueName: "secret"))
    var secret: String?

    @Option(
        name: .customLong("turn-uri"),
        help: ArgumentHelp("A relay's TURN URI handed out with the credentials (repeatable).", valueName: "uri"))
    var turnURIs: [String] = []

    @Option(
        name: .customLong("party-relay"),
        help: ArgumentHelp("Where parties are hosted, told to every peer.", valueName: "ip:port"))
    var partyRelay: String?

    @Option(name: .customLong("party-key"), help: ArgumentHelp("That relay's public key.", valueName: "key"))
    var partyKey: String?

    @Option(
        name: .customLong("relay-secret"),
        help: ArgumentHelp(
            "Take load reports from relays that hold this secret (tusa relay --directory … --directory-secret): a new room then goes to a live relay below 70 % of its capacity, the less loaded of two picked at random, and each peer is given the TURN URIs of the least loaded relay.",
            valueName: "secret"))
    var relaySecret: String?

    @Option(
        name: .customLong("max-connections"),
        help: ArgumentHelp(
            "Peers connected at once (each takes a file descriptor: the soft ulimit -n is raised to the hard one at start).",
            valueName: "n"))
    var maxConnections = 20_000

    @Option(
        name: .customLong("max-connections-per-ip"),
        help: ArgumentHelp(
            "Connections open at once from one address; more are closed on accept (a NAT in front of many users needs more).",
            valueName: "n"))
    var maxConnectionsPerIP = 1_000

    @Option(
        name: .customLong("memory-limit"),
        help: ArgumentHelp("As tusa relay's: at 90 % of it, posts are refused.", valueName: "size"))
    var memoryLimit: String?

    @Option(name: .customLong("log-level"), help: "Log level on standard error.")
    var logLevel: Relay.LogLevel = .info

    func run() async throws {
        guard let address = TransportAddress(listen, defaultPort: 3480) else {
            throw failure("--listen must be IP:PORT, not '\(listen)'")
        }
        let databaseURL: DirectoryDatabase
        do { databaseURL = try DirectoryDatabase(database) } catch { throw failure(error.description) }
        var core = RendezvousServerConfiguration()
        if let secret {
            guard !secret.isEmpty else {
                throw failure("--static-auth-secret must not be empty: anyone could make TURN credentials with it")
            }
            guard !turnURIs.isEmpty || relaySecret != nil else {
                throw failure("--static-auth-secret needs a --turn-uri, or --relay-secret for relays that report theirs")
            }
            for uri in turnURIs where (try? TURNURI(parsing: uri)) == nil {
                throw failure("--turn-uri '\(uri)' is not a turn: or turns: URI")
            }
            core.turn = TURNIssuer(secret: secret, uris: turnURIs)
        } else if !turnURIs.isEmpty {
            throw failure("--turn-uri needs --static-auth-secret")
        }
        switch (partyRelay, partyKey) {
        case (let relay?, let key?):
            // Clients are given the address (a name resolved here, once: they take IP:PORT).
            let address: TransportAddress
            do { address = try HostAndPort.resolve(relay, option: "--party-relay", defaultPort: nil) } catch {
                throw failure(error.message)
            }
            guard PublicKey(base64: key) != nil else { throw failure("--party-key is not a public key: '\(key)'") }
            core.party = PartyGrant(address: "\(address)", key: key)
        case (nil, nil): break
        default: throw failure("--party-relay and --party-key go together")
        }
        if let relaySecret {
            guard !relaySecret.isEmpty else { throw failure("--relay-secret must not be empty") }
            core.relaySecret = relaySecret
        }
        guard (1...1_000_000).contains(maxConnections) else { throw failure("--max-connections must be 1-1000000") }
        core.maximumConnections = maxConnections
        guard (1...1_000_000).contains(maxConnectionsPerIP) else {
            throw failure("--max-connections-per-ip must be 1-1000000")
        }
        core.maximumConnectionsPerSource = maxConnectionsPerIP
        let limit: UInt64?
        switch Relay.memoryLimit(memoryLimit) {
        case .success(let bytes): limit = bytes
        case .failure(let problem): throw failure(problem.message)
        }

        Relay.logToStandardError(at: logLevel.level)
        let logger = Logger(label: "tusa.directory")
        let descriptors = Self.raiseDescriptorLimit()
        let store: any RendezvousStore
        do { store = try await databaseURL.open(logger: logger) } catch { throw failure(error.description) }
        if descriptors < UInt64(maxConnections) + 64 {
            logger.warning(
                "--max-connections \(maxConnections) is past what the descriptor limit (ulimit -n \(descriptors)) holds: connections past it are closed at once"
            )
        }
        let memory = MemoryGuard(option: limit, logger: logger)
        let service = RendezvousService(address: address, configuration: core, memory: memory, store: store, logger: logger)
        let group = ServiceGroup(
            configuration: .init(services: [memory, service], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        do {
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                tasks.addTask { try await group.run() }
                tasks.addTask {
                    print("directory tcp \(try await service.boundAddress())")
                    let node = await store.node
                    print(
                        "database \(databaseURL) (schema \(databaseURL.schemaVersion)" + (node == 0 ? ")" : ", node \(node))"))
                    flushStandardOutput()
                }
                try await tasks.waitForAll()
            }
        } catch let error as RelayServiceError {
            throw failure(error.message)
        } catch {
            throw failure("\(error)")
        }
        print("stopped")
        flushStandardOutput()
    }

    /// The soft limit on open descriptors raised to the hard one; the limit now.
    private static func raiseDescriptorLimit() -> UInt64 {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 0 }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
        }
        return UInt64(limit.rlim_cur)
    }

    /// One line on standard error; throw the result to exit with status 1.
    private func failure(_ message: String) -> ExitCode {
        let line = Array("tusa directory: error: \(message)\n".utf8)
        _ = line.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
        return ExitCode(1)
    }
}
