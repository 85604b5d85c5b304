@testable import Secure
import Testing
import TusaBase

/// Two or more `SecureEndpoint`s joined by a simulated network on a virtual
/// clock: datagrams are delivered after a delay, and may be lost, duplicated or
/// reordered by a seeded generator. Tests drive it step by step.
final class SimulatedNetwork {
    struct Datagram {
        var bytes: [UInt8]
        var from: TransportAddress
        var to: TransportAddress
        var at: Timestamp
    }

    struct Impairment {
        var loss = 0.0
        var duplicate = 0.0
        /// Extra random delay up to this, so packets overtake each other.
        var jitter: Duration = .zero
        var delay: Duration = .milliseconds(10)
    }

    final class Node {
        let endpoint: SecureEndpoint
        var address: TransportAddress
        var media: [(PeerID, RTPHeader, [UInt8])] = []
        var events: [SecureEvent] = []
        var drops: [SecureReceive] = []
        var sent: [[UInt8]] = []
        init(endpoint: SecureEndpoint, address: TransportAddress) {
            self.endpoint = endpoint
            self.address = address
        }
    }

    var now = Timestamp.seconds(1000)
    var nodes: [Node] = []
    var inFlight: [Datagram] = []
    var impairment = Impairment()
    var rng = SplitMix64(seed: 42)
    /// Every datagram put on the wire, for replay tests.
    var wire: [Datagram] = []
    /// A hook to drop or rewrite a datagram before delivery (nil drops it).
    var tamper: ((Datagram) -> Datagram?)?

    func addNode(_ identity: Identity = .generate(), port: UInt16, configuration: SecureConfiguration = .init()) -> Node {
        let address = TransportAddress(ip: .v4(0x7F00_0001), port: port)
        let node = Node(endpoint: SecureEndpoint(identity: identity, configuration: configuration, now: now), address: address)
        nodes.append(node)
        return node
    }

    func send(_ bytes: [UInt8], from: TransportAddress, to: TransportAddress) {
        let d = Datagram(bytes: bytes, from: from, to: to, at: now)
        wire.append(d)
        if rng.chance(impairment.loss) { return }
        let copies = rng.chance(impairment.duplicate) ? 2 : 1
        for _ in 0..<copies {
            var delay = impairment.delay
            if impairment.jitter > .zero {
                delay += .nanoseconds(Int64(rng.next() % UInt64(impairment.jitter.nanoseconds)))
            }
            inFlight.append(Datagram(bytes: bytes, from: from, to: to, at: now + delay))
        }
    }

    /// Moves every node's queued outputs onto the wire and records its events.
    func flush(_ node: Node) {
        for out in node.endpoint.outputs() {
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
            let nextPacket = inFlight.map(\.at).min()
            let nextTimer = nodes.compactMap { $0.endpoint.nextDeadline }.min()
            let next = [nextPacket, nextTimer].compactMap { $0 }.min()
            guard let next, next <= t else { break }
            now = max(now, next)
            if let i = inFlight.firstIndex(where: { $0.at <= now }) {
                let d = inFlight.remove(at: i)
                if let tamper {
                    if let changed = tamper(d) { deliver(changed) }
                } else {
                    deliver(d)
                }
                continue
            }
            for node in nodes {
                if let d = node.endpoint.nextDeadline, d <= now {
                    node.endpoint.poll(now: now)
                    flush(node)
                }
            }
        }
        now = max(now, t)
    }

    func run(for d: Duration) { run(until: now + d) }
}

extension SplitMix64 {
    /// True with probability `p` (SplitMix64 from TusaBase, so impaired runs repeat exactly).
    mutating func chance(_ p: Double) -> Bool {
        p > 0 && Double(next() % 1_000_000) / 1_000_000 < p
    }
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
            a.endpoint.connect(bAtA, now: net.now)
            net.flush(a)
            net.run(for: .seconds(1))
        }
        return (net, a, b, bAtA, aAtB)
    }
}
