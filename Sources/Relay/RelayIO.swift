import CRelayIO
import Logging
import NIOCore
import NIOPosix
import STUN
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// The relay sockets' I/O, without a NIO channel per socket: a relay socket is a
// raw non-blocking UDP fd in its lane's epoll set, read with recvmmsg on the
// lane's event loop when a poller thread says the set is readable, and written
// with sendmmsg (UDP GSO for runs to one peer) from the event loop. Per
// allocation that costs the fd and a `RelaySocket`.

// MARK: - Socket addresses

extension TransportAddress {
    /// The address in a `sockaddr_storage` the kernel filled in; nil for other families.
    init?(_ storage: UnsafePointer<sockaddr_storage>) {
        let raw = UnsafeRawPointer(storage)
        switch Int32(storage.pointee.ss_family) {
        case AF_INET:
            let sin = raw.load(as: sockaddr_in.self)
            self.init(ip: .v4(UInt32(bigEndian: sin.sin_addr.s_addr)), port: UInt16(bigEndian: sin.sin_port))
        case AF_INET6:
            let sin6 = raw.load(as: sockaddr_in6.self)
            let (high, low) = withUnsafeBytes(of: sin6.sin6_addr) { bytes in
                (
                    UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt64.self)),
                    UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
                )
            }
            self.init(ip: .v6(high: high, low: low), port: UInt16(bigEndian: sin6.sin6_port))
        default:
            return nil
        }
    }

    /// Writes the address into `storage`; returns its length.
    func store(into storage: inout sockaddr_storage) -> UInt32 {
        withUnsafeMutableBytes(of: &storage) { raw in
            switch ip {
            case .v4(let v4):
                var sin = sockaddr_in()
                sin.sin_family = sa_family_t(AF_INET)
                sin.sin_port = port.bigEndian
                sin.sin_addr.s_addr = v4.bigEndian
                raw.storeBytes(of: sin, as: sockaddr_in.self)
                return UInt32(MemoryLayout<sockaddr_in>.size)
            case .v6(let high, let low):
                var sin6 = sockaddr_in6()
                sin6.sin6_family = sa_family_t(AF_INET6)
                sin6.sin6_port = port.bigEndian
                withUnsafeMutableBytes(of: &sin6.sin6_addr) { bytes in
                    bytes.storeBytes(of: high.bigEndian, toByteOffset: 0, as: UInt64.self)
                    bytes.storeBytes(of: low.bigEndian, toByteOffset: 8, as: UInt64.self)
                }
                raw.storeBytes(of: sin6, as: sockaddr_in6.self)
                return UInt32(MemoryLayout<sockaddr_in6>.size)
            }
        }
    }
}

// MARK: - Sockets

/// A UDP socket could not be made: the call that failed and its errno.
struct UDPSocketError: Error, CustomStringConvertible {
    let address: TransportAddress
    let call: String
    let errno: Int32

    var description: String { "\(call) \(address): \(String(cString: strerror(errno)))" }
}

/// A non-blocking close-on-exec UDP socket bound to `address` (an IPv6 one
/// v6-only), `configure` setting its options before the bind. Nothing is
/// left open when it throws.
func bindUDPSocket(_ address: TransportAddress, configure: (Int32) -> Void = { _ in }) throws(UDPSocketError) -> Int32 {
    let family = address.ip.isIPv4 ? AF_INET : AF_INET6
    let fd = socket(family, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw UDPSocketError(address: address, call: "socket", errno: errno) }
    var one: Int32 = 1
    if !address.ip.isIPv4 { setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &one, socklen_t(MemoryLayout<Int32>.size)) }
    configure(fd)
    var storage = sockaddr_storage()
    let length = address.store(into: &storage)
    let bound = withUnsafePointer(to: &storage) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(length)) == 0 }
    }
    guard bound else {
        let error = UDPSocketError(address: address, call: "bind", errno: errno)
        close(fd)
        throw error
    }
    return fd
}

// MARK: - Poller

