import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import STUN

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Where relay sockets are bound: the IPs per family and the port range.
public struct RelayAddressPlan: Hashable, Sendable {
    /// One relay IP per family at most (IPv4, IPv6).
    public var ips: [IPAddress]
    public var minPort: UInt16
    public var maxPort: UInt16

    public init(ips: [IPAddress], minPort: UInt16 = 49152, maxPort: UInt16 = 65535) {
        self.ips = ips
        self.minPort = minPort
        self.maxPort = maxPort
    }

    func ip(for family: UInt8) -> IPAddress? { ips.first { $0.family == family } }
}

/// The TURN side of one event loop: the sans-IO ``TURNServer`` core, the relay
/// sockets it opened, and the client-facing channels its answers leave on.
/// Everything here is touched on that event loop only.
final class TURNLane: TURNRelayPorts {
    let loop: any EventLoop
    let core: TURNServer
    let plan: RelayAddressPlan
    let logger: Logger
    /// Seconds between expiry sweeps.
    static let sweepInterval = TimeAmount.seconds(1)

    /// The UDP listener channel of each server address, on this loop.
    var listeners: [TransportAddress: any Channel] = [:]
    /// TCP control connections by 5-tuple.
    var connections: [FiveTuple: any Channel] = [:]
    fileprivate var relays: [TransportAddress: RelaySocket] = [:]
    /// Relay channels written to during the current read burst, to flush at its end.
    private var unflushed: [any Channel] = []
    private var listenersUnflushed: [any Channel] = []
    private var flushScheduled = false
    private var sweep: RepeatedTask?
    private var nextPort: [UInt8: Int] = [:]
    /// Set by `stop()`: nothing new is allocated while the service drains.
    private var stopped = false

    init(loop: any EventLoop, configuration: TURNServerConfiguration, plan: RelayAddressPlan, logger: Logger) {
        self.loop = loop
        self.plan = plan
        self.logger = logger
        var configuration = configuration
        let uptime = NIODeadline.now().uptimeNanoseconds / 1_000_000_000
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        configuration.unixTimeAtZero = UInt64(max(0, ts.tv_sec)) &- uptime
        // The core needs its ports before it exists; `self` is complete once `core` is set.
        let placeholder = PortsTrampoline()
        self.core = TURNServer(configuration: configuration, relayPorts: placeholder)
        placeholder.target = self
        let log = logger
        core.onEvent = { event in
            switch event {
            case .allocated(let tuple, let user, let relays, let lifetime):
                log.info("allocation", metadata: [
                    "client": "\(tuple)", "user": "\(user)", "relays": "\(relays.map(\.description))", "lifetime": "\(lifetime)",
                ])
            case .deleted(let tuple, let relays, let reason, let toPeer, let toClient):
                log.info("allocation deleted", metadata: [
                    "client": "\(tuple)", "relays": "\(relays.map(\.description))", "reason": "\(reason)",
                    "packets-to-peer": "\(toPeer)", "packets-to-client": "\(toClient)",
                ])
            case .authFailed(let tuple, let user):
                log.notice("authentication failed", metadata: ["client": "\(tuple)", "user": "\(user)"])
            }
        }
    }

    static var now: Timestamp { Timestamp(nanoseconds: NIODeadline.now().uptimeNanoseconds) }

    func start() {
        let lane = NIOLoopBound(self, eventLoop: loop)
        sweep = loop.scheduleRepeatedTask(initialDelay: Self.sweepInterval, delay: Self.sweepInterval) { _ in
            lane.value.core.expire(now: Self.now)
        }
    }

    func stop() {
        stopped = true
        sweep?.cancel()
        core.deleteAll(now: Self.now)
    }

    // MARK: - Client packets

    /// Handles a non-Binding packet from a client; returns bytes to answer with, if any.
    func handleClient(_ bytes: ByteBuffer, from tuple: FiveTuple) -> [UInt8]? {
        guard !stopped else { return nil }
        let outcome = bytes.withUnsafeReadableBytes { core.handleClient($0, from: tuple, now: Self.now) }
        switch outcome {
        case .reply(let answer): return answer
        case .drop: return nil
        case .relay(let allocation, let peer, let range):
            guard let relay = allocation.relays.first(where: { $0.ip.family == peer.ip.family }) ?? allocation.relays.first,
                let channel = relays[relay]?.channel
            else {
                core.recordDrop(.noRelaySocket)
                return nil
            }
            // A relay socket whose kernel buffer is full queues in NIO: drop instead of growing without bound.
            guard channel.isWritable else {
                core.recordDrop(.backpressure)
                return nil
            }
            let payload = bytes.getSlice(at: bytes.readerIndex + range.lowerBound, length: range.count)
                ?? ByteBuffer()
            channel.write(AddressedEnvelope(remoteAddress: SocketAddress(peer), data: payload), promise: nil)
            if !unflushed.contains(where: { $0 === channel }) { unflushed.append(channel) }
            return nil
        }
    }

