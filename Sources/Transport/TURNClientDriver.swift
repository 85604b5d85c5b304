import Logging
import NIOCore
import NIOPosix
import STUN
import TURN
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A TURN client connection (RFC 8656) to one server over UDP or TCP: hosts
/// the sans-IO ``TURNClient`` on the socket's event loop, with the loop's
/// clock and timers, and offers it as async calls.
///
/// ```swift
/// let turn = try await TURNClientConnection.connect(to: server, over: .udp, configuration: config)
/// let allocation = try await turn.allocate()
/// try await turn.bindChannel(to: peer)
/// try await turn.send(bytes, to: peer)
/// for await datagram in turn.received { … }
/// try await turn.close()   // Refresh with LIFETIME 0, bounded wait
/// ```
///
/// The allocation, its permissions and channels are refreshed in the
/// background for as long as the connection is open. ``received`` ends when
/// the connection closes or the allocation is lost.
public final class TURNClientConnection: Sendable {
    /// How the client reaches the server (the relay toward peers is always UDP).
    public enum TransportProtocol: String, Hashable, Sendable {
        case udp
        case tcp
    }

    private let channel: Channel
    private let engine: NIOLoopBound<TURNClientEngine>
    /// False when the socket belongs to another handler (``attached(to:server:configuration:deliver:logger:)``):
    /// `close()` then releases the allocation and leaves the socket open.
    private let ownsChannel: Bool
    /// The server's address.
    public let server: TransportAddress
    public let transport: TransportProtocol
    /// This end's socket address.
    public let localAddress: TransportAddress?
    /// Application data from peers, in arrival order (the newest 4,096 are
    /// kept if the reader falls behind).
    public let received: AsyncStream<TURNClient.Datagram>

    private init(
        channel: Channel, engine: NIOLoopBound<TURNClientEngine>, server: TransportAddress, transport: TransportProtocol,
        received: AsyncStream<TURNClient.Datagram>, ownsChannel: Bool = true
    ) {
        self.channel = channel
        self.engine = engine
        self.ownsChannel = ownsChannel
        self.server = server
        self.transport = transport
        self.localAddress = channel.localAddress.flatMap { TransportAddress($0) }
        self.received = received
    }

    /// Opens a UDP socket connected to the server (so ICMP errors surface), or
    /// a TCP connection to it. The configuration's reliability is made to match
    /// the transport (retransmissions on UDP, none on TCP).
    ///
    /// - Throws: ``TURNClientError/invalidArgument(_:)`` for bad credentials,
    ///   ``TURNClientError/transport(_:)`` when the socket cannot be opened or
    ///   the TCP connection is refused or not made within `connectTimeout`.
    public static func connect(
        to server: TransportAddress, over transport: TransportProtocol = .udp,
        configuration: TURNClient.Configuration, connectTimeout: Duration = .seconds(5),
        group: EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger = Logger(label: "tusa.turn-client")
    ) async throws(TURNClientError) -> TURNClientConnection {
        var configuration = configuration
        switch (transport, configuration.reliability) {
        case (.udp, .reliable): configuration.reliability = .unreliable()
        case (.tcp, .unreliable): configuration.reliability = .reliable()
        default: break
        }
        let core = try TURNClient(configuration: configuration)
        let (stream, continuation) = AsyncStream.makeStream(
            of: TURNClient.Datagram.self, bufferingPolicy: .bufferingNewest(4096))
        let isStream = transport == .tcp
        let initialize: @Sendable (Channel) -> EventLoopFuture<Void> = { channel in
            channel.eventLoop.makeCompletedFuture {
                let engine = TURNClientEngine(
                    core: core, server: server, stream: isStream, eventLoop: channel.eventLoop,
                    continuation: continuation, logger: logger)
                if isStream {
                    try channel.pipeline.syncOperations.addHandler(TURNStreamHandler(engine: engine))
                } else {
                    try channel.pipeline.syncOperations.addHandler(TURNDatagramHandler(engine: engine))
                }
            }
        }
        let channel: Channel
        do {
            switch transport {
            case .udp:
                let local = TransportAddress(ip: server.ip.isIPv4 ? .v4(0) : .v6(high: 0, low: 0), port: 0)
                channel = try await DatagramBootstrap(group: group)
                    .channelInitializer(initialize)
                    .bind(to: SocketAddress(local))
                    .flatMap { ch in ch.connect(to: SocketAddress(server)).map { ch } }
                    .get()
            case .tcp:
                channel = try await ClientBootstrap(group: group)
                    .channelOption(.socketOption(.tcp_nodelay), value: 1)
                    .connectTimeout(.nanoseconds(connectTimeout.nanoseconds))
                    .channelInitializer(initialize)
                    .connect(to: SocketAddress(server))
                    .get()
            }
        } catch {
            continuation.finish()
            throw .transport("cannot connect over \(transport.rawValue)", ErrorCause(error))
        }
        do {
            let engine = try await channel.eventLoop.submit {
                let sync = channel.pipeline.syncOperations
                let engine: TURNClientEngine
                if isStream {
                    engine = try sync.handler(type: TURNStreamHandler.self).engine
                } else {
                    engine = try sync.handler(type: TURNDatagramHandler.self).engine
                }
                engine.attach(channel)
                return NIOLoopBound(engine, eventLoop: channel.eventLoop)
            }.get()
            return TURNClientConnection(channel: channel, engine: engine, server: server, transport: transport, received: stream)
        } catch {
            try? await channel.close()
            continuation.finish()
            throw .transport("cannot set up the connection to \(server)", ErrorCause(error))
        }
    }

