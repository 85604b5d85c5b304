import Logging
import NIOCore
import NIOPosix
import STUN
import TURN
import Transport
import TusaBase

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
/// Stateless per request: each datagram is answered from the read buffer into
/// a reused scratch buffer. Answers that leave from this socket are collected
/// for the read burst by destination and size, and at the end of the burst
/// each group goes out as one UDP GSO write (`UDP_SEGMENT`, per-message
/// segment size) that the kernel splits into datagrams; a lone answer is a
/// plain datagram, and all of them leave in one flush (sendmmsg). Where GSO is
/// not available, or the first GSO write fails, every answer is its own
/// datagram. A response that RFC 5780 sends from another server address goes
/// out on that address's channel.
///
/// A relaying service's primary sockets are read by their TURN lane instead
/// (``ListenerSocket``); this handler serves every socket of a Binding-only
/// service and the RFC 5780 alternate sockets.
final class UDPListenerHandler: ChannelInboundHandler {
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
    /// Where the core writes each answer before it is copied out.
    private var scratch = [UInt8](repeating: 0, count: 512)

    /// Answers of this burst for one destination, all of one size.
    private struct Group {
        var destination: TransportAddress
        var remote: SocketAddress
        var length: Int
        var buffer: ByteBuffer
        var count: Int
    }

    private var groups: [Group] = []
    /// Segments per GSO write: the kernel's UDP_MAX_SEGMENTS (64 on Linux 6.1).
    static let maxSegments = 64
    /// Only answers this small are segmented: Linux refuses (EINVAL) a GSO
    /// segment larger than the path MTU less headers, and NIO closes the socket
    /// on that error. 1200 bytes fits every MTU IPv6 allows. Larger answers
    /// (a mirrored PADDING) go out one by one.
    static let maxSegmentSize = 1200
    /// A GSO write stays under the 64 KiB UDP limit.
    static let maxGSOBytes = 65_000
    /// Until one GSO write has succeeded, failures switch GSO off.
    private var gso: GSOState
    /// Bit `routeIndex` set: that origin's channel (on this event loop) has unflushed writes.
    private var unflushedRoutes: UInt8 = 0

    init(
        core: BindingServer, origin: BindingServer.Origin, routes: UDPRoutes, lane: Int, totals: StatisticsBox,
        logger: Logger, gso: Bool = true
    ) {
        self.gso = GSOState(enabled: gso)
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
        if scratch.count < capacity { scratch = [UInt8](repeating: 0, count: capacity) }
        let outcome = request.withUnsafeReadableBytes { req in
            scratch.withUnsafeMutableBytes { core.handle(req, from: source, arrivedOn: origin, into: $0) }
        }

        switch outcome {
        case .drop(let reason):
            counters.drop(reason)
        case .reply(let length, let destination, let responseOrigin):
            // The usual answer goes back to the sender: reuse its address as read.
            let remote = destination == source ? envelope.remoteAddress : SocketAddress(destination)
            if responseOrigin == origin && gso.enabled && length <= Self.maxSegmentSize {
                collect(length: length, destination: destination, remote: remote)
                counters.responses += 1
                return
            }
            var response = allocator.buffer(capacity: length)
            response.writeBytes(scratch[0..<length])
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

    /// Appends the answer in `scratch` to the group for its destination and size.
    private func collect(length: Int, destination: TransportAddress, remote: SocketAddress) {
        let limit = min(Self.maxSegments, Self.maxGSOBytes / length)
        let index = groups.firstIndex {
            $0.length == length && $0.count < limit && $0.destination == destination
        }
        scratch.withUnsafeBytes { bytes in
            let answer = UnsafeRawBufferPointer(rebasing: bytes[0..<length])
            if let index {
                groups[index].buffer.writeBytes(answer)
                groups[index].count += 1
            } else {
                var buffer = allocator.buffer(capacity: length * 8)
                buffer.writeBytes(answer)
                groups.append(Group(destination: destination, remote: remote, length: length, buffer: buffer, count: 1))
            }
        }
    }

    /// Writes the collected answers: one GSO write per group of two or more.
    private func writeGroups(context: ChannelHandlerContext) {
        for group in groups {
            if group.count == 1 {
                context.write(wrapOutboundOut(AddressedEnvelope(remoteAddress: group.remote, data: group.buffer)), promise: nil)
                continue
            }
            counters.gsoWrites += 1
            counters.gsoSegments += group.count
            let envelope = AddressedEnvelope(
                remoteAddress: group.remote, data: group.buffer,
                metadata: .init(ecnState: .transportNotCapable, packetInfo: nil, segmentSize: group.length))
            if gso.confirmed {
                context.write(wrapOutboundOut(envelope), promise: nil)
            } else {
                let promise = context.eventLoop.makePromise(of: Void.self)
                let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
                promise.futureResult.whenComplete { result in
                    switch result {
                    case .success: handler.value.gso.confirmed = true
                    case .failure(let error):
                        handler.value.gso.disable("\(error)", logger: handler.value.logger, what: "Binding answers")
                    }
                }
                context.write(wrapOutboundOut(envelope), promise: promise)
            }
        }
        groups.removeAll(keepingCapacity: true)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if !groups.isEmpty { writeGroups(context: context) }
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
