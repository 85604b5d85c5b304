import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import Prometheus
import STUN
import ServiceLifecycle
import Transport
import TusaBase

/// A small HTTP server for Prometheus: `GET /metrics` answers with a
/// registry's metrics in the text exposition format; other paths are 404,
/// other methods 405. A swift-service-lifecycle `Service`.
///
/// `run()` binds the address, then calls `refresh` every `refreshInterval`
/// (and once before serving) until graceful shutdown or cancellation, then
/// closes the listening socket and every connection.
public final class MetricsEndpoint: Service, Sendable {
    public let address: TransportAddress
    public let registry: PrometheusCollectorRegistry
    public let refreshInterval: Duration
    private let refresh: @Sendable () async -> Void
    private let logger: Logger
    private let bound = BoundResult<TransportAddress>()

    /// Connections that say nothing for this long are closed.
    static let idleTimeout: TimeAmount = .seconds(30)
    /// Connections open at once, in all and from one IP address: a scraper needs one or
    /// two; past the caps a connection is closed as it is accepted.
    public static let connectionLimits = ConnectionAdmission.Limits(total: 256, perSource: 16)
    /// A request must be in whole this long after its first byte (see ``RequestDeadlineHandler``).
    public let requestTimeout: Duration
    private let admission = ConnectionAdmission(limits: MetricsEndpoint.connectionLimits)

    /// Connections closed on accept because of ``connectionLimits``.
    public var refusedConnections: Int { admission.refused.values.reduce(0, +) }

    public init(
        address: TransportAddress, registry: PrometheusCollectorRegistry, refreshInterval: Duration = .seconds(1),
        requestTimeout: Duration = .seconds(10), logger: Logger, refresh: @escaping @Sendable () async -> Void = {}
    ) {
        self.address = address
        self.registry = registry
        self.refreshInterval = refreshInterval
        self.requestTimeout = requestTimeout
        self.refresh = refresh
        self.logger = logger
    }

    /// An endpoint that serves `service`'s ``RelayMetrics``, refreshed from
    /// its statistics about once a second.
    public static func serving(
        _ service: RelayService, party: PartyService? = nil, memory: MemoryGuard? = nil, on address: TransportAddress,
        logger: Logger
    ) -> MetricsEndpoint {
        let registry = PrometheusCollectorRegistry()
        let metrics = RelayMetrics(factory: PrometheusMetricsFactory(registry: registry))
        return MetricsEndpoint(address: address, registry: registry, logger: logger) {
            await metrics.update(from: service)
            if let party { metrics.update(from: party) }
            if let memory { metrics.update(from: memory) }
        }
    }

    /// The bound address (the real port when port 0 was asked for) once
    /// `run()` has bound it; throws its bind error, or `CancellationError`
    /// if the caller is cancelled first.
    public func boundAddress() async throws -> TransportAddress {
        try await bound.wait()
    }

    public func run() async throws {
        let registry = self.registry
        let admission = self.admission
        let requestTimeout = TimeAmount.nanoseconds(Int64(requestTimeout.nanoseconds))
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let channel: any Channel
        do {
            let bootstrap = ServerBootstrap(group: group)
                .childChannelInitializer { channel in
                    guard admission.admit(channel) == nil else { return channel.close() }
                    return channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                        // First in the pipeline: it sees the bytes as they come and the response as it leaves.
                        try channel.pipeline.syncOperations.addHandler(
                            RequestDeadlineHandler(timeout: requestTimeout), position: .first)
                        try channel.pipeline.syncOperations.addHandlers([
                            IdleStateHandler(readTimeout: Self.idleTimeout),
                            MetricsHTTPHandler(registry: registry),
                        ])
                    }
                }
            channel = try await bootstrap.listen(on: address, backlog: 64, listener: "metrics \(address)", logger: logger)
        } catch {
            let failure = RelayServiceError(
                .bindFailed, "cannot serve metrics on tcp \(address): \(RelayServiceError.reason(error))")
            bound.resolve(.failure(failure))
            try? await group.shutdownGracefully()
            throw failure
        }
        let local = channel.localAddress.flatMap(TransportAddress.init) ?? address
        logger.info("serving metrics", metadata: ["address": "http://\(local)/metrics"])
        await refresh()
        bound.resolve(.success(local))

        // Refresh until graceful shutdown or cancellation, then stop serving.
        let interval = refreshInterval
        let refresh = self.refresh
        try? await cancelWhenGracefulShutdown {
            while true {
                try await Task.sleep(for: interval)
                await refresh()
            }
        }
        try? await channel.close()
        try? await group.shutdownGracefully()
    }
}

/// Closes a connection whose request has not come in whole `timeout` after its first
/// byte; the response leaving is the sign that it did. Bytes trickled one at a time
/// (slowloris) reset the idle timer at each read, never this deadline.
final class RequestDeadlineHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = IOData

    private let timeout: TimeAmount
    private var deadline: Scheduled<Void>?

    init(timeout: TimeAmount) {
        self.timeout = timeout
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if deadline == nil {
            let channel = context.channel
            deadline = context.eventLoop.scheduleTask(in: timeout) { channel.close(promise: nil) }
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        deadline?.cancel()
        deadline = nil
        context.write(data, promise: promise)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
    }
}

/// Answers each HTTP request on one connection.
final class MetricsHTTPHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let registry: PrometheusCollectorRegistry
    private var request: HTTPRequestHead?

    init(registry: PrometheusCollectorRegistry) {
        self.registry = registry
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            request = head
        case .body:
            break
        case .end:
            guard let head = request else { return }
            request = nil
            respond(to: head, context: context)
        }
    }

    /// A request the HTTP parser refused (bytes that are no request, a header past its
    /// limit): `HTTPServerProtocolErrorHandler` has answered 400 with `Connection: close`
    /// and passed the error on; the connection closes, as that answer says (left open, it
    /// sat until the idle timeout, holding one of its address's connections).
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is IdleStateHandler.IdleStateEvent {
            context.close(promise: nil)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }

    private func respond(to head: HTTPRequestHead, context: ChannelHandlerContext) {
        let path = head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        let status: HTTPResponseStatus
        var body: [UInt8]
        var headers = HTTPHeaders()
        if path != "/metrics" {
            status = .notFound
            body = Array("not found: metrics are at /metrics\n".utf8)
            headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
        } else if head.method != .GET && head.method != .HEAD {
            status = .methodNotAllowed
            body = Array("only GET and HEAD\n".utf8)
            headers.add(name: "Allow", value: "GET, HEAD")
            headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
        } else {
            status = .ok
            body = registry.emitToBuffer()
            headers.add(name: "Content-Type", value: "text/plain; version=0.0.4; charset=utf-8")
        }
        headers.add(name: "Content-Length", value: "\(body.count)")
        if head.method == .HEAD { body = [] }
        let keepAlive = head.isKeepAlive
        if !keepAlive { headers.add(name: "Connection", value: "close") }

        context.write(
            wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: status, headers: headers))), promise: nil)
        if !body.isEmpty {
            context.write(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(bytes: body)))), promise: nil)
        }
        let done = context.writeAndFlush(wrapOutboundOut(.end(nil)))
        if !keepAlive {
            let channel = context.channel
            done.whenComplete { _ in channel.close(promise: nil) }
        }
    }
}