    /// Flushes relay sockets written during a read burst.
    func flushRelays() {
        for channel in unflushed { channel.flush() }
        unflushed.removeAll(keepingCapacity: true)
    }

    // MARK: - Peer packets

    fileprivate func handlePeer(_ envelope: AddressedEnvelope<ByteBuffer>, socket: RelaySocket) {
        guard let allocation = socket.allocation, let peer = TransportAddress(envelope.remoteAddress) else { return }
        let data = envelope.data
        let outcome = data.withUnsafeReadableBytes { core.handlePeer($0, from: peer, allocation: allocation, now: Self.now) }
        switch outcome {
        case .drop: return
        case .channel(let number, let tuple):
            let length = data.readableBytes
            let padding = tuple.transport.isStream ? (4 - length % 4) % 4 : 0
            guard let channel = socket.client ?? clientChannel(tuple) else { return }
            var frame = channel.allocator.buffer(capacity: 4 + length + padding)
            frame.writeInteger(number)
            frame.writeInteger(UInt16(truncatingIfNeeded: length))
            frame.writeImmutableBuffer(data)
            if padding > 0 { frame.writeRepeatingByte(0, count: padding) }
            write(frame, to: tuple, on: channel, socket: socket)
        case .indication(let bytes, let tuple):
            guard let channel = socket.client ?? clientChannel(tuple) else { return }
            var buffer = channel.allocator.buffer(capacity: bytes.count)
            buffer.writeBytes(bytes)
            write(buffer, to: tuple, on: channel, socket: socket)
        }
    }

    private func clientChannel(_ tuple: FiveTuple) -> (any Channel)? {
        tuple.transport == .udp ? listeners[tuple.server] : connections[tuple]
    }

    private func write(_ buffer: ByteBuffer, to tuple: FiveTuple, on channel: any Channel, socket: RelaySocket) {
        // A TCP client that stops reading must not make the server buffer its peer's flood.
        guard channel.isWritable else {
            core.recordDrop(.backpressure)
            return
        }
        if tuple.transport == .udp {
            let remote = socket.clientRemote ?? SocketAddress(tuple.client)
            channel.write(AddressedEnvelope(remoteAddress: remote, data: buffer), promise: nil)
        } else {
            channel.write(buffer, promise: nil)
        }
        if !listenersUnflushed.contains(where: { $0 === channel }) { listenersUnflushed.append(channel) }
    }

    /// A relay socket's read burst ended. The flush toward clients waits for the
    /// end of this event-loop tick, so that what every relay socket read in one
    /// wakeup leaves in as few sendmmsg calls as possible.
    fileprivate func peerBurstEnded() {
        guard !flushScheduled, !listenersUnflushed.isEmpty else { return }
        flushScheduled = true
        let lane = NIOLoopBound(self, eventLoop: loop)
        loop.execute {
            let lane = lane.value
            lane.flushScheduled = false
            for channel in lane.listenersUnflushed { channel.flush() }
            lane.listenersUnflushed.removeAll(keepingCapacity: true)
        }
    }

    // MARK: - TURNRelayPorts

    func serves(family: UInt8) -> Bool { plan.ip(for: family) != nil }

