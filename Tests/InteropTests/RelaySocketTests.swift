import Dispatch
import Foundation
import Logging
import NIOCore
import Relay
import STUN
import ServiceLifecycle
import TURN
import Testing
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// The relay sockets' driver (raw fds, recvmmsg/sendmmsg, GSO; Transport/RelayIO.swift)
// on real loopback sockets: what it relays, and that every socket it opens is closed
// again (expiry, Refresh 0, held EVEN-PORT ports, shutdown; fds counted in a
// `tusa relay` process of its own).

private let loopback = IPAddress.v4(0x7F00_0001)
private let loopback6 = IPAddress.v6(high: 0, low: 1)
private let ipv6Available: Bool = (try? TestSocket.udp(bindingTo: loopback6)) != nil

private let quiet: Logger = {
    var logger = Logger(label: "tusa.test.relay-sockets")
    logger.logLevel = .warning
    return logger
}()

@Suite("Relay sockets: raw fds read with recvmmsg, written with sendmmsg/GSO", .serialized)
struct RelaySocketTests {
    static func configuration(
        lifetime: UInt32 = 600, gso: Bool = true, batchWindow: TimeAmount = RelayService.Configuration.defaultBatchWindow
    ) -> RelayService.Configuration {
        var turn = TURNServerConfiguration(realm: "test")
        turn.anonymous = true
        turn.peerFilter = PeerFilter(allowLoopback: true)
        turn.defaultLifetime = lifetime
        turn.maxLifetime = lifetime
        turn.reservationLifetime = .seconds(1)
        var ips = [loopback]
        if ipv6Available { ips.append(loopback6) }
        return RelayService.Configuration(
            listenAddresses: [TransportAddress(ip: loopback, port: 0)], tcp: false, gso: gso, batchWindow: batchWindow,
            turn: turn,
            // Above Linux's ephemeral range (32768-60999): a port a test frees is not handed to another test's bind(0).
            relayPlan: RelayAddressPlan(ips: ips, minPort: 61_000, maxPort: 64_999))
    }

    @Test(
        "relays both ways: bursts (GSO runs), interleaved flows, 60 KB datagrams, Data indications",
        arguments: [true, false])
    func relaysBothWays(gso: Bool) async throws {
        try await withService(Self.configuration(gso: gso)) { service, server in
            try await Harness.offPool {
                let a = try Flow(server: server, family: 0x01)
                let b = try Flow(server: server, family: 0x01)
                // A burst per flow, then the two flows interleaved, each way.
                try a.sendUp(40, size: 100)
                try a.expectAtPeer(40, size: 100)
                try a.sendDown(40, size: 100)
                try a.expectAtClient(40, size: 100)
                for i in 0..<20 {
                    try a.sendUp(1, size: 80, tag: UInt8(i))
                    try b.sendUp(1, size: 90, tag: UInt8(i))
                }
                try a.expectAtPeer(20, size: 80)
                try b.expectAtPeer(20, size: 90)
                for i in 0..<20 {
                    try a.sendDown(1, size: 70, tag: UInt8(i))
                    try b.sendDown(1, size: 60, tag: UInt8(i))
                }
                try a.expectAtClient(20, size: 70)
                try b.expectAtClient(20, size: 60)
                // Mixed sizes in one burst, and payloads above the GSO segment limit.
                try a.sendUp(3, size: 1300)
                try a.sendUp(2, size: 20)
                try a.expectAtPeer(3, size: 1300)
                try a.expectAtPeer(2, size: 20)
                // The largest datagram a peer can send over IPv4 loopback with the frame still fitting.
                try a.sendDown(1, size: 60_000)
                try a.expectAtClient(1, size: 60_000)
                // A peer with a permission but no channel: Data indication.
                let other = try TestSocket.udp(bindingTo: loopback)
                try a.permit(other.localAddress)
                try other.sendDatagram([1, 2, 3], to: a.relay)
                let (bytes, _) = try #require(try a.client.receive(timeout: 10))
                let m = try Message(decoding: bytes)
                #expect(m.type == MessageType(method: .data, class: .indication))
                #expect(try m.value(.data) == .data([1, 2, 3]))
            }
            let statistics = await service.turnStatistics()
            #expect(statistics.dropped(.backpressure) == 0)
            #expect(statistics.dropped(.noRelaySocket) == 0)
        }
    }

