import Logging
import NIOCore
import STUN
import TURN
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A primary UDP listener of a relaying service, read by its TURN lane rather
/// than by a NIO pipeline.
///
/// Voice reaches a relay as one datagram per flow every 20 ms, flows
/// interleaved: nothing to coalesce per flow, so what a datagram costs in user
/// space decides the relay's rate. NIO's read path spends per datagram an
/// envelope, a buffer, the sender's address formatted as text and a trip
/// through the pipeline; here the lane reads the socket with recvmmsg into its
/// own slots in the same drain as the relay sockets (the listener sits in the
/// lane's epoll set), answers Binding and TURN requests from the bytes, and
/// queues answers and ChannelData toward clients in the lane's outbox, which
/// sends them with sendmmsg (UDP GSO for runs to one client) at the end of
/// the drain.
///
/// NIO still holds the socket (the service binds it and hands it over with
/// `withBoundSocket`, reading off): answers that RFC 5780 sends from another
/// server address reach this one through its channel, as before. The lane
/// reads and writes a duplicate of NIO's descriptor, which it closes itself
/// when NIO's channel has closed: NIO closes its own number a moment before
/// the lane hears of it, and that number may meanwhile be another socket's.
final class ListenerSocket {
    /// The lane's duplicate of the bound socket, as the outbox knows sockets
    /// (never in the relay table); its fd is -1 once closed.
    let socket: RelaySocket
    /// NIO's handle on the same descriptor.
    let channel: any Channel
    let core: BindingServer
    let routes: UDPRoutes
    /// Which reuse-port sibling this is: the lane index for ``UDPRoutes``.
    let laneIndex: Int
    let totals: StatisticsBox
    @exclusivity(unchecked) var counters = BindingCounters()
    /// The lane's drain that last read it (see ``TURNLane``'s `drains`).
    var lastDrain = -1
    /// Where the Binding core writes each answer.
    @exclusivity(unchecked) var scratch = [UInt8](repeating: 0, count: 512)

    /// Nil when the descriptor cannot be duplicated (out of descriptors).
    init?(
        fd: Int32, address: TransportAddress, channel: any Channel, core: BindingServer, routes: UDPRoutes, laneIndex: Int,
        totals: StatisticsBox
    ) {
        let copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else { return nil }
        socket = RelaySocket(address: address, fd: copy)
        socket.reading = true
        socket.towardClients = true
        self.channel = channel
        self.core = core
        self.routes = routes
        self.laneIndex = laneIndex
        self.totals = totals
    }

    /// Adds the counters to the service's totals.
    func mergeCounters() {
        totals.merge(&counters)
    }

    /// Closes the lane's duplicate (NIO's descriptor is NIO's). Idempotent.
    func close() {
        guard socket.fd >= 0 else { return }
        Glibc.close(socket.fd)
        socket.fd = -1
        socket.reading = false
    }

    /// A non-blocking UDP socket bound to `address` for a listener (SO_REUSEPORT
    /// when lanes share the address), with `buffer` bytes of kernel buffer each
    /// way; with `dualStack`, an IPv6 address takes IPv4 too (IPV6_V6ONLY off, as a
    /// socket NIO binds). Throws the bind error, naming the address.
    static func bind(
        _ address: TransportAddress, reusePort: Bool, buffer: Int32, dualStack: Bool = false, dontFragment: Bool = false
    ) throws(UDPSocketError) -> Int32 {
        try bindUDPSocket(address) { fd in
            var one: Int32 = 1
            var zero: Int32 = 0
            var bytes = buffer
            let size = socklen_t(MemoryLayout<Int32>.size)
            if reusePort { setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, size) }
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, size)
            setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, size)
            if dualStack && !address.ip.isIPv4 { setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &zero, size) }
            if dontFragment {
                // DF set, the path's learnt MTU not applied (PROBE, not DO: a datagram is
                // never refused for a smaller MTU an ICMP message claimed). A datagram the
                // kernel may not fragment needs no IP identification: without this each
                // one took __ip_select_ident's shared hash and atomic (3 % of the party
                // relay's CPU). For datagrams sized below every path's MTU, as party
                // packets are (a control part is at most 1,100 bytes of JSON).
                var probe = IP_PMTUDISC_PROBE
                setsockopt(fd, Int32(IPPROTO_IP), IP_MTU_DISCOVER, &probe, size)
                if !address.ip.isIPv4 {
                    var probe6 = IPV6_PMTUDISC_PROBE
                    setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_MTU_DISCOVER, &probe6, size)
                }
            }
        }
    }
}

extension TURNLane {
    /// Reads up to `limit` datagrams from a listener and answers or relays each;
    /// returns how many were read. What leaves is queued in the outbox.
    func read(_ listener: ListenerSocket, atMost limit: Int) -> Int {
        inbox.read(
            atMost: limit, from: { listener.socket.fd }, truncated: { listener.counters.drop(.tooLarge) },
            handle: { handleDatagram($0, from: $1, on: listener, now: $2) })
    }

    private func handleDatagram(
        _ payload: UnsafeRawBufferPointer, from source: TransportAddress, on listener: ListenerSocket, now: Timestamp
    ) {
        if payload.count >= 2, TURNServer.isTURN(leadingBytes: UInt16(payload[0]) << 8 | UInt16(payload[1])) {
            let tuple = FiveTuple(client: source, server: listener.socket.address, transport: .udp)
            if let answer = handleClient(payload, from: tuple, now: now) {
                answer.withUnsafeBytes { outbox.append($0, to: source, on: listener.socket, answer: true) }
                listener.counters.responses += 1
            }
            return
        }
        let capacity = listener.core.responseCapacity(requestLength: payload.count)
        if listener.scratch.count < capacity { listener.scratch = [UInt8](repeating: 0, count: capacity) }
        let outcome = listener.scratch.withUnsafeMutableBytes {
            listener.core.handle(payload, from: source, arrivedOn: .primary, into: $0)
        }
        switch outcome {
        case .drop(let reason):
            listener.counters.drop(reason)
        case .reply(let length, let destination, let origin):
            if origin == .primary {
                listener.scratch.withUnsafeBytes {
                    outbox.append(
                        UnsafeRawBufferPointer(rebasing: $0[0..<length]), to: destination, on: listener.socket, answer: true)
                }
                listener.counters.responses += 1
            } else if let channel = listener.routes.channel(for: origin, lane: listener.laneIndex) {
                // RFC 5780: the answer leaves from another server address, through its NIO channel.
                var buffer = channel.allocator.buffer(capacity: length)
                buffer.writeBytes(listener.scratch[0..<length])
                channel.writeAndFlush(AddressedEnvelope(remoteAddress: SocketAddress(destination), data: buffer), promise: nil)
                listener.counters.responses += 1
            } else {
                listener.counters.unroutable += 1
            }
        }
    }
}