    func openRelay(family: UInt8, even: Bool, reserveNext: Bool, dontFragment: Bool) -> (relay: TransportAddress, reserved: TransportAddress?)? {
        guard let ip = plan.ip(for: family), plan.minPort <= plan.maxPort else { return nil }
        // Port arithmetic in Int: the range may end at 65535.
        let lo = Int(plan.minPort), hi = Int(plan.maxPort)
        let span = hi - lo + 1
        var port = nextPort[family] ?? lo + Int.random(in: 0..<span)
        for _ in 0..<min(span, 4096) {
            if port < lo || port > hi { port = lo }
            if even && port % 2 == 1 { port += 1 }
            if port > hi { port = lo + lo % 2 }  // wrap to the first even port
            guard port <= hi else { return nil }  // a one-port odd range has no even port
            let candidate = port
            port = candidate + 1
            if reserveNext && candidate + 1 > hi { continue }
            let address = TransportAddress(ip: ip, port: UInt16(candidate))
            guard let fd = Self.bindSocket(address, dontFragment: dontFragment) else { continue }
            var reserved: TransportAddress?
            if reserveNext {
                let next = TransportAddress(ip: ip, port: UInt16(candidate + 1))
                guard let fd2 = Self.bindSocket(next, dontFragment: dontFragment) else {
                    close(fd)
                    continue
                }
                relays[next] = RelaySocket(address: next, fd: fd2)
                reserved = next
                port = candidate + 2
            }
            nextPort[family] = port
            let socket = RelaySocket(address: address, fd: fd)
            relays[address] = socket
            register(socket)
            return (address, reserved)
        }
        return nil
    }

    func openReserved(_ address: TransportAddress, dontFragment: Bool) -> Bool {
        guard let socket = relays[address], socket.channel == nil, !socket.registering else { return false }
        register(socket)
        return true
    }

    func attach(_ relay: TransportAddress, to allocation: TURNAllocation) {
        guard let socket = relays[relay] else { return }
        socket.allocation = allocation
        // Resolved once, not per datagram: where this relay's traffic to the client leaves.
        socket.client = clientChannel(allocation.tuple)
        if allocation.tuple.transport == .udp { socket.clientRemote = SocketAddress(allocation.tuple.client) }
    }

    func closeRelay(_ address: TransportAddress) {
        guard let socket = relays.removeValue(forKey: address) else { return }
        socket.allocation = nil
        socket.client = nil
        socket.closed = true
        if let channel = socket.channel {
            channel.close(promise: nil)
        } else if !socket.registering, socket.fd >= 0 {
            close(socket.fd)
            socket.fd = -1
        }
    }

    private func register(_ socket: RelaySocket) {
        socket.registering = true
        let fd = socket.fd
        socket.fd = -1  // NIO owns it from here, and closes it itself if registration fails.
        let lane = NIOLoopBound(self, eventLoop: loop)
        let boxed = NIOLoopBound(socket, eventLoop: loop)
        DatagramBootstrap(group: loop)
            // Peers may send up to 64 KiB; the default 2048-byte read would cut them short silently.
            .channelOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: 65_536))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(RelayHandler(lane: lane.value, socket: boxed.value))
                }
            }
            .withBoundSocket(fd)
            .whenComplete { result in
                let socket = boxed.value
                socket.registering = false
                switch result {
                case .success(let channel):
                    if socket.closed { channel.close(promise: nil) } else { socket.channel = channel }
                case .failure(let error):
                    lane.value.logger.warning("relay socket registration failed", metadata: ["relay": "\(socket.address)", "error": "\(error)"])
                    lane.value.relays[socket.address] = nil
                    if !socket.closed { lane.value.core.relayFailed(socket.address, now: Self.now) }
                }
            }
    }

    /// A non-blocking UDP socket bound to `address`, or nil when the port is taken.
    static func bindSocket(_ address: TransportAddress, dontFragment: Bool) -> Int32? {
        let family = address.ip.isIPv4 ? AF_INET : AF_INET6
        let fd = socket(family, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        var one: Int32 = 1
        if !address.ip.isIPv4 { setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &one, socklen_t(MemoryLayout<Int32>.size)) }
        if dontFragment {
            var mode = IP_PMTUDISC_DO
            if address.ip.isIPv4 {
                setsockopt(fd, Int32(IPPROTO_IP), IP_MTU_DISCOVER, &mode, socklen_t(MemoryLayout<Int32>.size))
            } else {
                setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_MTU_DISCOVER, &mode, socklen_t(MemoryLayout<Int32>.size))
            }
        }
        let ok = SocketAddress(address).withSockAddr { sa, len in bind(fd, sa, socklen_t(len)) == 0 }
        guard ok else {
            close(fd)
            return nil
        }
        return fd
    }
}

