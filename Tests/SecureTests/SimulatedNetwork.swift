import TestSupport
import Testing
import TusaBase

@testable import Secure

/// Two or more `SecureEndpoint`s on TestSupport's `VirtualNetwork` (its clock,
/// delay, loss, duplication and jitter from a seeded generator, tamper hook and
/// wire log). Tests drive it step by step.
final class SimulatedNetwork {
    typealias Datagram = VirtualNetwork.Datagram
    typealias Impairment = VirtualNetwork.Impairment

    final class Node {
        let endpoint: SecureEndpoint
        var address: TransportAddress
        var media: [(PeerID, RTPHeader, [UInt8])] = []
        var events: [SecureEvent] = []
        var drops: [SecureReceive] = []
        var sent: [[UInt8]] = []
        /// How often its timers woke it (`handleTimeout`).
        var wakes = 0
        init(endpoint: SecureEndpoint, address: TransportAddress) {
            self.endpoint = endpoint
            self.address = address
        }
    }

    let network = VirtualNetwork(clock: VirtualClock(.seconds(1000)))
    var now: Timestamp { network.now }
    var nodes: [Node] = []
    var impairment: Impairment {
        get { network.impairment }
        set { network.impairment = newValue }
    }
    /// Datagrams on their way (a test may hold them back).
    var inFlight: [Datagram] {
        get { network.inFlight }
        set { network.inFlight = newValue }
    }
    /// Every datagram put on the wire, for replay tests.
    var wire: [Datagram] { network.wire }
    /// A hook to drop or rewrite a datagram before delivery (nil drops it).
    var tamper: ((Datagram) -> Datagram?)? {
        get { network.tamper }
        set { network.tamper = newValue }
    }

    func addNode(
        _ identity: Identity = .generate(), port: UInt16, configuration: SecureConfiguration = .init(),
        random: any SecureRandom = SystemRandom()
    ) -> Node {
        let address = TransportAddress(ip: .v4(0x7F00_0001), port: port)
        let endpoint = SecureEndpoint(identity: identity, configuration: configuration, random: random, now: now)
        let node = Node(endpoint: endpoint, address: address)
        nodes.append(node)
        network.attach(address)
        return node
    }

    func send(_ bytes: [UInt8], from: TransportAddress, to: TransportAddress) {
        // Every address is public here (a node may move to a new one): the
        // delivery finds the node, or nobody.
        network.attach(from)
        network.attach(to)
        network.send(bytes, from: from, to: to)
    }

    /// Moves every node's queued outputs onto the wire and records its events.
    func flush(_ node: Node) {
        while let out = node.endpoint.pollAction() {
            switch out {
            case .send(let bytes, let to):
                node.sent.append(bytes)
                send(bytes, from: node.address, to: to)
            case .event(let e):
                node.events.append(e)
            }
        }
    }

    /// Seals a media payload from `node` to `peer` and puts it on the wire.
    @discardableResult
    func sendMedia(_ node: Node, to peer: PeerID, payload: [UInt8], timestamp: UInt32 = 0) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: payload.count + 64)
        let (n, to) = try payload.withUnsafeBytes { p in
            try out.withUnsafeMutableBytes { o in
                try node.endpoint.sealMedia(to: peer, payloadType: 111, timestamp: timestamp, payload: p, into: o, now: now)
            }
        }
        let packet = Array(out[..<n])
        send(packet, from: node.address, to: to)
        flush(node)
        return packet
    }

    /// Delivers one datagram to whichever node has its destination address.
    func deliver(_ d: Datagram) {
        guard let node = nodes.first(where: { $0.address == d.to }) else { return }
        var bytes = d.bytes
        let r = node.endpoint.receive(&bytes, from: d.from, now: now)
        switch r {
        case .media(let peer, let header, let payload):
            node.media.append((peer, header, Array(bytes[payload])))
        case .handled: break
        case .dropped, .droppedHandshake: node.drops.append(r)
        }
        flush(node)
    }

    /// Advances the clock to `t`, delivering datagrams and running timers in order.
    func run(until t: Timestamp) {
        while true {
            for node in nodes {
                // After every packet and wake: the timer queue never says later than a walk of every peer.
                #expect(node.endpoint.timerQueueIsComplete, "a deadline missing from the timer queue at \(now)")
            }
            let nextPacket = network.nextDelivery
            let nextTimer = nodes.compactMap { $0.endpoint.nextDeadline }.min()
            let next = [nextPacket, nextTimer].compactMap { $0 }.min()
            guard let next, next <= t else { break }
            network.clock.advance(to: next)
            if let d = network.popDue() {
                deliver(d)
                continue
            }
            for node in nodes {
                if let d = node.endpoint.nextDeadline, d <= now {
                    node.wakes += 1
                    node.endpoint.handleTimeout(now: now)
                    flush(node)
                }
            }
        }
        network.clock.advance(to: t)
    }

    func run(for d: Duration) { run(until: now + d) }
}

extension SimulatedNetwork {
    /// A (initiator) and B (responder) that know each other's keys, handshaken.
    static func pair(
        configuration: SecureConfiguration = .init(), impairment: Impairment = .init(), connect: Bool = true
    ) -> (SimulatedNetwork, Node, Node, PeerID, PeerID) {
        let net = SimulatedNetwork()
        net.impairment = impairment
        let a = net.addNode(port: 1000, configuration: configuration)
        let b = net.addNode(port: 2000, configuration: configuration)
        let bAtA = a.endpoint.addPeer(b.endpoint.identity.publicKey, address: b.address)
        let aAtB = b.endpoint.addPeer(a.endpoint.identity.publicKey)
        if connect {
            a.endpoint.handle(.connect(bAtA), now: net.now)
            net.flush(a)
            net.run(for: .seconds(1))
        }
        return (net, a, b, bAtA, aAtB)
    }
}
extension SecureEndpoint {
    /// Every action waiting, in order (`drainActions()` for a reference the test holds in a `let`).
    func takeActions() -> [SecureOutput] {
        var actions: [SecureOutput] = []
        while let a = pollAction() { actions.append(a) }
        return actions
    }
}
