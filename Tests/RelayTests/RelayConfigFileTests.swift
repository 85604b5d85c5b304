import Foundation
import Relay
import Testing

// `tusa relay --config FILE`: coturn's turnserver.conf format turned into
// `tusa relay` arguments (a pure function). The binary reading such files is
// tested in InteropTests (RelayConfigBinaryTests).

@Suite("Relay config file: coturn's turnserver.conf as tusa relay arguments")
struct RelayConfigFileTests {
    private func parse(_ text: String) throws -> RelayConfigFile.Result {
        try RelayConfigFile.arguments(from: text, file: "turnserver.conf")
    }

    @Test("options map to tusa relay's long flags, in file order, with their lines")
    func mapping() throws {
        let result = try parse(
            """
            realm=example.org
            user=alice:wonderland
            user=bob:0x0123456789abcdef0123456789abcdef
            use-auth-secret
            static-auth-secret=north=wind
            lt-cred-mech
            min-port=50000
            max-port=50100
            relay-ip=192.0.2.10
            external-ip=203.0.113.7/192.0.2.10
            allow-loopback-peers
            allowed-peer-ip=10.0.0.1-10.0.0.9
            denied-peer-ip=172.16.0.0/12
            user-quota=10
            total-quota=100
            max-bps=64000
            max-allocate-lifetime=1800
            stale-nonce=300
            no-tcp
            prometheus
            prometheus-port=9642
            """)
        #expect(
            result.arguments == [
                "--realm=example.org", "--user=alice:wonderland", "--user=bob:0x0123456789abcdef0123456789abcdef",
                "--use-auth-secret", "--static-auth-secret=north=wind", "--lt-cred-mech", "--min-port=50000",
                "--max-port=50100", "--relay-ip=192.0.2.10", "--external-ip=203.0.113.7/192.0.2.10",
                "--allow-loopback-peers", "--allowed-peer-ip=10.0.0.1-10.0.0.9", "--denied-peer-ip=172.16.0.0/12",
                "--user-quota=10", "--total-quota=100", "--max-bps=64000", "--max-allocate-lifetime=1800",
                "--stale-nonce=300", "--no-tcp", "--prometheus", "--prometheus-port=9642",
            ])
        #expect(result.lines == Array(1...21))
        #expect(result.notices.isEmpty)
    }

    @Test("comments, blank lines, indentation, CRLF and trailing blanks are skipped")
    func commentsAndBlanks() throws {
        let result = try parse("# turnserver.conf\r\n\r\n   # indented comment\n\trealm=example.org   \r\n\n  no-auth\n")
        #expect(result.arguments == ["--realm=example.org", "--no-auth"])
        #expect(result.lines == [4, 6])
    }

    @Test("a space, a tab or '=' with blanks around it separates name and value, as in coturn")
    func separators() throws {
        let result = try parse("realm example.org\nuser\talice:wonderland\nmin-port = 50000\nmax-port==50100")
        #expect(
            result.arguments == [
                "--realm=example.org", "--user=alice:wonderland", "--min-port=50000", "--max-port=50100",
            ])
    }

    @Test("double quotes around a value are removed; a value may begin with a dash")
    func quotesAndDashes() throws {
        let result = try parse("realm=\"example.org\"\nstatic-auth-secret=-starts-with-a-dash\nsoftware=\"tusa relay\"")
        #expect(
            result.arguments == [
                "--realm=example.org", "--static-auth-secret=-starts-with-a-dash", "--software=tusa relay",
            ])
    }

    @Test("flags take coturn's booleans: off, no, false and 0 leave them unset")
    func booleanFlags() throws {
        let result = try parse("no-tcp=true\nno-udp=off\nno-auth yes\nallow-loopback-peers=0\nlt-cred-mech=1")
        #expect(result.arguments == ["--no-tcp", "--no-auth", "--lt-cred-mech"])
        #expect(throws: RelayConfigFile.Problem.self) { try parse("no-tcp=maybe") }
    }

    @Test("listening-ip (repeatable) and listening-port become their own flags")
    func listening() throws {
        let result = try parse("listening-ip=127.0.0.1\nlistening-ip=::1\nlistening-port=3479")
        #expect(result.arguments == ["--listening-ip=127.0.0.1", "--listening-ip=::1", "--listening-port=3479"])
    }

    @Test("bare stale-nonce keeps the default, as coturn's optional value does")
    func bareStaleNonce() throws {
        #expect(try parse("stale-nonce").arguments.isEmpty)
    }

    @Test("coturn options tusa does not use are skipped with one notice each")
    func ignoredCoturnOptions() throws {
        let result = try parse(
            """
            fingerprint
            realm=example.org
            no-cli
            no-dtls
            verbose
            log-file=/var/log/turn.log
            simple-log
            no-stdout-log
            pidfile="/var/run/turnserver.pid"
            no-multicast-peers
            mobility
            """)
        #expect(result.arguments == ["--realm=example.org"])
        #expect(result.notices.count == 10)
        #expect(result.notices.first == "turnserver.conf:1: ignoring coturn option 'fingerprint' (not used by tusa)")
        #expect(result.notices.last == "turnserver.conf:11: ignoring coturn option 'mobility' (not used by tusa)")
    }

    /// coturn's TLS options are tusa relay's too: a coturn file with cert and pkey
    /// keeps its TLS listener (they were skipped as unused, and TLS silently lost).
    /// tusa's own options (parties, the rendezvous, the directory) load as well.
    @Test("coturn's TLS options and tusa's own options are taken, not skipped")
    func tlsAndTusasOwnOptions() throws {
        let result = try parse(
            """
            cert=/etc/tusa/cert.pem
            pkey=/etc/tusa/key.pem
            tls-listening-port=5349
            no-tls=false
            challenge-rate=50
            rendezvous-port=3480
            rendezvous-database=sqlite:/var/lib/tusa/d.sqlite
            party-port=3481
            party-tcp-port=443
            identity=/etc/tusa/identity.key
            directory=192.0.2.1:3480
            directory-secret=s3
            capacity-mbps=500
            max-party-size=16
            """)
        #expect(
            result.arguments == [
                "--cert=/etc/tusa/cert.pem", "--pkey=/etc/tusa/key.pem", "--tls-listening-port=5349", "--challenge-rate=50",
                "--rendezvous-port=3480", "--rendezvous-database=sqlite:/var/lib/tusa/d.sqlite", "--party-port=3481",
                "--party-tcp-port=443", "--identity=/etc/tusa/identity.key", "--directory=192.0.2.1:3480",
                "--directory-secret=s3", "--capacity-mbps=500", "--max-party-size=16",
            ])
        #expect(result.notices.isEmpty)
    }

    /// tusa relay serves TURN whenever it has credentials: coturn's stun-only with
    /// credentials in the same file is an error (it served TURN while the file said
    /// STUN only); alone, a notice.
    @Test("stun-only: an error beside credentials, a notice alone")
    func stunOnly() throws {
        let alone = try parse("realm=example.org\nstun-only")
        #expect(alone.arguments == ["--realm=example.org"])
        #expect(alone.notices == ["turnserver.conf:2: stun-only: without credentials tusa relay serves STUN only"])
        #expect(try parse("stun-only=off\nuser=a:b").arguments == ["--user=a:b"])
        #expect(try parse("stun-only\nno-auth=off").notices.count == 1)
        // (Values that read as booleans are still credentials: a secret "no", a file "0".)
        for credentials in [
            "user=a:b", "use-auth-secret\nstatic-auth-secret=s", "no-auth", "user-file=/etc/users", "static-auth-secret=no",
            "user-file=0",
        ] {
            do {
                _ = try RelayConfigFile.arguments(from: "stun-only\n" + credentials, file: "turnserver.conf")
                Issue.record("stun-only with \(credentials) loaded")
            } catch {
                #expect(error.line == 1)
                #expect(error.message.hasPrefix("stun-only: tusa relay serves TURN whenever"), "\(error)")
            }
        }
    }

    @Test(
        "anything else is an error naming the file and line",
        arguments: [
            ("realm=example.org\n\nbogus-option=1", 3, "unknown option 'bogus-option'"),
            ("# comment\nrealm", 2, "'realm' needs a value"),
            ("realm=\"\"", 1, "'realm' needs a value"),
            ("no-tcp=perhaps", 1, "'no-tcp' takes no value or a boolean"),
            ("--realm=example.org", 1, "write option names without dashes, e.g. 'realm'"),
            ("config=/etc/other.conf", 1, "unknown option 'config'"),
            ("help", 1, "unknown option 'help'"),
        ])
    func errors(_ text: String, _ line: Int, _ message: String) {
        do {
            _ = try RelayConfigFile.arguments(from: text, file: "/etc/turnserver.conf")
            Issue.record("no error for \(text)")
        } catch {
            #expect(error.line == line)
            #expect(error.description.hasPrefix("/etc/turnserver.conf:\(line): "), "\(error)")
            #expect(error.message.contains(message), "\(error)")
        }
    }

    @Test(
        "coturn's own shipped turnserver.conf loads (every option in it is known or ignored)",
        .enabled(if: FileManager.default.fileExists(atPath: "/etc/turnserver.conf"), "coturn not installed"))
    func coturnsOwnSampleLoads() throws {
        // Debian's coturn ships a file of commented-out examples; uncomment each
        // `#name` and `#name=value` line and every one must parse.
        let text = try String(contentsOfFile: "/etc/turnserver.conf", encoding: .utf8)
        var uncommented: [String] = []
        for line in text.split(whereSeparator: \.isNewline) where line.hasPrefix("#") {
            let body = line.dropFirst()
            guard let first = body.first, first.isLetter, first.isLowercase else { continue }
            let name = body.prefix { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" }
            let rest = body.dropFirst(name.count)
            guard rest.isEmpty || rest.first == "=" else { continue }  // prose, not an option
            // (stun-only beside the sample's users is refused, rightly: see stunOnly().)
            guard name != "stun-only" else { continue }
            uncommented.append(String(body))
        }
        #expect(uncommented.count > 50, "too few example options found: \(uncommented.count)")
        let result = try RelayConfigFile.arguments(from: uncommented.joined(separator: "\n"), file: "sample")
        #expect(!result.arguments.isEmpty && !result.notices.isEmpty)
    }
}
