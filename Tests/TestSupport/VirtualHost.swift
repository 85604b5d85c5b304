import TusaBase

/// What ``VirtualNetwork`` runs: something at one or more addresses that takes
/// datagrams and has timers.
public protocol VirtualNode: AnyObject {
    /// Where it receives (attached with ``VirtualNetwork/attach(_:behind:)``).
    var addresses: [TransportAddress] { get }
    var nextDeadline: Timestamp? { get }
    func handleTimeout(now: Timestamp)
    func receive(_ datagram: VirtualNetwork.Datagram, now: Timestamp)
}

/// Any ``SansIOCore`` on a ``VirtualNetwork``, the way a driver hosts it: a
/// datagram becomes an input (`input`), an action that is a datagram goes on the
/// wire (`output`), and every other action is kept in ``reported`` for the test.
public final class VirtualHost<Core: SansIOCore>: VirtualNode {
    /// A datagram to put on the wire: its bytes, the sending address, the destination.
    public typealias Outgoing = (bytes: [UInt8], from: TransportAddress, to: TransportAddress)

    public private(set) var core: Core
    public let addresses: [TransportAddress]
    public let network: VirtualNetwork
    /// The actions that were not datagrams (events), in order.
    public var reported: [Core.Action] = []
    /// Datagrams this host sent.
    public private(set) var sent = 0
    private let input: (VirtualNetwork.Datagram) -> Core.Input?
    private let output: (Core.Action) -> Outgoing?

    /// - Parameters:
    ///   - input: the core's input for a datagram received (nil: ignore it).
    ///   - output: the datagram an action asks to send (nil: an event, kept in ``reported``).
    public init(
        _ core: Core, at addresses: [TransportAddress], on network: VirtualNetwork,
        input: @escaping (VirtualNetwork.Datagram) -> Core.Input?, output: @escaping (Core.Action) -> Outgoing?
    ) {
        self.core = core
        self.addresses = addresses
        self.network = network
        self.input = input
        self.output = output
    }

    public var nextDeadline: Timestamp? { core.nextDeadline }

    public func handleTimeout(now: Timestamp) {
        core.handleTimeout(now: now)
        flush()
    }

    public func receive(_ datagram: VirtualNetwork.Datagram, now: Timestamp) {
        guard let i = input(datagram) else { return }
        core.handle(i, now: now)
        flush()
    }

    /// Feeds one input now.
    public func handle(_ input: Core.Input) {
        core.handle(input, now: network.now)
        flush()
    }

    /// Any other call on the core, now; what it leaves to do is performed.
    @discardableResult
    public func with<Result>(_ body: (inout Core, Timestamp) throws -> Result) rethrows -> Result {
        defer { flush() }
        return try body(&core, network.now)
    }

    /// Performs every action waiting.
    public func flush() {
        while let action = core.pollAction() {
            if let d = output(action) {
                sent += 1
                network.send(d.bytes, from: d.from, to: d.to)
            } else {
                reported.append(action)
            }
        }
    }
}
