import STUN
import TestSupport
import Testing
import TusaBase

@testable import TURN

// The TURN client core and the TURN server core on TestSupport's VirtualNetwork:
// the client behind a symmetric NAT, a peer on the public side, datagrams both
// ways through the relay.

/// The TURN server core at its listening address and its relays, driven only
/// through the SansIOCore contract: datagrams in, actions out, sweeps at its deadline.
private final class TURNServerNode: VirtualNode {
    let listening: TransportAddress
    let server: TURNServer
    let ports: RecordingPorts
    let network: VirtualNetwork
    var events: [TURNEvent] = []
    var addresses: [TransportAddress] { [listening] + Array(ports.open) }
    var nextDeadline: Timestamp? { server.nextDeadline }

    init(at listening: TransportAddress, on network: VirtualNetwork) {
        self.listening = listening
        self.network = network
        (server, ports) = TURNServerTests.makeServer()
    }

    func handleTimeout(now: Timestamp) {
        server.handleTimeout(now: now)
        perform()
    }

    func receive(_ d: VirtualNetwork.Datagram, now: Timestamp) {
        if d.to == listening {
            server.handle(.fromClient(d.bytes, FiveTuple(client: d.from, server: listening, transport: .udp)), now: now)
        } else {
            server.handle(.fromPeer(d.bytes, from: d.from, relay: d.to), now: now)
        }
        perform()
    }

    private func perform() {
        while let action = server.pollAction() {
            switch action {
            case .sendToClient(let bytes, let tuple): network.send(bytes, from: tuple.server, to: tuple.client)
            case .sendToPeer(let payload, let relay, let peer): network.send(payload, from: relay, to: peer)
            case .event(let event): events.append(event)
            }
        }
    }
}

/// The TURN client core at its socket's address.
private final class TURNClientNode: VirtualNode {
    var client: TURNClient
    let addresses: [TransportAddress]
    let server: TransportAddress
    let network: VirtualNetwork
    var events: [TURNClient.Event] = []
    var received: [TURNClient.Datagram] = []
    var nextDeadline: Timestamp? { client.nextDeadline }

    init(_ client: TURNClient, at address: TransportAddress, server: TransportAddress, on network: VirtualNetwork) {
        self.client = client
        addresses = [address]
        self.server = server
        self.network = network
    }

    func handleTimeout(now: Timestamp) {
        client.handleTimeout(now: now)
        flush()
    }

    func receive(_ d: VirtualNetwork.Datagram, now: Timestamp) {
        if let datagram = client.receive(d.bytes, now: now) { received.append(datagram) }
        flush()
    }

    func flush() {
        while let bytes = client.pollTransmit() { network.send(bytes, from: addresses[0], to: server) }
        while let e = client.pollEvent() { events.append(e) }
    }
}

/// A plain UDP peer that keeps what it receives.
private final class PeerNode: VirtualNode {
    let addresses: [TransportAddress]
    var received: [VirtualNetwork.Datagram] = []
    var nextDeadline: Timestamp? { nil }
    init(at address: TransportAddress) { addresses = [address] }
    func handleTimeout(now: Timestamp) {}
    func receive(_ d: VirtualNetwork.Datagram, now: Timestamp) { received.append(d) }
}

@Suite("TURN client and server on the virtual network")
struct TURNOverVirtualNetworkTests {
    @Test func aClientBehindASymmetricNATRelaysBothWaysThroughItsAllocation() throws {
        let network = VirtualNetwork(impairment: .init(delay: .milliseconds(20)))
        let serverAddress = TransportAddress("198.51.100.1:3478")!
        let server = TURNServerNode(at: serverAddress, on: network)
        network.attach(server)
        let peer = PeerNode(at: TransportAddress("203.0.113.99:5000")!)
        network.attach(peer)
        let nat = network.addNAT(.symmetric(IPAddress("203.0.113.50")!))
        let clientHost = TransportAddress("10.1.1.2:4000")!
        let client = TURNClientNode(
            try TURNClient(configuration: .init(username: "alice", password: "wonderland")),
            at: clientHost, server: serverAddress, on: network)
        network.attach(client, behind: nat)

        _ = try client.client.allocate(now: network.now)
        client.flush()
        network.run(for: .seconds(5)) { client.events.contains { if case .allocated = $0 { true } else { false } } }
        guard
            case .allocated(_, let allocation)? = client.events.first(where: { if case .allocated = $0 { true } else { false } })
        else {
            Issue.record("no allocation: \(client.events)")
            return
        }
        // The server saw the NAT's mapping, and says so.
        #expect(allocation.mapped == network.mapping(nat, of: clientHost, for: serverAddress))
        // The relay is reachable on the virtual network like any public address.
        network.attach(allocation.relayed)

        _ = try client.client.createPermission(for: [peer.addresses[0].ip], now: network.now)
        client.flush()
        network.run(for: .seconds(5)) { client.events.contains { if case .permissionsCreated = $0 { true } else { false } } }

        network.send([1, 2, 3], from: peer.addresses[0], to: allocation.relayed)
        network.run(for: .seconds(1)) { !client.received.isEmpty }
        #expect(client.received == [TURNClient.Datagram(peer: peer.addresses[0], payload: [1, 2, 3])])

        network.send(try client.client.wrap([4, 5], for: peer.addresses[0]), from: clientHost, to: serverAddress)
        network.run(for: .seconds(1)) { !peer.received.isEmpty }
        #expect(peer.received.map(\.bytes) == [[4, 5]])
        #expect(peer.received.first?.from == allocation.relayed)
        #expect(network.spins == 0)
        // The server reported the allocation, and its sweeps (at its own deadline)
        // delete it once its lifetime is over without a refresh.
        #expect(server.events.contains { if case .allocated = $0 { true } else { false } })
        client.client = try TURNClient(configuration: .init(username: "alice", password: "wonderland"))  // no more refreshes
        network.run(for: .seconds(Int64(allocation.lifetime.components.seconds) + 2))
        #expect(server.events.contains { if case .deleted(_, _, "expired", _, _) = $0 { true } else { false } })
        #expect(server.server.allocationCount == 0)
    }
}
