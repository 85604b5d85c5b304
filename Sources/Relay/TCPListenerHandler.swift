import Logging
import NIOCore
import STUN
import TURN
import Transport
import TusaBase

/// Hosts the sans-IO ``BindingServer`` on one STUN/TURN-over-TCP connection
/// (RFC 8489 §6.2.2, RFC 8656 §12.5).
///
/// A ``StreamFramer`` cuts the byte stream into messages whatever the segment
/// boundaries; each STUN request is answered on the same connection.
/// When the service relays, TURN requests and ChannelData go to the event
/// loop's ``TURNLane`` (the connection is the allocation's 5-tuple, and its
/// allocation dies with it). A
/// stream that is neither STUN nor ChannelData cannot be resynchronised and is
/// closed, and so is one that says nothing for ``RelayService/Configuration/tcpIdleTimeout``
/// (the pipeline puts an `IdleStateHandler` in front of this handler).
final class TCPListenerHandler: ChannelInboundHandler {
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
    private let turn: TURNLanes?
    private var lane: TURNLane?
    private var tuple: FiveTuple?

    /// `.tcp`, or `.tls` behind a TLS handler: names the allocation's transport.
    private let transport: TURNTransport

    /// A frame begun must be complete within this long (slowloris: one byte
    /// now and then would otherwise keep a connection forever).
    private let frameTimeout: TimeAmount
    private var partialSince: NIODeadline?

    init(
        core: BindingServer, totals: StatisticsBox, logger: Logger, turn: TURNLanes? = nil, transport: TURNTransport = .tcp,
        frameTimeout: TimeAmount = .seconds(30)
    ) {
        self.frameTimeout = frameTimeout
        self.turn = turn
        self.transport = transport
        self.core = core
        self.totals = totals
        self.logger = logger
    }

    func handlerAdded(context: ChannelHandlerContext) {
        peer = context.channel.remoteAddress.flatMap(TransportAddress.init)
    }

    func channelActive(context: ChannelHandlerContext) {
        if peer == nil { peer = context.channel.remoteAddress.flatMap(TransportAddress.init) }
        if let turn, let peer, let lane = turn.current(on: context.eventLoop),
            let local = context.channel.localAddress.flatMap(TransportAddress.init)
        {
            let tuple = FiveTuple(client: peer, server: local, transport: transport)
            self.lane = lane
            self.tuple = tuple
            lane.connections[tuple] = context.channel
            lane.core.ownEndpoints.insert(local)
        }
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        leaveLane()
        context.fireChannelInactive()
    }

    /// The connection is gone: so is its allocation (RFC 8656 §3.1).
    private func leaveLane() {
        guard let lane, let tuple else { return }
        lane.connections[tuple] = nil
        lane.core.connectionClosed(tuple, now: Timestamp.now())
        lane.reportEvents()
        self.lane = nil
    }

    /// Hands a TURN frame (ChannelData, or STUN other than Binding) to the lane.
    private func relay(_ frame: [UInt8], context: ChannelHandlerContext) -> Bool {
        guard let lane, let tuple else { return false }
        // The framer yields only whole STUN messages and ChannelData frames (at least 4 bytes).
        if frame.count >= 2, !TURNServer.isTURN(leadingBytes: UInt16(frame[0]) << 8 | UInt16(frame[1])) { return false }
        let buffer = ByteBuffer(bytes: frame)
        if let answer = lane.handleClient(buffer, from: tuple) {
            context.write(wrapOutboundOut(ByteBuffer(bytes: answer)), promise: nil)
            unflushed = true
            counters.responses += 1
        }
        return true
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
            switch frame {
            case .stun(let message):
                if !relay(message, context: context) { answer(message, context: context) }
            case .channelData(let data):
                _ = relay(data, context: context)
            }
        }
        if framer.bufferedByteCount > Self.maximumBufferedBytes {
            counters.badStreams += 1
            close(context, because: "\(framer.bufferedByteCount) bytes buffered without a complete frame")
            return
        }
        if framer.bufferedByteCount == 0 {
            partialSince = nil
        } else if let since = partialSince {
            if NIODeadline.now() - since > frameTimeout {
                counters.idleTimeouts += 1
                close(context, because: "a frame took longer than \(frameTimeout) to arrive")
            }
        } else {
            partialSince = .now()
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
        lane?.flushRelays()
        if unflushed {
            unflushed = false
            context.flush()
        }
        totals.merge(&counters)
        context.fireChannelReadComplete()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let idle = event as? IdleStateHandler.IdleStateEvent, idle == .read {
            // A TURN control connection may rest between refreshes while its allocation lives.
            if let lane, let tuple, lane.core.allocation(for: tuple) != nil { return }
            counters.idleTimeouts += 1
            close(context, because: "idle")
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        leaveLane()
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
