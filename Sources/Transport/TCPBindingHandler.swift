import Logging
import NIOCore
import STUN

/// Hosts the sans-IO ``BindingServer`` on one STUN/TURN-over-TCP connection
/// (RFC 8489 §6.2.2, RFC 8656 §12.5).
///
/// A ``StreamFramer`` cuts the byte stream into messages whatever the segment
/// boundaries; each STUN request is answered on the same connection.
/// ChannelData frames are ignored until the TURN allocation core lands. A
/// stream that is neither STUN nor ChannelData cannot be resynchronised and is
/// closed, and so is one that says nothing for ``BindingService/Configuration/tcpIdleTimeout``
/// (the pipeline puts an `IdleStateHandler` in front of this handler).
final class TCPBindingHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Bytes held while waiting for the rest of a frame, at most. The framer
    /// already refuses frames over its maximum; this bounds what one read adds.
    static let maximumBufferedBytes = 128 * 1024

    private let core: BindingServer
    private let logger: Logger
    private let totals: StatisticsBox

    private var framer = StreamFramer()
    private var peer: TransportAddress?
    private var counters = BindingCounters()
    private var unflushed = false
    private var closing = false

    init(core: BindingServer, totals: StatisticsBox, logger: Logger) {
        self.core = core
        self.totals = totals
        self.logger = logger
    }

    func handlerAdded(context: ChannelHandlerContext) {
        peer = context.channel.remoteAddress.flatMap(TransportAddress.init)
    }

    func channelActive(context: ChannelHandlerContext) {
        if peer == nil { peer = context.channel.remoteAddress.flatMap(TransportAddress.init) }
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !closing else { return }
        let bytes = unwrapInboundIn(data)
        framer.append(bytes.readableBytesView)
        while true {
            let frame: StreamFrame?
            do {
                frame = try framer.next()
            } catch {
                counters.badStreams += 1
                close(context, because: "\(error)")
                return
            }
            guard let frame else { break }
            if case .stun(let message) = frame { answer(message, context: context) }
        }
        if framer.bufferedByteCount > Self.maximumBufferedBytes {
            counters.badStreams += 1
            close(context, because: "\(framer.bufferedByteCount) bytes buffered without a complete frame")
        }
    }

    private func answer(_ request: [UInt8], context: ChannelHandlerContext) {
        guard let peer else { return }
        let capacity = core.responseCapacity(requestLength: request.count)
        var response = context.channel.allocator.buffer(capacity: capacity)
        var outcome = BindingServer.Outcome.drop(.noRoom)
        response.writeWithUnsafeMutableBytes(minimumWritableBytes: capacity) { out in
            outcome = request.withUnsafeBytes { core.handle($0, from: peer, arrivedOn: .primary, into: out) }
            guard case .reply(let length, _, _) = outcome else { return 0 }
            return length
        }
        switch outcome {
        case .drop(let reason):
            counters.drop(reason)
        case .reply:
            // On a connection the answer goes back where the request came from,
            // whatever RESPONSE-PORT said.
            context.write(wrapOutboundOut(response), promise: nil)
            unflushed = true
            counters.responses += 1
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if unflushed {
            unflushed = false
            context.flush()
        }
        totals.merge(&counters)
        context.fireChannelReadComplete()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let idle = event as? IdleStateHandler.IdleStateEvent, idle == .read {
            counters.idleTimeouts += 1
            close(context, because: "idle")
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        totals.merge(&counters)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        close(context, because: "\(error)")
    }

    private func close(_ context: ChannelHandlerContext, because reason: String) {
        guard !closing else { return }
        closing = true
        logger.debug(
            "closing STUN/TCP connection",
            metadata: ["peer": "\(peer.map { "\($0)" } ?? "?")", "reason": "\(reason)"])
        if unflushed {
            unflushed = false
            context.flush()
        }
        context.close(promise: nil)
    }
}