/// Wakes a lane's event loop when its relay sockets have datagrams.
///
/// The lane's relay sockets sit in one epoll set (`relaySet`, read by the
/// loop). NIO has no public way to watch such a descriptor, so a thread of
/// its own does: the relay set sits, one-shot, in the poller's own epoll set
/// beside an eventfd that stops it, and when the relay set turns readable the
/// thread writes a byte to a pipe whose read end is a NIO pipe channel on the
/// loop (``wakeDescriptor``). The loop then drains the relay set in its I/O
/// phase, taking turns with the listeners (an `execute` task would not: NIO
/// runs tasks until none is left, so drains re-armed one after another would
/// starve the listeners). The registration stays disarmed until the loop,
/// having drained, calls ``rearm()``: at most one wake-up is pending, and
/// what arrives meanwhile is read in the same batch. While traffic flows the
/// loop asks for the next drain after its batch window instead, from a
/// ``RelayTimer`` it watches itself, and leaves the relay set disarmed: the
/// thread only wakes the loop from idle. It never touches a relay socket or
/// the lane.
final class RelayPoller: Sendable {
    /// The poller's epoll set, its stop eventfd and the pipe's write end: made
    /// in `init`, closed in ``stop()`` once the thread has been joined, so the
    /// thread never sees them closed.
    private let pollSet: Int32
    private let stopEvent: Int32
    private let wakeWrite: Int32
    private let relaySet: Int32
    private let thread: pthread_t
    /// The pipe's read end, for `NIOPipeBootstrap.takingOwnershipOfDescriptor(input:)`;
    /// whoever takes it closes it (NIO, or the lane if NIO refuses it).
    let wakeDescriptor: Int32

    private static let stopToken: UInt64 = 0
    private static let relayToken: UInt64 = 1

    /// Starts the thread; nil (nothing left open) if a descriptor or the thread cannot be made.
    init?(relaySet: Int32, name: String) {
        var pipe: [Int32] = [-1, -1]
        let pollSet = relay_epoll_create()
        let stopEvent = relay_eventfd()
        let piped = pipe.withUnsafeMutableBufferPointer { relay_pipe($0.baseAddress) } == 0
        func closeAll() {
            for fd in [pollSet, stopEvent] + pipe where fd >= 0 { close(fd) }
        }
        guard pollSet >= 0, stopEvent >= 0, piped,
            relay_epoll_add(pollSet, stopEvent, Self.stopToken, 0) == 0,
            relay_epoll_add(pollSet, relaySet, Self.relayToken, 1) == 0
        else {
            closeAll()
            return nil
        }
        let wakeWrite = pipe[1]
        let body = ThreadBody(name: name) {
            var tokens = [UInt64](repeating: 0, count: 2)
            while true {
                let n = relay_epoll_wait(pollSet, &tokens, 2, -1)
                if n < 0 {
                    if errno == EINTR { continue }
                    return
                }
                if tokens[0..<Int(n)].contains(Self.stopToken) { return }
                if n > 0 { relay_pipe_signal(wakeWrite) }
            }
        }
        var thread = pthread_t()
        let box = Unmanaged.passRetained(body).toOpaque()
        let started = pthread_create(
            &thread, nil,
            { argument in
                guard let argument else { return nil }
                let body = Unmanaged<ThreadBody>.fromOpaque(argument).takeRetainedValue()
                body.run()
                return nil
            }, box)
        guard started == 0 else {
            Unmanaged<ThreadBody>.fromOpaque(box).release()
            closeAll()
            return nil
        }
        self.pollSet = pollSet
        self.stopEvent = stopEvent
        self.wakeWrite = wakeWrite
        self.wakeDescriptor = pipe[0]
        self.relaySet = relaySet
        self.thread = thread
    }

    /// The loop has drained the relay set: report it again when it next turns readable.
    func rearm() {
        _ = relay_epoll_rearm(pollSet, relaySet, Self.relayToken)
    }

    /// Stops and joins the thread (it wakes at once), then closes the poller's
    /// own fds. Call once, from the lane's loop; the relay set and the pipe's
    /// read end are not the poller's to close.
    func stop() {
        _ = relay_eventfd_signal(stopEvent)
        pthread_join(thread, nil)
        close(stopEvent)
        close(pollSet)
        close(wakeWrite)
    }
}

/// What a poller thread runs; handed to `pthread_create` as an opaque pointer.
private final class ThreadBody: Sendable {
    let name: String
    let body: @Sendable () -> Void
    init(name: String, body: @escaping @Sendable () -> Void) {
        self.name = name
        self.body = body
    }
    func run() {
        relay_name_thread(name)
        body()
    }
}

/// The lane's batch window: a timerfd that the lane's event loop watches
/// itself, through a NIO pipe channel that takes it as input (a read returns
/// the timer's 8-byte expiry count). A drain one window later then costs the
/// loop's own wake-up and the timer's read, where a timer in the poller's set
/// cost the poller thread's wake-up, its pipe write, and two thread switches.
/// Armed from the loop; no allocation per arming, unlike a NIO scheduled task.
/// Confined to the lane's event loop.
final class RelayTimer {
    /// The timerfd, -1 when it could not be made, NIO refused it, or the timer
    /// stopped. Once NIO has taken it, NIO closes it with its channel.
    @exclusivity(unchecked) private(set) var fd: Int32
    private var state = State.own