    /// Asks for an allocation (answering the server's 401 challenge) and
    /// returns the relayed and mapped addresses.
    ///
    /// - Parameter timeout: give up after this long (nil: when the
    ///   retransmissions run out, 39.5 s).
    public func allocate(timeout: Duration? = nil) async throws(TURNClientError) -> TURNClientAllocation {
        try await operation(TURNClientAllocation.self) { engine, promise in
            engine.start(method: .allocate, waiter: .allocate(promise), timeout: timeout) { core, now throws(TURNClientError) in
                try core.allocate(now: now)
            }
        }
    }

    /// Refreshes the allocation now and returns it as the server confirmed it:
    /// whether the server still holds it after a pause, a network change or a
    /// restart. A 437 answer (nothing allocated for this socket there) also
    /// loses the allocation.
    public func refresh(timeout: Duration? = nil) async throws(TURNClientError) -> TURNClientAllocation {
        try await operation(TURNClientAllocation.self) { engine, promise in
            engine.start(method: .refresh, waiter: .allocate(promise), timeout: timeout) { core, now throws(TURNClientError) in
                try core.refresh(now: now)
            }
        }
    }

    /// Installs permissions for peers' IP addresses; they are then refreshed every 240 s.
    public func createPermission(for peers: [IPAddress], timeout: Duration? = nil) async throws(TURNClientError) {
        try await operation(Void.self) { engine, promise in
            engine.start(method: .createPermission, waiter: .done(promise), timeout: timeout) {
                core, now throws(TURNClientError) in
                try core.createPermission(for: peers, now: now)
            }
        }
    }

    /// Installs a permission for one peer's IP address.
    public func createPermission(for peer: TransportAddress, timeout: Duration? = nil) async throws(TURNClientError) {
        try await createPermission(for: [peer.ip], timeout: timeout)
    }

    /// Binds a channel to a peer (and with it a permission); data to the peer
    /// then goes as ChannelData. Refreshed every 480 s.
    @discardableResult
    public func bindChannel(to peer: TransportAddress, timeout: Duration? = nil) async throws(TURNClientError) -> ChannelNumber {
        try await operation(ChannelNumber.self) { engine, promise in
            engine.start(method: .channelBind, waiter: .channel(promise), timeout: timeout) { core, now throws(TURNClientError) in
                try core.bindChannel(to: peer, now: now)
            }
        }
    }

