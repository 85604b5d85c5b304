import TusaBase

/// One simulated UDP network on a ``VirtualClock``: hosts at addresses, some
/// behind ``NAT`` boxes (RFC 4787 mapping and filtering), datagrams delivered in
/// time order after a delay and subject to loss, duplication and jitter from a
/// seeded generator (so a run repeats exactly).
///
/// Nodes (``VirtualNode``, e.g. a ``VirtualHost`` running any `SansIOCore`) are
/// attached at their addresses; ``run(until:stopWhen:)`` then delivers datagrams
/// and runs the nodes' timers in order. Tests may also drive it by hand
/// (``send(_:from:to:)``, ``popDue()``).
public final class VirtualNetwork {
    /// A datagram on the wire: `from` as the receiver sees it (after NAT),
    /// `to` as addressed (before NAT) until it is delivered.
    public struct Datagram: Hashable, Sendable {
        public var bytes: [UInt8]
        public var from: TransportAddress
        public var to: TransportAddress
        public var at: Timestamp

        public init(bytes: [UInt8], from: TransportAddress, to: TransportAddress, at: Timestamp) {
            self.bytes = bytes
            self.from = from
            self.to = to
            self.at = at
        }
    }

    /// What happens to every datagram on its way.
    public struct Impairment: Hashable, Sendable {
        /// Probability of loss (1: nothing gets through).
        public var loss = 0.0
        public var duplicate = 0.0
        /// One-way delay.
        public var delay: Duration = .milliseconds(10)
        /// Extra random delay up to this, so datagrams overtake each other.
        public var jitter: Duration = .zero

        public init(loss: Double = 0, duplicate: Double = 0, delay: Duration = .milliseconds(10), jitter: Duration = .zero) {
            self.loss = loss
            self.duplicate = duplicate
            self.delay = delay
            self.jitter = jitter
        }
    }

    /// A NAT attached to this network.
    public struct NATID: Hashable, Sendable { let index: Int }

    public let clock: VirtualClock
    public var now: Timestamp { clock.now }
    public var impairment: Impairment
    /// A hook to drop (nil) or rewrite a datagram before delivery.
    public var tamper: ((Datagram) -> Datagram?)?
    /// Every datagram put on the wire (sources after NAT), for replay and counting.
    public private(set) var wire: [Datagram] = []
    /// Datagrams that reached no one: lost, filtered by a NAT, or to an unknown address.
    public private(set) var dropped = 0
    /// Times a node asked for its timeout again at a time that had already passed
    /// right after it ran (a driver would spin).
    public private(set) var spins = 0

    private var rng: SplitMix64
    private var queue: [(datagram: Datagram, sequence: Int)] = []
    private var sequence = 0
    private var nats: [NATBox] = []
    /// Where each attached address sits (nil: on the public network).
    private var behind: [TransportAddress: NATID?] = [:]
    private var nodes: [any VirtualNode] = []

    public init(clock: VirtualClock = VirtualClock(), impairment: Impairment = .init(), seed: UInt64 = 42) {
        self.clock = clock
        self.impairment = impairment
        self.rng = SplitMix64(seed: seed)
    }

    // MARK: topology

    /// Adds a NAT box; attach hosts behind it with ``attach(_:behind:)``.
    public func addNAT(_ nat: NAT) -> NATID {
        nats.append(NATBox(nat))
        return NATID(index: nats.count - 1)
    }

    /// Makes `address` reachable: on the public network, or inside `nat`.
    public func attach(_ address: TransportAddress, behind nat: NATID? = nil) {
        behind[address] = .some(nat)
    }

    /// Attaches `node` at all its addresses, and runs it in ``run(until:stopWhen:)``.
    public func attach(_ node: any VirtualNode, behind nat: NATID? = nil) {
        for a in node.addresses { attach(a, behind: nat) }
        nodes.append(node)
    }

    /// Stops running `node` (its addresses stay attached, for the next node there).
    public func detach(_ node: any VirtualNode) {
        nodes.removeAll { $0 === node }
    }

    /// The external address `nat` has mapped `inside` to for `remote`, if any.
    public func mapping(_ nat: NATID, of inside: TransportAddress, for remote: TransportAddress) -> TransportAddress? {
        let box = nats[nat.index]
        let key: TransportAddress? =
            switch box.nat.mapping {
            case .endpointIndependent: nil
            case .addressDependent: TransportAddress(ip: remote.ip, port: 0)
            case .addressAndPortDependent: remote
            }
        return box.mappings.first { $0.inside == inside && $0.key == key }?.external
    }

    // MARK: the wire

