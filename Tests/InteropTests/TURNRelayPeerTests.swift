import Foundation
import STUN
import TestSupport
import Testing
import TusaInterop

#if canImport(Glibc)
    import Glibc
#endif

/// `tusa relay` as a TURN server for real clients: coturn's turnutils_uclient
/// (with turnutils_peer echoing) in each of its modes, and aioice's TURN
/// client over UDP and TCP. Pass means every byte sent came back, nothing lost.
@Suite(.serialized)
struct TURNRelayPeerTests {
    static let haveTusa = Harness.tusa != nil
    static let haveUclient = Harness.which("turnutils_uclient") != nil && Harness.which("turnutils_peer") != nil

    /// The credentials of ../shared/interop, so captures check with the same flags.
    static let relayAuth = [
        "-r", "example.org", "-u", "alice:wonderland", "--use-auth-secret", "--static-auth-secret", "northwind",
        "--allow-loopback-peers",
    ]

    static var interopCredentials: InteropCredentials {
        var c = InteropCredentials()
        c.users["alice"] = "wonderland"
        c.secrets = ["northwind"]
        return c
    }

    /// An echo peer on a free loopback port.
    static func startPeer() async throws -> (Harness.Background, UInt16)? {
        for _ in 0..<5 {
            let port = Harness.freePortPair()
            if let p = try await Harness.startEchoPeer(port: port) { return (p, port) }
        }
        return nil
    }

    struct UclientResult {
        var sent: Int
        var received: Int
        var lost: Int?
        var output: String
    }