    /// Sends application data to a peer through the relay: ChannelData when a
    /// channel is bound, a Send indication otherwise. Returns once the data is
    /// handed to the socket.
    ///
    /// - Throws: ``TURNClientError/notAllocated``, ``TURNClientError/noPermission(_:)``,
    ///   ``TURNClientError/closed``.
    public func send(_ payload: [UInt8], to peer: TransportAddress) async throws(TURNClientError) {
        try await operation(Void.self) { engine, promise in
            do {
                try engine.send(payload, to: peer)
                promise.succeed()
            } catch {
                promise.fail(error)
            }
        }
    }

    /// Sends at once when called on the connection's event loop (a secure endpoint
    /// sharing the loop), else by a hop to it. Errors of a hop are dropped, as UDP would.
    func sendFromLoop(_ payload: [UInt8], to peer: TransportAddress) throws(TURNClientError) {
        if channel.eventLoop.inEventLoop {
            try engine.value.send(payload, to: peer)
        } else {
            let engine = self.engine
            channel.eventLoop.execute { try? engine.value.send(payload, to: peer) }
        }
    }

    /// Releases the allocation (Refresh with LIFETIME 0), waiting at most
    /// `timeout` for the server's answer, then closes the socket. ``received`` ends.
    ///
    /// - Throws: the reason the server did not confirm the deallocation; the
    ///   connection is closed all the same.
    public func close(timeout: Duration = .seconds(2)) async throws(TURNClientError) {
        var failure: TURNClientError?
        do {
            try await operation(Void.self) { engine, promise in
                engine.deallocate(promise, timeout: timeout)
            }
        } catch {
            failure = error
        }
        let engine = self.engine
        try? await channel.eventLoop.submit { engine.value.shutDown(.closed) }.get()
        if ownsChannel { try? await channel.close() }
        if let failure, failure != .closed { throw failure }
    }

    /// A TURN client sharing a UDP socket that another handler reads (the
    /// secure endpoint's): that handler passes every datagram from `server`
    /// to the returned engine's `received(_:)`, and data the server relays
    /// from peers comes out of `deliver` instead of ``received`` (which ends at
    /// once). Call on the channel's event loop.
    static func attached(
        to channel: Channel, server: TransportAddress, configuration: TURNClient.Configuration,
        deliver: @escaping (TURNClient.Datagram) -> Void, logger: Logger
    ) throws(TURNClientError) -> (TURNClientConnection, TURNClientEngine) {
        var configuration = configuration
        if case .reliable = configuration.reliability { configuration.reliability = .unreliable() }
        let core = try TURNClient(configuration: configuration)
        let (stream, continuation) = AsyncStream.makeStream(of: TURNClient.Datagram.self)
        continuation.finish()
        let engine = TURNClientEngine(
            core: core, server: server, stream: false, eventLoop: channel.eventLoop,
            continuation: continuation, logger: logger, deliver: deliver)
        engine.attach(channel)
        let connection = TURNClientConnection(
            channel: channel, engine: NIOLoopBound(engine, eventLoop: channel.eventLoop), server: server,
            transport: .udp, received: stream, ownsChannel: false)
        return (connection, engine)
    }

    private func operation<T: Sendable>(
        _ type: T.Type,
        _ body: @escaping @Sendable (TURNClientEngine, EventLoopPromise<T>) -> Void
    ) async throws(TURNClientError) -> T {
        let promise = channel.eventLoop.makePromise(of: T.self)
        let engine = self.engine
        channel.eventLoop.execute { body(engine.value, promise) }
        do {
            return try await promise.futureResult.get()
        } catch let error as TURNClientError {
            throw error
        } catch {
            throw .transport("the connection's event loop is gone", ErrorCause(error))
        }
    }

    static func describe(_ error: Error) -> String {
        if let io = error as? IOError { return String(cString: strerror(io.errnoCode)) }
        return "\(error)"
    }
}

/// The core, its timer and the callers waiting for outcomes, confined to the
/// channel's event loop.
final class TURNClientEngine {
    enum Waiter {
        case allocate(EventLoopPromise<TURNClientAllocation>)
        case done(EventLoopPromise<Void>)
        case channel(EventLoopPromise<ChannelNumber>)

