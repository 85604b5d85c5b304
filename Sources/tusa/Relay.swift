import ArgumentParser
import Directory
import Foundation
import Logging
import NIOConcurrencyHelpers
import Party
import Relay
import Rendezvous
import STUN
import Secure
import ServiceLifecycle
import TURN
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// `tusa relay`: the STUN Binding service on UDP and TCP until SIGTERM or SIGINT.
///
/// Prints `listening udp 127.0.0.1:3478` (one line per socket, flushed) to
/// standard output once every socket is bound, so a script can start it on
/// port 0 and read the real port; logs go to standard error. With
/// `--config FILE` the options of a coturn-format file come first, as if given
/// before the command line's (``RelayConfigFile``); with `--prometheus` a
/// ``MetricsEndpoint`` serves the relay's metrics.
struct Relay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract:
            "Serve STUN (RFC 8489, RFC 5780 behaviour discovery) and, given credentials, TURN (RFC 8656) on UDP, TCP and TLS.",
        discussion: """
            Prints one 'listening udp|tcp ADDRESS' line per bound socket to standard output \
            (and 'metrics http://ADDRESS/metrics' with --prometheus), then serves until SIGTERM \
            or SIGINT and prints a one-line summary.
            """
    )

    enum LogLevel: String, CaseIterable, ExpressibleByArgument {
        case trace, debug, info, notice, warning, error, critical

        var level: Logger.Level {
            switch self {
            case .trace: .trace
            case .debug: .debug
            case .info: .info
            case .notice: .notice
            case .warning: .warning
            case .error: .error
            case .critical: .critical
            }
        }
    }

    @Option(
        name: [.customShort("c"), .customLong("config")],
        help: ArgumentHelp(
            "A coturn-format config file (turnserver.conf: name=value or bare flag per line, # comments). Flags given here override its single-valued options; repeatable ones add up.",
            valueName: "file"))
    var config: String?

    @Option(
        name: .customLong("listen"),
        help: ArgumentHelp(
            "Address to listen on, IP:PORT or [IPv6]:PORT (port 3478 if left out); repeatable. Default: 0.0.0.0:3478 and [::]:3478.",
            valueName: "addr:port"))
    var listen: [String] = []

    @Option(
        name: .customLong("listening-ip"),
        help: ArgumentHelp("IP to listen on at --listening-port (coturn's form); repeatable.", valueName: "ip"))
    var listeningIPs: [String] = []

    @Option(
        name: .customLong("listening-port"),
        help: ArgumentHelp(
            "Port for the --listening-ip addresses (default 3478); without --listening-ip and --listen, the port of the default wildcard addresses.",
            valueName: "port"))
    var listeningPort: UInt16?

    @Option(
        name: .customLong("alt-address"),
        help: ArgumentHelp(
            "Alternate IP:PORT for RFC 5780 behaviour discovery (UDP; needs a specific listen address of the same family).",
            valueName: "ip:port"))
    var alternateAddress: String?

    @Option(help: ArgumentHelp("SOFTWARE attribute for responses (none by default).", valueName: "text"))
    var software: String?

    @Flag(name: .customLong("no-tcp"), help: "Do not listen on TCP.")
    var noTCP = false

    @Flag(name: .customLong("no-udp"), help: "Do not listen on UDP.")
    var noUDP = false

    @Flag(
        name: .customLong("no-gso"),
        help: "Send every UDP answer on its own, without GSO (for NICs without TX checksum offload, or IPsec paths).")
    var noGSO = false

    @Option(help: "Event-loop threads; above 1, one SO_REUSEPORT UDP socket per thread and address.")
    var threads = 1

    @Option(
        name: .customLong("batch-window"),
        help: ArgumentHelp(
            "Microseconds the relay lets UDP datagrams gather before reading them in one batch (0: at once). "
                + "Adds at most that to a packet's trip; saves a wake-up per datagram under voice traffic.",
            valueName: "us"))
    var batchWindow = RelayOptions.defaultBatchWindowMicroseconds

    @Option(name: .customLong("log-level"), help: "Log level on standard error.")
    var logLevel: LogLevel = .info

    // TURN (RFC 8656). Option names follow coturn's where they overlap.

    @Option(
        name: [.customShort("u"), .customLong("user")],
        help: ArgumentHelp("A TURN user, NAME:PASSWORD or NAME:0xMD5KEY (coturn's form); repeatable.", valueName: "name:password")
    )
    var users: [String] = []

    @Option(
        name: .customLong("user-file"),
        help: ArgumentHelp("A file of TURN users, one NAME:PASSWORD per line (# comments).", valueName: "file"))
    var userFile: String?

    @Option(name: [.customShort("r"), .customLong("realm")], help: "The TURN realm.")
    var realm = "tusa"

    @Flag(
        name: .customLong("use-auth-secret"),
        help:
            "Accept coturn REST-API ephemeral credentials (username EXPIRY[:USER], password base64(HMAC-SHA1(secret, username)))."
    )
    var useAuthSecret = false

    @Option(
        name: .customLong("static-auth-secret"),
        help: ArgumentHelp("A REST-API shared secret; repeatable (rotation).", valueName: "secret"))
    var staticAuthSecrets: [String] = []

    @Flag(
        name: [.customShort("a"), .customLong("lt-cred-mech")],
        help: "Long-term credentials (the default whenever users or secrets are given; accepted for coturn compatibility).")
    var longTermCredentials = false

    @Flag(
        name: [.customShort("z"), .customLong("no-auth")],
        help: "Serve TURN without authentication. Anyone can relay through you: only for closed networks.")
    var noAuth = false

    @Option(
        name: .customLong("relay-ip"),
        help: ArgumentHelp(
            "IP to bind relay sockets on (one per family); default: the listen address, or the host's first address when listening on a wildcard.",
            valueName: "ip"))
    var relayIPs: [String] = []

    @Option(
        name: [.customShort("X"), .customLong("external-ip")],
        help: ArgumentHelp(
            "Public IP to advertise for relays behind 1:1 NAT: PUBLIC or PUBLIC/PRIVATE; repeatable (one per family).",
            valueName: "ip"))
    var externalIPs: [String] = []

    @Option(name: .customLong("min-port"), help: "Lowest relay port.")
    var minPort: UInt16 = 49152

    @Option(name: .customLong("max-port"), help: "Highest relay port.")
    var maxPort: UInt16 = 65535

    @Flag(name: .customLong("allow-loopback-peers"), help: "Let clients relay to loopback peers (refused by default).")
    var allowLoopbackPeers = false

    @Option(
        name: .customLong("allowed-peer-ip"),
        help: ArgumentHelp(
            "Peer range to allow even if denied by default: IP, IP/LEN or FIRST-LAST; repeatable.", valueName: "range"))
    var allowedPeerIPs: [String] = []

    @Option(
        name: .customLong("denied-peer-ip"),
        help: ArgumentHelp("Peer range to refuse: IP, IP/LEN or FIRST-LAST; repeatable.", valueName: "range"))
    var deniedPeerIPs: [String] = []

    @Option(
        name: .customLong("user-quota"),
        help: "Allocations (and held EVEN-PORT reservations) one user may hold at once, per --threads thread (0: no limit).")
    var userQuota = 1000

    @Option(name: .customLong("total-quota"), help: "Allocations the server holds at once, per --threads thread (0: no limit).")
    var totalQuota = 100_000

    @Option(name: .customLong("max-bps"), help: "Bytes per second each allocation may relay each way (0: no limit).")
    var maxBPS = 0

    @Option(name: .customLong("max-allocate-lifetime"), help: "Longest allocation lifetime granted, seconds.")
    var maxAllocateLifetime: UInt32 = 3600

    @Option(name: .customLong("stale-nonce"), help: "Seconds a nonce stays valid.")
    var staleNonce = 600

    @Option(
        name: .customLong("cert"),
        help: ArgumentHelp("PEM certificate chain: serve STUN/TURN over TLS too (with --pkey).", valueName: "file"))
    var certificate: String?

    @Option(name: .customLong("pkey"), help: ArgumentHelp("PEM private key of --cert.", valueName: "file"))
    var privateKey: String?

    @Option(name: .customLong("tls-listening-port"), help: "TLS port on every listen address.")
    var tlsPort: UInt16 = 5349

    @Flag(name: .customLong("no-tls"), help: "Do not serve TLS even with --cert.")
    var noTLS = false

    @Option(
        name: .customLong("max-tcp-connections"),
        help: "TCP and TLS connections open at once (TURN's, and apart from them the party ports'); more are closed on accept.")
    var maxTCPConnections = 10_000

    @Option(
        name: .customLong("max-tcp-connections-per-ip"),
        help:
            "TCP and TLS connections open at once from one IP address (TURN's, and apart from them the party ports'); more are closed on accept."
    )
    var maxTCPConnectionsPerSource = 1_000

    @Option(
        name: .customLong("memory-limit"),
        help: ArgumentHelp(
            "Memory the relay may use, e.g. 512M or 2G (default: its cgroup's limit, ulimit -v or the machine's RAM, whichever is tightest). At 90 % of it new allocations, rooms and joins are refused (508) and what exists goes on; below 80 % they are taken again.",
            valueName: "size"))
    var memoryLimit: String?

    @Flag(
        name: .customLong("strict-channel-numbers"),
        help:
            "Accept only RFC 8656 channel numbers 0x4000-0x4FFF (default: RFC 5766's 0x4000-0x7FFF, which older clients such as coturn's use)."
    )
    var strictChannelNumbers = false

    @Option(
        name: .customLong("challenge-rate"),
        help:
            "401/438 answers per second to one source IP, bursts of twice that (0: no limit); raise it for many clients behind one NAT."
    )
    var challengeRate: Double = 100

    @Flag(
        name: .customLong("strict-amplification"),
        help: "Drop 401/438 challenges larger than their request (no amplification at all; breaks clients with tiny requests).")
    var strictAmplification = false

    // Metrics (coturn's flag names).

    @Flag(name: .customLong("prometheus"), help: "Serve Prometheus metrics over HTTP at /metrics.")
    var prometheus = false

    @Option(name: .customLong("prometheus-port"), help: "Port of the metrics endpoint (0: any free port).")
    var prometheusPort: UInt16 = 9641

    @Option(name: .customLong("prometheus-address"), help: ArgumentHelp("IP of the metrics endpoint.", valueName: "ip"))
    var prometheusAddress = "127.0.0.1"

    // Rendezvous (signaling for `tusa call`).

    @Option(
        name: .customLong("rendezvous-port"),
        help:
            "Serve the rendezvous (peers register by public key and exchange sealed call offers) on this TCP port of the first listen address (0: any free port). Registered peers get TURN REST-API credentials when --static-auth-secret is set. Off unless given."
    )
    var rendezvousPort: UInt16?

    @Option(
        name: .customLong("rendezvous-database"),
        help: ArgumentHelp(
            "Keep the rendezvous's invitations and known keys in this database (sqlite:PATH or postgres://…), so that they outlive a restart, as tusa directory does (default: in memory).",
            valueName: "url"))
    var rendezvousDatabase: String?

    // Scale-out: a directory places peers and rooms on relays by load.

    @Option(
        name: .customLong("directory"),
        help: ArgumentHelp(
            "Report this relay's load to a directory every 2 s (tusa directory --relay-secret), which then sends peers and parties here by load. Several, comma-separated: nodes of one directory, the next tried when one dies.",
            valueName: "host:port"))
    var directory: String?

    @Option(name: .customLong("directory-secret"), help: ArgumentHelp("The directory's relay secret.", valueName: "secret"))
    var directorySecret: String?

    @Option(
        name: .customLong("capacity-mbps"),
        help: "What this relay may carry, megabits a second: the directory sends no new work past 70 % of it.")
    var capacityMbps = 1000

    // Parties (group voice rooms, end-to-end encrypted).

    @Option(
        name: .customLong("party-port"),
        help:
            "Host parties: members hold a Noise IK session with the relay's identity on this UDP port of the first listen address (0: any free port) and the relay forwards their sealed voice. Off unless given."
    )
    var partyPort: UInt16?

    @Option(
        name: .customLong("identity"),
        help: ArgumentHelp(
            "The relay's identity key file (tusa keygen) for --party-port; a fresh key for this run when not given.",
            valueName: "file"))
    var identity: String?

    @Option(
        name: .customLong("party-tcp-port"),
        help: ArgumentHelp(
            "Also take party members over TCP (RFC 4571) on this port, e.g. 443 for networks that block UDP (repeatable; the party UDP port's number always is).",
            valueName: "port"))
    var partyTCPPorts: [UInt16] = []

    @Option(
        name: .customLong("party-tls-port"),
        help: ArgumentHelp(
            "Also take party members over TLS (RFC 4571 inside) on this TCP port, e.g. 443 for networks that pass only TLS (repeatable). Shows them --party-cert (else --cert); any certificate serves, a self-signed one included: members prove the relay by its identity key. An ECDSA key costs the relay less per handshake than RSA.",
            valueName: "port"))
    var partyTLSPorts: [UInt16] = []

    @Option(
        name: .customLong("party-cert"),
        help: ArgumentHelp(
            "PEM certificate chain for --party-tls-port (with --party-pkey), when it is not --cert (which also serves STUN/TURN over TLS).",
            valueName: "file"))
    var partyCertificate: String?

    @Option(name: .customLong("party-pkey"), help: ArgumentHelp("PEM private key of --party-cert.", valueName: "file"))
    var partyPrivateKey: String?

    @Option(name: .customLong("max-party-size"), help: "Members a party may hold.")
    var maxPartySize = 50

    @Option(
        name: .customLong("party-keylog"),
        help: ArgumentHelp(
            "Log the members' hop-by-hop session keys to this file (mode 0600), for tusa interop decrypt: it opens the relay's layer and finds the voice still sealed end to end.",
            valueName: "file"))
    var partyKeyLog: String?

    func run() async throws {
        var relay = self
        if let config {
            do {
                relay = try withConfigFile(config)
            } catch {
                throw failure(error.message)
            }
        }
        try await relay.serve()
    }

    /// This command as if the file's options came first on its command line.
    private func withConfigFile(_ path: String) throws(ConfigurationProblem) -> Relay {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw ConfigurationProblem(message: "cannot read config file '\(path)'")
        }
        let file: RelayConfigFile.Result
        do {
            file = try RelayConfigFile.arguments(from: text, file: path)
        } catch {
            throw ConfigurationProblem(message: error.description)
        }
        for notice in file.notices { standardError("tusa relay: notice: \(notice)") }

        // The command line as given, after `tusa relay`.
        let given = Array(CommandLine.arguments.dropFirst())
        guard given.first == "relay" else {
            throw ConfigurationProblem(message: "--config works only as 'tusa relay --config FILE ...'")
        }
        do {
            var relay = try Relay.parse(file.arguments + given.dropFirst())
            relay.config = nil
            return relay
        } catch {
            // Blame the file's line when that option alone does not parse.
            for (argument, line) in zip(file.arguments, file.lines) {
                do {
                    _ = try Relay.parse([argument])
                } catch {
                    throw ConfigurationProblem(message: "\(path):\(line): \(Relay.message(for: error))")
                }
            }
            throw ConfigurationProblem(message: Relay.message(for: error))
        }
    }

    private func serve() async throws {
        let configuration: RelayService.Configuration
        let metricsAddress: TransportAddress?
        do throws(RelayConfigurationError) {
            let options = self.options
            configuration = try options.configuration()
            metricsAddress = try options.metricsAddress()
        } catch {
            throw failure(error.description)
        }
        do throws(RelayServiceError) { try RelayService.check(configuration) } catch { throw failure(error.message) }

        Relay.logToStandardError(at: logLevel.level)
        let logger = Logger(label: "tusa.relay")

        let limit: UInt64?
        switch Relay.memoryLimit(memoryLimit) {
        case .success(let bytes): limit = bytes
        case .failure(let problem): throw failure(problem.message)
        }
        let memory = MemoryGuard(option: limit, logger: logger)
        let service = RelayService(configuration: configuration, memory: memory, logger: logger)

        let party: PartyService?
        if let partyPort {
            guard (2...10_000).contains(maxPartySize) else { throw failure("--max-party-size must be 2-10000") }
            let key: Identity
            do { key = try identity.map { try Identity.read(from: $0) } ?? .generate() } catch {
                throw failure("cannot read the identity '\(identity ?? "")': \(error)")
            }
            var rooms = PartyServer.Configuration()
            rooms.maxMembers = maxPartySize
            // A directory finds this relay's rooms by their ids' first characters, and
            // its other relays take them over with their tickets when this one goes.
            if directory != nil { rooms.roomPrefix = RoomHome.roomPrefix(for: key.publicKey) }
            let ip = configuration.listenAddresses.first?.ip ?? .v4(0x7F00_0001)
            var tls: PartyService.TLSStreams?
            if (partyCertificate == nil) != (partyPrivateKey == nil) {
                throw failure("--party-cert and --party-pkey go together")
            }
            if partyCertificate != nil, partyTLSPorts.isEmpty { throw failure("--party-cert is for --party-tls-port") }
            if !partyTLSPorts.isEmpty {
                guard let certificate = partyCertificate ?? certificate, let privateKey = partyPrivateKey ?? privateKey
                else {
                    throw failure(
                        "--party-tls-port needs --party-cert and --party-pkey (or --cert and --pkey): the certificate members' TLS is shown (any serves, a self-signed one included: members prove the relay by its identity key)"
                    )
                }
                tls = PartyService.TLSStreams(ports: partyTLSPorts, certificateFile: certificate, privateKeyFile: privateKey)
                do throws(RelayServiceError) { _ = try tls?.context() } catch { throw failure(error.message) }
            }
            party = PartyService(
                address: TransportAddress(ip: ip, port: partyPort), identity: key, configuration: rooms,
                keyLogPath: partyKeyLog, streamPorts: [nil] + partyTCPPorts.map { $0 }, tls: tls,
                streamLimits: .init(total: maxTCPConnections, perSource: maxTCPConnectionsPerSource),
                ticketSecret: directory != nil ? directorySecret : nil, memory: memory, logger: logger)
        } else {
            guard identity == nil, partyKeyLog == nil, partyTCPPorts.isEmpty, partyTLSPorts.isEmpty, partyCertificate == nil
            else {
                throw failure(
                    "--identity, --party-tcp-port, --party-tls-port, --party-cert and --party-keylog need --party-port")
            }
            party = nil
        }
        let metrics = metricsAddress.map {
            MetricsEndpoint.serving(service, party: party, memory: memory, on: $0, logger: logger)
        }
        var store: (any RendezvousStore)?
        if let rendezvousDatabase {
            guard rendezvousPort != nil else { throw failure("--rendezvous-database needs --rendezvous-port") }
            do throws(DirectoryError) {
                store = try await DirectoryDatabase(rendezvousDatabase).open(logger: logger)
            } catch {
                throw failure(error.description)
            }
        }
        let rendezvous = rendezvousPort.map { port in
            makeRendezvous(
                port: port, configuration: configuration, service: service, party: party, memory: memory, store: store,
                logger: logger)
        }
        var reporter: DirectoryReporter?
        if let directory {
            guard let secret = directorySecret, !secret.isEmpty else { throw failure("--directory needs --directory-secret") }
            let targets: [TransportAddress]
            do { targets = try RendezvousServers.addresses(directory, option: "--directory") } catch {
                throw failure(error.message)
            }
            guard (1...100_000_000).contains(capacityMbps) else { throw failure("--capacity-mbps must be 1-100000000") }
            let key = party?.identity.privateKey ?? PrivateKey.generate()
            reporter = DirectoryReporter(
                directories: targets, secret: secret, identity: key, logger: logger,
                rooms: Self.roomLister(party),
                load: Self.loadReporter(service: service, party: party, capacityMbps: capacityMbps))
        } else if directorySecret != nil {
            throw failure("--directory-secret needs --directory")
        }
        let services: [any Service] =
            [memory, service] + (metrics.map { [$0] } ?? []) + (rendezvous.map { [$0] } ?? []) + (party.map { [$0] } ?? [])
            + (reporter.map { [$0] } ?? [])
        let group = ServiceGroup(
            configuration: .init(services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        do {
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                tasks.addTask { try await group.run() }
                tasks.addTask {
                    for socket in try await service.boundSockets() { print("listening \(socket)") }
                    if let metrics {
                        let address = try await metrics.boundAddress()
                        print("metrics http://\(address)/metrics")
                    }
                    if let rendezvous {
                        print("rendezvous tcp \(try await rendezvous.boundAddress())")
                    }
                    if let party {
                        print("party udp \(try await party.boundAddress()) key \(party.identity.publicKey)")
                        for address in try await party.boundTCPAddresses() { print("party tcp \(address)") }
                        for address in try await party.boundTLSAddresses() { print("party tls \(address)") }
                    }
                    flushStandardOutput()  // every line out before anyone waits on it
                }
                try await tasks.waitForAll()
            }
        } catch let error as RelayServiceError {
            throw failure(error.message)
        } catch {
            throw failure("\(error)")
        }
        let turn = await service.turnStatistics()
        if configuration.turn != nil {
            print(
                "turn: \(turn.allocationsCreated) allocations, \(turn.packetsToPeer) packets to peers, \(turn.packetsToClient) to clients, \(turn.authFailures) auth failures, \(turn.totalDrops) drops"
            )
        }
        print("stopped: \(service.statistics)")
        flushStandardOutput()
    }

    /// What a directory's relay lists of its rooms (nil without parties).
    private static func roomLister(_ party: PartyService?) -> DirectoryReporter.RoomListings? {
        guard let party else { return nil }
        return { known in await party.roomListings(since: known) }
    }

    /// The relay's figures for its directory: TURN bytes and packets and party frames
    /// per second since the last call (a party voice frame counted as 120 bytes on the
    /// wire), allocations, rooms, members, CPU in cores.
    private static func loadReporter(service: RelayService, party: PartyService?, capacityMbps: Int)
        -> @Sendable (Double) async -> RelayLoad
    {
        let last = NIOLockedValueBox((bytes: UInt64(0), packets: UInt64(0), frames: UInt64(0), cpu: 0.0, at: Date()))
        return { _ in
            let turn = await service.turnStatistics()
            let frames = party?.statistics.framesForwarded ?? 0
            let bytes = UInt64(clamping: turn.bytesToPeer) &+ UInt64(clamping: turn.bytesToClient)
            let packets = UInt64(clamping: turn.packetsToPeer) &+ UInt64(clamping: turn.packetsToClient)
            let cpu = DirectoryReporter.cpuSeconds()
            let now = Date()
            let before = last.withLockedValue { previous in
                defer { previous = (bytes, packets, frames, cpu, now) }
                return previous
            }
            let seconds = max(0.001, now.timeIntervalSince(before.at))
            let rate = { (now: UInt64, then: UInt64) in UInt64(Double(now &- min(then, now)) / seconds) }
            var grant: PartyGrant?
            if let party, let address = try? await party.boundAddress() {
                grant = PartyGrant(address: "\(address)", key: party.identity.publicKey.base64)
            }
            let uris = (try? await service.turnURIs().map(\.description)) ?? []
            return RelayLoad(
                party: grant, turnURIs: uris, capacityBitsPerSecond: UInt64(capacityMbps) * 1_000_000,
                bitsPerSecond: rate(bytes, before.bytes) * 8 + rate(frames, before.frames) * 120 * 8,
                packetsPerSecond: rate(packets, before.packets) + rate(frames, before.frames),
                allocations: turn.allocationsActive, rooms: party?.roomCount ?? 0, members: party?.memberCount ?? 0,
                cpu: (cpu - before.cpu) / seconds)
        }
    }

    /// The rendezvous on the first listen address; with REST secrets, registered peers
    /// get credentials (the first secret) for the relay's own TURN sockets.
    private func makeRendezvous(
        port: UInt16, configuration: RelayService.Configuration, service: RelayService, party: PartyService?,
        memory: MemoryGuard, store: (any RendezvousStore)?, logger: Logger
    ) -> RendezvousService {
        let ip = configuration.listenAddresses.first?.ip ?? .v4(0x7F00_0001)
        var core = RendezvousServerConfiguration()
        core.maximumConnectionsPerSource = configuration.maxTCPConnectionsPerSource
        if let turn = configuration.turn, let secret = turn.credentials.restSecrets.first {
            core.turn = TURNIssuer(secret: secret, uris: [])
        }
        var partyGrant: (@Sendable () async throws -> PartyGrant)?
        if let party {
            let key = party.identity.publicKey.base64
            partyGrant = { PartyGrant(address: "\(try await party.boundAddress())", key: key) }
        }
        return RendezvousService(
            address: TransportAddress(ip: ip, port: port), configuration: core,
            turnURIs: {
                try await service.turnURIs().map(\.description)
            },
            party: partyGrant, rooms: Self.roomLister(party), memory: memory, store: store, logger: logger)
    }

    private struct ConfigurationProblem: Error {
        var message: String
    }

    /// The flags as the relay library's options (which check them).
    private var options: RelayOptions {
        var o = RelayOptions()
        o.listen = listen
        o.listeningIPs = listeningIPs
        o.listeningPort = listeningPort
        o.alternateAddress = alternateAddress
        o.software = software
        o.udp = !noUDP
        o.tcp = !noTCP
        o.gso = !noGSO
        o.threads = threads
        o.batchWindowMicroseconds = batchWindow
        o.users = users
        o.userFile = userFile
        o.realm = realm
        o.useAuthSecret = useAuthSecret
        o.staticAuthSecrets = staticAuthSecrets
        o.noAuth = noAuth
        o.relayIPs = relayIPs
        o.externalIPs = externalIPs
        o.minPort = minPort
        o.maxPort = maxPort
        o.allowLoopbackPeers = allowLoopbackPeers
        o.allowedPeerIPs = allowedPeerIPs
        o.deniedPeerIPs = deniedPeerIPs
        o.userQuota = userQuota
        o.totalQuota = totalQuota
        o.maxBPS = maxBPS
        o.maxAllocateLifetime = maxAllocateLifetime
        o.staleNonce = staleNonce
        o.strictChannelNumbers = strictChannelNumbers
        o.challengeRate = challengeRate
        o.strictAmplification = strictAmplification
        o.certificate = certificate
        o.privateKey = privateKey
        o.tlsPort = tlsPort
        o.noTLS = noTLS
        o.maxTCPConnections = maxTCPConnections
        o.maxTCPConnectionsPerSource = maxTCPConnectionsPerSource
        o.prometheus = prometheus
        o.prometheusPort = prometheusPort
        o.prometheusAddress = prometheusAddress
        return o
    }

    /// Says what was wrong in one line on standard error; throw the result to exit with status 1.
    private func failure(_ message: String) -> ExitCode {
        standardError("tusa relay: error: \(message)")
        return ExitCode(1)
    }

    /// One line on standard error, unbuffered.
    private func standardError(_ text: String) {
        let line = Array("\(text)\n".utf8)
        _ = line.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
    }
}

// What `tusa relay` and `tusa directory` share.
extension Relay {
    struct OptionProblem: Error {
        var message: String
    }

    /// `--memory-limit`'s bytes (nil when not given), or why the text is not a size.
    static func memoryLimit(_ text: String?) -> Result<UInt64?, OptionProblem> {
        guard let text else { return .success(nil) }
        guard let bytes = MemoryLimit.parse(text) else {
            return .failure(OptionProblem(message: "--memory-limit must be a size such as 512M or 2G, not '\(text)'"))
        }
        return .success(bytes)
    }

    /// Every logger to standard error from `level` up.
    static func logToStandardError(at level: Logger.Level) {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
    }
}