    /// Runs turnutils_uclient and reads its final totals.
    static func uclient(_ flags: [String], server: UInt16, peer: UInt16, messages: Int = 20, clients: Int = 2) async throws
        -> UclientResult
    {
        let uclient = try #require(Harness.which("turnutils_uclient"))
        let args =
            flags + [
                "-p", "\(server)", "-e", "127.0.0.1", "-r", "\(peer)", "-n", "\(messages)", "-m", "\(clients)", "-l", "120",
                "127.0.0.1",
            ]
        var r = try await Harness.run("/usr/bin/timeout", ["60", uclient] + args, timeout: 70)
        // uclient binds two channels of random numbers on one allocation (its source says
        // the repeated binds are "playing with the TURN server"): when the two numbers
        // coincide (1 in 16,384 per client), the relay's RFC 8656 §11.2 refusal, which
        // coturn gives too, ends uclient. That run says nothing of the relay: once more.
        if (r.stdout + r.stderr).contains("channel bind: error 400 (Channel bound to another peer)") {
            FileHandle.standardError.write(Data("tusa: uclient's two random channel numbers coincided; running it again\n".utf8))
            r = try await Harness.run("/usr/bin/timeout", ["60", uclient] + args, timeout: 70)
        }
        let out = r.stdout + r.stderr
        func last(_ pattern: String) -> Int? {
            guard let regex = try? NSRegularExpression(pattern: pattern) else { return nil }
            let matches = regex.matches(in: out, range: NSRange(out.startIndex..., in: out))
            guard let m = matches.last, let range = Range(m.range(at: 1), in: out) else { return nil }
            return Int(out[range])
        }
        return UclientResult(
            sent: last(#"tot_send_bytes ~ ([0-9]+)"#) ?? -1, received: last(#"tot_recv_bytes ~ ([0-9]+)"#) ?? -2,
            lost: last(#"Total lost packets ([0-9]+)"#), output: out)
    }

    static let modes: [(String, [String])] = [
        ("channels", ["-u", "alice", "-w", "wonderland"]),
        ("send indications", ["-s", "-u", "alice", "-w", "wonderland"]),
        ("TCP control", ["-t", "-u", "alice", "-w", "wonderland"]),
        ("REST credentials", ["-W", "northwind", "-u", "bob"]),
        ("DONT-FRAGMENT and padding", ["-g", "-D", "-u", "alice", "-w", "wonderland"]),
    ]

    @Test(
        .enabled(
            if: haveTusa && haveUclient, "needs tusa and coturn's turnutils_uclient/turnutils_peer (make test installs coturn)"),
        arguments: modes.indices)
    func uclientRelaysThroughTusa(mode: Int) async throws {
        let (name, flags) = Self.modes[mode]
        let (peer, peerPort) = try #require(try await Self.startPeer())
        defer { peer.kill() }
        let (relay, udpPort) = try #require(try await Harness.startRelay(["--listen", "127.0.0.1:0"] + Self.relayAuth))
        defer { relay.kill() }
        // Over TCP, the TCP listener's port: the UDP port's number when it was free for
        // TCP too, another when a connection elsewhere on the machine held it.
        var port = udpPort
        if flags.contains("-t") {
            let line = try #require(await relay.waitForMatch(#"listening tcp 127\.0\.0\.1:[0-9]+"#), "\(relay.stdout)")
            port = try #require(line.split(separator: ":").last.flatMap { UInt16($0) })
        }
        let r = try await Self.uclient(flags, server: port, peer: peerPort)
        #expect(r.sent > 0 && r.sent == r.received, "\(name): sent \(r.sent), received \(r.received)\n\(r.output.suffix(1500))")
        #expect(r.lost == 0, "\(name): lost \(String(describing: r.lost))")
        #expect(await relay.stop() == 0)
        #expect(relay.stdout.contains("turn: "), "\(relay.stdout)")
    }

    @Test(.enabled(if: haveTusa && haveUclient, "needs tusa and coturn's turnutils_uclient/turnutils_peer"))
    func fiftyUclientClientsAtOnce() async throws {
        let (peer, peerPort) = try #require(try await Self.startPeer())
        defer { peer.kill() }
        let (relay, port) = try #require(try await Harness.startRelay(["--listen", "127.0.0.1:0"] + Self.relayAuth))
        defer { relay.kill() }
        let r = try await Self.uclient(
            ["-u", "alice", "-w", "wonderland"], server: port, peer: peerPort, messages: 20, clients: 50)
        #expect(
            r.sent == 50 * 20 * 120 && r.received == r.sent, "sent \(r.sent), received \(r.received)\n\(r.output.suffix(1500))")
        #expect(r.lost == 0)
        #expect(await relay.stop() == 0)
        // The relay made one allocation per client at least (uclient adds RTCP ones).
        let made = relay.stdout.firstMatch(of: /turn: ([0-9]+) allocations/).flatMap { Int($0.1) } ?? 0
        #expect(made >= 50, "\(relay.stdout)")
    }

    @Test(.enabled(if: haveTusa && haveUclient, "needs tusa and coturn's turnutils_uclient/turnutils_peer"))
    func wrongPasswordRelaysNothing() async throws {
        let (peer, peerPort) = try #require(try await Self.startPeer())
        defer { peer.kill() }
        let (relay, port) = try #require(try await Harness.startRelay(["--listen", "127.0.0.1:0"] + Self.relayAuth))
        defer { relay.kill() }
        let r = try await Self.uclient(
            ["-u", "alice", "-w", "not-the-password"], server: port, peer: peerPort, messages: 3, clients: 1)
        #expect(r.received <= 0, "relayed with a wrong password:\n\(r.output.suffix(800))")
        #expect(await relay.stop() == 0)
        #expect(relay.stdout.contains("turn: 0 allocations"), "\(relay.stdout)")
        #expect(!relay.stdout.contains(" 0 auth failures"), "\(relay.stdout)")
    }

    @Test(.enabled(if: haveTusa && haveUclient, "needs tusa and coturn's turnutils_uclient/turnutils_peer"))
    func loopbackPeersAreRefusedByDefault() async throws {
        let (peer, peerPort) = try #require(try await Self.startPeer())
        defer { peer.kill() }
        let (relay, port) = try #require(
            try await Harness.startRelay(["--listen", "127.0.0.1:0", "-r", "example.org", "-u", "alice:wonderland"]))
        defer { relay.kill() }
        let r = try await Self.uclient(
            ["-u", "alice", "-w", "wonderland"], server: port, peer: peerPort, messages: 3, clients: 1)
        #expect(r.received <= 0, "relayed to loopback:\n\(r.output.suffix(800))")
        #expect(r.output.contains("403"), "\(r.output.suffix(800))")
    }

    @Test(
        .enabled(
            if: haveTusa && haveUclient && Harness.python != nil,
            "needs tusa, turnutils_peer and .venv with aioice (make test sets it up)"),
        arguments: ["udp", "tcp"])
    func aioiceRelaysThroughTusa(transport: String) async throws {
        let (peer, peerPort) = try #require(try await Self.startPeer())
        defer { peer.kill() }
        let (relay, port) = try #require(try await Harness.startRelay(["--listen", "127.0.0.1:0"] + Self.relayAuth))
        defer { relay.kill() }
        let script = Harness.packageRoot.appendingPathComponent("Tests/InteropTests/peers/aioice_turn.py").path
        let r = try await Harness.run(
            try #require(Harness.python),
            [
                script, "--turn", "127.0.0.1:\(port)", "--user", "alice", "--password", "wonderland",
                "--peer", "127.0.0.1:\(peerPort)", "--transport", transport, "--count", "20",
            ], timeout: 30)
        #expect(r.status == 0, "aioice over \(transport): \(r.stdout) \(r.stderr)")
        #expect(r.stdout.contains(#""received": 20"#), "\(r.stdout)")
    }

    @Test(
        .enabled(
            if: haveTusa && haveUclient && Harness.python != nil && Harness.which("openssl") != nil,
            "needs tusa, coturn's tools, aioice and openssl"))
    func turnOverTLS() async throws {
        let certificate = try TestCertificate.make()
        let (cert, key) = (certificate.certificateFile, certificate.privateKeyFile)
        let (peer, peerPort) = try #require(try await Self.startPeer())
        defer { peer.kill() }
        let tlsPort = Harness.freePort()
        let (relay, _) = try #require(
            try await Harness.startRelay(
                ["--listen", "127.0.0.1:0", "--cert", cert, "--pkey", key, "--tls-listening-port", "\(tlsPort)"] + Self.relayAuth)
        )
        defer { relay.kill() }
        #expect(await relay.waitForMatch("listening tls 127.0.0.1:\(tlsPort)") != nil, "\(relay.stdout)")
        // coturn's client over TLS (-t -S).
        let r = try await Self.uclient(
            ["-t", "-S", "-u", "alice", "-w", "wonderland"], server: tlsPort, peer: peerPort, messages: 10, clients: 2)
        #expect(
            r.sent > 0 && r.sent == r.received && r.lost == 0, "sent \(r.sent), received \(r.received)\n\(r.output.suffix(1200))")
        // aioice's TURN client over TLS.
        let script = Harness.packageRoot.appendingPathComponent("Tests/InteropTests/peers/aioice_turn.py").path
        let a = try await Harness.run(
            try #require(Harness.python),
            [
                script, "--turn", "127.0.0.1:\(tlsPort)", "--user", "alice", "--password", "wonderland",
                "--peer", "127.0.0.1:\(peerPort)", "--transport", "tls", "--count", "10",
            ], timeout: 30)
        #expect(a.status == 0, "aioice over TLS: \(a.stdout) \(a.stderr)")
        // A bad key file is a one-line start error.
        let bad = try await Harness.run(
            try #require(Harness.tusa),
            ["relay", "--listen", "127.0.0.1:0", "--cert", cert, "--pkey", "/nonexistent"] + Self.relayAuth, timeout: 20)
        #expect(bad.status == 1 && bad.stderr.hasPrefix("tusa relay: error:"), "\(bad.stderr)")
    }

    /// A live capture of uclient (UDP channels, Send indications, TCP) and
    /// aioice through tusa relay verifies with `tusa interop check`.
    @Test(
        .enabled(
            if: haveTusa && haveUclient && Harness.which("tshark") != nil && Harness.isRoot,
            "needs tusa, coturn's tools, tshark and root to capture on lo"))
    func liveTURNCaptureVerifies() async throws {
        let (peer, peerPort) = try #require(try await Self.startPeer())
        defer { peer.kill() }
        let (relay, port) = try #require(try await Harness.startRelay(["--listen", "127.0.0.1:0"] + Self.relayAuth))
        defer { relay.kill() }
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("tusa-turn-\(UUID()).pcapng").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        let probe = try TestSocket.udp(bindingTo: .v4(0x7F00_0001))
        let tshark = try Harness.Background(
            try #require(Harness.which("tshark")),
            [
                "-i", "lo", "-f", "port \(port) or udp port \(probe.localAddress.port)", "-w", file, "-q", "-a", "duration:90",
            ])
        defer { tshark.kill() }
        #expect(
            await tshark.waitFor(timeout: 15) { _, err in err.contains("Capturing on") }, "tshark did not start: \(tshark.stderr)"
        )
        #expect(await Harness.syncCapture(file, probe: probe), "the capture saw no probe: \(tshark.stderr)")
        for flags in [
            ["-u", "alice", "-w", "wonderland"], ["-s", "-u", "alice", "-w", "wonderland"],
            ["-t", "-u", "alice", "-w", "wonderland"],
            ["-W", "northwind", "-u", "bob"],
        ] {
            _ = try await Self.uclient(flags, server: port, peer: peerPort, messages: 5, clients: 1)
        }
        #expect(await Harness.syncCapture(file, probe: probe), "the capture fell behind: \(tshark.stderr)")
        #expect(await tshark.stop() == 0, "tshark: \(tshark.stderr)")
        let report = InteropChecker(credentials: Self.interopCredentials).check(path: file)
        #expect(report.passed, "\(report.failures.prefix(10))")
        #expect(report.packets > 50 && report.decoded == report.packets, "\(report.summary)")
        // Every authenticated request and every signed answer verified.
        #expect(report.verified > 20, "\(report.summary)")
    }
}
