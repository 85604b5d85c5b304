/// Reads a coturn-format configuration file (`turnserver.conf`) into `tusa
/// relay` command-line arguments.
///
/// The format is coturn's: one option per line, its long name without dashes,
/// then the value after any run of spaces, tabs or `=` (`realm=example.org`,
/// `realm example.org`); a value in double quotes loses them; a flag stands
/// alone or takes a boolean (`fingerprint`, `no-tcp=true`, `no-udp off`); a line
/// whose first non-blank character is `#` is a comment. Options that `tusa relay`
/// has become `--name=value` arguments (so a value may begin with a dash);
/// coturn options it has no use for are skipped with a notice each; anything
/// else is an error naming its line.
///
/// The caller parses the file's arguments first and the command line's after
/// them, so a single-valued option on the command line overrides the file and
/// repeatable ones add up.
public enum RelayConfigFile {
    /// How an option takes its value.
    public enum Kind: Hashable, Sendable {
        /// A flag: bare, or with a boolean (on/off, yes/no, true/false, 1/0).
        case flag
        /// An option that needs a value.
        case value
        /// An option whose bare form keeps the default (coturn's `stale-nonce`).
        case optionalValue
    }

    /// What a file says, as arguments.
    public struct Result: Hashable, Sendable {
        /// `--name=value` and `--flag` arguments, in file order.
        public var arguments: [String]
        /// The 1-based line each argument came from (same indices as ``arguments``).
        public var lines: [Int]
        /// One line per skipped coturn option: `FILE:LINE: ...`.
        public var notices: [String]

        public init(arguments: [String] = [], lines: [Int] = [], notices: [String] = []) {
            self.arguments = arguments
            self.lines = lines
            self.notices = notices
        }
    }

    /// `FILE:LINE: what is wrong`.
    public struct Problem: Error, Hashable, Sendable, CustomStringConvertible {
        public var file: String
        public var line: Int
        public var message: String

        public init(file: String, line: Int, message: String) {
            self.file = file
            self.line = line
            self.message = message
        }

        public var description: String { "\(file):\(line): \(message)" }
    }

    /// The long options of `tusa relay` a file may set (coturn's names where
    /// the two overlap). `config`, `help` and `version` are not among them.
    public static let relayOptions: [String: Kind] = [
        // Listening.
        "listen": .value, "listening-ip": .value, "listening-port": .value, "alt-address": .value,
        "no-tcp": .flag, "no-udp": .flag, "no-gso": .flag, "threads": .value, "batch-window": .value,
        "software": .value, "log-level": .value,
        // TURN authentication.
        "user": .value, "user-file": .value, "realm": .value, "use-auth-secret": .flag,
        "static-auth-secret": .value, "lt-cred-mech": .flag, "no-auth": .flag,
        // Relay addresses and peers.
        "relay-ip": .value, "external-ip": .value, "min-port": .value, "max-port": .value,
        "allow-loopback-peers": .flag, "allowed-peer-ip": .value, "denied-peer-ip": .value,
        // Limits.
        "user-quota": .value, "total-quota": .value, "max-bps": .value, "max-allocate-lifetime": .value,
        "stale-nonce": .optionalValue, "strict-channel-numbers": .flag, "strict-amplification": .flag,
        "max-tcp-connections": .value, "max-tcp-connections-per-ip": .value, "memory-limit": .value,
        "challenge-rate": .value,
        // TLS.
        "cert": .value, "pkey": .value, "tls-listening-port": .value, "no-tls": .flag,
        // Metrics.
        "prometheus": .flag, "prometheus-port": .value, "prometheus-address": .value,
        // tusa's own: the rendezvous, the directory, parties.
        "rendezvous-port": .value, "rendezvous-database": .value, "directory": .value, "directory-secret": .value,
        "capacity-mbps": .value, "party-port": .value, "identity": .value, "party-tcp-port": .value,
        "party-tls-port": .value, "party-cert": .value, "party-pkey": .value, "max-party-size": .value,
        "party-keylog": .value,
    ]

    /// The options that give `tusa relay` credentials, and with them TURN.
    static let credentialOptions: Set<String> = ["user", "user-file", "use-auth-secret", "static-auth-secret", "no-auth"]