    @Test(
        "the lane's batch window off, 50 µs and 20 ms: interleaved flows and bursts relayed both ways",
        arguments: [TimeAmount.zero, .microseconds(50), .milliseconds(20)])
    func relaysWithAnyBatchWindow(window: TimeAmount) async throws {
        try await withService(Self.configuration(batchWindow: window)) { service, server in
            try await Harness.offPool {
                let flows = try (0..<4).map { _ in try Flow(server: server, family: 0x01) }
                // Voice-like: one datagram per flow in turn, then bursts that fill a drain's budget.
                for i in 0..<25 {
                    for (k, flow) in flows.enumerated() { try flow.sendUp(1, size: 60 + k, tag: UInt8(i)) }
                }
                for (k, flow) in flows.enumerated() { try flow.expectAtPeer(25, size: 60 + k) }
                for i in 0..<25 {
                    for (k, flow) in flows.enumerated() { try flow.sendDown(1, size: 40 + k, tag: UInt8(i)) }
                }
                for (k, flow) in flows.enumerated() { try flow.expectAtClient(25, size: 40 + k) }
                // 240 at once: more than half a drain's budget, so the next drain follows without the window.
                for flow in flows { try flow.sendUp(60, size: 100) }
                for flow in flows { try flow.expectAtPeer(60, size: 100) }
                for flow in flows { try flow.sendDown(60, size: 100) }
                for flow in flows { try flow.expectAtClient(60, size: 100) }
                // A Binding request on the same socket is answered by the lane too.
                let (bytes, _) = try flows[0].client.exchange(Message(type: .bindingRequest).encode(), with: server)
                #expect(try Message(decoding: bytes).type == .bindingSuccess)
            }
            #expect(service.statistics.responses >= 1)
            let statistics = await service.turnStatistics()
            #expect(statistics.dropped(.backpressure) == 0)
            #expect(statistics.packetsToPeer >= 4 * 85)
            #expect(statistics.packetsToClient >= 4 * 85)
        }
    }

    @Test("an IPv6 relay (REQUESTED-ADDRESS-FAMILY) relays both ways", .enabled(if: ipv6Available, "no IPv6 loopback"))
    func ipv6Relay() async throws {
        try await withService(Self.configuration()) { _, server in
            try await Harness.offPool {
                let a = try Flow(server: server, family: 0x02)
                #expect(!a.relay.ip.isIPv4)
                try a.sendUp(10, size: 100)
                try a.expectAtPeer(10, size: 100)
                try a.sendDown(10, size: 100)
                try a.expectAtClient(10, size: 100)
            }
        }
    }

    @Test("a held EVEN-PORT port becomes a relay that reads and writes (RESERVATION-TOKEN)")
    func reservedPortRelays() async throws {
        try await withService(Self.configuration()) { _, server in
            try await Harness.offPool {
                let first = try Flow(server: server, family: 0x01, evenPort: true)
                let token = try #require(first.reservationToken)
                let second = try Flow(server: server, family: 0x01, token: token)
                #expect(second.relay == TransportAddress(ip: first.relay.ip, port: first.relay.port + 1))
                for flow in [first, second] {
                    try flow.sendUp(5, size: 100)
                    try flow.expectAtPeer(5, size: 100)
                    try flow.sendDown(5, size: 100)
                    try flow.expectAtClient(5, size: 100)
                }
            }
        }
    }

    @Test(
        "a dual allocation (ADDITIONAL-ADDRESS-FAMILY) relays over both its relays",
        .enabled(if: ipv6Available, "no IPv6 loopback"))
    func dualAllocation() async throws {
        try await withService(Self.configuration()) { _, server in
            try await Harness.offPool {
                let flow = try Flow(server: server, family: 0x01, additionalFamily: 0x02)
                #expect(flow.relays.count == 2)
                let relay6 = try #require(flow.relays.first { !$0.ip.isIPv4 })
                let peer6 = try TestSocket.udp(bindingTo: loopback6)
                _ = try Flow.request(
                    .channelBind, [.channelNumber(0x4001), .xorPeerAddress(peer6.localAddress)], client: flow.client,
                    server: server)
                try flow.client.sendDatagram([0x40, 0x01, 0x00, 0x03, 7, 8, 9], to: server)
                let (up, from) = try #require(try peer6.receive(timeout: 10))
                #expect(up == [7, 8, 9] && from == relay6)
                try peer6.sendDatagram([4, 5], to: relay6)
                let (down, _) = try #require(try flow.client.receive(timeout: 10))
                #expect(down == [0x40, 0x01, 0x00, 0x02, 4, 5])
                // The IPv4 relay still works beside it.
                try flow.sendUp(3, size: 100)
                try flow.expectAtPeer(3, size: 100)
            }
        }
    }