        func fail(_ error: TURNClientError) {
            switch self {
            case .allocate(let p): p.fail(error)
            case .done(let p): p.fail(error)
            case .channel(let p): p.fail(error)
            }
        }
    }

    /// The core on this loop: its clock, its timer, its actions performed by ``perform(_:)``.
    private var host: CoreHost<TURNClient>!
    private let server: TransportAddress
    private let destination: SocketAddress
    private let stream: Bool
    private let eventLoop: EventLoop
    private let continuation: AsyncStream<TURNClient.Datagram>.Continuation
    /// Where relayed peer data goes when the socket is shared; nil: `continuation`.
    private let deliver: ((TURNClient.Datagram) -> Void)?
    private let logger: Logger
    private var channel: Channel?
    private var waiters: [TURNClient.OperationID: Waiter] = [:]
    private var wrote = false
    /// Set when the connection is gone; every later call fails with it.
    private var shutDownError: TURNClientError?

    init(
        core: TURNClient, server: TransportAddress, stream: Bool, eventLoop: EventLoop,
        continuation: AsyncStream<TURNClient.Datagram>.Continuation, logger: Logger,
        deliver: ((TURNClient.Datagram) -> Void)? = nil
    ) {
        self.deliver = deliver
        self.server = server
        self.destination = SocketAddress(server)
        self.stream = stream
        self.eventLoop = eventLoop
        self.continuation = continuation
        self.logger = logger
        // The host holds this engine weakly: the channel's handler owns the engine.
        host = CoreHost(core, on: eventLoop) { [weak self] action in
            self?.perform(action)
        } afterActions: { [weak self] in
            guard let self, wrote else { return }
            wrote = false
            channel?.flush()
        }
    }

    func attach(_ channel: Channel) { self.channel = channel }

    // MARK: calls from the application

    func start(
        method: Method, waiter: Waiter, timeout: Duration?,
        _ body: (inout TURNClient, Timestamp) throws(TURNClientError) -> TURNClient.OperationID
    ) {
        if let shutDownError {
            waiter.fail(shutDownError)
            return
        }
        do {
            let id = try starting { () throws(TURNClientError) in try host.with(body) }
            register(id, waiter)
            if let timeout { expire(id, after: timeout, method: method) }
        } catch {
            waiter.fail(error)
        }
    }

    /// Outcomes the core gave while the operation was being started, before its
    /// waiter was in place (the host drains the core's actions before `with`
    /// returns): a deallocation with nothing allocated ends at once.
    private var early: [TURNClient.Event] = []
    private var isStarting = false

    private func starting<T, Failure: Error>(_ body: () throws(Failure) -> T) throws(Failure) -> T {
        isStarting = true
        defer { isStarting = false }
        do {
            return try body()
        } catch {
            early = []  // (an operation refused at once has no outcome to wait for)
            throw error
        }
    }

    private func register(_ id: TURNClient.OperationID, _ waiter: Waiter) {
        waiters[id] = waiter
        let outcomes = early
        early = []
        for event in outcomes { handle(event) }
    }

    func send(_ payload: [UInt8], to peer: TransportAddress) throws(TURNClientError) {
        if let shutDownError { throw shutDownError }
        let wrapped = try host.read { core throws(TURNClientError) in try core.wrap(payload, for: peer) }
        write(wrapped)
        channel?.flush()
    }

    func deallocate(_ promise: EventLoopPromise<Void>, timeout: Duration) {
        if let shutDownError {
            promise.fail(shutDownError)
            return
        }
        let id = starting { host.with { core, now in core.deallocate(now: now) } }
        register(id, .done(promise))
        expire(id, after: timeout, method: .refresh)
    }

    private func expire(_ id: TURNClient.OperationID, after timeout: Duration, method: Method) {
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        eventLoop.scheduleTask(in: .nanoseconds(max(0, timeout.nanoseconds))) {
            bound.value.waiters.removeValue(forKey: id)?.fail(.timeout(method))
        }
    }

    // MARK: calls from the network

    func received(_ bytes: [UInt8]) {
        host.handle(.received(bytes))
    }

