import NIOCore
import NIOPosix
import Rendezvous
import STUN
import Secure
import TusaBase

/// Errors of a rendezvous connection as a client sees them.
public enum RendezvousConnectionError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The TCP connection could not be made; the socket's error is the cause.
    case connectFailed(TransportAddress, ErrorCause)
    /// No registration answer within the timeout.
    case timedOut(TransportAddress)
    /// The server refused (offline or unknown peer, bad proof, replaced, ...).
    case refused(RendezvousErrorCode, String)
    /// The connection closed before an answer: by the server (no cause), or
    /// broken by the error that is the cause.
    case closed(ErrorCause?)
    /// The server answered a request with something that does not answer it.
    case unexpectedAnswer(String)
    /// An empty list of servers to try.
    case noServer

    public var description: String {
        switch self {
        case .connectFailed(let a, let why): "cannot reach the rendezvous at \(a): \(why)"
        case .timedOut(let a): "the rendezvous at \(a) did not answer in time"
        case .refused(let code, let detail): "the rendezvous refused (\(code.rawValue)): \(detail)"
        case .closed(nil): "the rendezvous connection was closed by the server"
        case .closed(let cause?): "the rendezvous connection broke: \(cause)"
        case .unexpectedAnswer(let what): "the rendezvous answered with \(what)"
        case .noServer: "no rendezvous server to try"
        }
    }
}

/// A registered connection to a rendezvous: the sans-IO ``RendezvousClient`` hosted
/// on the TCP connection's event loop by a ``CoreHost``. `incoming` yields what peers
/// sent (opened and authenticated); lookups and sends wait for the server's answer.
/// The core pings to keep the registration alive and times out what the server
/// does not answer.
public final class RendezvousConnection: Sendable {
    /// The server this connection is registered at.
    public let server: TransportAddress
    /// Every server it may register at (directory nodes serving as one), `server` among them.
    public let servers: [TransportAddress]
    public let identity: PublicKey
    /// TURN credentials the rendezvous handed out at registration, if any.
    public let turn: TURNGrant?
    /// Where the relay hosts parties, when it does.
    public let party: PartyGrant?
    /// Payloads from peers, in arrival order; finishes when the connection closes.
    public let incoming: AsyncStream<(from: PublicKey, payload: [UInt8])>
    /// How long a lookup or send waits for the server's answer.
    public let requestTimeout: Duration

    private let channel: any Channel
    private let driver: NIOLoopBound<RendezvousDriver>

    private init(
        server: TransportAddress, servers: [TransportAddress], identity: PublicKey, turn: TURNGrant?, party: PartyGrant?,
        channel: any Channel, driver: NIOLoopBound<RendezvousDriver>,
        incoming: AsyncStream<(from: PublicKey, payload: [UInt8])>, requestTimeout: Duration
    ) {
        self.server = server
        self.servers = servers
        self.identity = identity
        self.turn = turn
        self.party = party
        self.channel = channel
        self.driver = driver
        self.incoming = incoming
        self.requestTimeout = requestTimeout
    }

    /// Connects (from `local`, when given: one of this machine's addresses, port 0
    /// for any), registers `identity` and returns once the server confirmed it.
    public static func connect(
        to server: TransportAddress, identity: PrivateKey, timeout: Duration = .seconds(10), from local: TransportAddress? = nil,
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton
    ) async throws -> RendezvousConnection {
        try await connect(to: server, among: [server], identity: identity, timeout: timeout, from: local, group: group)
    }

    /// Registers at the first of `servers` (directory nodes serving as one) that
    /// takes `identity`, trying them in order, each for its share of `timeout`
    /// (at least a second); the last one's error when none does.
    public static func connect(
        toAnyOf servers: [TransportAddress], identity: PrivateKey, timeout: Duration = .seconds(10),
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton
    ) async throws -> RendezvousConnection {
        try await connect(trying: servers, among: servers, identity: identity, timeout: timeout, group: group)
    }

    /// Registers at one of its servers again, the one after ``server`` first and
    /// ``server`` last (the connection broke, or its server died).
    public func connectAgain(
        identity: PrivateKey, timeout: Duration = .seconds(10),
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton
    ) async throws -> RendezvousConnection {
        let next = servers.firstIndex(of: server).map { $0 + 1 } ?? 0
        let order = Array(servers[next...] + servers[..<next])
        return try await Self.connect(trying: order, among: servers, identity: identity, timeout: timeout, group: group)
    }

