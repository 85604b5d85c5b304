import Logging
import NIOCore
import STUN

/// The UDP channels of one STUN server address set, by ``BindingServer/Origin``
/// and event-loop lane: where a response that must leave from another server
/// address is written.
///
/// Built once all sockets are bound and never changed, so handlers read it
/// without locks.
struct UDPRoutes: Sendable {
    /// `channels[origin.routeIndex][lane]`; an origin that is not served has no lanes.
    private let channels: [[any Channel]]

    init(channels: [BindingServer.Origin: [any Channel]]) {
        var table = [[any Channel]](repeating: [], count: BindingServer.Origin.all.count)
        for (origin, lanes) in channels { table[origin.routeIndex] = lanes }
        self.channels = table
    }

    /// The channel bound to `origin`, preferring the one on `lane` (the same event loop).
    func channel(for origin: BindingServer.Origin, lane: Int) -> (any Channel)? {
        let lanes = channels[origin.routeIndex]
        guard !lanes.isEmpty else { return nil }
        return lanes[lane % lanes.count]
    }
}

extension BindingServer.Origin {
    /// 0 primary, 1 alternate port, 2 alternate IP, 3 both: the position in ``BindingServer/Origin/all``.
    var routeIndex: Int { (alternateIP ? 2 : 0) + (alternatePort ? 1 : 0) }
}

/// Hosts the sans-IO ``BindingServer`` on a UDP socket.
///
/// Stateless per request: each datagram is answered straight from the read
/// buffer into a new outbound buffer. Responses are written without flushing
/// and flushed once per read batch, so a vector read (recvmmsg) turns into a
/// vector write (sendmmsg). A response that RFC 5780 sends from another server
/// address goes out on that address's channel.
final class UDPBindingHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    typealias OutboundOut = AddressedEnvelope<ByteBuffer>

    private let core: BindingServer
    /// The server address this channel is bound to.
    private let origin: BindingServer.Origin
    private let routes: UDPRoutes
    /// Which of the reuse-port sockets of this address this is (its event loop).
    private let lane: Int
    private let logger: Logger
    private let totals: StatisticsBox

    private var counters = BindingCounters()
    private var allocator = ByteBufferAllocator()
    /// Bit `routeIndex` set: that origin's channel (on this event loop) has unflushed writes.
    private var unflushedRoutes: UInt8 = 0

    init(
        core: BindingServer, origin: BindingServer.Origin, routes: UDPRoutes, lane: Int, totals: StatisticsBox,
        logger: Logger
    ) {
        self.core = core
        self.origin = origin
        self.routes = routes
        self.lane = lane
        self.totals = totals
        self.logger = logger
    }

    func handlerAdded(context: ChannelHandlerContext) {
        allocator = context.channel.allocator
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let envelope = unwrapInboundIn(data)
        guard let source = TransportAddress(envelope.remoteAddress) else { return }
        let request = envelope.data
        let capacity = core.responseCapacity(requestLength: request.readableBytes)
        var response = allocator.buffer(capacity: capacity)
        var outcome = BindingServer.Outcome.drop(.noRoom)
        response.writeWithUnsafeMutableBytes(minimumWritableBytes: capacity) { out in
            outcome = request.withUnsafeReadableBytes { core.handle($0, from: source, arrivedOn: origin, into: out) }
            guard case .reply(let length, _, _) = outcome else { return 0 }
            return length
        }

        switch outcome {
        case .drop(let reason):
            counters.drop(reason)
        case .reply(_, let destination, let responseOrigin):
            // The usual answer goes back to the sender: reuse its address as read.
            let remote = destination == source ? envelope.remoteAddress : SocketAddress(destination)
            let reply = AddressedEnvelope(remoteAddress: remote, data: response)
            if responseOrigin == origin {
                context.write(wrapOutboundOut(reply), promise: nil)
                counters.responses += 1
            } else if let channel = routes.channel(for: responseOrigin, lane: lane) {
                if channel.eventLoop.inEventLoop {
                    channel.write(reply, promise: nil)
                    unflushedRoutes |= 1 << UInt8(responseOrigin.routeIndex)
                } else {
                    channel.writeAndFlush(reply, promise: nil)
                }
                counters.responses += 1
            } else {
                counters.unroutable += 1
            }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        context.flush()
        if unflushedRoutes != 0 {
            for origin in BindingServer.Origin.all where unflushedRoutes & (1 << UInt8(origin.routeIndex)) != 0 {
                routes.channel(for: origin, lane: lane)?.flush()
            }
            unflushedRoutes = 0
        }
        totals.merge(&counters)
        context.fireChannelReadComplete()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        totals.merge(&counters)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // ICMP errors surface here (ECONNREFUSED after an unreachable peer);
        // the socket stays open and NIO closes it itself on fatal errors.
        logger.debug("UDP socket error", metadata: ["error": "\(error)", "origin": "\(origin)"])
    }
}