/// The core holds its ports strongly and the lane holds the core; this breaks the cycle.
private final class PortsTrampoline: TURNRelayPorts {
    weak var target: TURNLane?
    func serves(family: UInt8) -> Bool { target?.serves(family: family) ?? false }
    func openRelay(family: UInt8, even: Bool, reserveNext: Bool, dontFragment: Bool) -> (relay: TransportAddress, reserved: TransportAddress?)? {
        target?.openRelay(family: family, even: even, reserveNext: reserveNext, dontFragment: dontFragment)
    }
    func openReserved(_ address: TransportAddress, dontFragment: Bool) -> Bool { target?.openReserved(address, dontFragment: dontFragment) ?? false }
    func attach(_ relay: TransportAddress, to allocation: TURNAllocation) { target?.attach(relay, to: allocation) }
    func closeRelay(_ address: TransportAddress) { target?.closeRelay(address) }
}

/// One relay socket: bound at once, registered with NIO shortly after.
final class RelaySocket {
    let address: TransportAddress
    var fd: Int32
    var channel: (any Channel)?
    var allocation: TURNAllocation?
    /// The channel toward the allocation's client, and its address (UDP).
    var client: (any Channel)?
    var clientRemote: SocketAddress?
    var registering = false
    var closed = false

    init(address: TransportAddress, fd: Int32) {
        self.address = address
        self.fd = fd
    }
}

/// Reads datagrams from peers on a relay socket and hands them to the lane.
private final class RelayHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>

    private let lane: TURNLane
    private let socket: RelaySocket

    init(lane: TURNLane, socket: RelaySocket) {
        self.lane = lane
        self.socket = socket
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        lane.handlePeer(unwrapInboundIn(data), socket: socket)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        lane.peerBurstEnded()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // ICMP port unreachable from a peer surfaces here; the socket stays open.
    }
}

/// The TURN lanes of a service, one per event loop, found from the loop a handler runs on.
struct TURNLanes: Sendable {
    private let lanes: [NIOLoopBound<TURNLane>]

    init(_ lanes: [NIOLoopBound<TURNLane>]) { self.lanes = lanes }

    /// The lane of the calling event loop (call on an event loop of the service).
    func current(on loop: any EventLoop) -> TURNLane? {
        for lane in lanes where lane.eventLoop === loop { return lane.value }
        return nil
    }

    var all: [NIOLoopBound<TURNLane>] { lanes }
}

extension RelayAddressPlan {
    /// Relay IPs from the listen addresses: each family's first specific
    /// address, else (wildcard listening) the host's first non-loopback
    /// address of that family, else loopback.
    public static func derived(from listen: [TransportAddress], minPort: UInt16 = 49152, maxPort: UInt16 = 65535) -> RelayAddressPlan {
        var ips: [IPAddress] = []
        for family: UInt8 in [0x01, 0x02] {
            let mine = listen.filter { $0.ip.family == family }
            guard !mine.isEmpty else { continue }
            if let specific = mine.first(where: { !$0.ip.isUnspecified }) {
                ips.append(specific.ip)
            } else if let host = hostAddress(family: family) {
                ips.append(host)
            }
        }
        return RelayAddressPlan(ips: ips, minPort: minPort, maxPort: maxPort)
    }

    /// The first up, non-loopback interface address of a family; loopback when there is none.
    static func hostAddress(family: UInt8) -> IPAddress? {
        guard let interfaces = try? System.enumerateDevices() else { return nil }
        var loopback: IPAddress?
        for device in interfaces {
            guard let address = device.address.flatMap(TransportAddress.init), address.ip.family == family else { continue }
            if case .v6(let high, _) = address.ip, high >> 54 == 0x3FA { continue }  // fe80::/10 needs a scope
            if address.ip == .v4(0x7F00_0001) || address.ip == .v6(high: 0, low: 1) {
                loopback = address.ip
            } else {
                return address.ip
            }
        }
        return loopback
    }
}

extension TURNStatistics {
    mutating func merge(_ o: TURNStatistics) {
        allocationsActive += o.allocationsActive
        allocationsCreated += o.allocationsCreated
        allocationsExpired += o.allocationsExpired
        allocationsDeleted += o.allocationsDeleted
        permissionsExpired += o.permissionsExpired
        channelsExpired += o.channelsExpired
        packetsToPeer += o.packetsToPeer
        bytesToPeer += o.bytesToPeer
        packetsToClient += o.packetsToClient
        bytesToClient += o.bytesToClient
        authFailures += o.authFailures
        challenges += o.challenges
        for (code, n) in o.errors { errors[code, default: 0] += n }
        for i in drops.indices where i < o.drops.count { drops[i] += o.drops[i] }
    }
}
