// party-load: parties at voice pacing against `tusa relay --party-port`, for loopback
// benchmarks (issues 15 and 17: room forwarding, one read and N-1 writes per frame).
//
// Every member is a real party member: its own identity, a Noise IK session with the
// relay (the root package's `SecureEndpoint`) and the room client's core
// (`PartyMember`), which creates or joins its room and hands its sender keys to the
// others through the relay. Members have one source address each (127.S.x.y) and all
// send and receive through one wildcard socket (the source set per datagram with
// IP_PKTINFO, the member found from each arrival's destination), so the generator's
// own cost per packet is a share of a sendmmsg or a recvmmsg.
//
// Setup: `--rooms` rooms of `--size` members; the first member of each creates it, the
// others join; then the generator waits until every member has every other's key.
// Then one measured phase per step of `--ramp` (default: all rooms): in the first N
// rooms, `--speakers` members each send one voiced frame (`--payload` bytes of audio,
// sealed end to end, then hop by hop) every 1/`--rate` s, the speakers' sends spread
// evenly over the period and interleaved across rooms. The relay forwards each frame
// to the room's other members: `--size` - 1 deliveries per frame. Every delivery is
// opened hop by hop (the Noise session) and counted by the phase it was sent in; one
// frame per member each 50 ms is also opened end to end by the member's core (so the
// keys are shown to work, and the core hears its relay the way it does in a call).
// lost = expected - delivered after a drain. With --server-pid, the relay's CPU
// (utime+stime) over the measured seconds: CPU per 1000 delivered frames. Sends the
// generator could not make in time (a whole period behind) are `skipped`, kernel drops
// (machine-wide, /proc/net/snmp) are shown beside the loss.
//
// One line per phase: 'phase=party rooms=N ... delivered_pps= ... loss_pct= ...'.
import BenchSupport
import CMultiMsg
import Party
import Secure
import TusaBase

#if canImport(Glibc)
    import Glibc
#endif

let usage = """
    usage: party-load --target IPV4:PORT (--relay-key BASE64 | --relay-identity FILE) [options]
      --target IPV4:PORT     the relay's party port, loopback only (127.0.0.0/8)
      --relay-key BASE64     the relay's public key (tusa relay --identity FILE: its public-key line)
      --relay-identity FILE  or the relay's identity file itself
      --rooms N              rooms (default 4)
      --size N               members per room (default 25)
      --speakers N           members talking in each room (default 3)
      --rate R               frames per second per speaker (default 50: 20 ms frames)
      --payload BYTES        audio bytes per frame (default 60: Opus at 24 kbit/s, 20 ms)
      --duration S           measured seconds per phase (default 3)
      --warmup S             unmeasured seconds before each measurement (default 0.5)
      --ramp N1,N2,...       one phase with the first N1, N2, ... rooms talking (default: all rooms)
      --server-pid PID       read the relay's CPU from /proc
      --source-net A.B       first two octets of the members' source addresses (default 127.3)
      --join-rate R          handshakes started per second while setting up (default 200)
      --setup-timeout S      give up setting up after S seconds (default 120)
    prints one 'setup ...' line, one 'phase=party ...' line per phase, then 'done ...'
    """

// MARK: - Members

/// One party member: a session with the relay, the room client's core, and where it stands.
final class Member {
    let index: Int
    let ip: UInt32
    let room: Int
    let endpoint: SecureEndpoint
    var core: PartyMember
    let peer: PeerID
    var started = false
    var established = false
    var joined = false
    var joinSent = false
    var keys = 0
    var lost = false
    var nextTimer = 0.0
    var lastOpened = 0.0

    init(index: Int, ip: UInt32, room: Int, relay: TransportAddress, relayKey: PublicKey, now: Timestamp) {
        self.index = index
        self.ip = ip
        self.room = room
        let identity = Identity.generate()
        endpoint = SecureEndpoint(identity: identity, now: now)
        peer = endpoint.addPeer(relayKey, address: relay)
        core = PartyMember(identity: identity.privateKey)
    }
}

/// What a phase counted.
struct PhaseCounts {
    var sent = 0, unsent = 0, delivered = 0, stale = 0, opened = 0, openFailed = 0, refused = 0, skipped = 0
    var lateMax = 0.0
}

// MARK: - The generator

