import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Rendezvous
import STUN
import ServiceLifecycle
import Transport
import TusaBase

/// The rendezvous (signaling) over TCP: hosts a ``RendezvousServer`` core on one
/// event loop. A swift-service-lifecycle `Service`, run beside the relay's
/// ``RelayService`` by `tusa relay --rendezvous-port`.
public final class RendezvousService: Service, Sendable {
    public let address: TransportAddress
    public let configuration: RendezvousServerConfiguration
    private let logger: Logger
    private let bound = BoundResult<TransportAddress>()
    private let state: NIOLockedValueBox<(statistics: RendezvousStatistics, core: Hub?)> = .init((RendezvousStatistics(), nil))

    private let turnURIs: (@Sendable () async throws -> [String])?

    /// `turnURIs`, when given, supplies the URIs of TURN grants once known (after the
    /// relay bound its sockets); `configuration.turn` supplies the secret and lifetime.
    public init(address: TransportAddress, configuration: RendezvousServerConfiguration = .init(),
                turnURIs: (@Sendable () async throws -> [String])? = nil, logger: Logger) {
        self.address = address
        self.configuration = configuration
        self.turnURIs = turnURIs
        self.logger = logger
    }

    /// The bound address once `run()` has bound it (the real port for port 0).
    public func boundAddress() async throws -> TransportAddress { try await bound.wait() }

    /// The core's statistics, as of the last event.
    public var statistics: RendezvousStatistics { state.withLockedValue { $0.statistics } }

    public func run() async throws {
        var configuration = self.configuration
        if configuration.turn != nil, let turnURIs {
            do { configuration.turn?.uris = try await turnURIs() } catch {
                bound.resolve(.failure(error))
                throw error
            }
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let loop = group.next()
        let hub = Hub(core: RendezvousServer(configuration: configuration), loop: loop, logger: logger) { [state] stats in
            state.withLockedValue { $0.statistics = stats }
        }
        let channel: any Channel
        do {
            channel = try await ServerBootstrap(group: group)
                .serverChannelOption(.backlog, value: 256)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(RendezvousConnectionHandler(hub: hub))
                    }
                }
                .bind(to: SocketAddress(address)).get()
        } catch {
            let failure = RelayServiceError(.bindFailed, "cannot serve the rendezvous on tcp \(address): \(RelayServiceError.reason(error))")
            bound.resolve(.failure(failure))
            try? await group.shutdownGracefully()
            throw failure
        }
        let local = channel.localAddress.flatMap(TransportAddress.init) ?? address
        logger.info("serving the rendezvous", metadata: ["address": "tcp \(local)"])
        let ticker = loop.scheduleRepeatedTask(initialDelay: .seconds(1), delay: .seconds(1)) { _ in hub.poll() }
        bound.resolve(.success(local))
        try? await gracefulShutdown()
        ticker.cancel()
        try? await channel.close()
        try? await loop.submit { hub.closeAll() }.get()
        try? await group.shutdownGracefully()
    }
}

/// The core and the open connections, touched only on `loop`.
final class Hub: @unchecked Sendable {
    private var core: RendezvousServer
    private var channels: [ConnectionID: any Channel] = [:]
    private var nextID: UInt64 = 1
    let loop: any EventLoop
    private let logger: Logger
    private let publish: @Sendable (RendezvousStatistics) -> Void

    init(core: RendezvousServer, loop: any EventLoop, logger: Logger, publish: @escaping @Sendable (RendezvousStatistics) -> Void) {
        self.core = core; self.loop = loop; self.logger = logger; self.publish = publish
    }

    private static func unixSeconds() -> UInt64 { UInt64(max(0, Date().timeIntervalSince1970)) }

    func opened(_ channel: any Channel) -> ConnectionID {
        loop.preconditionInEventLoop()
        let id = ConnectionID(nextID)
        nextID += 1
        channels[id] = channel
        carry(core.accept(id, now: Timestamp.now()))
        return id
    }

    func received(_ id: ConnectionID, _ bytes: [UInt8]) {
        loop.preconditionInEventLoop()
        carry(core.receive(id, bytes, now: Timestamp.now(), unixSeconds: Self.unixSeconds()))
    }

    func closed(_ id: ConnectionID) {
        loop.preconditionInEventLoop()
        channels[id] = nil
        core.closed(id, now: Timestamp.now())
        publish(core.statistics)
    }

    func poll() {
        loop.preconditionInEventLoop()
        carry(core.poll(now: Timestamp.now()))
    }

    func closeAll() {
        for channel in channels.values { channel.close(promise: nil) }
    }

    private func carry(_ actions: [RendezvousAction]) {
        for action in actions {
            switch action {
            case .send(let id, let bytes):
                guard let channel = channels[id] else { continue }
                channel.writeAndFlush(channel.allocator.buffer(bytes: bytes), promise: nil)
            case .close(let id):
                guard let channel = channels[id] else { continue }
                logger.debug("rendezvous: closing", metadata: ["connection": "\(id)"])
                // After what was written for it (the error that says why).
                channel.writeAndFlush(channel.allocator.buffer(capacity: 0)).whenComplete { _ in channel.close(promise: nil) }
            }
        }
        publish(core.statistics)
    }
}

/// One TCP connection of the rendezvous.
final class RendezvousConnectionHandler: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    private let hub: Hub
    private var id: ConnectionID?

    init(hub: Hub) { self.hub = hub }

    func channelActive(context: ChannelHandlerContext) {
        id = hub.opened(context.channel)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard let id else { return }
        var buffer = unwrapInboundIn(data)
        if let bytes = buffer.readBytes(length: buffer.readableBytes) { hub.received(id, bytes) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if let id { hub.closed(id) }
        id = nil
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
