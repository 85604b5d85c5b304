import CRelayIO
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import STUN
import TURN
import Transport
import TusaBase

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
/// Everything here is touched on that event loop only (the poller thread only
/// asks the loop to drain; see ``RelayPoller``).
///
/// Relay sockets are raw non-blocking UDP fds, not NIO channels (a channel
/// costs ~2.6 KB per allocation), and so are the primary UDP listeners
/// (``ListenerSocket``): all of them sit in one epoll set that the loop drains
/// with recvmmsg when the poller says it is readable. What a drain sends, toward
/// peers from the relay sockets and toward clients from the listener, is queued
/// in one ``PeerOutbox`` and leaves at the drain's end in sendmmsg batches, runs
/// to one destination as UDP GSO writes.
///
/// The stored properties a relayed datagram touches, here, in ``RelaySocket``,
/// ``PeerOutbox``, ``ListenerSocket`` and the TURN core, are
/// `@exclusivity(unchecked)`: Swift's run-time exclusivity checks (one per
/// access, each a thread-local lookup) cost about 3 % of the relay's CPU. They
/// are confined to the lane's loop, and no code passes one of them `inout` to a
/// call that touches it again; the compiler still checks what it can see.
final class TURNLane: TURNRelayPorts {
    let loop: any EventLoop
    let core: TURNServer
    let plan: RelayAddressPlan
    let logger: Logger

    /// The UDP listener of each server address, on this loop.
    @exclusivity(unchecked) private(set) var udpListeners: [TransportAddress: ListenerSocket] = [:]
    /// TCP control connections by 5-tuple.
    @exclusivity(unchecked) var connections: [FiveTuple: any Channel] = [:]
    @exclusivity(unchecked) fileprivate var relays: [TransportAddress: RelaySocket] = [:]
    /// Open (readable) relay sockets by fd: what the relay set's events name.
    @exclusivity(unchecked) private var socketsByFD: [RelaySocket?] = []
    /// The epoll set of the relay sockets that are read (held ports are not); -1 when it could not be made.
    private let relaySet: Int32
    @exclusivity(unchecked) private var poller: RelayPoller?
    /// The NIO pipe channel the poller wakes the loop through.
    private var wakeChannel: (any Channel)?
    /// The next drain while traffic flows (the batch window), watched by the loop itself.
    private let timer = RelayTimer()
    let inbox = RelayInbox()
    let outbox: PeerOutbox
    /// Drains so far (wrapping): a listener read in this drain has it as its `lastDrain`.
    private var drains = 0
    /// Tokens of one drain's ready relay sockets.
    @exclusivity(unchecked) private var ready = [UInt64](repeating: 0, count: TURNLane.readyPerWait)
    /// At most this many ready sockets come back from one wait of the relay set.
    static let readyPerWait = 256
    /// At most this many datagrams are read from one relay socket per drain, so that one flood cannot starve the rest.
    static let readsPerDrain = 2 * RelayInbox.slots
    /// At most this many datagrams per drain from the relay sockets together,
    /// and as many from the listeners, so that under load the loop alternates
    /// between the two directions instead of starving one (whose buffer then
    /// overflows). Sockets left readable are reported again at once (the
    /// set is level-triggered).
    static let datagramsPerDrain = 256
    /// A drain that read this many datagrams is followed by the next at once,
    /// not a batch window later: half the budget, far above what voice brings
    /// in a window (a window at 200 µs holds 20 datagrams per 100,000 packets/s).
    static let fullBatch = datagramsPerDrain / 2
    /// Listener tokens in the epoll set: the fd with this bit set (relay sockets' tokens are their fd).
    static let listenerToken: UInt64 = 1 << 40
    /// The outbox is sent when it holds this many bytes, even in the middle of a drain.
    static let outboxBytesLimit = 32 * 1024

    /// TCP channels toward clients written to since the last flush.
    @exclusivity(unchecked) private var unflushed: [any Channel] = []

