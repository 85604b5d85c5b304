import Foundation
import STUN
import Testing
import TusaBase
import TusaInterop

/// Tusa against real peers: coturn's own tools and server, aioice, and tshark
/// recording the traffic for `tusa interop check`. Everything on loopback.
@Suite(.serialized)
struct RealPeerTests {
    static let haveTusa = Harness.tusa != nil
    static let haveCoturn = Harness.which("turnserver") != nil && Harness.which("turnutils_stunclient") != nil

    static let reflexive = #"UDP reflexive addr: 127\.0\.0\.1:[0-9]+"#

    @Test(.enabled(if: haveTusa && haveCoturn, "needs .build/debug/tusa and coturn (make test installs coturn)"))
    func turnutilsStunclientAgainstTusaRelay() async throws {
        let (relay, port) = try #require(try await Harness.startRelay(["--listen", "127.0.0.1:0"]))
        defer { relay.kill() }
        let stunclient = try #require(Harness.which("turnutils_stunclient"))
        // turnutils_stunclient never times out on its own: bound it.
        let r = try await Harness.run("/usr/bin/timeout", ["5", stunclient, "-p", "\(port)", "127.0.0.1"], timeout: 10)
        #expect(r.status == 0, "stunclient: \(r.stdout) \(r.stderr)")
        #expect(r.stdout.range(of: Self.reflexive, options: .regularExpression) != nil, "\(r.stdout)")
        #expect(await relay.stop() == 0, "relay must exit 0 on SIGTERM: \(relay.stderr)")
    }

    @Test(.enabled(if: haveTusa && haveCoturn, "needs .build/debug/tusa and coturn"))
    func turnutilsStunclientRFC5780AgainstTusaRelay() async throws {
        let port = Harness.freePortPair()
        let (relay, _) = try #require(
            try await Harness.startRelay([
                "--listen", "127.0.0.1:\(port)", "--alt-address", "127.0.0.2:\(port + 1)", "--no-tcp",
            ]))
        defer { relay.kill() }
        let stunclient = try #require(Harness.which("turnutils_stunclient"))
        for flags in [["-f"], []] {
            let r = try await Harness.run(
                "/usr/bin/timeout", ["8", stunclient] + flags + ["-p", "\(port)", "127.0.0.1"], timeout: 12)
            #expect(r.status == 0 && !r.timedOut, "stunclient \(flags): \(r.stdout)")
            for n in 1...3 { #expect(r.stdout.contains("RFC 5780 response \(n)"), "\(flags): \(r.stdout)") }
            #expect(r.stdout.contains("Other addr: : 127.0.0.2:\(port + 1)"), "\(r.stdout)")
            #expect(r.stdout.contains("Response origin: : 127.0.0.2:\(port + 1)"), "\(r.stdout)")
            #expect(r.stdout.components(separatedBy: "UDP reflexive addr").count - 1 >= 3, "\(r.stdout)")
        }
    }

    @Test(.enabled(if: haveTusa && haveCoturn, "needs .build/debug/tusa and coturn"))
    func tusaStunAgainstCoturn() async throws {
        let port = Harness.freePortPair()
        let server = try #require(try await Harness.startTurnserver(port: port), "turnserver did not start")
        defer { server.kill() }
        let tusa = try #require(Harness.tusa)
        let r = try await Harness.run(tusa, ["stun", "127.0.0.1:\(port)"], timeout: 15)
        #expect(r.status == 0, "\(r.stderr)")
        let mapped = r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(TransportAddress(mapped)?.ip == IPAddress("127.0.0.1"), "\(r.stdout)")
    }