final class PartyLoad {
    let members: [Member]
    let rooms: Int
    let size: Int
    let speakersPerRoom: Int
    let rate: Double
    let payload: Int
    let relay: TransportAddress
    let relayIP: UInt32
    let relayPort: UInt16
    let net: UInt32
    let socket: Int32
    /// Room ids, once their creators are in.
    var roomIDs: [String?]
    /// The phase being counted (frames carry it in the top byte of their timestamp).
    var phaseTag: UInt32 = 0
    var counting = false
    var counts = PhaseCounts()
    var protocolErrors: [String: Int] = [:]

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
    let audio: [UInt8]

    init(
        rooms: Int, size: Int, speakers: Int, rate: Double, payload: Int, relay: (ip: UInt32, port: UInt16),
        relayKey: PublicKey, net: UInt32
    ) {
        self.rooms = rooms
        self.size = size
        self.speakersPerRoom = speakers
        self.rate = rate
        self.payload = payload
        self.net = net
        relayIP = relay.ip
        relayPort = relay.port
        self.relay = TransportAddress(ip: .v4(relay.ip), port: relay.port)
        roomIDs = Array(repeating: nil, count: rooms)
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
        let now = Timestamp(nanoseconds: nowNanoseconds())
        let relayAddress = TransportAddress(ip: .v4(relay.ip), port: relay.port)
        let sizeOfRoom = size
        members = (0..<rooms * size).map { i in
            Member(
                index: i, ip: net + 1 + UInt32(i), room: i / sizeOfRoom, relay: relayAddress,
                relayKey: relayKey, now: now)
        }
        sendBuffers = .allocate(byteCount: batch * slotSize, alignment: 16)
        sendMsgs = .allocate(capacity: batch)
        sendIov = .allocate(capacity: batch)
        sendNames = .allocate(capacity: batch)
        sendControl = .allocate(byteCount: batch * controlSpace, alignment: 16)
        let slots = makeReceiveSlots(count: batch, size: slotSize)
        recvBuffers = slots.buffers
        recvMsgs = slots.msgs
        recvControl = .allocate(byteCount: batch * recvControlSpace, alignment: 16)
        var g = SystemRandomNumberGenerator()
        audio = (0..<payload).map { _ in UInt8.random(in: 0...255, using: &g) }
    }

    var clock: Timestamp { Timestamp(nanoseconds: nowNanoseconds()) }

    // MARK: sending

    /// Copies `bytes` into the next send slot, from `source`; flushes a full batch.
    func queue(_ bytes: UnsafeRawBufferPointer, from source: UInt32) {
        guard bytes.count <= slotSize else { return }
        if pending == batch { flush() }
        let slot = sendBuffers + pending * slotSize
        slot.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
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

    /// Everything the member's session and core want done now.
    func drain(_ m: Member) {
        var busy = true
        while busy {
            busy = false
            while let action = m.endpoint.pollAction() {
                busy = true
                switch action {
                case .send(let bytes, _):
                    bytes.withUnsafeBytes { queue($0, from: m.ip) }
                case .event(let event):
                    switch event {
                    case .established: m.established = true
                    case .peerGone, .handshakeFailed: m.lost = true
                    default: break
                    }
                }
            }
            while let action = m.core.pollAction() {
                busy = true
                switch action {
                case .send(let bytes): sendHop(m, bytes)
                case .event(let event): handle(event, of: m)
                }
            }
        }
    }

    /// Seals `bytes` hop by hop and queues them for the relay; false when the
    /// session has no keys to seal with now.
    @discardableResult
    func sendHop(_ m: Member, _ bytes: [UInt8]) -> Bool {
        if pending == batch { flush() }
        let slot = UnsafeMutableRawBufferPointer(start: sendBuffers + pending * slotSize, count: slotSize)
        let sealed = bytes.withUnsafeBytes { plain in
            try? m.endpoint.sealMedia(
                to: m.peer, payloadType: PartyHop.payloadType, timestamp: PartyFrameHeader.peekTimestamp(bytes) ?? 0,
                payload: plain, into: slot, now: clock)
        }
        // sealMedia may have started a handshake (keys too old).
        defer { if m.endpoint.hasOutputs { drain(m) } }
        guard let sealed else { return false }  // no session now: the control channel sends again
        enqueueSlot(length: sealed.length, from: m.ip)
        return true
    }

    func handle(_ event: PartyMemberEvent, of m: Member) {
        switch event {
        case .joined(let room, _, _, _):
            m.joined = true
            if m.index % size == 0 { roomIDs[m.room] = room }
        case .keyReceived:
            m.keys += 1
        case .refused(let code, let detail):
            protocolErrors["refused \(code): \(detail)", default: 0] += 1
            m.joinSent = false
        case .ended(let reason):
            protocolErrors["ended: \(reason)", default: 0] += 1
            m.lost = true
        case .connectionLost:
            protocolErrors["connection lost", default: 0] += 1
            m.lost = true
        case .audio:
            if counting { counts.opened += 1 }
        case .dropped:
            if counting { counts.openFailed += 1 }
        default:
            break
        }
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
            let now = clock
            let seconds = monotonicSeconds()
            for k in 0..<r {
                let destination = withUnsafePointer(to: &recvMsgs[k].msg_hdr) { bench_pktinfo_destination($0) }
                let index = Int(destination) - Int(net) - 1
                guard index >= 0, index < members.count else { continue }
                let m = members[index]
                let datagram = UnsafeMutableRawBufferPointer(start: recvBuffers + k * slotSize, count: Int(recvMsgs[k].msg_len))
                let result = m.endpoint.receive(datagram, from: relay, now: now)
                switch result {
                case .media(_, let header, let range) where header.payloadType == PartyHop.payloadType:
                    let hop = UnsafeRawBufferPointer(rebasing: datagram[range])
                    if hop.first == PartyPacketType.media.rawValue, hop.count >= PartyFrameHeader.fixedLength {
                        // 5-8: the frame's RTP timestamp, whose top byte is the phase.
                        let stamp = UInt32(hop[5]) << 24 | UInt32(hop[6]) << 16 | UInt32(hop[7]) << 8 | UInt32(hop[8])
                        if counting && stamp >> 24 == phaseTag { counts.delivered += 1 } else if counting { counts.stale += 1 }
                        if seconds - m.lastOpened >= 0.05 {
                            m.lastOpened = seconds
                            m.core.handle(.received(Array(hop)), now: now)
                        }
                    } else {
                        m.core.handle(.received(Array(hop)), now: now)
                    }
                default:
                    break
                }
                drain(m)
            }
            flush()
            if r < batch { return }
        }
    }