    /// The core's next deadline (its expiry sweep), armed after every sweep: the
    /// hot paths do not move it, so it is not re-read per packet.
    private var sweep: Scheduled<Void>?
    /// The service's relay port ranges, shared with the other lanes.
    let ports: RelayPortPool
    /// Set by `stop()`: nothing new is allocated while the service drains.
    @exclusivity(unchecked) private var stopped = false

    /// See ``RelayService/Configuration/batchWindow``.
    let batchWindow: TimeAmount
    /// While it says memory is short, no relay socket is opened (the core answers 508).
    let memory: MemoryGuard?

    init(
        loop: any EventLoop, configuration: TURNServerConfiguration, plan: RelayAddressPlan, logger: Logger, gso: Bool = true,
        batchWindow: TimeAmount = .zero, ports: RelayPortPool? = nil, memory: MemoryGuard? = nil
    ) {
        self.loop = loop
        self.memory = memory
        self.ports = ports ?? RelayPortPool(plan: plan)
        self.batchWindow = batchWindow
        self.plan = plan
        self.logger = logger
        self.relaySet = relay_epoll_create()
        self.outbox = PeerOutbox(gso: gso)
        if relaySet < 0 { logger.error("cannot create the relay sockets' epoll set; no relays", metadata: ["errno": "\(errno)"]) }
        var configuration = configuration
        configuration.unixTimeAtZero = Timestamp.unixNanosecondsAtZero() / 1_000_000_000
        // The core needs its ports before it exists; `self` is complete once `core` is set.
        let placeholder = PortsTrampoline()
        self.core = TURNServer(configuration: configuration, relayPorts: placeholder)
        placeholder.target = self
    }

    /// Logs the events the core left (allocations made and deleted, failed
    /// authentications). Cheap when there are none: every hot-path call ends here.
    @inline(__always)
    func reportEvents() {
        while let action = core.pollAction() {
            guard case .event(let event) = action else { continue }
            switch event {
            case .allocated(let tuple, let user, let relays, let lifetime):
                logger.info(
                    "allocation",
                    metadata: [
                        "client": "\(tuple)", "user": "\(user)", "relays": "\(relays.map(\.description))",
                        "lifetime": "\(lifetime)",
                    ])
            case .deleted(let tuple, let relays, let reason, let toPeer, let toClient):
                logger.info(
                    "allocation deleted",
                    metadata: [
                        "client": "\(tuple)", "relays": "\(relays.map(\.description))", "reason": "\(reason)",
                        "packets-to-peer": "\(toPeer)", "packets-to-client": "\(toClient)",
                    ])
            case .authFailed(let tuple, let user):
                logger.notice("authentication failed", metadata: ["client": "\(tuple)", "user": "\(user)"])
            }
        }
    }