    /// The connection is gone (closed, refused, broken): fail everyone waiting.
    func shutDown(_ error: TURNClientError) {
        guard shutDownError == nil else { return }
        shutDownError = error
        host.stop()
        let waiting = waiters
        waiters.removeAll()
        for (_, w) in waiting { w.fail(error) }
        continuation.finish()
        channel = nil
    }

    /// What one action of the core means on this connection.
    private func perform(_ action: TURNClient.Action) {
        switch action {
        case .transmit(let bytes):
            write(bytes)
            wrote = true
        case .event(let event):
            handle(event)
        case .deliver(let datagram):
            if let deliver { deliver(datagram) } else { continuation.yield(datagram) }
        }
    }

    private func write(_ bytes: [UInt8]) {
        guard let channel else { return }
        var buffer = channel.allocator.buffer(capacity: bytes.count)
        buffer.writeBytes(bytes)
        let promise = eventLoop.makePromise(of: Void.self)
        let logger = self.logger
        let server = self.server
        promise.futureResult.whenFailure { error in
            logger.debug("cannot send to the TURN server", metadata: ["server": "\(server)", "error": "\(error)"])
        }
        if stream {
            channel.write(buffer, promise: promise)
        } else {
            channel.write(AddressedEnvelope(remoteAddress: destination, data: buffer), promise: promise)
        }
    }

    private func handle(_ event: TURNClient.Event) {
        if isStarting, let id = event.operation, waiters[id] == nil {
            early.append(event)
            return
        }
        switch event {
        case .allocated(let id, let allocation), .confirmed(let id, let allocation):
            if case .allocate(let p)? = waiters.removeValue(forKey: id) { p.succeed(allocation) }
        case .permissionsCreated(let id, _), .deallocated(let id):
            if case .done(let p)? = waiters.removeValue(forKey: id) { p.succeed() }
        case .channelBound(let id, let number, _):
            if case .channel(let p)? = waiters.removeValue(forKey: id) { p.succeed(number) }
        case .failed(let id, let error):
            waiters.removeValue(forKey: id)?.fail(error)
        case .refreshed(let lifetime, _):
            logger.debug("allocation refreshed", metadata: ["server": "\(server)", "lifetime": "\(lifetime)"])
        case .allocationLost(let error):
            logger.warning("allocation lost", metadata: ["server": "\(server)", "error": "\(error)"])
            continuation.finish()
        case .permissionLost(let ip, let error):
            logger.warning("permission lost", metadata: ["peer": "\(ip)", "error": "\(error)"])
        case .channelLost(let number, let peer, let error):
            logger.warning("channel lost", metadata: ["channel": "\(number)", "peer": "\(peer)", "error": "\(error)"])
        }
    }
}

/// UDP: datagrams from the server go to the core.
final class TURNDatagramHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    let engine: TURNClientEngine

    init(engine: TURNClientEngine) { self.engine = engine }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let envelope = unwrapInboundIn(data)
        engine.received(Array(envelope.data.readableBytesView))
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        // On a connected socket, ICMP port unreachable arrives as ECONNREFUSED.
        engine.shutDown(.transport("the server refused (nothing listening?)", ErrorCause(error)))
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        engine.shutDown(.closed)
        context.fireChannelInactive()
    }
}

/// TCP: STUN messages and padded ChannelData cut from the byte stream go to the core.
final class TURNStreamHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    let engine: TURNClientEngine
    private var framer = StreamFramer()

    init(engine: TURNClientEngine) { self.engine = engine }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        framer.append(buffer.readableBytesView)
        do {
            while let frame = try framer.next() {
                switch frame {
                case .stun(let bytes), .channelData(let bytes): engine.received(bytes)
                }
            }
        } catch {
            engine.shutDown(.transport("the server's stream cannot be framed", ErrorCause(error)))
            context.close(promise: nil)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        engine.shutDown(.transport("connection to the server failed", ErrorCause(error)))
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        engine.shutDown(.transport("the server closed the connection", nil))
        context.fireChannelInactive()
    }
}
