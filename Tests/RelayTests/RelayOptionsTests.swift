import Foundation
import Relay
import STUN
import TURN
import Testing
import TusaBase

/// `tusa relay`'s flags as ``RelayOptions``: what they build, and which option
/// each refusal names.
@Suite("Relay options: flags to a checked configuration")
struct RelayOptionsTests {
    @Test("no options: STUN on the default wildcard addresses, no TURN, no metrics")
    func defaults() throws {
        let configuration = try RelayOptions().configuration()
        #expect(configuration.listenAddresses == RelayService.Configuration.defaultListenAddresses)
        #expect(configuration.turn == nil)
        #expect(configuration.tls == nil)
        #expect(try RelayOptions().metricsAddress() == nil)
    }

    @Test("the batch window: 200 µs by default, 0 turns it off, and it reaches the service's configuration")
    func batchWindow() throws {
        #expect(try RelayOptions().configuration().batchWindow == .microseconds(200))
        var options = RelayOptions()
        options.batchWindowMicroseconds = 0
        #expect(try options.configuration().batchWindow == .zero)
        options.batchWindowMicroseconds = 750
        #expect(try options.configuration().batchWindow == .microseconds(750))
    }

    @Test("listen addresses, listening IPs at the listening port")
    func listenAddresses() throws {
        var options = RelayOptions()
        options.listen = ["127.0.0.1:4000", "[::1]"]
        options.listeningIPs = ["127.0.0.2"]
        options.listeningPort = 5000
        #expect(
            try options.configuration().listenAddresses == [
                TransportAddress("127.0.0.1:4000")!, TransportAddress("[::1]:3478")!, TransportAddress("127.0.0.2:5000")!,
            ])
        var portOnly = RelayOptions()
        portOnly.listeningPort = 6000
        #expect(try portOnly.configuration().listenAddresses.map(\.port) == [6000, 6000])
    }

    @Test("a user makes TURN, with the relay plan and the TURN limits")
    func turn() throws {
        var options = RelayOptions()
        options.listen = ["127.0.0.1:3478"]
        options.users = ["alice:secret"]
        options.realm = "example.org"
        options.minPort = 50000
        options.maxPort = 50100
        options.externalIPs = ["203.0.113.5/10.0.0.5"]
        options.staleNonce = 300
        options.challengeRate = 10
        let configuration = try options.configuration()
        let turn = try #require(configuration.turn)
        #expect(turn.realm == "example.org")
        #expect(turn.credentials.userCount == 1)
        #expect(turn.externalIP[IPAddress("203.0.113.5")!.family] == IPAddress("203.0.113.5"))
        #expect(turn.nonceLifetime == .seconds(300))
        #expect(turn.challengeBurst == 20)
        #expect(configuration.relayPlan == RelayAddressPlan(ips: [.v4(0x7F00_0001)], minPort: 50000, maxPort: 50100))
    }

    @Test("TCP connection limits: 10,000 in total and 1,000 per IP by default, both passed on")
    func tcpConnectionLimits() throws {
        var options = RelayOptions()
        options.listen = ["127.0.0.1:3478"]
        var configuration = try options.configuration()
        #expect(configuration.maxTCPConnections == 10_000 && configuration.maxTCPConnectionsPerSource == 1_000)
        options.maxTCPConnections = 50
        options.maxTCPConnectionsPerSource = 7
        configuration = try options.configuration()
        #expect(configuration.maxTCPConnections == 50 && configuration.maxTCPConnectionsPerSource == 7)
    }

    @Test("TLS with both files, none with --no-tls")
    func tls() throws {
        var options = RelayOptions()
        options.certificate = "cert.pem"
        options.privateKey = "key.pem"
        options.tlsPort = 5350
        #expect(
            try options.configuration().tls == TLSSettings(certificateFile: "cert.pem", privateKeyFile: "key.pem", port: 5350))
        options.noTLS = true
        #expect(try options.configuration().tls == nil)
    }

    @Test("metrics address")
    func metrics() throws {
        var options = RelayOptions()
        options.prometheus = true
        options.prometheusPort = 9000
        #expect(try options.metricsAddress() == TransportAddress("127.0.0.1:9000"))
        options.prometheusAddress = "localhost"
        #expect(throws: RelayConfigurationError.badPrometheusAddress("localhost")) { try options.metricsAddress() }
    }

    /// Options with one mistake, and the error (and message) it gives.
    static let mistakes: [(String, @Sendable (inout RelayOptions) -> Void, RelayConfigurationError, String)] = [
        (
            "listen", { $0.listen = ["nowhere"] }, .badListenAddress("nowhere"),
            "--listen 'nowhere' is not IP:PORT or [IPv6]:PORT"
        ),
        (
            "listening-ip", { $0.listeningIPs = ["1.2.3"] }, .badListeningIP("1.2.3"),
            "--listening-ip '1.2.3' is not an IP address"
        ),
        (
            "listening-port with listen",
            {
                $0.listen = ["127.0.0.1:1"]
                $0.listeningPort = 2
            }, .listeningPortWithListen,
            "--listening-port applies to --listening-ip addresses, not to --listen (which has its own port)"
        ),
        (
            "alt-address", { $0.alternateAddress = "127.0.0.1" }, .badAlternateAddress("127.0.0.1"),
            "--alt-address '127.0.0.1' is not IP:PORT or [IPv6]:PORT"
        ),
        ("threads", { $0.threads = 0 }, .threadsOutOfRange(0), "--threads must be between 1 and 1024, not 0"),
        (
            "batch-window", { $0.batchWindowMicroseconds = -1 }, .batchWindowOutOfRange(-1),
            "--batch-window must be between 0 and 100000 microseconds, not -1"
        ),
        (
            "batch-window too long", { $0.batchWindowMicroseconds = 100_001 }, .batchWindowOutOfRange(100_001),
            "--batch-window must be between 0 and 100000 microseconds, not 100001"
        ),
        ("cert alone", { $0.certificate = "c.pem" }, .certificateWithoutKey, "--cert and --pkey go together"),
        (
            "max-tcp-connections", { $0.maxTCPConnections = 0 }, .maxTCPConnectionsTooLow,
            "--max-tcp-connections must be at least 1"
        ),
        (
            "max-tcp-connections-per-ip", { $0.maxTCPConnectionsPerSource = 0 }, .maxTCPConnectionsPerSourceTooLow,
            "--max-tcp-connections-per-ip must be at least 1"
        ),
        (
            "user-file", { $0.userFile = "/nonexistent/users" }, .unreadableUserFile("/nonexistent/users"),
            "--user-file '/nonexistent/users' cannot be read"
        ),
        (
            "use-auth-secret", { $0.useAuthSecret = true }, .authSecretWithoutSecret,
            "--use-auth-secret needs --static-auth-secret"
        ),
        (
            "empty static-auth-secret",
            {
                $0.useAuthSecret = true
                $0.staticAuthSecrets = [""]
            }, .emptyAuthSecret, "--static-auth-secret must not be empty: anyone could make TURN credentials with it"
        ),
        (
            "allowed-peer-ip",
            {
                $0.noAuth = true
                $0.allowedPeerIPs = ["x"]
            }, .badPeerRange(option: "--allowed-peer-ip", text: "x"),
            "--allowed-peer-ip 'x' is not IP, IP/LEN or FIRST-LAST"
        ),
        (
            "denied-peer-ip",
            {
                $0.noAuth = true
                $0.deniedPeerIPs = ["nope"]
            },
            .badPeerRange(option: "--denied-peer-ip", text: "nope"),
            "--denied-peer-ip 'nope' is not IP, IP/LEN or FIRST-LAST"
        ),
        (
            "external-ip",
            {
                $0.noAuth = true
                $0.externalIPs = ["public"]
            }, .badExternalIP("public"),
            "--external-ip 'public' is not PUBLIC or PUBLIC/PRIVATE"
        ),
        (
            "quota",
            {
                $0.noAuth = true
                $0.userQuota = -1
            }, .negativeQuota, "quotas and --max-bps cannot be negative"
        ),
        (
            "max-allocate-lifetime",
            {
                $0.noAuth = true
                $0.maxAllocateLifetime = 599
            }, .allocateLifetimeTooShort,
            "--max-allocate-lifetime must be at least the default 600 s"
        ),
        (
            "stale-nonce",
            {
                $0.noAuth = true
                $0.staleNonce = 0
            }, .staleNonceOutOfRange,
            "--stale-nonce must be between 1 and 86400 seconds"
        ),
        (
            "challenge-rate",
            {
                $0.noAuth = true
                $0.challengeRate = -1
            }, .badChallengeRate, "--challenge-rate must be a number, 0 or more"
        ),
        (
            "relay-ip",
            {
                $0.noAuth = true
                $0.listen = ["127.0.0.1:1"]
                $0.relayIPs = ["here"]
            }, .badRelayIP("here"),
            "--relay-ip 'here' is not an IP address"
        ),
        (
            "min-port",
            {
                $0.noAuth = true
                $0.listen = ["127.0.0.1:1"]
                $0.minPort = 0
            }, .noRelayPorts(minPort: 0, maxPort: 65535),
            "--min-port 0 and --max-port 65535 leave no relay ports"
        ),
    ]

    @Test("each mistake names its option", arguments: mistakes.indices)
    func mistake(_ index: Int) {
        let (_, change, expected, message) = Self.mistakes[index]
        var options = RelayOptions()
        change(&options)
        #expect(throws: expected) { try options.configuration() }
        #expect(expected.description == message)
    }

    @Test("a bad user entry says what STUN's credential parser said")
    func badUser() {
        var options = RelayOptions()
        options.users = ["nopassword"]
        #expect {
            try options.configuration()
        } throws: { error in
            guard case .badUser(let stun) = error as? RelayConfigurationError else { return false }
            return (error as? RelayConfigurationError)?.description == stun.message
        }
    }

    /// What is wrong with a user entry, named with the user, and for a file, its line.
    @Test("a bad user entry names the user, and a file's its line")
    func badUserMessages() throws {
        func message(_ change: (inout RelayOptions) -> Void) -> String? {
            var options = RelayOptions()
            options.listen = ["127.0.0.1:3478"]
            change(&options)
            do {
                _ = try options.configuration()
                return nil
            } catch { return error.description }
        }
        #expect(message { $0.users = ["a:"] } == "user 'a' has an empty password")
        #expect(message { $0.users = ["a:\u{7}"] }?.hasPrefix("user 'a': ") == true)
        let path = NSTemporaryDirectory() + "tusa-relay-bad-users-\(getpid()).txt"
        try "# users\nalice:one\n\nbob\n".write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        #expect(message { $0.userFile = path } == "--user-file \(path):4: user 'bob' is not NAME:PASSWORD")
    }

    @Test("users from a file, comments and blank lines skipped")
    func userFile() throws {
        let path = NSTemporaryDirectory() + "tusa-relay-users-\(getpid()).txt"
        try "# users\nalice:one\n\n  bob:two  \n".write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        var options = RelayOptions()
        options.listen = ["127.0.0.1:3478"]
        options.userFile = path
        #expect(try options.configuration().turn?.credentials.userCount == 2)
    }
}
