import Dispatch
import Foundation
import Logging
import Party
import Prometheus
import Relay
import STUN
import ServiceLifecycle
import TURN
import Testing
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#endif

// The relay's Prometheus metrics: RelayMetrics on a registry, the HTTP
// endpoint over real loopback TCP, and `tusa relay --config --prometheus`
// as a binary under coturn's TURN client. Every wait is bounded.

private let loopback = IPAddress.v4(0x7F00_0001)

private let quietLogger: Logger = {
    var logger = Logger(label: "tusa.test.metrics")
    logger.logLevel = .critical
    return logger
}()

@Suite("Metrics: RelayMetrics and the /metrics endpoint", .serialized)
struct MetricsTests {
    // MARK: RelayMetrics

    @Test("party metrics: rooms and members as gauges, frames by outcome as counters")
    func partyMetricsFollowTotals() throws {
        let registry = PrometheusCollectorRegistry()
        let metrics = RelayMetrics(factory: PrometheusMetricsFactory(registry: registry))
        let fresh = Exposition(registry.emitToString())
        #expect(fresh["tusa_party_rooms"] == 0 && fresh["tusa_party_members"] == 0)
        #expect(fresh["tusa_party_frames_total{outcome=\"spoofed\"}"] == 0)
        #expect(fresh["tusa_party_copies_dropped_total"] == 0)
        #expect(fresh.types["tusa_party_rooms"] == "gauge" && fresh.types["tusa_party_frames_total"] == "counter")
        var s = PartyServer.Statistics()
        s.framesForwarded = 240
        s.framesNotSelected = 7
        s.framesSpoofed = 2
        s.copiesDropped = 5
        metrics.update(party: s, rooms: 3, members: 11)
        metrics.update(party: s, rooms: 2, members: 9)
        let after = Exposition(registry.emitToString())
        #expect(after["tusa_party_rooms"] == 2 && after["tusa_party_members"] == 9)
        #expect(after["tusa_party_frames_total{outcome=\"forwarded\"}"] == 240)
        #expect(after["tusa_party_frames_total{outcome=\"not_selected\"}"] == 7)
        #expect(after["tusa_party_frames_total{outcome=\"spoofed\"}"] == 2)
        #expect(after["tusa_party_copies_dropped_total"] == 5)
    }

    /// A scrape before the memory guard's first sample (the guard's service starts beside
    /// the endpoint; on a busy machine the endpoint's first refresh can come first) shows
    /// the limit, not 0. A run of the whole suite beside two CPU hogs served
    /// `tusa_memory_limit_bytes 0.0` to `tusa relay -c FILE --prometheus`.
    @Test("memory metrics before the guard's first sample: it samples, the limit is never 0")
    func memoryMetricsBeforeTheFirstSample() throws {
        let registry = PrometheusCollectorRegistry()
        let metrics = RelayMetrics(factory: PrometheusMetricsFactory(registry: registry))
        let memory = MemoryGuard(option: 3 << 30, logger: quietLogger)
        #expect(memory.lastSample == nil)
        metrics.update(from: memory)
        let text = Exposition(registry.emitToString())
        let limit = try #require(text["tusa_memory_limit_bytes"])
        #expect(limit > 0 && limit <= Double(3 << 30), "\(limit)")
        #expect(try #require(text["tusa_memory_used_bytes"]) > 0)
        #expect(text["tusa_memory_short"] == 0)
    }