    private static func connect(
        trying order: [TransportAddress], among servers: [TransportAddress], identity: PrivateKey, timeout: Duration,
        group: any EventLoopGroup
    ) async throws -> RendezvousConnection {
        var failure: any Error = RendezvousConnectionError.noServer
        let share = order.count == 1 ? timeout : max(.seconds(1), timeout / order.count)
        for server in order {
            do {
                return try await connect(
                    to: server, among: servers, identity: identity, timeout: share, from: nil, group: group)
            } catch {
                failure = error
            }
        }
        throw failure
    }

    private static func connect(
        to server: TransportAddress, among servers: [TransportAddress], identity: PrivateKey, timeout: Duration,
        from local: TransportAddress?, group: any EventLoopGroup
    ) async throws -> RendezvousConnection {
        let (stream, yield) = AsyncStream<(from: PublicKey, payload: [UInt8])>.makeStream()
        var timing = RendezvousClient.Timing()
        timing.registration = timeout
        let loop = group.next()
        let registered = loop.makePromise(of: Registration.self)
        let channel: any Channel
        do {
            var bootstrap = ClientBootstrap(group: loop)
            if let local { bootstrap = bootstrap.bind(to: SocketAddress(local)) }
            channel =
                try await bootstrap
                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                .connectTimeout(.nanoseconds(timeout.nanoseconds))
                .channelInitializer { [timing] channel in
                    channel.eventLoop.makeCompletedFuture {
                        let driver = RendezvousDriver(
                            core: RendezvousClient(identity: identity, timing: timing), server: server, channel: channel,
                            registered: registered, yield: yield)
                        try channel.pipeline.syncOperations.addHandler(RendezvousClientHandler(driver: driver))
                    }
                }
                .connect(to: SocketAddress(server)).get()
        } catch {
            registered.fail(RendezvousConnectionError.connectFailed(server, ErrorCause(error)))
            throw RendezvousConnectionError.connectFailed(server, ErrorCause(error))
        }
        let grants: Registration
        do {
            grants = try await registered.futureResult.get()
        } catch {
            try? await channel.close()
            throw error
        }
        let driver = try await channel.eventLoop.submit {
            NIOLoopBound(
                try channel.pipeline.syncOperations.handler(type: RendezvousClientHandler.self).driver,
                eventLoop: channel.eventLoop)
        }.get()
        return RendezvousConnection(
            server: server, servers: servers, identity: identity.publicKey, turn: grants.turn, party: grants.party,
            channel: channel, driver: driver, incoming: stream, requestTimeout: timing.request)
    }

    /// Whether `peer` is registered now.
    public func lookup(_ peer: PublicKey) async throws -> Bool {
        let event = try await request { core, now in core.lookup(peer, now: now) }
        guard case .lookup(_, _, let online) = event else { throw RendezvousConnectionError.unexpectedAnswer("\(event)") }
        return online
    }

    /// The relay that hosts party room `room` now: a relay's own rendezvous names
    /// its relay; a directory the relay the room was made on, or, when that one is
    /// gone or draining, the one it places the room on now (throws
    /// `.refused(.noRelay, …)` when no relay hosts parties). With `follow` (a member
    /// that still hears its relay), nothing is placed: where the room was moved, if
    /// it was, else where it was made.
    public func locate(room: String, follow: Bool = false) async throws -> PartyGrant {
        let event = try await request { core, now in core.locate(room: room, follow: follow, now: now) }
        guard case .located(_, let located, let party) = event, located == room else {
            throw RendezvousConnectionError.unexpectedAnswer("\(event)")
        }
        return party
    }

    /// Where a new party room goes: a directory places it by load (reserving what it
    /// is expected to use there); a relay's own rendezvous names its relay. Throws
    /// `.refused(.noRelay, …)` when no relay takes it. An older rendezvous knows no
    /// `place`: it refuses it as malformed and closes the connection (register again,
    /// ``connectAgain(identity:timeout:group:)``, and use ``party``).
    public func placeRoom() async throws -> PartyGrant {
        let event = try await request { core, now in core.place(now: now) }
        guard case .located(_, "", let party) = event else { throw RendezvousConnectionError.unexpectedAnswer("\(event)") }
        return party
    }

