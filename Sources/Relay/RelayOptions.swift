import Foundation
import STUN
import TURN
import TusaBase

/// A relay's options as a user writes them (the `tusa relay` flags, coturn's
/// names where they overlap): text for addresses, numbers as given. ``configuration()``
/// checks them and builds the ``RelayService/Configuration`` (with its TURN
/// configuration), or says which option was wrong.
public struct RelayOptions: Hashable, Sendable {
    /// `listen`: `IP:PORT` or `[IPv6]:PORT` (port 3478 if left out).
    public var listen: [String] = []
    /// `listening-ip`: IPs served at ``listeningPort``.
    public var listeningIPs: [String] = []
    /// `listening-port`: the port of ``listeningIPs`` (3478 by default); alone, the
    /// port of the default wildcard addresses.
    public var listeningPort: UInt16?
    /// `alt-address`: RFC 5780's alternate `IP:PORT`.
    public var alternateAddress: String?
    /// The SOFTWARE attribute of responses.
    public var software: String?
    public var udp = true
    public var tcp = true
    public var gso = true
    public var threads = 1
    /// `batch-window`: see ``RelayService/Configuration/batchWindow``.
    public var batchWindowMicroseconds = RelayOptions.defaultBatchWindowMicroseconds
    public static let defaultBatchWindowMicroseconds = Int(RelayService.Configuration.defaultBatchWindow.nanoseconds / 1000)

    // TURN (RFC 8656).

    /// `user`: `NAME:PASSWORD` or `NAME:0xMD5KEY`.
    public var users: [String] = []
    /// `user-file`: a file of users, one per line, `#` comments.
    public var userFile: String?
    public var realm = "tusa"
    /// `use-auth-secret`: accept coturn REST-API credentials (needs ``staticAuthSecrets``).
    public var useAuthSecret = false
    public var staticAuthSecrets: [String] = []
    /// `no-auth`: TURN without authentication.
    public var noAuth = false
    /// `relay-ip`: where relay sockets are bound, one per family.
    public var relayIPs: [String] = []
    /// `external-ip`: `PUBLIC` or `PUBLIC/PRIVATE`, one per family.
    public var externalIPs: [String] = []
    public var minPort: UInt16 = 49152
    public var maxPort: UInt16 = 65535
    public var allowLoopbackPeers = false
    /// `allowed-peer-ip` / `denied-peer-ip`: IP, IP/LEN or FIRST-LAST.
    public var allowedPeerIPs: [String] = []
    public var deniedPeerIPs: [String] = []
    public var userQuota = 1000
    public var totalQuota = 100_000
    /// `max-bps`: bytes per second per allocation each way (0: no limit).
    public var maxBPS = 0
    /// `max-allocate-lifetime`, seconds.
    public var maxAllocateLifetime: UInt32 = 3600
    /// `stale-nonce`, seconds.
    public var staleNonce = 600
    public var strictChannelNumbers = false
    /// `challenge-rate`: 401/438 answers per second to one source IP.
    public var challengeRate: Double = 100
    public var strictAmplification = false

    // TLS.

    /// `cert` and `pkey`: PEM files; TLS is served when both are given.
    public var certificate: String?
    public var privateKey: String?
    public var tlsPort: UInt16 = 5349
    /// `no-tls`: ignore ``certificate`` and ``privateKey``.
    public var noTLS = false
    public var maxTCPConnections = 10_000
    /// `max-tcp-connections-per-ip`.
    public var maxTCPConnectionsPerSource = 1_000

    // Metrics.

    /// `prometheus`: serve metrics at ``prometheusAddress``:``prometheusPort``.
    public var prometheus = false
    public var prometheusPort: UInt16 = 9641
    public var prometheusAddress = "127.0.0.1"

    public init() {}

    /// The service configuration these options ask for, checked option by option
    /// and then as a whole (``RelayService/Configuration/validate()``).
    public func configuration() throws(RelayConfigurationError) -> RelayService.Configuration {
        var listenAddresses: [TransportAddress] = []
        for text in listen {
            guard let address = TransportAddress(text, defaultPort: 3478) else { throw .badListenAddress(text) }
            listenAddresses.append(address)
        }
        for text in listeningIPs {
            guard let ip = IPAddress(text) else { throw .badListeningIP(text) }
            listenAddresses.append(TransportAddress(ip: ip, port: listeningPort ?? 3478))
        }
        if let listeningPort, listeningIPs.isEmpty {
            // coturn's listening-port alone: every address, on that port.
            guard listen.isEmpty else { throw .listeningPortWithListen }
            listenAddresses = RelayService.Configuration.defaultListenAddresses.map {
                TransportAddress(ip: $0.ip, port: listeningPort)
            }
        }
        var alternate: TransportAddress?
        if let text = alternateAddress {
            guard let address = TransportAddress(text) else { throw .badAlternateAddress(text) }
            alternate = address
        }
        guard (1...1024).contains(threads) else { throw .threadsOutOfRange(threads) }
        guard (0...100_000).contains(batchWindowMicroseconds) else { throw .batchWindowOutOfRange(batchWindowMicroseconds) }
        let addresses = listenAddresses.isEmpty ? RelayService.Configuration.defaultListenAddresses : listenAddresses
        var configuration = RelayService.Configuration(
            listenAddresses: addresses,
            alternateAddress: alternate, software: software, udp: udp, tcp: tcp, threads: threads, gso: gso,
            batchWindow: .microseconds(Int64(batchWindowMicroseconds)))
        if !noTLS {
            switch (certificate, privateKey) {
            case (let cert?, let key?): configuration.tls = TLSSettings(certificateFile: cert, privateKeyFile: key, port: tlsPort)
            case (nil, nil): break
            default: throw .certificateWithoutKey
            }
        }
        guard maxTCPConnections >= 1 else { throw .maxTCPConnectionsTooLow }
        guard maxTCPConnectionsPerSource >= 1 else { throw .maxTCPConnectionsPerSourceTooLow }
        configuration.maxTCPConnections = maxTCPConnections
        configuration.maxTCPConnectionsPerSource = maxTCPConnectionsPerSource
        if let turn = try turnConfiguration() {
            configuration.turn = turn
            var plan = RelayAddressPlan.derived(from: addresses, minPort: minPort, maxPort: maxPort)
            if !relayIPs.isEmpty {
                plan.ips = []
                for text in relayIPs {
                    guard let ip = IPAddress(text) else { throw .badRelayIP(text) }
                    plan.ips.removeAll { $0.family == ip.family }
                    plan.ips.append(ip)
                }
            }
            guard minPort > 0, minPort <= maxPort else { throw .noRelayPorts(minPort: minPort, maxPort: maxPort) }
            if plan.ips.isEmpty { throw .noRelayIP }
            configuration.relayPlan = plan
        }
        do throws(RelayServiceError) {
            try configuration.validate()
        } catch {
            throw .invalid(error)
        }
        return configuration
    }