    /// Runs the members' timers that are due (each member at most every 10 ms).
    func timers() {
        let seconds = monotonicSeconds()
        let now = clock
        for m in members where m.started && seconds >= m.nextTimer {
            m.nextTimer = seconds + 0.01
            if let due = m.endpoint.nextDeadline, due <= now { m.endpoint.handleTimeout(now: now) }
            if let due = m.core.nextDeadline, due <= now { m.core.handleTimeout(now: now) }
            drain(m)
        }
        flush()
    }

    func wait(ms: Int32) {
        var p = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
        _ = poll(&p, 1, ms)
    }

    // MARK: setup

    /// Handshakes, rooms created and joined, keys handed over; false on timeout.
    func setUp(joinRate: Double, timeout: Double) -> (ok: Bool, seconds: Double, why: String) {
        let begin = monotonicSeconds()
        var startedCount = 0
        var lastTimers = 0.0
        while true {
            let now = monotonicSeconds()
            if now - begin > timeout {
                return (false, now - begin, setupState())
            }
            // Start handshakes at the join rate.
            let due = min(members.count, Int((now - begin) * joinRate) + 1)
            while startedCount < due {
                let m = members[startedCount]
                m.started = true
                m.endpoint.handle(.connect(m.peer), now: clock)
                drain(m)
                startedCount += 1
            }
            // Creators create; the others join once their room exists.
            for m in members where m.established && !m.joinSent {
                if m.index % size == 0 {
                    m.joinSent = true
                    m.core.handle(.create(name: "load \(m.room)", maxMembers: size, invite: []), now: clock)
                    drain(m)
                } else if let room = roomIDs[m.room] {
                    m.joinSent = true
                    m.core.handle(.join(room: room), now: clock)
                    drain(m)
                }
            }
            flush()
            receive()
            if now - lastTimers >= 0.005 {
                lastTimers = now
                timers()
            }
            if let lost = members.first(where: { $0.lost }) {
                return (false, now - begin, "member \(lost.index) lost its session or room; " + setupState())
            }
            if startedCount == members.count && members.allSatisfy({ $0.joined && $0.keys >= size - 1 }) {
                return (true, now - begin, "")
            }
            wait(ms: 1)
        }
    }

    func setupState() -> String {
        let established = members.filter(\.established).count
        let joined = members.filter(\.joined).count
        let keyed = members.filter { $0.keys >= size - 1 }.count
        let errors = protocolErrors.map { "\($0.key) x\($0.value)" }.sorted().joined(separator: "; ")
        return "established=\(established) joined=\(joined) keyed=\(keyed) of \(members.count)"
            + (errors.isEmpty ? "" : " errors: \(errors)")
    }

    // MARK: a phase