    private enum State {
        /// Not handed to NIO (never, or not yet): ours to close.
        case own
        /// Handed to NIO, the registration not complete yet.
        case handingOver
        case watched(any Channel)
        case stopped
    }

    init() { fd = relay_timerfd() }

    deinit {
        if case .own = state, fd >= 0 { close(fd) }
    }

    /// Hands the timerfd to a pipe channel on `loop` (call on it, once), whose reads
    /// go to the handler `makeHandler` returns. When NIO refuses it, or closes the
    /// channel later (not through ``stop()``), `lost` runs on the loop: the timer is
    /// gone, ``arm(after:)`` false from then on. A refused descriptor is left open:
    /// NIO may have closed it already, and closing a number twice could close
    /// another socket's.
    func watch(
        on loop: any EventLoop, makeHandler: @escaping @Sendable () -> any ChannelHandler,
        lost: @escaping @Sendable (any Error) -> Void
    ) {
        guard fd >= 0, case .own = state else { return }
        state = .handingOver
        let bound = NIOLoopBound(self, eventLoop: loop)
        let descriptor = fd
        NIOPipeBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(makeHandler()) }
            }
            .takingOwnershipOfDescriptor(input: descriptor)
            .whenComplete { result in
                let timer = bound.value
                switch result {
                case .success(let channel):
                    if case .stopped = timer.state {
                        channel.close(promise: nil)
                        return
                    }
                    timer.state = .watched(channel)
                    channel.closeFuture.whenComplete { _ in
                        let timer = bound.value
                        guard case .watched = timer.state else { return }
                        timer.gone()
                        lost(ChannelError.ioOnClosedChannel)
                    }
                case .failure(let error):
                    guard case .handingOver = timer.state else { return }
                    timer.gone()
                    lost(error)
                }
            }
    }

    /// NIO has the descriptor no more: its number is never used again here.
    private func gone() {
        state = .stopped
        fd = -1
    }

    /// Fires once, `delay` from now (at least 1 ns); false when there is no timer.
    func arm(after delay: TimeAmount) -> Bool {
        fd >= 0 && relay_timerfd_arm(fd, delay.nanoseconds) == 0
    }

    /// Closes the timer (NIO's channel, or the timerfd if NIO never took it). Idempotent.
    func stop() {
        switch state {
        case .own: if fd >= 0 { close(fd) }
        case .handingOver: break  // the registration's completion closes it
        case .watched(let channel): channel.close(promise: nil)
        case .stopped: break
        }
        state = .stopped
        fd = -1
    }
}

// MARK: - Outgoing datagrams

/// Datagrams a lane's drain sends, toward peers from the relay sockets and
/// toward clients from the listeners, queued while the drain lasts and sent
/// at its end: per socket, runs to one destination of one size as one UDP
/// GSO write (`UDP_SEGMENT`), everything in as few sendmmsg calls as possible.
/// Confined to the lane's event loop.
final class PeerOutbox {
    private struct Entry {
        var peer: TransportAddress
        var offset: Int
        var length: Int
        /// May share a GSO write with its neighbours: relayed data, not a STUN
        /// answer (a capture on loopback shows a GSO write as one datagram, and
        /// two answers in one datagram would not read as STUN).
        var segmentable: Bool
        /// The next entry of the same relay socket, or -1.
        var next: Int
    }

    /// The payloads, back to back.
    @exclusivity(unchecked) private var bytes: [UInt8] = []
    @exclusivity(unchecked) private var entries: [Entry] = []
    /// Sockets with queued entries, in the order they were first written.
    @exclusivity(unchecked) private var dirty: [RelaySocket] = []
    private let messages = UnsafeMutablePointer<relay_message>.allocate(capacity: Int(RELAY_BATCH))
    private let iovs = UnsafeMutablePointer<iovec>.allocate(capacity: PeerOutbox.iovCapacity)
    /// Where each message of a batch starts in the chain, and its datagram count.
    @exclusivity(unchecked) private var firstEntry = [Int](repeating: 0, count: Int(RELAY_BATCH))
    @exclusivity(unchecked) private var segmentCount = [Int](repeating: 0, count: Int(RELAY_BATCH))

