import STUN
import TusaBase

/// Why ``RelayOptions`` do not make a relay configuration. Each case names the
/// option (by its coturn / `tusa relay` name) and the value that was wrong.
public enum RelayConfigurationError: Error, Hashable, Sendable, CustomStringConvertible {
    /// A `listen` address is not `IP:PORT` or `[IPv6]:PORT`.
    case badListenAddress(String)
    /// A `listening-ip` is not an IP address.
    case badListeningIP(String)
    /// `listening-port` given with `listen` addresses (which carry their own port) and no `listening-ip`.
    case listeningPortWithListen
    /// The `alt-address` is not `IP:PORT` or `[IPv6]:PORT`.
    case badAlternateAddress(String)
    /// `threads` is not in 1...1024.
    case threadsOutOfRange(Int)
    case batchWindowOutOfRange(Int)
    /// One of `cert` and `pkey` without the other.
    case certificateWithoutKey
    /// `max-tcp-connections` is below 1.
    case maxTCPConnectionsTooLow
    /// `max-tcp-connections-per-ip` is below 1.
    case maxTCPConnectionsPerSourceTooLow
    /// A `relay-ip` is not an IP address.
    case badRelayIP(String)
    /// `min-port` is 0 or above `max-port`.
    case noRelayPorts(minPort: UInt16, maxPort: UInt16)
    /// No relay IP could be derived from the listen addresses.
    case noRelayIP
    /// The `prometheus-address` is not an IP address.
    case badPrometheusAddress(String)
    /// The `user-file` cannot be read.
    case unreadableUserFile(String)
    /// `use-auth-secret` without any `static-auth-secret`.
    case authSecretWithoutSecret
    /// A `static-auth-secret` is empty: anyone could make credentials with it.
    case emptyAuthSecret
    /// A `user` entry is not `NAME:PASSWORD` or `NAME:0xMD5KEY`.
    case badUser(STUNError)
    /// An `allowed-peer-ip` or `denied-peer-ip` (the option's name) is not IP, IP/LEN or FIRST-LAST.
    case badPeerRange(option: String, text: String)
    /// An `external-ip` is not `PUBLIC` or `PUBLIC/PRIVATE`.
    case badExternalIP(String)
    /// `user-quota`, `total-quota` or `max-bps` is negative.
    case negativeQuota
    /// `max-allocate-lifetime` is below RFC 8656's default lifetime, 600 s.
    case allocateLifetimeTooShort
    /// `stale-nonce` is not in 1...86400 seconds.
    case staleNonceOutOfRange
    /// `challenge-rate` is negative or not finite.
    case badChallengeRate
    /// The assembled configuration cannot be served (``RelayService/Configuration/validate()``).
    case invalid(RelayServiceError)

    public var description: String {
        switch self {
        case .badListenAddress(let text): "--listen '\(text)' is not IP:PORT or [IPv6]:PORT"
        case .badListeningIP(let text): "--listening-ip '\(text)' is not an IP address"
        case .listeningPortWithListen:
            "--listening-port applies to --listening-ip addresses, not to --listen (which has its own port)"
        case .badAlternateAddress(let text): "--alt-address '\(text)' is not IP:PORT or [IPv6]:PORT"
        case .threadsOutOfRange(let threads): "--threads must be between 1 and 1024, not \(threads)"
        case .batchWindowOutOfRange(let us): "--batch-window must be between 0 and 100000 microseconds, not \(us)"
        case .certificateWithoutKey: "--cert and --pkey go together"
        case .maxTCPConnectionsTooLow: "--max-tcp-connections must be at least 1"
        case .maxTCPConnectionsPerSourceTooLow: "--max-tcp-connections-per-ip must be at least 1"
        case .badRelayIP(let text): "--relay-ip '\(text)' is not an IP address"
        case .noRelayPorts(let minPort, let maxPort): "--min-port \(minPort) and --max-port \(maxPort) leave no relay ports"
        case .noRelayIP: "no relay IP: give --relay-ip"
        case .badPrometheusAddress(let text): "--prometheus-address '\(text)' is not an IP address"
        case .unreadableUserFile(let path): "--user-file '\(path)' cannot be read"
        case .authSecretWithoutSecret: "--use-auth-secret needs --static-auth-secret"
        case .emptyAuthSecret: "--static-auth-secret must not be empty: anyone could make TURN credentials with it"
        case .badUser(let error): error.message
        case .badPeerRange(let option, let text): "\(option) '\(text)' is not IP, IP/LEN or FIRST-LAST"
        case .badExternalIP(let text): "--external-ip '\(text)' is not PUBLIC or PUBLIC/PRIVATE"
        case .negativeQuota: "quotas and --max-bps cannot be negative"
        case .allocateLifetimeTooShort: "--max-allocate-lifetime must be at least the default 600 s"
        case .staleNonceOutOfRange: "--stale-nonce must be between 1 and 86400 seconds"
        case .badChallengeRate: "--challenge-rate must be a number, 0 or more"
        case .invalid(let error): error.message
        }
    }
}