    /// Where to serve metrics; nil without ``prometheus``.
    public func metricsAddress() throws(RelayConfigurationError) -> TransportAddress? {
        guard prometheus else { return nil }
        guard let ip = IPAddress(prometheusAddress) else { throw .badPrometheusAddress(prometheusAddress) }
        return TransportAddress(ip: ip, port: prometheusPort)
    }

    /// The TURN configuration, or nil when no credentials (and no ``noAuth``) were
    /// given: STUN only. Reads ``userFile``.
    public func turnConfiguration() throws(RelayConfigurationError) -> TURNServerConfiguration? {
        // Each with where it came from, for errors (`--user-file PATH:LINE`).
        var fileUsers: [(spec: String, line: Int)] = []
        if let userFile {
            guard let text = try? String(contentsOfFile: userFile, encoding: .utf8) else { throw .unreadableUserFile(userFile) }
            for (n, line) in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).enumerated() {
                let entry = line.trimmingCharacters(in: .whitespaces)
                if !entry.isEmpty && !entry.hasPrefix("#") { fileUsers.append((entry, n + 1)) }
            }
        }
        if useAuthSecret && staticAuthSecrets.isEmpty { throw .authSecretWithoutSecret }
        // An empty secret is one anyone can sign credentials with.
        if staticAuthSecrets.contains("") { throw .emptyAuthSecret }
        let secrets = useAuthSecret || !staticAuthSecrets.isEmpty ? staticAuthSecrets : []
        guard noAuth || !users.isEmpty || !fileUsers.isEmpty || !secrets.isEmpty else { return nil }
        var turn = TURNServerConfiguration(realm: realm)
        turn.software = software
        turn.anonymous = noAuth
        do throws(STUNError) {
            for spec in users { try turn.credentials.addUser(spec: spec) }
        } catch {
            throw .badUser(error)
        }
        for (spec, line) in fileUsers {
            do throws(STUNError) { try turn.credentials.addUser(spec: spec) } catch {
                throw .badUser(STUNError(error.code, "--user-file \(userFile ?? ""):\(line): \(error.message)"))
            }
        }
        turn.credentials.restSecrets = secrets
        var allowed: [IPRange] = []
        var denied: [IPRange] = []
        for text in allowedPeerIPs {
            guard let ranges = IPRange.parseList(text) else { throw .badPeerRange(option: "--allowed-peer-ip", text: text) }
            allowed += ranges
        }
        for text in deniedPeerIPs {
            guard let ranges = IPRange.parseList(text) else { throw .badPeerRange(option: "--denied-peer-ip", text: text) }
            denied += ranges
        }
        turn.peerFilter = PeerFilter(allowLoopback: allowLoopbackPeers, allowed: allowed, denied: denied)
        for text in externalIPs {
            let publicPart = String(text.split(separator: "/", maxSplits: 1).first ?? "")
            guard let ip = IPAddress(publicPart) else { throw .badExternalIP(text) }
            turn.externalIP[ip.family] = ip
        }
        guard userQuota >= 0, totalQuota >= 0, maxBPS >= 0 else { throw .negativeQuota }
        turn.userQuota = userQuota
        turn.totalQuota = totalQuota
        turn.maxBandwidth = maxBPS
        guard maxAllocateLifetime >= 600 else { throw .allocateLifetimeTooShort }
        turn.maxLifetime = maxAllocateLifetime
        guard (1...86_400).contains(staleNonce) else { throw .staleNonceOutOfRange }
        turn.nonceLifetime = .seconds(staleNonce)
        turn.strictAmplification = strictAmplification
        guard challengeRate >= 0, challengeRate.isFinite else { throw .badChallengeRate }
        turn.challengeRate = challengeRate
        turn.challengeBurst = challengeRate * 2
        if strictChannelNumbers { turn.channelNumbers = ChannelNumber.validRange }
        return turn
    }
}