    /// The speakers of the first `activeRooms` rooms, interleaved across rooms.
    func speakers(inFirst activeRooms: Int) -> [Member] {
        var out: [Member] = []
        for s in 0..<speakersPerRoom {
            for r in 0..<activeRooms { out.append(members[r * size + s]) }
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
                let m = talkers[i]
                let n = frames[i]
                frames[i] += 1
                let timestamp = phaseTag << 24 | UInt32(truncatingIfNeeded: n * 160) & 0x00FF_FFFF
                let level = AudioLevel(level: UInt8(20 + i % 3 * 5), voiced: true)
                if let frame = m.core.seal(audio, timestamp: timestamp, level: level, now: clock), sendHop(m, frame) {
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

    /// The length of a delivered frame on the wire (RTP 12 + party header + SFrame + audio + tags).
    var deliveredLength: Int {
        let m = members[0]
        guard let frame = m.core.seal(audio, timestamp: 0, level: AudioLevel(level: 127, voiced: false), now: clock)
        else { return 0 }
        return 12 + frame.count + 16
    }
}

// MARK: - Main

let args = Arguments(
    Array(CommandLine.arguments.dropFirst()),
    options: [
        "target", "relay-key", "relay-identity", "rooms", "size", "speakers", "rate", "payload", "duration", "warmup",
        "ramp", "server-pid", "source-net", "join-rate", "setup-timeout",
    ],
    usage: usage)
guard let targetText = args.string("target"), let target = parseV4(targetText), target.ip >> 24 == 127 else {
    fail("--target IPV4:PORT on loopback is required\n\(usage)")
}
let relayKey: PublicKey
if let text = args.string("relay-key") {
    guard let key = PublicKey(base64: text) else { fail("--relay-key: not a base64 public key") }
    relayKey = key
} else if let path = args.string("relay-identity") {
    do { relayKey = try Identity.read(from: path).publicKey } catch { fail("--relay-identity: \(error)") }
} else {
    fail("--relay-key or --relay-identity is required\n\(usage)")
}
let rooms = args.int("rooms", default: 4, range: 1...400)
let size = args.int("size", default: 25, range: 2...200)
let speakers = args.int("speakers", default: 3, range: 1...size)
guard rooms * size <= 60_000 else { fail("--rooms x --size: at most 60000 members") }
let rate = args.double("rate", default: 50, range: 1...1000)
let payload = args.int("payload", default: 60, range: 1...1200)
let duration = args.double("duration", default: 3, range: 0.1...600)
let warmup = args.double("warmup", default: 0.5, range: 0...60)
let serverPID = args.string("server-pid").map { text -> Int32 in
    guard let pid = Int32(text), pid > 0 else { fail("--server-pid: not a process id") }
    return pid
}
let netText = args.string("source-net") ?? "127.3"
let netParts = netText.split(separator: ".").compactMap { UInt8($0) }
guard netParts.count == 2, netParts[0] == 127 else { fail("--source-net: A.B with A = 127") }
let net = UInt32(netParts[0]) << 24 | UInt32(netParts[1]) << 16
let joinRate = args.double("join-rate", default: 200, range: 1...100_000)
let setupTimeout = args.double("setup-timeout", default: 120, range: 1...3600)
var steps = [rooms]
if let ramp = args.string("ramp") {
    steps = ramp.split(separator: ",").map { text in
        guard let n = Int(text), (1...rooms).contains(n) else { fail("--ramp: '\(text)' is not a room count in 1...\(rooms)") }
        return n
    }
}

let load = PartyLoad(
    rooms: rooms, size: size, speakers: speakers, rate: rate, payload: payload, relay: target, relayKey: relayKey, net: net)
let setup = load.setUp(joinRate: joinRate, timeout: setupTimeout)
guard setup.ok else {
    print("setup FAILED after \(fmt(setup.seconds, 1)) s: \(setup.why)")
    exit(1)
}
print(
    "setup rooms=\(rooms) size=\(size) members=\(rooms * size) seconds=\(fmt(setup.seconds, 2))"
        + " datagram=\(load.deliveredLength) payload=\(payload)")
var failed = false
for (i, n) in steps.enumerated() {
    let line = load.run(rooms: n, phase: i + 1, warmup: warmup, duration: duration, serverPID: serverPID)
    print(line)
    fflush(nil)
    if load.members.contains(where: { $0.lost }) {
        print("a member lost its session or room: \(load.setupState())")
        failed = true
        break
    }
}
print("done generator_cpu_total=\(fmt(selfCPU(), 2))")
exit(failed ? 1 : 0)