    static let iovCapacity = 1024
    /// See ``UDPListenerHandler/maxSegmentSize``: larger payloads go one by one.
    static let maxSegmentSize = UDPListenerHandler.maxSegmentSize
    static let maxSegments = UDPListenerHandler.maxSegments
    static let maxGSOBytes = UDPListenerHandler.maxGSOBytes
    /// Above this, the payload buffer's capacity is given back after a flush.
    static let keptCapacity = 1 << 20

    /// Toward peers (relay sockets) and toward clients (listeners): a path
    /// that refuses GSO writes switches them off for its direction only.
    @exclusivity(unchecked) var gso: [GSOState]

    init(gso: Bool) {
        self.gso = [GSOState(enabled: gso), GSOState(enabled: gso)]
    }

    deinit {
        messages.deallocate()
        iovs.deallocate()
    }

    var isEmpty: Bool { entries.isEmpty }

    /// Bytes queued.
    var byteCount: Int { bytes.count }

    /// Queues `payload` for `peer` on `socket`; with `channel`, as ChannelData
    /// of that number (RFC 8656 §12.4; over UDP without padding). A STUN
    /// `answer` always leaves as a datagram of its own.
    func append(
        _ payload: UnsafeRawBufferPointer, to peer: TransportAddress, on socket: RelaySocket, channel: UInt16? = nil,
        answer: Bool = false
    ) {
        let index = entries.count
        let header = channel == nil ? 0 : 4
        entries.append(
            Entry(peer: peer, offset: bytes.count, length: header + payload.count, segmentable: !answer, next: -1))
        if let channel {
            let length = UInt16(truncatingIfNeeded: payload.count)
            bytes.append(UInt8(channel >> 8))
            bytes.append(UInt8(channel & 0xFF))
            bytes.append(UInt8(length >> 8))
            bytes.append(UInt8(length & 0xFF))
        }
        bytes.append(contentsOf: payload)
        if socket.outTail >= 0, socket.outTail < index {
            entries[socket.outTail].next = index
        } else {
            socket.outHead = index
            dirty.append(socket)
        }
        socket.outTail = index
    }

    /// Sends everything queued. Returns the datagrams dropped because a
    /// socket's send buffer was full (EAGAIN).
    func flush(logger: Logger) -> Int {
        var dropped = 0
        bytes.withUnsafeBytes { base in
            for socket in dirty {
                if socket.fd >= 0 { dropped += send(chainFrom: socket.outHead, on: socket, base: base, logger: logger) }
                socket.outHead = -1
                socket.outTail = -1
            }
        }
        dirty.removeAll(keepingCapacity: true)
        entries.removeAll(keepingCapacity: entries.capacity <= 4096)
        bytes.removeAll(keepingCapacity: bytes.capacity <= Self.keptCapacity)
        return dropped
    }

    private func send(chainFrom head: Int, on socket: RelaySocket, base: UnsafeRawBufferPointer, logger: Logger) -> Int {
        let fd = socket.fd
        let direction = socket.towardClients ? 1 : 0
        var cursor = head
        var dropped = 0
        while cursor >= 0 {
            // One batch: up to RELAY_BATCH messages, each one datagram or one GSO run.
            var count = 0
            var iovCount = 0
            while cursor >= 0, count < Int(RELAY_BATCH), iovCount + Self.maxSegments <= Self.iovCapacity {
                let first = entries[cursor]
                firstEntry[count] = cursor
                messages[count].iov_start = Int32(iovCount)
                messages[count].to_length = first.peer.store(into: &messages[count].to)
                iovs[iovCount] = iovec(
                    iov_base: UnsafeMutableRawPointer(mutating: base.baseAddress.map { $0 + first.offset }), iov_len: first.length
                )
                iovCount += 1
                var segments = 1
                cursor = first.next
                if gso[direction].enabled && first.segmentable && first.length > 0 && first.length <= Self.maxSegmentSize {
                    let limit = min(Self.maxSegments, Self.maxGSOBytes / first.length)
                    while cursor >= 0, segments < limit {
                        let next = entries[cursor]
                        guard next.length == first.length, next.segmentable, next.peer == first.peer else { break }
                        iovs[iovCount] = iovec(
                            iov_base: UnsafeMutableRawPointer(mutating: base.baseAddress.map { $0 + next.offset }),
                            iov_len: next.length)
                        iovCount += 1
                        segments += 1
                        cursor = next.next
                    }
                }
                messages[count].iov_count = Int32(segments)
                messages[count].segment = segments > 1 ? UInt16(first.length) : 0
                segmentCount[count] = segments
                count += 1
            }
            var sent = 0
            while sent < count {
                let n = Int(relay_send_batch(fd, messages + sent, Int32(count - sent), iovs))
                if n > 0 {
                    if !gso[direction].confirmed, (sent..<(sent + n)).contains(where: { messages[$0].segment > 0 }) {
                        gso[direction].confirmed = true
                    }
                    sent += n
                    continue
                }
                let error = errno
                if error == EAGAIN || error == EWOULDBLOCK || error == ENOBUFS {
                    // The send buffer is full: what is left of this socket's queue goes.
                    dropped += segmentCount[sent..<count].reduce(0, +)
                    while cursor >= 0 {
                        dropped += 1
                        cursor = entries[cursor].next
                    }
                    return dropped
                }
                if messages[sent].segment > 0 && !gso[direction].confirmed {
                    // GSO refused before it ever worked: off, and this run again one by one.
                    gso[direction].disable(
                        String(cString: strerror(error)), logger: logger,
                        what: direction == 1 ? "ChannelData toward clients" : "relayed datagrams toward peers")
                    cursor = firstEntry[sent]
                    break
                }
                // Refused (a too-large datagram with DONT-FRAGMENT, an unroutable peer): skip it.
                sent += 1
            }
        }
        return dropped
    }
}