    /// Adds and removes contacts: the keys whose posts and sends this key takes freely
    /// (to the rendezvous, anyone else is a stranger to it). Both empty: only asks.
    /// Returns the contacts now; more than ``RendezvousMessage/maximumContactChange``
    /// keys go in several requests.
    public func contacts(add: [PublicKey] = [], remove: [PublicKey] = []) async throws -> [PublicKey] {
        let step = RendezvousMessage.maximumContactChange
        var changes = stride(from: 0, to: remove.count, by: step).map {
            ([PublicKey](), Array(remove[$0..<min($0 + step, remove.count)]))
        }
        changes += stride(from: 0, to: add.count, by: step).map { (Array(add[$0..<min($0 + step, add.count)]), [PublicKey]()) }
        if changes.isEmpty { changes = [([], [])] }
        var now: [PublicKey] = []
        for (add, remove) in changes {
            let event = try await request { core, time in core.changeContacts(add: add, remove: remove, now: time) }
            guard case .contacts(_, let keys) = event else { throw RendezvousConnectionError.unexpectedAnswer("\(event)") }
            now = keys
        }
        return now
    }

    /// Seals `payload` to `peer` and waits until the server passed it on (throws
    /// `.refused(.offline/.unknownPeer, …)` otherwise).
    public func send(_ payload: [UInt8], to peer: PublicKey) async throws {
        let event = try await request { core, now in try core.send(payload, to: peer, now: now) }
        guard case .sent = event else { throw RendezvousConnectionError.unexpectedAnswer("\(event)") }
    }

    /// Seals `payload` to `peer` for the server to keep a day and deliver whenever
    /// `peer` is registered, now too if it is (an invitation); returns once kept.
    public func post(_ payload: [UInt8], to peer: PublicKey) async throws {
        let event = try await request { core, now in try core.post(payload, to: peer, now: now) }
        guard case .sent = event else { throw RendezvousConnectionError.unexpectedAnswer("\(event)") }
    }

    /// A relay's load report to its directory, proven with the directory's relay
    /// secret (no answer; a refusal closes the connection).
    public func report(_ load: RelayLoad, secret: String) async throws {
        let driver = self.driver
        try await channel.eventLoop.submit { try driver.value.report { $0.report(load, secret: secret) } }.get()
    }

    /// A relay's rooms to the directory (no answer): ``RelayRooms/reports(open:closed:complete:)`` cuts a long list.
    public func report(_ rooms: RelayRooms, secret: String) async throws {
        let driver = self.driver
        try await channel.eventLoop.submit { try driver.value.report { $0.report(rooms, secret: secret) } }.get()
    }

    /// The parties this key may see: its own, those it is invited to, its friends'
    /// open ones, each with where it is now; true when there were more than one answer holds.
    public func parties() async throws -> ([PartyEntry], more: Bool) {
        let event = try await request { core, now in core.parties(now: now) }
        guard case .parties(_, let entries, let more) = event else {
            throw RendezvousConnectionError.unexpectedAnswer("\(event)")
        }
        return (entries, more)
    }

    /// Whether the server closed the connection (or it broke).
    public var isClosed: Bool { !channel.isActive }

    /// What the server said of the whole connection as it closed it (a relay's load
    /// report under the wrong secret, a registration replaced, …): nil while it said
    /// nothing. The refusal comes before the close, so it is known once ``isClosed``.
    public func refusal() async -> RendezvousConnectionError? {
        let driver = self.driver
        return try? await channel.eventLoop.submit { driver.value.refusal }.get()
    }

    public func close() async {
        try? await channel.close()
    }

    private func request(
        _ make: @escaping @Sendable (inout RendezvousClient, Timestamp) throws -> UInt32
    ) async throws -> RendezvousClient.Event {
        let driver = self.driver
        return try await channel.eventLoop.flatSubmit { driver.value.request(make) }.get()
    }
}

/// The client core, its host and the callers waiting for answers, on the channel's loop.
final class RendezvousDriver {
    private var host: CoreHost<RendezvousClient>!
    private let server: TransportAddress
    private let channel: any Channel
    private var registered: EventLoopPromise<Registration>?
    private var pending: [UInt32: EventLoopPromise<RendezvousClient.Event>] = [:]
    private let yield: AsyncStream<(from: PublicKey, payload: [UInt8])>.Continuation
    private var ended: RendezvousConnectionError?
    /// What the server said of the whole connection after the registration.
    private var closedBecause: RendezvousConnectionError?
    var refusal: RendezvousConnectionError? { closedBecause }