    @Test("every metric is registered up front; updates add what each total gained")
    func relayMetricsFollowTotals() throws {
        let registry = PrometheusCollectorRegistry()
        let metrics = RelayMetrics(factory: PrometheusMetricsFactory(registry: registry))
        let fresh = Exposition(registry.emitToString())
        #expect(fresh["tusa_allocations_created_total"] == 0)
        #expect(fresh["tusa_allocations_active"] == 0)
        #expect(fresh["tusa_relayed_bytes_total{direction=\"to_peer\"}"] == 0)
        #expect(fresh["tusa_turn_drops_total{reason=\"no_permission\"}"] == 0)
        #expect(fresh["tusa_stun_drops_total{reason=\"not_stun\"}"] == 0)
        #expect(fresh.types["tusa_allocations_active"] == "gauge")
        #expect(fresh.types["tusa_allocations_created_total"] == "counter")

        var turn = TURNStatistics()
        turn.allocationsActive = 2
        turn.allocationsCreated = 3
        turn.allocationsDeleted = 1
        turn.packetsToPeer = 10
        turn.bytesToPeer = 1000
        turn.packetsToClient = 9
        turn.bytesToClient = 900
        turn.authFailures = 1
        turn.challenges = 4
        turn.errors = [401: 5, 486: 1]
        turn.drops[TURNDropReason.noPermission.rawValue] = 7
        var stun = BindingStatistics()
        stun.responses = 12
        stun.drops = [.notSTUN: 2]
        metrics.update(stun: stun, turn: turn)

        var text = Exposition(registry.emitToString())
        #expect(text["tusa_allocations_active"] == 2)
        #expect(text["tusa_allocations_created_total"] == 3)
        #expect(text["tusa_allocations_deleted_total"] == 1)
        #expect(text["tusa_relayed_packets_total{direction=\"to_peer\"}"] == 10)
        #expect(text["tusa_relayed_packets_total{direction=\"to_client\"}"] == 9)
        #expect(text["tusa_relayed_bytes_total{direction=\"to_peer\"}"] == 1000)
        #expect(text["tusa_relayed_bytes_total{direction=\"to_client\"}"] == 900)
        #expect(text["tusa_auth_failures_total"] == 1)
        #expect(text["tusa_challenges_total"] == 4)
        #expect(text["tusa_error_responses_total{code=\"401\"}"] == 5)
        #expect(text["tusa_error_responses_total{code=\"486\"}"] == 1)
        #expect(text["tusa_turn_drops_total{reason=\"no_permission\"}"] == 7)
        #expect(text["tusa_stun_responses_total"] == 12)
        #expect(text["tusa_stun_drops_total{reason=\"not_stun\"}"] == 2)

        // Totals that rise add the difference; the gauge follows; nothing counts twice.
        turn.allocationsActive = 0
        turn.allocationsCreated = 5
        turn.errors[401] = 6
        metrics.update(stun: stun, turn: turn)
        metrics.update(stun: stun, turn: turn)
        text = Exposition(registry.emitToString())
        #expect(text["tusa_allocations_active"] == 0)
        #expect(text["tusa_allocations_created_total"] == 5)
        #expect(text["tusa_error_responses_total{code=\"401\"}"] == 6)
        #expect(text["tusa_stun_responses_total"] == 12)

        metrics.update(relayPortsHeld: 3, capacity: 16384)
        text = Exposition(registry.emitToString())
        #expect(text["tusa_relay_ports_held"] == 3 && text["tusa_relay_ports_free"] == 16381)
        #expect(text.types["tusa_relay_ports_free"] == "gauge")
    }

    // MARK: the endpoint

    @Test("GET /metrics answers in the text format, refreshed; other paths 404, other methods 405")
    func endpointServesMetrics() async throws {
        let registry = PrometheusCollectorRegistry()
        let refreshes = registry.makeCounter(
            descriptor: MetricNameDescriptor(metricName: "test_refreshes", unitName: "total", helpText: "Refreshes so far."))
        let endpoint = MetricsEndpoint(
            address: TransportAddress(ip: loopback, port: 0), registry: registry,
            refreshInterval: .milliseconds(50), logger: quietLogger
        ) { refreshes.increment() }
        try await withService(endpoint) {
            let address = try await endpoint.boundAddress()
            #expect(address.ip == loopback && address.port != 0)

            let ok = try await Harness.offPool { try httpGet(address, "/metrics") }
            #expect(ok.status == 200, "\(ok.head)")
            #expect(ok.head.contains("Content-Type: text/plain; version=0.0.4"), "\(ok.head)")
            let first = try #require(Exposition(ok.body)["test_refreshes_total"])
            #expect(first >= 1, "refreshed once before serving")
            // Refreshed every 50 ms while serving.
            let refreshed = try await eventually(within: .seconds(10), poll: .milliseconds(50)) {
                let later = try await Harness.offPool { try httpGet(address, "/metrics?x=1") }
                return try #require(Exposition(later.body)["test_refreshes_total"]) > first
            }
            #expect(refreshed, "refreshed while serving")

            #expect(try await Harness.offPool { try httpGet(address, "/") }.status == 404)
            #expect(try await Harness.offPool { try httpGet(address, "/metrics", method: "POST") }.status == 405)
            let head = try await Harness.offPool { try httpGet(address, "/metrics", method: "HEAD") }
            #expect(head.status == 200 && head.body.isEmpty)
        }
    }