/// Whether UDP GSO writes are made, and whether one has ever succeeded: until
/// then, a failure switches them off (the kernel or the path does not take them).
struct GSOState {
    private(set) var enabled: Bool
    var confirmed = false

    init(enabled: Bool) { self.enabled = enabled && System.supportsUDPSegmentationOffload }

    mutating func disable(_ error: String, logger: Logger, what: String) {
        guard enabled else { return }
        enabled = false
        logger.notice("UDP GSO write failed; sending one datagram at a time", metadata: ["what": "\(what)", "error": "\(error)"])
    }
}

// MARK: - From peers

/// The lane's receive slots: one recvmmsg batch of datagrams up to 64 KiB each.
/// The slots are virtual memory until a datagram touches them.
final class RelayInbox {
    static let slots = 32
    /// Larger than any UDP payload, so only a broken kernel could truncate; a
    /// truncated datagram is dropped and counted anyway.
    static let slotSize = 65_536
    let buffer = UnsafeMutableRawPointer.allocate(byteCount: RelayInbox.slots * RelayInbox.slotSize, alignment: 16)
    let datagrams = UnsafeMutablePointer<relay_datagram>.allocate(capacity: RelayInbox.slots)

    deinit {
        buffer.deallocate()
        datagrams.deallocate()
    }

    /// Reads up to `limit` (at most ``slots``) datagrams from `fd`; returns how many (0 on EAGAIN or an error).
    func receive(from fd: Int32, atMost limit: Int) -> Int {
        let count = Int32(max(0, min(limit, Self.slots)))
        let n = relay_recv_batch(fd, buffer.assumingMemoryBound(to: UInt8.self), Self.slotSize, count, datagrams)
        return n > 0 ? Int(n) : 0
    }

    /// Reads up to `limit` datagrams from the socket `fd()` names, a batch at a
    /// time until a batch comes short or the socket is closed meanwhile
    /// (`fd()` < 0), and hands each to `handle` with its batch's arrival time
    /// (a truncated one to `truncated` instead); returns how many were read.
    func read(
        atMost limit: Int, from fd: () -> Int32, truncated: () -> Void,
        handle: (UnsafeRawBufferPointer, TransportAddress, Timestamp) -> Void
    ) -> Int {
        var total = 0
        while total < limit, fd() >= 0 {
            let count = receive(from: fd(), atMost: limit - total)
            total += count
            let now = Timestamp.now()
            for i in 0..<count {
                let (payload, from) = datagram(i)
                guard let from else { continue }
                guard let payload else {
                    truncated()
                    continue
                }
                handle(payload, from, now)
            }
            if count < Self.slots { break }
        }
        return total
    }

    /// Datagram `i` of the last ``receive(from:atMost:)``: its bytes (nil if truncated) and sender.
    func datagram(_ i: Int) -> (payload: UnsafeRawBufferPointer?, from: TransportAddress?) {
        guard i >= 0, i < Self.slots else { return (nil, nil) }
        let d = datagrams + i
        let from = withUnsafePointer(to: &d.pointee.from) { TransportAddress($0) }
        guard d.pointee.truncated == 0, d.pointee.length >= 0, Int(d.pointee.length) <= Self.slotSize else { return (nil, from) }
        return (UnsafeRawBufferPointer(start: buffer + i * Self.slotSize, count: Int(d.pointee.length)), from)
    }
}
