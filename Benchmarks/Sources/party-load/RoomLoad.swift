// The members' side of a room-forwarding benchmark, whatever the server: one wildcard
// socket for every member (the source set per datagram with IP_PKTINFO, the member found
// from each arrival's destination), send and receive batches, and the voice-paced phase
// that counts deliveries. `PartyLoad` (tusa's party relay) and `ReferenceLoad` (the C
// forwarder) say how a member sends a frame and what a delivery is.
import BenchSupport
import CMultiMsg

#if canImport(Glibc)
    import Glibc
#endif

/// What a phase counted.
struct PhaseCounts {
    var sent = 0, unsent = 0, delivered = 0, stale = 0, opened = 0, openFailed = 0, refused = 0, skipped = 0
}

class RoomLoad {
    let rooms: Int
    let size: Int
    let speakersPerRoom: Int
    let rate: Double
    let relayIP: UInt32
    let relayPort: UInt16
    let net: UInt32
    let socket: Int32
    let memberCount: Int
    /// Every how many deliveries of a frame one is opened (1: all). The others are
    /// counted by the phase tag they show in clear (the hop's RTP timestamp, the
    /// reference's header), so that the generator's cost per delivery stays below the
    /// servers' and a ramp finds where they, not it, start losing.
    var openEvery = 1
    private var sinceOpened = 0
    /// The phase being counted (frames carry it in the top byte of their timestamp).
    var phaseTag: UInt32 = 0
    var counting = false
    var counts = PhaseCounts()

    // Send and receive slots.
    let batch = 64
    let slotSize = 2048
    let sendBuffers: UnsafeMutableRawPointer
    let sendMsgs: UnsafeMutablePointer<bench_mmsghdr>
    let sendIov: UnsafeMutablePointer<iovec>
    let sendNames: UnsafeMutablePointer<sockaddr_in>
    let sendControl: UnsafeMutableRawPointer
    var pending = 0
    let recvBuffers: UnsafeMutableRawPointer
    let recvMsgs: UnsafeMutablePointer<bench_mmsghdr>
    let recvControl: UnsafeMutableRawPointer
    let controlSpace = Int(bench_PKTINFO_SPACE)
    let recvControlSpace = 64

    init(rooms: Int, size: Int, speakers: Int, rate: Double, relay: (ip: UInt32, port: UInt16), net: UInt32) {
        self.rooms = rooms
        self.size = size
        self.speakersPerRoom = speakers
        self.rate = rate
        self.net = net
        memberCount = rooms * size
        relayIP = relay.ip
        relayPort = relay.port
        let fd = udpSocket(family: AF_INET, nonBlocking: true)
        // As root past net.core.rmem_max (SO_RCVBUFFORCE, SO_SNDBUFFORCE): a burst of
        // deliveries must wait in the generator's socket, not be dropped there.
        for (force, plain, bytes) in [(Int32(33), SO_RCVBUF, Int32(32 << 20)), (Int32(32), SO_SNDBUF, Int32(8 << 20))] {
            var value = bytes
            if setsockopt(fd, SOL_SOCKET, force, &value, socklen_t(MemoryLayout<Int32>.size)) != 0 {
                setSocketBuffer(fd, option: plain, bytes: bytes)
            }
        }
        if bench_reuseaddr(fd) != 0 || bench_receive_pktinfo(fd) != 0 || withSockaddr(0, 0, { bind(fd, $0, $1) }) != 0 {
            fail("bind the members' socket: \(errnoText())")
        }
        socket = fd
        sendBuffers = .allocate(byteCount: batch * slotSize, alignment: 16)
        sendMsgs = .allocate(capacity: batch)
        sendIov = .allocate(capacity: batch)
        sendNames = .allocate(capacity: batch)
        sendControl = .allocate(byteCount: batch * controlSpace, alignment: 16)
        let slots = makeReceiveSlots(count: batch, size: slotSize)
        recvBuffers = slots.buffers
        recvMsgs = slots.msgs
        recvControl = .allocate(byteCount: batch * recvControlSpace, alignment: 16)
    }

    /// Member `index`'s source address.
    func ip(of index: Int) -> UInt32 { net + 1 + UInt32(index) }

    // MARK: what a server's members do

    /// Sends member `index`'s frame with this RTP timestamp; false when it could not.
    func sendFrame(from index: Int, timestamp: UInt32, level: UInt8) -> Bool { false }