    /// Starts the expiry sweep and the poller thread that wakes the loop for peer datagrams.
    func start() {
        let lane = NIOLoopBound(self, eventLoop: loop)
        core.handleTimeout(now: Timestamp.now())
        armSweep()
        guard relaySet >= 0, poller == nil else { return }
        guard let poller = RelayPoller(relaySet: relaySet, name: "tusa-relay-poll") else {
            logger.error("cannot start the relay poller thread; peers' datagrams will not be read")
            return
        }
        self.poller = poller
        let wake = poller.wakeDescriptor
        NIOPipeBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(RelayWakeHandler(lane: lane.value))
                }
            }
            .takingOwnershipOfDescriptor(input: wake)
            .whenComplete { result in
                let lane = lane.value
                switch result {
                case .success(let channel):
                    if lane.stopped { channel.close(promise: nil) } else { lane.wakeChannel = channel }
                case .failure(let error):
                    // Left open: NIO closed it already unless it refused it before
                    // making a channel, and closing a number twice could close
                    // another socket's. One descriptor, on a failure said below.
                    lane.logger.error(
                        "cannot watch the relay poller's pipe; peers' datagrams will not be read", metadata: ["error": "\(error)"]
                    )
                }
            }
        timer.watch(
            on: loop, makeHandler: { RelayWakeHandler(lane: lane.value) },
            lost: { error in
                let lane = lane.value
                guard !lane.stopped else { return }
                lane.logger.warning(
                    "cannot watch the relay batch timer; drains follow the poller only", metadata: ["error": "\(error)"])
                // A drain may have armed it: the poller watches instead.
                lane.poller?.rearm()
            })
    }

    /// Schedules the core's `handleTimeout` at its `nextDeadline`, again after each.
    private func armSweep() {
        guard !stopped, let deadline = core.nextDeadline else { return }
        let lane = NIOLoopBound(self, eventLoop: loop)
        sweep = loop.scheduleTask(deadline: .uptimeNanoseconds(deadline.nanoseconds)) {
            let lane = lane.value
            lane.core.handleTimeout(now: Timestamp.now())
            lane.reportEvents()
            lane.armSweep()
        }
    }

    /// Deletes every allocation, closes every relay socket, stops the poller. Idempotent.
    func stop() {
        guard !stopped else { return }
        stopped = true
        sweep?.cancel()
        core.deleteAll(now: Timestamp.now())
        reportEvents()
        for address in Array(relays.keys) { closeRelay(address) }
        for listener in udpListeners.values {
            listener.mergeCounters()
            listener.close()
        }
        udpListeners.removeAll()
        poller?.stop()
        poller = nil
        timer.stop()
        wakeChannel?.close(promise: nil)
        wakeChannel = nil
        if relaySet >= 0 { close(relaySet) }
    }

    // MARK: - Client packets

    /// Handles a non-Binding packet from a TCP client; returns bytes to answer with, if any.
    /// Relayed payloads are queued until ``flushRelays()``.
    func handleClient(_ bytes: ByteBuffer, from tuple: FiveTuple) -> [UInt8]? {
        bytes.withUnsafeReadableBytes { handleClient($0, from: tuple, now: Timestamp.now()) }
    }

    /// Handles a non-Binding packet from a client; returns bytes to answer with, if any.
    /// Relayed payloads are queued until ``flushRelays()``.
    func handleClient(_ raw: UnsafeRawBufferPointer, from tuple: FiveTuple, now: Timestamp) -> [UInt8]? {
        guard !stopped else { return nil }
        defer { reportEvents() }
        if let first = raw.first, first < 0x40 { followWallClock(now: now) }
        switch core.handleClient(raw, from: tuple, now: now) {
        case .reply(let answer): return answer
        case .drop: return nil
        case .relay(let allocation, let peer, let range):
            // An allocation of one relay keeps its socket (`attach`); one of two looks it up by family.
            guard
                let socket = allocation.driverContext as? RelaySocket
                    ?? allocation.relay(toward: peer).flatMap({ relays[$0] }),
                socket.fd >= 0, range.lowerBound >= 0, range.upperBound <= raw.count
            else {
                core.recordDrop(.noRelaySocket)
                return nil
            }
            outbox.append(UnsafeRawBufferPointer(rebasing: raw[range]), to: peer, on: socket)
            return nil
        }
    }

    /// When the system clock was last read for the core's REST expiry checks.
    @exclusivity(unchecked) private var wallClockRead: Timestamp?

    /// Before a STUN request (never ChannelData), at most once a second: the core's
    /// Unix time follows the system clock, so that a clock stepped after start judges
    /// REST credentials as their issuer (the rendezvous, or a web service) dates them.
    private func followWallClock(now: Timestamp) {
        if let read = wallClockRead, now.nanoseconds &- read.nanoseconds < 1_000_000_000 { return }
        wallClockRead = now
        core.unixTimeAtZero = Timestamp.unixNanosecondsAtZero() / 1_000_000_000
    }

    /// Reads a primary UDP listener in this lane's drains from now on (the
    /// service calls this on the lane's loop, once per listener).
    /// A listener the lane cannot read (no poller, or epoll refused it) has its
    /// channel closed, which fails the service loudly rather than leave it deaf.
    func attach(_ listener: ListenerSocket) {
        guard !stopped, relaySet >= 0, poller != nil,
            relay_epoll_add(relaySet, listener.socket.fd, Self.listenerToken | UInt64(listener.socket.fd), 0) == 0
        else {
            logger.error(
                "cannot read the UDP listener", metadata: ["address": "\(listener.socket.address)", "errno": "\(errno)"])
            listener.close()
            listener.channel.close(promise: nil)
            return
        }
        udpListeners[listener.socket.address] = listener
        core.ownEndpoints.insert(listener.socket.address)
        let lane = NIOLoopBound(self, eventLoop: loop)
        let bound = NIOLoopBound(listener, eventLoop: loop)
        // NIO closed its descriptor (shutdown, or a fatal error): the lane's copy goes too.
        listener.channel.closeFuture.hop(to: loop).whenComplete { _ in lane.value.detach(bound.value) }
    }

    private func detach(_ listener: ListenerSocket) {
        guard udpListeners[listener.socket.address] === listener else { return }
        udpListeners[listener.socket.address] = nil
        listener.mergeCounters()
        // Closing the copy takes it out of the set; answers still queued are dropped by the flush.
        listener.close()
    }

    /// Sends what the read burst queued toward peers. A relay socket whose
    /// kernel buffer is full drops the rest of its queue (counted as backpressure).
    func flushRelays() {
        guard !outbox.isEmpty else { return }
        let dropped = outbox.flush(logger: logger)
        for _ in 0..<dropped { core.recordDrop(.backpressure) }
    }

    // MARK: - Peer packets

    /// Reads the listeners and relay sockets that have datagrams (on the loop,
    /// when the poller wakes it, or on the batch window's timer), then sends
    /// what that queued.
    ///
    /// While datagrams keep coming, the loop drains again one batch window
    /// later, woken by the lane's ``RelayTimer`` (without the wait when this drain
    /// read a full batch already): a steady trickle of voice is read and
    /// sent in batches, without a wake-up per datagram, and without allocating
    /// per drain. A drain that finds nothing hands the watching back to the
    /// relay set, so an idle relay sleeps and the first datagram after a pause
    /// is read at once. (Internal, not private, for the lane's tests.)
    func drainRelays() {
        guard !stopped, relaySet >= 0 else { return }
        let n = ready.withUnsafeMutableBufferPointer { relay_epoll_wait(relaySet, $0.baseAddress, Int32($0.count), 0) }
        var budget = Self.datagramsPerDrain
        var listenerBudget = Self.datagramsPerDrain
        for i in 0..<max(0, Int(n)) {
            let token = ready[i]
            if token & Self.listenerToken != 0 {
                let fd = Int32(truncatingIfNeeded: token & 0xFFFF_FFFF)
                guard listenerBudget > 0, let listener = udpListeners.values.first(where: { $0.socket.fd == fd }) else {
                    continue
                }
                listener.lastDrain = drains
                listenerBudget -= read(listener, atMost: listenerBudget)
            } else {
                let fd = Int(truncatingIfNeeded: token)
                guard budget > 0, fd >= 0, fd < socketsByFD.count, let socket = socketsByFD[fd] else { continue }
                budget -= read(socket, atMost: min(budget, Self.readsPerDrain))
            }
            if outbox.byteCount >= Self.outboxBytesLimit { flushRelays() }
        }
        if Int(n) == ready.count {
            // The set may hold more ready sockets than one wait returns, and it
            // reports them in turn: with thousands of relay sockets ready, a
            // listener would wait for its turn over several drains while the
            // clients' datagrams, all on that one socket, overflow its buffer.
            // Under such load the listeners are read in every drain.
            for listener in udpListeners.values where listener.lastDrain != drains && listenerBudget > 0 {
                listenerBudget -= read(listener, atMost: listenerBudget)
                if outbox.byteCount >= Self.outboxBytesLimit { flushRelays() }
            }
        }
        drains &+= 1
        flushRelays()
        for listener in udpListeners.values { listener.mergeCounters() }
        for channel in unflushed { channel.flush() }
        unflushed.removeAll(keepingCapacity: true)
        let read = 2 * Self.datagramsPerDrain - budget - listenerBudget
        if budget <= 0 || listenerBudget <= 0 || read >= Self.fullBatch {
            // Busy enough to batch without waiting; a window would only add
            // latency (and cap a closed-loop load at a batch per window). Back
            // through the timer, not `execute`: NIO runs tasks until none is
            // left, so drains queued one after another would starve the loop's
            // other sockets.
            drainAgain(after: .nanoseconds(1))
        } else if read > 0 && batchWindow > .zero {
            drainAgain(after: batchWindow)
        } else {
            poller?.rearm()
        }
    }

    /// The next drain `delay` from now, whatever arrives meanwhile (the relay set
    /// stays disarmed); on the poller's next readiness when there is no timer.
    private func drainAgain(after delay: TimeAmount) {
        if !timer.arm(after: delay) { poller?.rearm() }
    }

    /// Reads up to `limit` datagrams from a relay socket; returns how many.
    private func read(_ socket: RelaySocket, atMost limit: Int) -> Int {
        inbox.read(
            atMost: limit, from: { socket.fd }, truncated: { core.recordDrop(.tooLarge) },
            handle: { handlePeer($0, from: $1, socket: socket, now: $2) })
    }

    private func handlePeer(_ payload: UnsafeRawBufferPointer, from peer: TransportAddress, socket: RelaySocket, now: Timestamp) {
        guard let allocation = socket.allocation else { return }
        switch core.handlePeer(payload, from: peer, allocation: allocation, now: now) {
        case .drop: return
        case .channel(let number, let tuple):
            if tuple.transport == .udp {
                guard let listener = socket.clientListener ?? udpListeners[tuple.server]?.socket else { return }
                outbox.append(payload, to: tuple.client, on: listener, channel: number)
                return
            }
            guard let channel = socket.client ?? connections[tuple] else { return }
            let length = payload.count
            // A TCP client that stops reading must not make the server buffer its peer's flood.
            guard channel.isWritable else {
                core.recordDrop(.backpressure)
                return
            }
            let padding = (4 - length % 4) % 4
            var frame = channel.allocator.buffer(capacity: 4 + length + padding)
            frame.writeInteger(number)
            frame.writeInteger(UInt16(truncatingIfNeeded: length))
            frame.writeBytes(payload)
            if padding > 0 { frame.writeRepeatingByte(0, count: padding) }
            channel.write(frame, promise: nil)
            markUnflushed(channel)
        case .indication(let bytes, let tuple):
            if tuple.transport == .udp {
                guard let listener = socket.clientListener ?? udpListeners[tuple.server]?.socket else { return }
                bytes.withUnsafeBytes { outbox.append($0, to: tuple.client, on: listener, answer: true) }
                return
            }
            guard let channel = socket.client ?? connections[tuple] else { return }
            guard channel.isWritable else {
                core.recordDrop(.backpressure)
                return
            }
            var buffer = channel.allocator.buffer(capacity: bytes.count)
            buffer.writeBytes(bytes)
            channel.write(buffer, promise: nil)
            markUnflushed(channel)
        }
    }

    private func markUnflushed(_ channel: any Channel) {
        if !unflushed.contains(where: { $0 === channel }) { unflushed.append(channel) }
    }

    // MARK: - TURNRelayPorts

    func serves(family: UInt8) -> Bool { plan.ip(for: family) != nil }

    func openRelay(family: UInt8, even: Bool, reserveNext: Bool, dontFragment: Bool) -> (
        relay: TransportAddress, reserved: TransportAddress?
    )? {
        guard !stopped, relaySet >= 0, let ip = plan.ip(for: family) else { return nil }
        if let short = memory?.admit() {
            reportMemory(short)
            return nil
        }
        var bound: (relay: RelaySocket, reserved: RelaySocket?)?
        // No socket can be made (too many open files): no other port would do better,
        // so the draw stops trying them (every try a failing syscall) and says why.
        var shortage: Int32?
        let port = ports.take(family: family, even: even, pair: reserveNext) { port in
            guard shortage == nil else { return false }
            let address = TransportAddress(ip: ip, port: UInt16(port))
            guard let fd = Self.bindSocket(address, dontFragment: dontFragment, shortage: &shortage) else { return false }
            guard reserveNext else {
                bound = (RelaySocket(address: address, fd: fd), nil)
                return true
            }
            let next = TransportAddress(ip: ip, port: UInt16(port + 1))
            guard let fd2 = Self.bindSocket(next, dontFragment: dontFragment, shortage: &shortage) else {
                close(fd)
                return false
            }
            bound = (RelaySocket(address: address, fd: fd), RelaySocket(address: next, fd: fd2))
            return true
        }
        if port == nil, let shortage { reportShortage(shortage) }
        guard port != nil, let (socket, reserved) = bound else { return nil }
        relays[socket.address] = socket
        if let reserved { relays[reserved.address] = reserved }
        guard startReading(socket) else {
            closeRelay(socket.address)
            if let reserved { closeRelay(reserved.address) }
            return nil
        }
        return (socket.address, reserved?.address)
    }

    func openReserved(_ address: TransportAddress, dontFragment: Bool) -> Bool {
        guard !stopped, let socket = relays[address], socket.fd >= 0, !socket.reading else { return false }
        return startReading(socket)
    }

    func attach(_ relay: TransportAddress, to allocation: TURNAllocation) {
        guard let socket = relays[relay] else { return }
        socket.allocation = allocation
        if allocation.relays.count == 1 { allocation.driverContext = socket }
        // Resolved once, not per datagram: where this relay's traffic to the client leaves.
        if allocation.tuple.transport == .udp {
            socket.clientListener = udpListeners[allocation.tuple.server]?.socket
        } else {
            socket.client = connections[allocation.tuple]
        }
    }

    func closeRelay(_ address: TransportAddress) {
        guard let socket = relays.removeValue(forKey: address) else { return }
        ports.release(family: address.ip.family, port: Int(address.port))
        if let allocation = socket.allocation, allocation.driverContext === socket { allocation.driverContext = nil }
        socket.allocation = nil
        socket.client = nil
        socket.clientListener = nil
        guard socket.fd >= 0 else { return }
        let fd = Int(socket.fd)
        if fd < socketsByFD.count, socketsByFD[fd] === socket { socketsByFD[fd] = nil }
        // Closing also takes it out of the relay set.
        close(socket.fd)
        socket.fd = -1
        socket.reading = false
    }

    /// Puts a bound relay socket in the relay set; false (the socket stays as it was) if epoll refuses.
    private func startReading(_ socket: RelaySocket) -> Bool {
        guard socket.fd >= 0, relay_epoll_add(relaySet, socket.fd, UInt64(socket.fd), 0) == 0 else {
            logger.warning("relay socket registration failed", metadata: ["relay": "\(socket.address)", "errno": "\(errno)"])
            return false
        }
        let fd = Int(socket.fd)
        if fd >= socketsByFD.count { socketsByFD.append(contentsOf: repeatElement(nil, count: fd + 1 - socketsByFD.count)) }
        socketsByFD[fd] = socket
        socket.reading = true
        return true
    }

    /// A non-blocking UDP socket bound to `address`, or nil when the port is taken
    /// or (`shortage` set to its errno) no socket could be made at all.
    static func bindSocket(_ address: TransportAddress, dontFragment: Bool, shortage: inout Int32?) -> Int32? {
        do {
            return try bindUDPSocket(address) { fd in
                guard dontFragment else { return }
                var mode = IP_PMTUDISC_DO
                if address.ip.isIPv4 {
                    setsockopt(fd, Int32(IPPROTO_IP), IP_MTU_DISCOVER, &mode, socklen_t(MemoryLayout<Int32>.size))
                } else {
                    setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_MTU_DISCOVER, &mode, socklen_t(MemoryLayout<Int32>.size))
                }
            }
        } catch {
            if error.call == "socket" { shortage = error.errno }
            return nil
        }
    }

    /// When a shortage of sockets was last logged.
    private var shortageSaid: Timestamp?

    /// An allocation refused (508) because no socket could be made: said once a minute.
    private func reportShortage(_ code: Int32) {
        let now = Timestamp.now()
        if let said = shortageSaid, now.nanoseconds &- said.nanoseconds < 60_000_000_000 { return }
        shortageSaid = now
        logger.error(
            "cannot open relay sockets: \(ResourceShortage.describe(errno: code)); allocations are refused (508) until some close"
        )
    }

    /// When a shortage of memory was last logged.
    private var memorySaid: Timestamp?

    /// An allocation refused (508) for memory: said once every 10 s.
    private func reportMemory(_ use: MemoryUse) {
        let now = Timestamp.now()
        if let said = memorySaid, now.nanoseconds &- said.nanoseconds < 10_000_000_000 { return }
        memorySaid = now
        logger.error("allocation refused (508): memory short, \(use)")
    }
}

