import Logging
import NIOCore
import NIOPosix
import STUN
import TURN
import Testing
import TusaBase

@testable import Relay
@testable import Transport

#if canImport(Glibc)
    import Glibc
#endif

/// The lane on real sockets: its relay-port picking at the edges of the port
/// range, and what one drain reads.
struct TURNLaneTests {
    static func withLane<T: Sendable>(min: UInt16, max: UInt16, _ body: @escaping @Sendable (TURNLane) throws -> T) async throws
        -> T
    {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let loop = group.next()
        let config: TURNServerConfiguration = {
            var c = TURNServerConfiguration(realm: "t")
            c.anonymous = true
            return c
        }()
        let plan = RelayAddressPlan(ips: [IPAddress("127.0.0.1")!], minPort: min, maxPort: max)
        let result: Result<T, any Error>
        do {
            result = .success(
                try await loop.submit {
                    let lane = TURNLane(loop: loop, configuration: config, plan: plan, logger: Logger(label: "test"))
                    defer { lane.stop() }
                    return try body(lane)
                }.get())
        } catch {
            result = .failure(error)
        }
        try await group.shutdownGracefully()
        return try result.get()
    }

    @Test("EVEN-PORT with a reservation at the top of the range (65535) neither traps nor leaves the range")
    func evenPortsAtTheTopOfTheRange() async throws {
        let ports = try await Self.withLane(min: 65_526, max: 65_535) { lane -> [UInt16] in
            var got: [UInt16] = []
            for _ in 0..<8 {
                guard let r = lane.openRelay(family: 0x01, even: true, reserveNext: true, dontFragment: false) else { continue }
                got.append(r.relay.port)
                #expect(r.reserved?.port == r.relay.port + 1)
            }
            return got
        }
        // Ports the machine has free in 65526-65535 come in even/odd pairs; none outside.
        #expect(ports.allSatisfy { $0 % 2 == 0 && $0 >= 65_526 && $0 <= 65_534 })
        #expect(Set(ports).count == ports.count)
    }

    @Test("an odd lower bound still gives even ports")
    func oddLowerBound() async throws {
        let ports = try await Self.withLane(min: 50_001, max: 50_007) { lane -> [UInt16] in
            (0..<6).compactMap { _ in
                lane.openRelay(family: 0x01, even: true, reserveNext: false, dontFragment: false)?.relay.port
            }
        }
        #expect(ports.allSatisfy { $0 % 2 == 0 && (50_002...50_006).contains($0) })
    }

    @Test("relay sockets are bound on unpredictable ports, and the range's accounting follows opens and closes")
    func relayPortsAreUnpredictableAndAccounted() async throws {
        let (ports, heldAfterOpen, heldAfterClose) = try await Self.withLane(min: 45_000, max: 46_999) {
            lane -> ([UInt16], Int, Int) in
            var relays: [TransportAddress] = []
            for _ in 0..<40 {
                guard let r = lane.openRelay(family: 0x01, even: false, reserveNext: false, dontFragment: false) else { continue }
                relays.append(r.relay)
            }
            let opened = lane.ports.usage.held
            for relay in relays { lane.closeRelay(relay) }
            return (relays.map(\.port), opened, lane.ports.usage.held)
        }
        #expect(ports.count >= 35, "the machine had most of 45000-46999 free: \(ports.count) opened")
        #expect(ports.allSatisfy { (45_000...46_999).contains($0) })
        let steps = zip(ports, ports.dropFirst()).map { Int($1) - Int($0) }
        #expect(steps.filter { abs($0) <= 2 }.count <= 2, "ports handed out in sequence: \(ports)")
        #expect(heldAfterOpen == ports.count)
        #expect(heldAfterClose == 0)
    }

    /// More relay sockets ready than one wait of the relay set returns: the set
    /// reports them in turn, and a listener that turned readable after them is
    /// still read in the first drain (its clients' datagrams all queue on that
    /// one socket, and would overflow its buffer while it waits its turn).
    @Test("a listener behind more ready relay sockets than one wait returns is read in the first drain")
    func aListenerIsReadInTheFirstDrainBehindACrowdOfRelaySockets() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let loop = group.next()
        let fd = try ListenerSocket.bind(TransportAddress(ip: .v4(0x7F00_0001), port: 0), reusePort: false, buffer: 1 << 20)
        let channel = try await DatagramBootstrap(group: loop).channelOption(.autoRead, value: false).withBoundSocket(fd).get()
        let address = try #require(channel.localAddress.flatMap(TransportAddress.init))
        let answered = try await loop.submit { () throws -> Bool in
            var config = TURNServerConfiguration(realm: "t")
            config.anonymous = true
            let plan = RelayAddressPlan(ips: [IPAddress("127.0.0.1")!], minPort: 40_000, maxPort: 44_999)
            let lane = TURNLane(loop: loop, configuration: config, plan: plan, logger: Logger(label: "test"))
            defer { lane.stop() }
            lane.start()
            let listener = try #require(
                ListenerSocket(
                    fd: fd, address: address, channel: channel, core: BindingServer(), routes: UDPRoutes(channels: [:]),
                    laneIndex: 0, totals: StatisticsBox()))
            lane.attach(listener)
            // The loop is ours until this returns: nothing is read before the drain below.
            let crowd = 300
            #expect(crowd > TURNLane.readyPerWait && crowd > TURNLane.datagramsPerDrain)
            let relays = (0..<crowd).compactMap { _ in
                lane.openRelay(family: 0x01, even: false, reserveNext: false, dontFragment: false)?.relay
            }
            #expect(relays.count == crowd)
            let peer = try bindUDPSocket(TransportAddress(ip: .v4(0x7F00_0001), port: 0))
            let client = try bindUDPSocket(TransportAddress(ip: .v4(0x7F00_0001), port: 0))
            defer { for s in [peer, client] { close(s) } }
            for relay in relays { _ = Self.send([0x01], from: peer, to: relay) }
            let request = Message(type: MessageType(method: .binding, class: .request)).encode()
            #expect(Self.send(request, from: client, to: address))
            usleep(20_000)  // loopback delivers at once; room for a slow machine
            lane.drainRelays()
            var answer = [UInt8](repeating: 0, count: 512)
            let n = recv(client, &answer, answer.count, Int32(MSG_DONTWAIT))
            return n >= 20 && answer[0] == 0x01 && answer[1] == 0x01  // a Binding success response
        }.get()
        try await channel.close()
        try await group.shutdownGracefully()
        #expect(answered, "the listener was not read in the first drain")
    }

    static func send(_ bytes: [UInt8], from fd: Int32, to address: TransportAddress) -> Bool {
        var storage = sockaddr_storage()
        let length = address.store(into: &storage)
        let sent = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, bytes, bytes.count, 0, $0, socklen_t(length)) }
        }
        return sent == bytes.count
    }
}