    @Test("expiry, Refresh 0, held EVEN-PORT ports and shutdown close the relay sockets")
    func socketsAreClosed() async throws {
        var relays: [TransportAddress] = []
        try await withService(Self.configuration(lifetime: 1)) { service, server in
            relays = try await Harness.offPool {
                let expiring = try Flow(server: server, family: 0x01, channel: false)
                let refreshed = try Flow(server: server, family: 0x01, channel: false)
                let held = try Flow(server: server, family: 0x01, channel: false, evenPort: true)
                #expect(held.relay.port % 2 == 0)
                let reserved = TransportAddress(ip: held.relay.ip, port: held.relay.port + 1)
                #expect(!isFree(reserved), "the reserved port is held")
                try refreshed.deleteAllocation()
                // Polled: under a full parallel test run the check once raced the close.
                #expect(eventuallyBlocking(within: .seconds(10)) { isFree(refreshed.relay) }, "Refresh 0 closed the relay socket")
                // Lifetime 1 s and a 1 s sweep; the reservation lives 1 s too.
                #expect(
                    eventuallyBlocking(within: .seconds(15)) { isFree(expiring.relay) && isFree(held.relay) && isFree(reserved) },
                    "expiry closed the relay sockets")
                return [expiring.relay, refreshed.relay, held.relay, reserved]
            }
            let statistics = await service.turnStatistics()
            #expect(statistics.allocationsExpired == 2)
            #expect(statistics.allocationsDeleted == 1)
            #expect(statistics.allocationsActive == 0)
        }
        #expect(relays.count == 4)
        // Live allocations at shutdown: closed by deleteAll.
        var live: [TransportAddress] = []
        try await withService(Self.configuration()) { _, server in
            live = try await Harness.offPool {
                (0..<5).compactMap { _ in try? Flow(server: server, family: 0x01, channel: false).relay }
            }
            #expect(live.count == 5)
            #expect(!live.contains(where: isFree))
        }
        #expect(live.allSatisfy(isFree), "shutdown closed every relay socket")
    }

    @Test(
        "tusa relay: one fd per live allocation, none left after Refresh 0 and held ports' expiry",
        .enabled(if: Harness.tusa != nil, "tusa binary not built"))
    func binaryLeaksNoDescriptors() async throws {
        let (relay, port) = try #require(
            try await Harness.startRelay([
                "--listen", "127.0.0.1:0", "--no-tcp", "-z", "--allow-loopback-peers", "--min-port", "40000", "--max-port",
                "59999",
            ]))
        defer { relay.kill() }
        let pid = relay.process.processIdentifier
        let server = TransportAddress(ip: loopback, port: port)
        try await Harness.offPool {
            let base = try #require(openFDs(pid))
            var flows: [Flow] = []
            for _ in 0..<20 { flows.append(try Flow(server: server, family: 0x01)) }
            try flows[0].sendUp(5, size: 100)
            try flows[0].expectAtPeer(5, size: 100)
            try flows[0].sendDown(5, size: 100)
            try flows[0].expectAtClient(5, size: 100)
            #expect(openFDs(pid) == base + 20)
            for flow in flows { try flow.deleteAllocation() }
            #expect(eventuallyBlocking(within: .seconds(10)) { openFDs(pid) == base }, "Refresh 0 closed every relay socket")
            // An EVEN-PORT reservation holds two fds until it is deleted; its held port
            // goes when the reservation expires (30 s by default: not waited for here).
            let held = try Flow(server: server, family: 0x01, channel: false, evenPort: true)
            #expect(openFDs(pid) == base + 2)
            try held.deleteAllocation()
            #expect(eventuallyBlocking(within: .seconds(10)) { openFDs(pid) == base + 1 }, "the held port stays, the relay goes")
        }
        let status = await relay.stop()
        #expect(status == 0)
    }
}

// MARK: - A client, its allocation, and a peer

/// One anonymous UDP allocation with a peer socket on loopback, bound to channel 0x4000.
private final class Flow {
    let client: TestSocket
    let peer: TestSocket
    let server: TransportAddress
    let relay: TransportAddress
    /// The RESERVATION-TOKEN of an EVEN-PORT allocation that holds the next port.
    let reservationToken: UInt64?

    /// Every XOR-RELAYED-ADDRESS of the answer (two for a dual allocation).
    let relays: [TransportAddress]