    /// One datagram from the server to member `index`.
    func deliver(_ datagram: UnsafeMutableRawBufferPointer, to index: Int, seconds: Double) {}

    /// Runs the members' timers that are due.
    func timers() {}

    /// Whether this delivery of a frame is to be opened (one in ``openEvery``).
    func sampled() -> Bool {
        sinceOpened += 1
        guard sinceOpened >= openEvery else { return false }
        sinceOpened = 0
        return true
    }

    /// Counts a delivered frame stamped `stamp` in the current phase or as stale.
    func countDelivery(stamp: UInt32) {
        guard counting else { return }
        if stamp >> 24 == phaseTag { counts.delivered += 1 } else { counts.stale += 1 }
    }

    // MARK: sending

    /// The next free send slot, after a flush when the batch is full.
    func nextSlot() -> UnsafeMutableRawBufferPointer {
        if pending == batch { flush() }
        return UnsafeMutableRawBufferPointer(start: sendBuffers + pending * slotSize, count: slotSize)
    }

    /// Copies `bytes` into the next send slot, from `source`; flushes a full batch.
    func queue(_ bytes: UnsafeRawBufferPointer, from source: UInt32) {
        guard bytes.count <= slotSize else { return }
        let slot = nextSlot()
        slot.copyMemory(from: bytes)
        enqueueSlot(length: bytes.count, from: source)
    }

    /// The slot `pending` holds `length` bytes to send from `source`.
    func enqueueSlot(length: Int, from source: UInt32) {
        let slot = sendBuffers + pending * slotSize
        sendIov[pending] = iovec(iov_base: slot, iov_len: length)
        sendNames[pending] = sockaddrIn(relayIP, relayPort)
        let control = sendControl + pending * controlSpace
        var m = bench_mmsghdr()
        m.msg_hdr.msg_control = control
        m.msg_hdr.msg_controllen = Int(bench_pktinfo(control, source))
        m.msg_hdr.msg_name = UnsafeMutableRawPointer(sendNames + pending)
        m.msg_hdr.msg_namelen = socklen_t(MemoryLayout<sockaddr_in>.size)
        m.msg_hdr.msg_iov = sendIov + pending
        m.msg_hdr.msg_iovlen = 1
        sendMsgs[pending] = m
        pending += 1
    }

    func flush() {
        var done = 0
        while done < pending {
            let r = Int(bench_sendmmsg(socket, sendMsgs + done, UInt32(pending - done), Int32(MSG_DONTWAIT)))
            if r > 0 {
                done += r
                continue
            }
            if errno == EINTR { continue }
            counts.refused += pending - done
            break
        }
        pending = 0
    }

    // MARK: receiving

    /// Reads everything waiting (at most `rounds` batches).
    func receive(rounds: Int = 16) {
        for _ in 0..<rounds {
            for i in 0..<batch {
                recvMsgs[i].msg_hdr.msg_flags = 0
                recvMsgs[i].msg_hdr.msg_control = recvControl + i * recvControlSpace
                recvMsgs[i].msg_hdr.msg_controllen = recvControlSpace
            }
            let r = Int(bench_recvmmsg(socket, recvMsgs, UInt32(batch), Int32(MSG_DONTWAIT), nil))
            guard r > 0 else { return }
            let seconds = monotonicSeconds()
            for k in 0..<r {
                let destination = withUnsafePointer(to: &recvMsgs[k].msg_hdr) { bench_pktinfo_destination($0) }
                let index = Int(destination) - Int(net) - 1
                guard index >= 0, index < memberCount else { continue }
                let datagram = UnsafeMutableRawBufferPointer(start: recvBuffers + k * slotSize, count: Int(recvMsgs[k].msg_len))
                deliver(datagram, to: index, seconds: seconds)
            }
            flush()
            if r < batch { return }
        }
    }

    func wait(ms: Int32) {
        var p = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
        _ = poll(&p, 1, ms)
    }

    // MARK: a phase

    /// The speakers of the first `activeRooms` rooms, interleaved across rooms.
    func speakers(inFirst activeRooms: Int) -> [Int] {
        var out: [Int] = []
        for s in 0..<speakersPerRoom {
            for r in 0..<activeRooms { out.append(r * size + s) }
        }
        return out
    }