    /// Issue 18's abuse of every TCP listener, on the metrics port: a request trickled a
    /// byte at a time (each byte well inside the 30 s idle timeout, which it resets) is
    /// cut off at the request deadline; one address holds at most its share of
    /// connections, the next closed as it is accepted; another address is still served.
    @Test("metrics under abuse: a trickled request is cut off at its deadline, one address holds its share, others are served")
    func endpointUnderAbuse() async throws {
        let endpoint = MetricsEndpoint(
            address: TransportAddress(ip: loopback, port: 0), registry: PrometheusCollectorRegistry(),
            requestTimeout: .seconds(1), logger: quietLogger)
        try await withService(endpoint) {
            let address = try await endpoint.boundAddress()
            let closedAfter = try await Harness.offPool { () throws -> Double? in
                let socket = try TestSocket.tcp(connectingTo: address)
                let request = Array("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: ".utf8) + [UInt8](repeating: 0x61, count: 100)
                let start = DispatchTime.now().uptimeNanoseconds
                for byte in request {
                    guard (try? socket.sendAll([byte])) != nil else { break }
                    if socket.waitForClose(timeout: 0.2) { return Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9 }
                }
                return socket.waitForClose(timeout: 0.5) ? Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9 : nil
            }
            let after = try #require(closedAfter, "a request trickled for 28 s was never cut off")
            #expect(after >= 0.9 && after < 5, "cut off after \(after) s (deadline 1 s)")

            // Bytes that are no request, and a header past the parser's limit: answered 400
            // and closed at once (not held until the idle timeout). (The long header's 400
            // may be lost to the reset that closing on unread bytes sends.)
            for (bad, answered) in [
                ([0x00, 0xFF, 0x13, 0x37] + Array("\r\n\r\n".utf8), true),
                (Array("GET /metrics HTTP/1.1\r\nX-Pad: ".utf8) + [UInt8](repeating: 0x61, count: 120_000), false),
            ] {
                let answer = try await Harness.offPool { () throws -> [UInt8]? in
                    let socket = try TestSocket.tcp(connectingTo: address)
                    try? socket.sendAll(bad)
                    return socket.readToEnd(timeout: 1)
                }
                let text = try #require(
                    answer.map { String(decoding: $0, as: UTF8.self) }, "a refused request's connection stayed open")
                #expect(!answered || text.hasPrefix("HTTP/1.1 400"), "\(text)")
            }

            let share = MetricsEndpoint.connectionLimits.perSource
            let held = try await Harness.offPool { try (0..<share).map { _ in try TestSocket.tcp(connectingTo: address) } }
            #expect(
                try await Harness.offPool { try TestSocket.tcp(connectingTo: address).waitForClose(timeout: 5) },
                "one address held more than its \(share) connections")
            #expect(endpoint.refusedConnections >= 1)
            let other = try await Harness.offPool { try httpGet(address, "/metrics", from: .v4(0x7F00_0002)) }
            #expect(other.status == 200, "another address was not served beside the abuse: \(other.head)")
            #expect(held.count == share)
        }
    }

    @Test("a port in use is a one-line bind error from run() and boundAddress()")
    func endpointPortInUse() async throws {
        let first = MetricsEndpoint(
            address: TransportAddress(ip: loopback, port: 0), registry: PrometheusCollectorRegistry(),
            logger: quietLogger)
        try await withService(first) {
            let taken = try await first.boundAddress()
            let second = MetricsEndpoint(address: taken, registry: PrometheusCollectorRegistry(), logger: quietLogger)
            do {
                try await second.run()
                Issue.record("a second endpoint bound \(taken)")
            } catch let error as RelayServiceError {
                #expect(error.code == .bindFailed)
                #expect(error.message == "cannot serve metrics on tcp \(taken): Address already in use", "\(error)")
            }
            await #expect(throws: RelayServiceError.self) { try await second.boundAddress() }
        }
    }

    // MARK: the binary

    @Test(
        "tusa relay -c FILE --prometheus: file options apply, ignored ones are noted, /metrics serves the names",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func binaryServesMetricsFromConfigFile() async throws {
        let config = try TemporaryFile(
            """
            # a coturn-style file
            listening-ip=127.0.0.1
            listening-port=0
            realm=example.org
            user=alice:wonderland
            fingerprint
            no-cli
            prometheus
            memory-limit=3G
            """)
        let relay = try #require(try await Harness.startRelay(["-c", config.path, "--prometheus-port", "0", "--no-tcp"])?.0)
        defer { relay.kill() }
        let url = try #require(await relay.waitForMatch(#"metrics http://127\.0\.0\.1:[0-9]+/metrics"#))
        let address = try #require(metricsAddress(url))
        let response = try await Harness.offPool { try httpGet(address, "/metrics") }
        #expect(response.status == 200)
        let names = Set(
            response.body.split(separator: "\n").filter { !$0.hasPrefix("#") }.compactMap {
                $0.split(whereSeparator: { $0 == "{" || $0 == " " }).first.map(String.init)
            })
        for name in [
            "tusa_allocations_active", "tusa_allocations_created_total", "tusa_allocations_expired_total",
            "tusa_allocations_deleted_total", "tusa_relayed_packets_total", "tusa_relayed_bytes_total",
            "tusa_auth_failures_total", "tusa_challenges_total", "tusa_turn_drops_total",
            "tusa_stun_responses_total", "tusa_stun_drops_total", "tusa_relay_ports_held", "tusa_relay_ports_free",
            "tusa_memory_used_bytes", "tusa_memory_limit_bytes", "tusa_memory_short", "tusa_memory_refusals_total",
        ] {
            #expect(names.contains(name), "\(name) missing from /metrics")
        }
        // The file's memory-limit is taken: the fullest limit shown is its 3 GiB (or a
        // tighter one: a container's, a small machine's RAM), and memory is not short.
        let limitLine = response.body.split(separator: "\n").first { $0.hasPrefix("tusa_memory_limit_bytes ") }
        let limit = limitLine.flatMap { Double($0.split(separator: " ").last ?? "") }
        #expect(limit.map { $0 > 0 && $0 <= 3_221_225_472 } == true, "\(String(describing: limitLine))")
        #expect(response.body.contains("\ntusa_memory_short 0.0\n"), "\(response.body)")
        #expect(!relay.stdout.contains("listening tcp"), "--no-tcp from the command line")
        #expect(
            relay.stderr.contains("tusa relay: notice: \(config.path):6: ignoring coturn option 'fingerprint'"), "\(relay.stderr)"
        )
        #expect(relay.stderr.contains("tusa relay: notice: \(config.path):7: ignoring coturn option 'no-cli'"), "\(relay.stderr)")
        #expect(relay.stderr.contains("realm=example.org"), "the file's realm is in the TURN log line: \(relay.stderr)")
        #expect(await relay.stop() == 0)
    }

    @Test(
        "turnutils_uclient's allocations through tusa relay raise tusa_allocations_created_total",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN)"),
        .enabled(
            if: Harness.which("turnutils_uclient") != nil && Harness.which("turnutils_peer") != nil,
            "coturn's turnutils_uclient/turnutils_peer not installed (make test installs coturn): skipped"))
    func allocationsRaiseTheCounter() async throws {
        let uclient = try #require(Harness.which("turnutils_uclient"))
        _ = try #require(Harness.which("turnutils_peer"))
        let config = try TemporaryFile("realm=example.org\nuser=alice:wonderland\nallow-loopback-peers\n")
        let (relay, port) = try #require(
            try await Harness.startRelay([
                "--config", config.path, "--listen", "127.0.0.1:0", "--prometheus", "--prometheus-port", "0",
            ]))
        defer { relay.kill() }
        let url = try #require(await relay.waitForMatch(#"metrics http://127\.0\.0\.1:[0-9]+/metrics"#))
        let address = try #require(metricsAddress(url))
        let before = Exposition(try await Harness.offPool { try httpGet(address, "/metrics") }.body)
        #expect(before["tusa_allocations_created_total"] == 0)

        let peerPort = Harness.freePortPair()
        let peer = try #require(try await Harness.startEchoPeer(port: peerPort), "turnutils_peer did not start")
        defer { peer.kill() }
        let run = try await Harness.run(
            uclient,
            [
                "-u", "alice", "-w", "wonderland", "-p", "\(port)", "-e", "127.0.0.1", "-r", "\(peerPort)",
                "-n", "3", "-m", "1", "127.0.0.1",
            ], timeout: 30)
        #expect(!run.timedOut && run.status == 0, "turnutils_uclient: \(run.stdout.suffix(800)) \(run.stderr.suffix(800))")

        // The endpoint refreshes about once a second.
        var after = before
        _ = try await eventually(within: .seconds(15), poll: .milliseconds(200)) {
            after = Exposition(try await Harness.offPool { try httpGet(address, "/metrics") }.body)
            return (after["tusa_allocations_created_total"] ?? 0) >= 1
                && (after["tusa_relayed_packets_total{direction=\"to_peer\"}"] ?? 0) >= 1
        }
        #expect((after["tusa_allocations_created_total"] ?? 0) >= 1, "\(after.text)")
        #expect((after["tusa_relayed_packets_total{direction=\"to_peer\"}"] ?? 0) >= 1, "\(after.text)")
        #expect((after["tusa_challenges_total"] ?? 0) >= 1, "uclient is challenged before it authenticates")
        #expect((after["tusa_auth_failures_total"] ?? -1) == 0)
        #expect(await relay.stop() == 0)
    }

    @Test(
        "a metrics port in use is a one-line error, status 1",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func binaryReportsMetricsPortInUse() async throws {
        let binary = try #require(Harness.tusa)
        let holder = MetricsEndpoint(
            address: TransportAddress(ip: loopback, port: 0), registry: PrometheusCollectorRegistry(),
            logger: quietLogger)
        try await withService(holder) {
            let taken = try await holder.boundAddress()
            let r = try await Harness.run(
                binary,
                [
                    "relay", "--listen", "127.0.0.1:0", "--no-tcp", "--prometheus", "--prometheus-port", "\(taken.port)",
                    "--log-level", "critical",
                ], timeout: 10)
            #expect(r.status == 1)
            #expect(
                r.stderr == "tusa relay: error: cannot serve metrics on tcp \(taken): Address already in use\n", "\(r.stderr)")
        }
    }
}