    /// coturn's `turnserver` options (4.6 and later) that `tusa relay` does not
    /// take: TLS/DTLS, databases, the CLI and web admin, logging, process
    /// control and tuning knobs. A file that sets them still loads.
    public static let ignoredCoturnOptions: Set<String> = [
        "acme-redirect", "allocation-default-address-family", "alt-listening-port", "alt-tls-listening-port",
        "alternate-server", "aux-server", "bps-capacity", "channel-lifetime", "check-origin-consistency",
        "cipher-list", "cli", "cli-ip", "cli-max-output-sessions", "cli-password", "cli-port", "cpus", "daemon", "db",
        "dh-file", "dh1066", "dh566", "drain-min-allocations", "drop-invalid-packets", "drop-invalid-packets-log",
        "dtls", "ec-curve-name", "fingerprint", "include-reason-string", "keep-address-family", "listening-device",
        "log-binding", "log-file", "log-min-level", "max-allocate-timeout", "mobility", "mongo-userdb",
        "multiplex-peer", "multiplex-peer-max-peers", "multiplex-peer-port", "mysql-userdb", "ne",
        "new-log-timestamp", "new-log-timestamp-format", "no-auth-pings", "no-cli", "no-dtls", "no-dynamic-ip-list",
        "no-dynamic-realms", "no-loopback-peers", "no-multicast-peers", "no-rfc5780", "no-software-attribute",
        "no-stdout-log", "no-stun", "no-stun-backward-compatibility", "no-tcp-relay", "no-tlsv1",
        "no-tlsv1_1", "no-tlsv1_2", "no-udp-relay", "oauth", "permission-lifetime", "pidfile", "pkey-pwd",
        "proc-group", "proc-user", "prod", "prometheus-cert", "prometheus-key", "prometheus-path",
        "prometheus-tls", "prometheus-username-labels", "psql-userdb", "raw-public-keys", "redis-statsdb",
        "redis-userdb", "relay-device", "relay-threads", "respond-http-unsupported",
        "response-origin-only-with-rfc5780", "rest-api-separator", "rfc3489-compatibility",
        "rfc5766-channel-numbers", "rfc5780", "secret-key-file", "secure-stun", "server-name", "server-relay",
        "simple-log", "sock-buf-size", "software-attribute", "sql-userdb", "stateless-nonce",
        "stateless-nonce-secret", "stun-backward-compatibility", "syslog", "syslog-facility",
        "tcp-alternate-server", "tcp-proxy-port", "tls-alternate-server", "tlsv1",
        "udp-alternate-server", "udp-gso", "udp-recvmmsg", "udp-recvmmsg-log", "udp-self-balance",
        "udp-sendmmsg-log", "unauthorized-ratelimit", "unauthorized-ratelimit-rps", "userdb", "verbose",
        "web-admin", "web-admin-ip", "web-admin-listen-on-workers", "web-admin-port",
    ]

    /// Turns the text of a file into arguments. `file` only names it in
    /// notices and errors. Pure: reads nothing, prints nothing.
    public static func arguments(
        from text: String, file: String,
        options: [String: Kind] = relayOptions, ignored: Set<String> = ignoredCoturnOptions
    ) throws(Problem) -> Result {
        var result = Result()
        var number = 0
        // coturn's stun-only (where it was, and whether it was on), judged once the
        // whole file is read.
        var stunOnly: (line: Int, on: Bool)?
        for rawLine in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline) {
            number += 1
            let line = rawLine.drop { $0 == " " || $0 == "\t" }.trimmingTrailingWhitespace()
            if line.isEmpty || line.hasPrefix("#") { continue }

            // coturn: the name ends at the first space, tab or '='; the value
            // starts after the run of them.
            let separators: Set<Character> = [" ", "\t", "="]
            let nameEnd = line.firstIndex { separators.contains($0) } ?? line.endIndex
            let name = String(line[..<nameEnd])
            var value = line[nameEnd...].drop { separators.contains($0) }
            if value.hasPrefix("\"") {
                value = value.dropFirst()
                if value.hasSuffix("\"") { value = value.dropLast() }
            }

            func problem(_ message: String) -> Problem { Problem(file: file, line: number, message: message) }
            func add(_ argument: String) {
                result.arguments.append(argument)
                result.lines.append(number)
            }

            if name == "stun-only" {
                guard let on = boolean(value) else { throw problem("'stun-only' takes no value or a boolean, not '\(value)'") }
                stunOnly = (number, on)
                continue
            }
            guard let kind = options[name] else {
                if ignored.contains(name) {
                    result.notices.append("\(file):\(number): ignoring coturn option '\(name)' (not used by tusa)")
                    continue
                }
                if name.hasPrefix("-") {
                    throw problem("'\(name)': write option names without dashes, e.g. '\(name.drop { $0 == "-" })'")
                }
                throw problem("unknown option '\(name)'")
            }
            switch kind {
            case .flag:
                guard let on = boolean(value) else {
                    throw problem("'\(name)' takes no value or a boolean (on/off, yes/no, true/false, 1/0), not '\(value)'")
                }
                if on { add("--\(name)") }
            case .value:
                guard !value.isEmpty else { throw problem("'\(name)' needs a value") }
                add("--\(name)=\(value)")
            case .optionalValue:
                if !value.isEmpty { add("--\(name)=\(value)") }
            }
        }
        // tusa relay has no switch for it: it serves TURN whenever it has credentials,
        // STUN alone otherwise. With credentials in the file, stun-only would be a lie.
        if let stunOnly, stunOnly.on {
            // (A flag set off is no argument; a value, whatever it reads as, is one.)
            let credentials = result.arguments.contains { argument in
                credentialOptions.contains(String(argument.dropFirst(2).prefix { $0 != "=" }))
            }
            if credentials {
                throw Problem(
                    file: file, line: stunOnly.line,
                    message:
                        "stun-only: tusa relay serves TURN whenever the file gives it credentials (user, user-file, static-auth-secret, no-auth); remove them, or this line"
                )
            }
            result.notices.append("\(file):\(stunOnly.line): stun-only: without credentials tusa relay serves STUN only")
        }
        return result
    }

    /// coturn's booleans; nil for anything else.
    static func boolean(_ text: Substring) -> Bool? {
        switch text.lowercased() {
        case "", "1", "on", "yes", "y", "true", "t": true
        case "0", "off", "no", "n", "false", "f": false
        default: nil
        }
    }
}

extension Substring {
    fileprivate func trimmingTrailingWhitespace() -> Substring {
        var end = endIndex
        while end > startIndex, let last = self[..<end].last, last.isWhitespace { end = index(before: end) }
        return self[startIndex..<end]
    }
}