    init(
        server: TransportAddress, family: UInt8, channel: Bool = true, evenPort: Bool = false, token: UInt64? = nil,
        additionalFamily: UInt8? = nil
    ) throws {
        self.server = server
        client = try TestSocket.udp(bindingTo: loopback)
        peer = try TestSocket.udp(bindingTo: family == 0x01 ? loopback : loopback6)
        var attributes: [Attribute] = [.requestedTransport(17)]
        if family != 0x01 { attributes.append(.requestedAddressFamily(family)) }
        if evenPort { attributes.append(.evenPort(reserveNext: true)) }
        if let token { attributes.append(.reservationToken(token)) }
        if let additionalFamily { attributes.append(.additionalAddressFamily(additionalFamily)) }
        let answer = try Self.request(.allocate, attributes, client: client, server: server)
        guard case .xorRelayedAddress(let relayed)? = try answer.value(.xorRelayedAddress) else {
            throw TestSocketError("no relayed address in \(answer)")
        }
        relay = relayed
        relays = try answer.typedAttributes().compactMap { if case .xorRelayedAddress(let a) = $0 { a } else { nil } }
        if case .reservationToken(let t)? = try answer.value(.reservationToken) {
            reservationToken = t
        } else {
            reservationToken = nil
        }
        if channel {
            _ = try Self.request(
                .channelBind, [.channelNumber(0x4000), .xorPeerAddress(peer.localAddress)], client: client, server: server)
        }
    }

    static func request(_ method: STUN.Method, _ attributes: [Attribute], client: TestSocket, server: TransportAddress) throws
        -> Message
    {
        let request = Message(
            type: MessageType(method: method, class: .request), transactionID: .random(), attributes: attributes)
        let (bytes, _) = try client.exchange(request.encode(fingerprint: true), with: server)
        let answer = try Message(decoding: bytes)
        guard answer.type.messageClass == .successResponse else { throw TestSocketError("\(method) failed: \(answer)") }
        return answer
    }

    func permit(_ address: TransportAddress) throws {
        _ = try Self.request(.createPermission, [.xorPeerAddress(address)], client: client, server: server)
    }

    func deleteAllocation() throws {
        _ = try Self.request(.refresh, [.lifetime(0)], client: client, server: server)
    }

    /// Payload `index` of a run: its first byte tags the run, the rest counts.
    private static func payload(_ size: Int, tag: UInt8, index: Int) -> [UInt8] {
        var bytes = [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: size)
        bytes[0] = tag
        return bytes
    }

    func sendUp(_ count: Int, size: Int, tag: UInt8 = 0xA5) throws {
        for i in 0..<count {
            let data = Self.payload(size, tag: tag, index: i)
            let frame = [0x40, 0x00, UInt8(size >> 8), UInt8(size & 0xFF)] + data
            try client.sendDatagram(frame, to: server)
        }
    }

    func sendDown(_ count: Int, size: Int, tag: UInt8 = 0x5A) throws {
        for i in 0..<count { try peer.sendDatagram(Self.payload(size, tag: tag, index: i), to: relay) }
    }

    func expectAtPeer(_ count: Int, size: Int) throws {
        for _ in 0..<count {
            let (bytes, from) = try #require(try peer.receive(timeout: 10, capacity: 65_536), "a relayed datagram")
            #expect(from == relay)
            #expect(bytes.count == size)
        }
    }

    func expectAtClient(_ count: Int, size: Int) throws {
        for _ in 0..<count {
            let (bytes, from) = try #require(try client.receive(timeout: 10, capacity: 65_536), "a ChannelData frame")
            #expect(from == server)
            #expect(bytes.count == 4 + size)
            #expect(Array(bytes.prefix(4)) == [0x40, 0x00, UInt8(size >> 8), UInt8(size & 0xFF)])
        }
    }
}

// MARK: - Helpers

private func withService(
    _ configuration: RelayService.Configuration, _ body: (RelayService, TransportAddress) async throws -> Void
) async throws {
    let service = RelayService(configuration: configuration, logger: quiet)
    let group = ServiceGroup(configuration: .init(services: [service], logger: quiet))
    let running = Task { try await group.run() }
    do {
        let sockets = try await service.boundSockets()
        let server = try #require(sockets.first { $0.kind == .udp }?.address)
        try await body(service, server)
    } catch {
        running.cancel()
        _ = try? await running.value
        throw error
    }
    await group.triggerGracefulShutdown()
    try await running.value
}

/// Whether a UDP port can be bound now (no socket of this process or another holds it).
private func isFree(_ address: TransportAddress) -> Bool {
    (try? TestSocket.udp(bindingTo: address.ip, port: address.port)) != nil
}

private func openFDs(_ pid: Int32) -> Int? {
    try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count
}