    @Test(.enabled(if: haveTusa && haveCoturn, "needs .build/debug/tusa and coturn"))
    func tusaStunBehaviorAgainstCoturnAndTusa() async throws {
        let tusa = try #require(Harness.tusa)
        // coturn with two loopback IPs supports RFC 5780.
        let port = Harness.freePortPair()
        let coturn = try #require(try await Harness.startTurnserver(port: port, listen: ["127.0.0.1", "127.0.0.2"]))
        defer { coturn.kill() }
        let r = try await Harness.run(tusa, ["stun", "--behavior", "--timeout", "2", "127.0.0.1:\(port)"], timeout: 30)
        #expect(r.status == 0, "\(r.stdout) \(r.stderr)")
        #expect(r.stdout.contains("mapping: no NAT"), "\(r.stdout)")
        #expect(r.stdout.contains("filtering: endpoint-independent"), "\(r.stdout)")
        #expect(r.stdout.contains("NAT type: open internet"), "\(r.stdout)")
        // And against tusa relay itself, on ports it picks (ports picked here could be
        // taken by a parallel test before it binds them).
        let (relay, p2) = try #require(
            try await Harness.startRelay(["--listen", "127.0.0.1:0", "--alt-address", "127.0.0.2:0", "--no-tcp"]))
        defer { relay.kill() }
        let t = try await Harness.run(tusa, ["stun", "--behavior", "--timeout", "2", "127.0.0.1:\(p2)"], timeout: 30)
        #expect(t.status == 0, "\(t.stdout) \(t.stderr)")
        // The other address is the alternate IP on the alternate port, both the relay's.
        let other = t.stdout.split(separator: "\n").first { $0.hasPrefix("other address: 127.0.0.2:") }
        let otherPort = other.flatMap { $0.split(separator: ":").last }.flatMap { UInt16($0) }
        #expect(otherPort != nil && otherPort != p2, "\(t.stdout)")
        #expect(relay.stdout.contains("listening udp 127.0.0.2:\(otherPort ?? 0)"), "\(relay.stdout)")
        #expect(t.stdout.contains("NAT type: open internet"), "\(t.stdout)")
    }

    @Test(.enabled(if: haveTusa, "needs .build/debug/tusa"))
    func tusaStunErrorsAreOneLineAndNonZero() async throws {
        let tusa = try #require(Harness.tusa)
        // Nothing listening: ICMP port unreachable, reported at once.
        let closed = Harness.freePort()
        let r = try await Harness.run(tusa, ["stun", "--timeout", "3", "127.0.0.1:\(closed)"], timeout: 10)
        #expect(r.status == 1)
        #expect(r.stderr.hasPrefix("tusa stun: "), "\(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "\(r.stderr)")
        // A server that never answers: a timeout.
        let silentServer = try TestSocket.udp(bindingTo: .v4(0x7F00_0001))
        let silent = silentServer.localAddress.port
        defer { withExtendedLifetime(silentServer) {} }  // it must stay bound, and silent, through the run
        let t = try await Harness.run(tusa, ["stun", "--timeout", "1", "127.0.0.1:\(silent)"], timeout: 10)
        #expect(t.status == 1)
        #expect(t.stderr.contains("no response"), "\(t.stderr)")
        // Nonsense arguments.
        let n = try await Harness.run(tusa, ["stun", "no-such-host.invalid:1"], timeout: 20)
        #expect(n.status != 0)
        #expect(n.stderr.contains("cannot resolve"), "\(n.stderr)")
    }

    @Test(.enabled(if: haveTusa && Harness.python != nil, "needs .build/debug/tusa and .venv with aioice (make test sets it up)"))
    func aioiceGathersServerReflexiveCandidateFromTusaRelay() async throws {
        let (relay, port) = try #require(try await Harness.startRelay(["--listen", "127.0.0.1:0", "--no-tcp"]))
        defer { relay.kill() }
        let script = Harness.packageRoot.appendingPathComponent("Tests/InteropTests/peers/aioice_srflx.py").path
        let r = try await Harness.run(
            try #require(Harness.python), [script, "--stun", "127.0.0.1:\(port)", "--timeout", "8"], timeout: 15)
        #expect(r.status == 0, "\(r.stdout) \(r.stderr)")
        let json = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any]
        let srflx = json?["srflx"] as? [String] ?? []
        #expect(srflx.count == 1, "\(r.stdout)")
        #expect(srflx.first?.hasPrefix("127.0.0.1:") == true)
    }

    /// The same peers, recorded live with tshark, then checked by `tusa interop check`.
    @Test(
        .enabled(
            if: haveTusa && haveCoturn && Harness.python != nil && Harness.which("tshark") != nil && Harness.isRoot,
            "needs tusa, coturn, aioice, tshark, and root to capture on lo"))
    func liveCaptureOfRealPeersVerifies() async throws {
        let port = Harness.freePortPair()
        let (relay, _) = try #require(
            try await Harness.startRelay([
                "--listen", "127.0.0.1:\(port)", "--alt-address", "127.0.0.2:\(port + 1)", "--no-tcp",
            ]))
        defer { relay.kill() }
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("tusa-live-\(UUID()).pcapng").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        let probe = try TestSocket.udp(bindingTo: .v4(0x7F00_0001))
        let tshark = try Harness.Background(
            try #require(Harness.which("tshark")),
            [
                "-i", "lo", "-f", "udp portrange \(port)-\(port + 1) or udp port \(probe.localAddress.port)", "-w", file, "-q",
                "-a", "duration:60",
            ])
        // SIGTERM, not SIGINT: under the test runner children inherit SIGINT ignored.
        defer { tshark.kill() }
        #expect(
            await tshark.waitFor(timeout: 15) { _, err in err.contains("Capturing on") }, "tshark did not start: \(tshark.stderr)"
        )
        #expect(await Harness.syncCapture(file, probe: probe), "the capture saw no probe: \(tshark.stderr)")
        let stunclient = try #require(Harness.which("turnutils_stunclient"))
        _ = try await Harness.run("/usr/bin/timeout", ["8", stunclient, "-f", "-p", "\(port)", "127.0.0.1"], timeout: 12)
        let script = Harness.packageRoot.appendingPathComponent("Tests/InteropTests/peers/aioice_srflx.py").path
        _ = try await Harness.run(
            try #require(Harness.python), [script, "--stun", "127.0.0.1:\(port)", "--timeout", "8"], timeout: 15)
        _ = try await Harness.run(
            try #require(Harness.tusa), ["stun", "--behavior", "--timeout", "1", "127.0.0.1:\(port)"], timeout: 20)
        #expect(await Harness.syncCapture(file, probe: probe), "the capture fell behind: \(tshark.stderr)")
        #expect(await tshark.stop() == 0, "tshark: \(tshark.stderr)")
        let report = InteropChecker().check(path: file)
        #expect(report.passed, "\(report.failures)")
        // stunclient -f: 3 requests + 3 answers; aioice 1 + 1; tusa stun --behavior
        // with no NAT: test I and the change-IP-and-port filtering test, 2 + 2.
        #expect(report.packets >= 12, "\(report.summary)")
        #expect(report.decoded == report.packets && report.roundTrip == report.packets)
        // Every response from tusa relay carries a valid FINGERPRINT.
        #expect(report.verified >= 7, "\(report.summary)")
    }

    /// Tusa's own committed captures (Interop/, made by `make record`) keep verifying.
    @Test func committedCapturesVerify() async throws {
        let dir = Harness.packageRoot.appendingPathComponent("Interop").path
        let files = ((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []).filter { $0.hasSuffix(".pcapng") }
            .sorted()
        try #require(!files.isEmpty, "Interop/ has no captures: run `make record`")
        for f in files {
            let report = InteropChecker(credentials: TURNRelayPeerTests.interopCredentials).check(path: "\(dir)/\(f)")
            #expect(report.passed, "\(f): \(report.failures)")
            #expect(
                report.packets > 0 && report.decoded == report.packets && report.roundTrip == report.packets,
                "\(f): \(report.summary)")
            #expect(report.verified > 0, "\(f): \(report.summary)")
        }
    }
}
