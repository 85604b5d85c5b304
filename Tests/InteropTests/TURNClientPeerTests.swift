import Dispatch
import Foundation
import STUN
import TURN
import Testing
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#endif

/// Tusa's TURN client against coturn's `turnserver` with long-term
/// credentials, relaying to coturn's `turnutils_peer` echo. Everything on loopback.
@Suite(.serialized)
struct TURNClientPeerTests {
    static let haveCoturn =
        Harness.which("turnserver") != nil && Harness.which("turnutils_stunclient") != nil
        && Harness.which("turnutils_peer") != nil
    static let haveTusa = Harness.tusa != nil
    static let needs = "needs coturn (turnserver, turnutils_peer, turnutils_stunclient; make test installs it)"

    /// coturn with long-term credentials alice:wonderland in realm example.org,
    /// and an echo peer; both stopped when `body` returns.
    static func withServerAndPeer(
        extra: [String] = [], _ body: (_ server: UInt16, _ peer: UInt16) async throws -> Void
    ) async throws {
        let port = Harness.freePortPair()
        let server = try #require(
            try await Harness.startTurnserver(
                port: port,
                extra: [
                    "-a", "-u", "alice:wonderland", "-r", "example.org", "--allow-loopback-peers",
                ] + extra), "turnserver did not start")
        defer { server.kill() }
        // turnutils_peer binds PORT and PORT+1; a pair taken meanwhile is given up
        // and another tried (see Harness.startEchoPeer).
        var started: (Harness.Background, UInt16)?
        var failures: [UInt16] = []
        for _ in 0..<5 where started == nil {
            let peerPort = Harness.freePortPair()
            if let peer = try await Harness.startEchoPeer(port: peerPort) {
                started = (peer, peerPort)
            } else {
                failures.append(peerPort)
            }
        }
        let (peer, peerPort) = try #require(started, "turnutils_peer did not bind: \(failures)")
        defer { peer.kill() }
        try await body(port, peerPort)
    }

    /// `tusa` with arguments, to completion (at most `timeout` seconds).
    static func tusa(_ arguments: [String], timeout: Double = 30) async throws -> Harness.Result {
        let tusa = try #require(Harness.tusa)
        return try await Harness.run(tusa, arguments, timeout: timeout)
    }

    @Test(
        .enabled(if: haveTusa && haveCoturn, "needs .build/debug/tusa; \(needs)"),
        arguments: [[], ["--tcp"], ["--no-channel"], ["--tcp", "--no-channel"]])
    func tusaTurnRelaysToAnEchoPeer(flags: [String]) async throws {
        try await Self.withServerAndPeer { server, peer in
            let r = try await Self.tusa(
                [
                    "turn", "127.0.0.1:\(server)", "--user", "alice:wonderland", "--peer", "127.0.0.1:\(peer)",
                    "--count", "20", "--interval-ms", "5", "--timeout", "5",
                ] + flags)
            #expect(r.status == 0 && !r.timedOut, "\(flags): \(r.stdout) \(r.stderr)")
            #expect(
                r.stdout.range(of: #"relayed address: 127\.0\.0\.1:[0-9]+"#, options: .regularExpression) != nil, "\(r.stdout)")
            #expect(
                r.stdout.range(of: #"mapped address: 127\.0\.0\.1:[0-9]+"#, options: .regularExpression) != nil, "\(r.stdout)")
            if flags.contains("--no-channel") {
                #expect(r.stdout.contains("sending in Send indications"), "\(r.stdout)")
            } else {
                #expect(r.stdout.contains("channel 0x4000 bound to 127.0.0.1:\(peer)"), "\(r.stdout)")
            }
            #expect(r.stdout.contains("sent 20, received 20, loss 0.0%"), "\(flags): \(r.stdout)")
            #expect(
                r.stdout.range(of: #"rtt min/avg/max [0-9.]+/[0-9.]+/[0-9.]+ ms"#, options: .regularExpression) != nil,
                "\(r.stdout)")
            #expect(r.stdout.contains("deallocated"), "\(r.stdout)")
            #expect(r.stderr.isEmpty, "\(r.stderr)")
        }
    }

    @Test(.enabled(if: haveTusa && haveCoturn, "needs .build/debug/tusa; \(needs)"), arguments: [[], ["--tcp"]])
    func wrongPasswordIsAuthenticationFailure(flags: [String]) async throws {
        try await Self.withServerAndPeer { server, peer in
            let r = try await Self.tusa(
                [
                    "turn", "127.0.0.1:\(server)", "--user", "alice:looking-glass", "--peer", "127.0.0.1:\(peer)",
                ] + flags)
            #expect(r.status == 1, "\(r.stdout) \(r.stderr)")
            #expect(r.stderr.hasPrefix("tusa turn: "), "\(r.stderr)")
            #expect(r.stderr.contains("authentication failed"), "\(r.stderr)")
            #expect(r.stderr.split(separator: "\n").count == 1, "\(r.stderr)")
            #expect(!r.stdout.contains("relayed address"), "\(r.stdout)")
        }
    }

    @Test(.enabled(if: haveTusa && haveCoturn, "needs .build/debug/tusa; \(needs)"))
    func aSilentPeerIsTotalLossAndExitOne() async throws {
        try await Self.withServerAndPeer { server, _ in
            let silent = Harness.freePort()
            let r = try await Self.tusa([
                "turn", "127.0.0.1:\(server)", "--user", "alice:wonderland", "--peer", "127.0.0.1:\(silent)",
                "--count", "3", "--timeout", "1",
            ])
            #expect(r.status == 1, "\(r.stdout) \(r.stderr)")
            #expect(r.stdout.contains("sent 3, received 0, loss 100.0%"), "\(r.stdout)")
            #expect(r.stderr.contains("tusa turn: no echoes"), "\(r.stderr)")
        }
    }

    @Test(.enabled(if: haveTusa, "needs .build/debug/tusa"))
    func unreachableAndSilentServersAreOneLineErrors() async throws {
        let closed = Harness.freePort()
        for flags in [[], ["--tcp"]] {
            let r = try await Self.tusa(["turn", "127.0.0.1:\(closed)", "--user", "a:b", "--peer", "127.0.0.1:9"] + flags)
            #expect(r.status == 1, "\(flags): \(r.stderr)")
            #expect(r.stderr.hasPrefix("tusa turn: 127.0.0.1:\(closed): "), "\(r.stderr)")
            #expect(r.stderr.contains("refused"), "\(r.stderr)")
            #expect(r.stderr.split(separator: "\n").count == 1, "\(r.stderr)")
        }
        let silentServer = try TestSocket.udp(bindingTo: .v4(0x7F00_0001))
        defer { withExtendedLifetime(silentServer) {} }
        let t = try await Self.tusa([
            "turn", "127.0.0.1:\(silentServer.localAddress.port)", "--user", "a:b", "--peer", "127.0.0.1:9", "--timeout", "1",
        ])
        #expect(t.status == 1)
        #expect(
            t.stderr == "tusa turn: 127.0.0.1:\(silentServer.localAddress.port): no answer to Allocate within 1.0 s\n",
            "\(t.stderr)")
        let bad = try await Self.tusa(["turn", "127.0.0.1:1", "--user", "nocolon", "--peer", "127.0.0.1:9"])
        #expect(bad.status == 1)
        #expect(bad.stderr == "tusa turn: --user 'nocolon' is not USER:PASSWORD\n", "\(bad.stderr)")
    }

    /// The library API in-process: TURNClientConnection against coturn.
    @Test(
        .enabled(if: haveCoturn, "\(needs)"),
        arguments: [TURNClientConnection.TransportProtocol.udp, .tcp])
    func connectionAPIAgainstCoturn(transport: TURNClientConnection.TransportProtocol) async throws {
        try await Self.withServerAndPeer { port, peerPort in
            try await Self.exerciseConnection(server: port, peer: peerPort, transport: transport)
        }
    }

    static func exerciseConnection(server port: UInt16, peer peerPort: UInt16, transport: TURNClientConnection.TransportProtocol)
        async throws
    {
        let peer = TransportAddress(ip: .v4(0x7F00_0001), port: peerPort)
        let turn = try await TURNClientConnection.connect(
            to: TransportAddress(ip: .v4(0x7F00_0001), port: port), over: transport,
            configuration: .init(username: "alice", password: "wonderland", realm: "example.org"))
        let allocation = try await turn.allocate(timeout: .seconds(5))
        #expect(allocation.relayed.ip == .v4(0x7F00_0001))
        #expect(allocation.mapped == turn.localAddress)
        #expect(allocation.lifetime == .seconds(600))
        // A Send indication before the channel (the echo comes back in a Data
        // indication), ChannelData after it.
        try await turn.createPermission(for: peer, timeout: .seconds(5))
        try await turn.send([1, 2, 3, 4, 5], to: peer)
        let first = try await Self.collect(1, from: turn, within: .seconds(5))
        #expect(first == [TURNClient.Datagram(peer: peer, payload: [1, 2, 3, 4, 5], channel: nil)])
        let channel = try await turn.bindChannel(to: peer, timeout: .seconds(5))
        #expect(channel.rawValue == 0x4000)
        try await turn.send([6, 7, 8], to: peer)
        let second = try await Self.collect(1, from: turn, within: .seconds(5))
        #expect(second == [TURNClient.Datagram(peer: peer, payload: [6, 7, 8], channel: 0x4000)])
        // Not permitted: a typed error, nothing sent.
        await #expect(throws: TURNClientError.noPermission(.v4(0x7F00_0002))) {
            try await turn.send([1], to: TransportAddress(ip: .v4(0x7F00_0002), port: 9))
        }
        try await turn.close(timeout: .seconds(2))
        await #expect(throws: TURNClientError.closed) { try await turn.send([1], to: peer) }
        // The stream has ended.
        var after = 0
        for await _ in turn.received { after += 1 }
        #expect(after == 0)
    }

    /// `refresh()` against coturn: confirmed while coturn holds the allocation; a
    /// typed 437 once coturn restarted without it. Closing a connection whose
    /// allocation is gone (or never was) ends at once, not at close's timeout.
    @Test(.enabled(if: haveCoturn, "\(needs)"))
    func refreshConfirmsOrSaysTheAllocationIsGoneAndCloseDoesNotWait() async throws {
        let port = Harness.freePortPair()
        let flags = ["-a", "-u", "alice:wonderland", "-r", "example.org", "--allow-loopback-peers"]
        let first = try #require(try await Harness.startTurnserver(port: port, extra: flags), "turnserver did not start")
        let server = TransportAddress(ip: .v4(0x7F00_0001), port: port)
        let configuration = TURNClient.Configuration(username: "alice", password: "wonderland")
        let turn = try await TURNClientConnection.connect(to: server, over: .udp, configuration: configuration)
        let allocation = try await turn.allocate(timeout: .seconds(5))
        let confirmed = try await turn.refresh(timeout: .seconds(5))
        #expect(confirmed.relayed == allocation.relayed)
        #expect(confirmed.expiresAt > allocation.expiresAt)

        first.kill()
        _ = await first.stop()
        let second = try #require(try await Harness.startTurnserver(port: port, extra: flags), "turnserver did not restart")
        defer { second.kill() }
        await #expect(throws: TURNClientError.allocationMismatch(.refresh)) { try await turn.refresh(timeout: .seconds(5)) }
        let clock = ContinuousClock()
        var started = clock.now
        try await turn.close(timeout: .seconds(30))
        #expect(clock.now - started < .seconds(10), "closing a lost allocation waited for its timeout")

        let idle = try await TURNClientConnection.connect(to: server, over: .udp, configuration: configuration)
        started = clock.now
        try await idle.close(timeout: .seconds(30))
        #expect(clock.now - started < .seconds(10), "closing without an allocation waited for its timeout")
    }

    /// coturn with permission and channel lifetimes of seconds and nonces that
    /// go stale every 2 s: the permission and the channel live only if the
    /// driver's timers refresh them, and the refreshes meet 438s on the way.
    /// (coturn grants no allocation under 600 s: allocation refresh timing is
    /// covered by the core's virtual-clock tests.)
    @Test(.enabled(if: haveCoturn, "\(needs)"), arguments: [TURNClientConnection.TransportProtocol.udp, .tcp])
    func refreshesKeepEverythingAliveThroughStaleNonces(transport: TURNClientConnection.TransportProtocol) async throws {
        let extra = ["--permission-lifetime", "4", "--channel-lifetime", "5", "--stale-nonce=2"]
        try await Self.withServerAndPeer(extra: extra) { port, peerPort in
            let peer = TransportAddress(ip: .v4(0x7F00_0001), port: peerPort)
            var configuration = TURNClient.Configuration(username: "alice", password: "wonderland")
            configuration.permissionRefreshInterval = .seconds(2)
            configuration.channelRefreshInterval = .seconds(2)
            let turn = try await TURNClientConnection.connect(
                to: TransportAddress(ip: .v4(0x7F00_0001), port: port), over: transport, configuration: configuration)
            _ = try await turn.allocate(timeout: .seconds(5))
            try await turn.bindChannel(to: peer, timeout: .seconds(5))
            // 10 s: twice the channel's lifetime, with a stale nonce at every refresh.
            for n in 0..<20 {
                try await turn.send([UInt8(n)], to: peer)
                let echo = try await Self.collect(1, from: turn, within: .seconds(3))
                #expect(echo == [TURNClient.Datagram(peer: peer, payload: [UInt8(n)], channel: 0x4000)], "packet \(n)")
                try await Task.sleep(for: .milliseconds(500))  // pacing, not a wait: the test spans the lifetimes
            }
            try await turn.close(timeout: .seconds(2))
        }
    }

    static func collect(
        _ n: Int, from turn: TURNClientConnection, within limit: Duration
    ) async throws -> [TURNClient.Datagram] {
        try await withThrowingTaskGroup(of: [TURNClient.Datagram].self) { group in
            group.addTask {
                var out: [TURNClient.Datagram] = []
                for await d in turn.received {
                    out.append(d)
                    if out.count == n { break }
                }
                return out
            }
            group.addTask {
                try await Task.sleep(for: limit)
                throw TURNClientError.timeout(.data)
            }
            defer { group.cancelAll() }
            return try #require(try await group.next())
        }
    }
}