    func run(rooms activeRooms: Int, phase: Int, warmup: Double, duration: Double, serverPID: Int32?) -> String {
        let talkers = speakers(inFirst: activeRooms)
        let interval = 1 / (Double(talkers.count) * rate)
        phaseTag = UInt32(phase & 0xFF)
        counts = PhaseCounts()
        counting = true
        var scheduled = 0
        let begin = monotonicSeconds()
        let measureStart = begin + warmup
        let end = measureStart + duration
        var measuring = false
        var marks = (sent: 0, delivered: 0, cpu: 0.0, generator: 0.0)
        var lastTimers = begin
        var now = begin
        var lateMax = 0.0
        var frames: [Int] = Array(repeating: 0, count: talkers.count)
        var kernelBefore = UDPCounters.read()
        while now < end {
            if !measuring && now >= measureStart {
                measuring = true
                marks = (counts.sent, counts.delivered, serverPID.flatMap(processCPU) ?? 0, selfCPU())
                lateMax = 0
                counts.skipped = 0
                kernelBefore = UDPCounters.read()
            }
            let due = Int(((now - begin) / interval).rounded(.down)) + 1
            if due - scheduled > talkers.count {
                counts.skipped += due - scheduled - talkers.count
                scheduled = due - talkers.count
            }
            while scheduled < due {
                let late = now - (begin + Double(scheduled) * interval)
                if late > lateMax { lateMax = late }
                let i = scheduled % talkers.count
                scheduled += 1
                let n = frames[i]
                frames[i] += 1
                let timestamp = phaseTag << 24 | UInt32(truncatingIfNeeded: n * 160) & 0x00FF_FFFF
                if sendFrame(from: talkers[i], timestamp: timestamp, level: UInt8(20 + i % 3 * 5)) {
                    counts.sent += 1
                } else {
                    counts.unsent += 1
                }
            }
            flush()
            receive()
            if now - lastTimers >= 0.005 {
                lastTimers = now
                timers()
            }
            let nextDue = begin + Double(scheduled) * interval
            if nextDue - monotonicSeconds() > 0.002 { wait(ms: 1) }
            now = monotonicSeconds()
        }
        let measured = now - measureStart
        let sentMeasured = counts.sent - marks.sent
        let deliveredMeasured = counts.delivered - marks.delivered
        let cpu = (serverPID.flatMap(processCPU) ?? 0) - marks.cpu
        let generatorCPU = selfCPU() - marks.generator
        let kernelAfter = UDPCounters.read()
        // Drain what is on the way, keeping the sessions alive.
        let expected = counts.sent * (size - 1)
        let drainEnd = monotonicSeconds() + 0.5
        while monotonicSeconds() < drainEnd && counts.delivered < expected {
            receive()
            timers()
            wait(ms: 1)
        }
        counting = false
        let lost = max(0, expected - counts.delivered)
        let secs = max(measured, 1e-9)
        let deliveredPPS = Double(deliveredMeasured) / secs
        var line = "phase=party rooms=\(activeRooms) size=\(size) speakers=\(talkers.count)"
        line += " rate=\(fmt(rate, 1)) sent=\(counts.sent) expected=\(expected) delivered=\(counts.delivered)"
        line += " lost=\(lost) loss_pct=\(fmt(expected > 0 ? 100 * Double(lost) / Double(expected) : 0, 4))"
        line += " offered_pps=\(Int((Double(talkers.count) * rate * Double(size - 1)).rounded()))"
        line += " in_pps=\(Int((Double(sentMeasured) / secs).rounded())) delivered_pps=\(Int(deliveredPPS.rounded()))"
        line += " seconds=\(fmt(measured, 3)) stale=\(counts.stale) opened=\(counts.opened) open_failed=\(counts.openFailed)"
        line +=
            " unsent=\(counts.unsent) refused=\(counts.refused) skipped=\(counts.skipped) late_max_ms=\(fmt(1000 * lateMax, 2))"
        line += " generator_cpu=\(Int((100 * generatorCPU / secs).rounded()))%"
        // Machine-wide: every socket on the path, the generator's included.
        line += " kernel_rcvbuf_errors=\(kernelAfter.rcvbufErrors - kernelBefore.rcvbufErrors)"
        line += " kernel_sndbuf_errors=\(kernelAfter.sndbufErrors - kernelBefore.sndbufErrors)"
        if serverPID != nil {
            line += " server_cpu=\(Int((100 * cpu / secs).rounded()))%"
            line += " server_ms_per_1000=\(fmt(deliveredMeasured > 0 ? 1000 * 1000 * cpu / Double(deliveredMeasured) : 0, 3))"
        }
        return line
    }
}