    init(
        core: RendezvousClient, server: TransportAddress, channel: any Channel, registered: EventLoopPromise<Registration>,
        yield: AsyncStream<(from: PublicKey, payload: [UInt8])>.Continuation
    ) {
        self.server = server
        self.channel = channel
        self.registered = registered
        self.yield = yield
        host = CoreHost(core, on: channel.eventLoop) { [unowned self] action in
            perform(action)
        } afterActions: {
            channel.flush()
        }
    }

    func connected() { host.handle(.connected) }

    func received(_ bytes: [UInt8]) { host.handle(.received(bytes)) }

    func report(_ make: (inout RendezvousClient) -> Void) throws {
        if let ended { throw ended }
        host.with { core, _ in make(&core) }
    }

    func request(_ make: (inout RendezvousClient, Timestamp) throws -> UInt32) -> EventLoopFuture<RendezvousClient.Event> {
        if let ended { return channel.eventLoop.makeFailedFuture(ended) }
        let promise = channel.eventLoop.makePromise(of: RendezvousClient.Event.self)
        do {
            let id = try host.with(make)
            // Writing the request may have found the connection gone (a write that fails
            // at once fails the connection before `with` returns); else the promise is in
            // place before the answer can come, which needs the network.
            if let ended {
                promise.fail(ended)
            } else {
                pending[id] = promise
            }
        } catch {
            promise.fail(error)
        }
        return promise.futureResult
    }

    private func perform(_ action: RendezvousClient.Action) {
        switch action {
        case .write(let bytes):
            let driver = NIOLoopBound(self, eventLoop: channel.eventLoop)
            channel.write(channel.allocator.buffer(bytes: bytes)).whenFailure { error in
                driver.value.fail(ErrorCause(error))
            }
        case .event(let event):
            handle(event)
        case .failed(let error):
            fail(ErrorCause(error))
            channel.close(promise: nil)
        }
    }

    private func handle(_ event: RendezvousClient.Event) {
        switch event {
        case .registered(let turn, let party):
            registered?.succeed(Registration(turn: turn, party: party))
            registered = nil
        case .lookup(let id, _, _), .sent(let id), .located(let id, _, _), .contacts(let id, _), .parties(let id, _, _):
            pending.removeValue(forKey: id)?.succeed(event)
        case .refused(let code, let detail, let id):
            let error = RendezvousConnectionError.refused(code, detail)
            if let id {
                pending.removeValue(forKey: id)?.fail(error)
            } else if let waiting = registered {
                waiting.fail(error)
                registered = nil
            } else {
                // Said of the connection, which the server closes next: why it did.
                closedBecause = error
            }
        case .timedOut(let id):
            if let id {
                pending.removeValue(forKey: id)?.fail(RendezvousConnectionError.timedOut(server))
            } else {
                registered?.fail(RendezvousConnectionError.timedOut(server))
                registered = nil
            }
        case .received(let from, let payload):
            yield.yield((from, payload))
        case .unopenable, .pong:
            break
        }
    }

    /// The connection is gone: everyone waiting learns why (the server's refusal,
    /// when it said one before it closed: a request an older server does not know).
    func fail(_ reason: ErrorCause?) {
        guard ended == nil else { return }
        let error = reason == nil ? closedBecause ?? .closed(nil) : RendezvousConnectionError.closed(reason)
        ended = error
        host.stop()
        let waiting = pending
        pending = [:]
        for (_, promise) in waiting { promise.fail(error) }
        registered?.fail(error)
        registered = nil
        yield.finish()
    }
}

/// The TCP connection's events, handed to the driver.
final class RendezvousClientHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    let driver: RendezvousDriver

    init(driver: RendezvousDriver) { self.driver = driver }

    func channelActive(context: ChannelHandlerContext) {
        driver.connected()
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        guard let bytes = buffer.readBytes(length: buffer.readableBytes) else { return }
        driver.received(bytes)
    }

    func channelInactive(context: ChannelHandlerContext) {
        driver.fail(nil)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        driver.fail(ErrorCause(error))
        context.close(promise: nil)
    }
}

/// What the server granted at registration.
struct Registration: Sendable {
    var turn: TURNGrant?
    var party: PartyGrant?
}