    /// Puts a datagram from the host at `from` on the wire towards `to`. Its
    /// source goes through the sender's NAT unless `to` is inside the same NAT.
    public func send(_ bytes: [UInt8], from: TransportAddress, to: TransportAddress) {
        var source = from
        if case .some(.some(let nat)) = behind[from], behind[to] != .some(.some(nat)) {
            source = nats[nat.index].outbound(from: from, to: to)
        }
        let d = Datagram(bytes: bytes, from: source, to: to, at: now)
        wire.append(d)
        if chance(impairment.loss) {
            dropped += 1
            return
        }
        let copies = chance(impairment.duplicate) ? 2 : 1
        for _ in 0..<copies {
            var delay = impairment.delay
            if impairment.jitter > .zero {
                delay += .nanoseconds(Int64(rng.next() % UInt64(impairment.jitter.nanoseconds)))
            }
            var copy = d
            copy.at = now + delay
            // In time order; equal times in the order sent.
            let i = queue.firstIndex { $0.datagram.at > copy.at } ?? queue.endIndex
            queue.insert((copy, sequence), at: i)
            sequence += 1
        }
    }

    /// Datagrams on their way, in delivery order (a test may hold some back).
    public var inFlight: [Datagram] {
        get { queue.map(\.datagram) }
        set {
            queue = newValue.sorted { $0.at < $1.at }.enumerated().map { ($1, sequence + $0) }
            sequence += newValue.count
        }
    }

    /// When the next datagram arrives, if any is on its way.
    public var nextDelivery: Timestamp? { queue.first?.datagram.at }

    /// The next datagram due at ``now``, with `to` translated by the receiver's
    /// NAT; datagrams that are filtered or go nowhere are dropped on the way.
    public func popDue() -> Datagram? {
        while let first = queue.first, first.datagram.at <= now {
            queue.removeFirst()
            var d = first.datagram
            if let tamper {
                guard let changed = tamper(d) else {
                    dropped += 1
                    continue
                }
                d = changed
            }
            if let destination = route(d) {
                d.to = destination
                return d
            }
            dropped += 1
        }
        return nil
    }

    /// Where a datagram ends up: an attached public address, a private one from
    /// inside its own NAT, or through a NAT's mapping if its filter lets it in.
    private func route(_ d: Datagram) -> TransportAddress? {
        switch behind[d.to] {
        case .some(.none):
            return d.to
        case .some(.some(let nat)):
            // A private address: only from inside the same NAT (the source was not translated).
            return behind[d.from] == .some(.some(nat)) ? d.to : nil
        case .none:
            guard let n = nats.firstIndex(where: { $0.nat.publicIP == d.to.ip }) else { return nil }
            return nats[n].inbound(from: d.from, to: d.to)
        }
    }

    private func chance(_ p: Double) -> Bool {
        p > 0 && Double(rng.next() % 1_000_000) / 1_000_000 < p
    }

    // MARK: running nodes

    /// Delivers datagrams and runs the attached nodes' timers in time order
    /// until `stopWhen` holds (checked after every step) or `deadline`; the
    /// clock ends at `deadline` unless stopped earlier. Returns whether `stopWhen` held.
    @discardableResult
    public func run(until deadline: Timestamp, stopWhen: () -> Bool = { false }) -> Bool {
        // Nodes that spun at this time wait for the clock to move.
        var spunAt: [ObjectIdentifier: Timestamp] = [:]
        while !stopWhen() {
            var next = nextDelivery
            for node in nodes {
                guard var d = node.nextDeadline else { continue }
                if let s = spunAt[ObjectIdentifier(node)], d <= s { d = s + .milliseconds(1) }
                if next == nil || d < next! { next = d }
            }
            guard let next, next <= deadline else {
                clock.advance(to: deadline)
                return stopWhen()
            }
            clock.advance(to: next)
            while let d = popDue() {
                guard let node = nodes.first(where: { $0.addresses.contains(d.to) }) else {
                    dropped += 1
                    continue
                }
                node.receive(d, now: now)
            }
            for node in nodes {
                guard let d = node.nextDeadline, d <= now else { continue }
                if let s = spunAt[ObjectIdentifier(node)], s == now { continue }
                node.handleTimeout(now: now)
                if let after = node.nextDeadline, after <= now {
                    spins += 1
                    spunAt[ObjectIdentifier(node)] = now
                }
            }
        }
        return true
    }

    /// ``run(until:stopWhen:)`` for `duration` from now.
    @discardableResult
    public func run(for duration: Duration, stopWhen: () -> Bool = { false }) -> Bool {
        run(until: now + duration, stopWhen: stopWhen)
    }
}