/// The core holds its ports strongly and the lane holds the core; this breaks the cycle.
private final class PortsTrampoline: TURNRelayPorts {
    weak var target: TURNLane?
    func serves(family: UInt8) -> Bool { target?.serves(family: family) ?? false }
    func openRelay(family: UInt8, even: Bool, reserveNext: Bool, dontFragment: Bool) -> (
        relay: TransportAddress, reserved: TransportAddress?
    )? {
        target?.openRelay(family: family, even: even, reserveNext: reserveNext, dontFragment: dontFragment)
    }
    func openReserved(_ address: TransportAddress, dontFragment: Bool) -> Bool {
        target?.openReserved(address, dontFragment: dontFragment) ?? false
    }
    func attach(_ relay: TransportAddress, to allocation: TURNAllocation) { target?.attach(relay, to: allocation) }
    func closeRelay(_ address: TransportAddress) { target?.closeRelay(address) }
}

/// One relay socket: a bound non-blocking UDP fd, read once it is in the lane's relay set.
final class RelaySocket {
    let address: TransportAddress
    /// -1 once closed.
    @exclusivity(unchecked) var fd: Int32
    /// In the relay set (a held EVEN-PORT reservation is bound but not read).
    @exclusivity(unchecked) var reading = false
    @exclusivity(unchecked) var allocation: TURNAllocation?
    /// The channel toward the allocation's client over TCP.
    @exclusivity(unchecked) var client: (any Channel)?
    /// The listener toward the allocation's client over UDP.
    @exclusivity(unchecked) var clientListener: RelaySocket?
    /// This socket's queue in the lane's ``PeerOutbox`` (entry indices, -1: empty).
    @exclusivity(unchecked) var outHead = -1
    @exclusivity(unchecked) var outTail = -1
    /// A listener's socket: what the outbox sends on it goes toward clients.
    @exclusivity(unchecked) var towardClients = false

    init(address: TransportAddress, fd: Int32) {
        self.address = address
        self.fd = fd
    }
}

/// Reads the poller's wake-up bytes; each read burst drains the relay sockets once.
private final class RelayWakeHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    private let lane: TURNLane

    init(lane: TURNLane) { self.lane = lane }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}

    func channelReadComplete(context: ChannelHandlerContext) {
        lane.drainRelays()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        lane.logger.warning("relay poller pipe error", metadata: ["error": "\(error)"])
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
    public static func derived(from listen: [TransportAddress], minPort: UInt16 = 49152, maxPort: UInt16 = 65535)
        -> RelayAddressPlan
    {
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
        NetworkInterfaces.addresses(family == 0x01 ? .ipv4 : .ipv6, includeLoopback: true).first
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