// MARK: - Helpers

/// A parsed Prometheus text exposition: sample values by `name{labels}`, types by name.
private struct Exposition {
    var text: String
    var samples: [String: Double] = [:]
    var types: [String: String] = [:]

    init(_ text: String) {
        self.text = text
        for line in text.split(separator: "\n") {
            if line.hasPrefix("# TYPE ") {
                let parts = line.split(separator: " ")
                if parts.count == 4 { types[String(parts[2])] = String(parts[3]) }
            } else if !line.hasPrefix("#"), let space = line.lastIndex(of: " ") {
                samples[String(line[..<space])] = Double(line[line.index(after: space)...])
            }
        }
    }

    subscript(_ key: String) -> Double? { samples[key] }
}

private struct HTTPResponse: Sendable {
    var status: Int
    var head: String
    var body: String
}

/// One HTTP/1.1 request with `Connection: close`, read to the end (5 s at most).
private func httpGet(_ server: TransportAddress, _ path: String, method: String = "GET", from source: IPAddress? = nil) throws
    -> HTTPResponse
{
    let socket = try TestSocket.tcp(connectingTo: server, from: source)
    try socket.sendAll(Array("\(method) \(path) HTTP/1.1\r\nHost: \(server)\r\nConnection: close\r\n\r\n".utf8))
    guard let bytes = socket.readToEnd(timeout: 5) else { throw TestSocketError("no complete answer from \(server)") }
    let text = String(decoding: bytes, as: UTF8.self)
    guard let split = text.range(of: "\r\n\r\n") else { throw TestSocketError("not HTTP: \(text.prefix(200))") }
    let head = String(text[..<split.lowerBound])
    let statusLine = head.split(separator: "\r\n").first ?? ""
    let status = statusLine.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
    return HTTPResponse(status: status, head: head, body: String(text[split.upperBound...]))
}

/// `127.0.0.1:PORT` out of `metrics http://127.0.0.1:PORT/metrics`.
private func metricsAddress(_ line: String) -> TransportAddress? {
    guard let start = line.range(of: "http://"), let end = line.range(of: "/metrics", range: start.upperBound..<line.endIndex)
    else {
        return nil
    }
    return TransportAddress(String(line[start.upperBound..<end.lowerBound]))
}

/// Runs `service` in a ServiceGroup around `body`, then shuts it down (5 s at most).
private func withService(_ service: some Service, _ body: () async throws -> Void) async throws {
    let group = ServiceGroup(configuration: .init(services: [service], logger: quietLogger))
    let running = Task { try await group.run() }
    do {
        try await body()
    } catch {
        running.cancel()
        _ = try? await running.value
        throw error
    }
    await group.triggerGracefulShutdown()
    let stopped = Task {
        try await Task.sleep(for: .seconds(5))
        running.cancel()
    }
    try await running.value
    stopped.cancel()
}
