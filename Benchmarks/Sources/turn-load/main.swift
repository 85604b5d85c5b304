// turn-load: a TURN (RFC 8656, UDP) load generator for loopback benchmarks.
//
// Every client is its own UDP socket, bound to a source address in 127.0.0.0/8
// (`--clients-per-ip` clients per address, so per-source-IP challenge limits see a crowd
// of hosts, not one) and connected to the server. A client allocates the way real ones
// do: Allocate without credentials, 401 with REALM and NONCE, Allocate again with
// USERNAME/REALM/NONCE/MESSAGE-INTEGRITY (long-term credentials, MD5 key), 438 Stale
// Nonce answered with the new nonce, unanswered requests retransmitted every 500 ms.
// Requests are built and answers decoded with the root package's STUN module.
//
// --mode relay: N clients allocate, and each binds a channel (ChannelBind) to its own
//   peer socket, a generator socket on 127.0.0.1 connected to that client's relayed
//   address. Then one phase per direction, each `--warmup` + `--duration` seconds:
//     up    clients send ChannelData (`--payload` bytes), their peers count what arrives;
//     down  peers send datagrams to the relayed addresses, clients count ChannelData;
//     both  the two at once.
//   Each direction keeps at most `--window` packets in flight (sent, not yet arrived),
//   sending `--batch` packets per write (one UDP GSO write, or sendmmsg with --no-gso),
//   round-robin over its sockets. A direction that has heard nothing for `--timeout-ms`
//   writes off its window (lost). After each phase the generator drains what is still
//   on the way; lost = sent - arrived. One line per phase.
//   With `--rate R` the traffic is paced as voice is: every flow sends one packet each
//   1/R s (R = 50: 20 ms frames) in both directions, the flows' sends spread evenly over
//   the period and interleaved, so no two consecutive packets belong to one flow. So that
//   the generator out-runs the server, each client still allocates from its own socket
//   (one source address each, 127.S.x.y, all on one port), but afterwards the clients
//   send and receive through one wildcard socket (the source address set per datagram
//   with IP_PKTINFO) and all channels lead to one peer socket: whatever is due goes out
//   in one sendmmsg per side, and arrivals are read 64 at a time. Each packet carries
//   its send time; the phase line adds the one-way delay through the server (p50, p99,
//   max), how late the generator ran and how many sends it skipped (a generator that
//   falls behind measures itself, not the server) and the sends the kernel refused.
//   `--flows N` lets only the first N clients send in the phases; `--ramp N1,N2,...`
//   then runs phase `both` (or `--ramp-phase`) with the first N1, N2, ... flows sending, one line each with
//   `flows=N`: where a server starts to lose packets, without allocating again.
// --mode allocate: N clients allocate (challenge + authenticated Allocate), at most
//   `--window` of them in progress at once; allocations/s. With --server-pid, also the
//   server's RSS (VmRSS), open fds and CPU before and after, while every allocation is
//   still alive (the clients' sockets stay open until the generator exits).
// --probe: one client allocates; exit 0 when it got a relayed address.
//
// With --server-pid the generator reads the server's CPU time (utime+stime in
// /proc/PID/stat) over each measured interval. Kernel UDP drops come from /proc/net/snmp
// (machine-wide: every socket on the path, the generator's included).
import BenchSupport
import CMultiMsg
import STUN
import TusaBase

#if canImport(Glibc)
    import Glibc
#endif

let usage = """
    usage: turn-load --target IPV4:PORT [--mode relay|allocate] [options]
      --target IPV4:PORT     the TURN server, loopback only (127.0.0.0/8)
      --mode relay|allocate  relayed packet rate (default) or allocation rate/memory
      --user NAME:PASSWORD   long-term credentials (default alice:wonderland)
      --clients N            clients, one UDP socket each (default 100; allocate: 1000)
      --clients-per-ip N     clients per source address 127.S.x.y (default 50)
      --source-net A.B       first two octets of the client source addresses (default 127.2)
      --server-pid PID       read the server's CPU (and in allocate mode RSS, fds) from /proc
      --setup-timeout S      give up allocating after S seconds (default 60)
    relay mode:
      --phases LIST          comma-separated, of up,down,both (default up,down,both)
      --duration S           measured seconds per phase (default 3)
      --warmup S             unmeasured seconds before each phase's measurement (default 0.5)
      --payload BYTES        application data per packet (default 100, 16...1200)
      --window N             packets in flight per direction (default 256)
      --batch N              packets per write (default 32, at most 64)
      --timeout-ms N         write off a silent direction's window after N ms (default 50)
      --rate R               paced voice-like flows: R packets/s per flow and direction (50: 20 ms frames)
      --flows N              with --rate: only the first N clients send in the phases (default: all)
      --ramp N1,N2,...       with --rate: then phase both with the first N1, N2, ... flows sending
      --ramp-phase P         the ramp's phase: up, down or both (default both)
      --no-gso               sendmmsg instead of one UDP GSO write per batch
      --refresh S            with --rate: every S s each of the --flows flows refreshes its channel,
                             permission and allocation (a long call's traffic); deleted at the end
    allocate mode:
      --window N             allocations in progress at once (default 64)
      --settle S             seconds to wait before reading the server's RSS (default 1)
    --probe                  one allocation; exit 0 when it succeeds (--duration: how long to try)
    prints (relay): one 'setup ...' line, then per phase 'phase=NAME ... total_pps= ...'
    prints (allocate): 'allocate clients= allocated= failed= seconds= aps= rss_before_kib= ...'
    """

func connectTo(_ fd: Int32, _ ip: UInt32, _ port: UInt16) {
    if withSockaddr(ip, port, { connect(fd, $0, $1) }) != 0 { fail("connect \(ipText(ip)):\(port): \(errnoText())") }
}

/// Linux UDP_SEGMENT (level SOL_UDP): GSO segment size; false where the kernel refuses.
func enableGSO(_ fd: Int32, segment: Int) -> Bool {
    var size = Int32(segment)
    return setsockopt(fd, 17, 103, &size, socklen_t(MemoryLayout<Int32>.size)) == 0
}

// MARK: - /proc readings

/// A "Key:  value kB" line of a /proc status-like file, in KiB.
func procField(_ path: String, _ key: String) -> Int? {
    guard let text = readText(path) else { return nil }
    for line in text.split(separator: "\n") where line.hasPrefix(key + ":") {
        return Int(line.dropFirst(key.count + 1).split(whereSeparator: { $0 == " " || $0 == "\t" }).first ?? "")
    }
    return nil
}

func openFDs(_ pid: Int32) -> Int? {
    guard let dir = opendir("/proc/\(pid)/fd") else { return nil }
    defer { closedir(dir) }
    var n = 0
    while let entry = readdir(dir) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        if name != "." && name != ".." { n += 1 }
    }
    return n
}

// MARK: - Clients and the allocation state machine

enum Step { case challenge, allocate, bind, done, failed }

final class Client {
    let index: Int
    let fd: Int32
    let sourceIP: UInt32
    var step = Step.challenge
    var txid = TransactionID.random()
    var request: [UInt8] = []
    var sentAt = 0.0
    var tries = 0
    var nonce = ""
    var realm = ""
    var key: IntegrityKey?
    var relayedPort: UInt16 = 0
    var relayedIP: UInt32 = 0
    var failure = ""
    /// Relay mode: the peer socket's port on 127.0.0.1 and the channel bound to it.
    var peerPort: UInt16 = 0
    var channel: UInt16 = 0x4000

    init(index: Int, fd: Int32, sourceIP: UInt32) {
        self.index = index
        self.fd = fd
        self.sourceIP = sourceIP
    }
}

struct SetupStats {
    var allocated = 0, bound = 0, failed = 0, challenges = 0, stale = 0, retransmits = 0
    var failures: [String: Int] = [:]
    var idleSeconds = 0.0
    var seconds = 0.0

    var failureText: String {
        failures.isEmpty ? "none" : failures.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: ",")
    }
}

/// Runs every client through challenge -> Allocate (-> ChannelBind), `window` at a time.
final class Allocator {
    let username: String
    let password: String
    let bindChannels: Bool
    let window: Int
    let rto = 0.5
    let maxTries = 7
    var keys: [String: IntegrityKey] = [:]
    var stats = SetupStats()
    private var buffer = [UInt8](repeating: 0, count: 2048)

    init(username: String, password: String, bindChannels: Bool, window: Int) {
        self.username = username
        self.password = password
        self.bindChannels = bindChannels
        self.window = window
    }

    func run(_ clients: [Client], deadline: Double) {
        let start = monotonicSeconds()
        var next = 0
        var active: [Client] = []
        var pfds: [pollfd] = []
        while (next < clients.count || !active.isEmpty) && monotonicSeconds() < deadline {
            while active.count < window && next < clients.count {
                let c = clients[next]
                next += 1
                c.step = .challenge
                c.txid = .random()
                c.request = allocateRequest(c, authenticated: false)
                c.tries = 0
                send(c)
                active.append(c)
            }
            pfds.removeAll(keepingCapacity: true)
            for c in active { pfds.append(pollfd(fd: c.fd, events: Int16(POLLIN), revents: 0)) }
            let t0 = monotonicSeconds()
            let ready = poll(&pfds, nfds_t(pfds.count), 5)
            let now = monotonicSeconds()
            stats.idleSeconds += now - t0
            if ready > 0 {
                for (i, p) in pfds.enumerated() where p.revents != 0 { receive(active[i]) }
            }
            for c in active where c.step != .done && c.step != .failed && now - c.sentAt > rto {
                if c.tries >= maxTries {
                    fail(c, "timeout")
                } else {
                    stats.retransmits += 1
                    send(c)
                }
            }
            active.removeAll { $0.step == .done || $0.step == .failed }
        }
        for c in active where c.step != .done && c.step != .failed { fail(c, "deadline") }
        stats.failed += clients.count - next  // never started
        if clients.count > next { stats.failures["deadline", default: 0] += clients.count - next }
        stats.seconds = monotonicSeconds() - start
    }

    private func send(_ c: Client) {
        c.tries += 1
        c.sentAt = monotonicSeconds()
        let n = c.request.withUnsafeBytes { Glibc.send(c.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        if n < 0 && errno != EAGAIN && errno != ECONNREFUSED { fail(c, "send:\(errno)") }
    }

    private func fail(_ c: Client, _ why: String) {
        c.step = .failed
        c.failure = why
        stats.failed += 1
        stats.failures[why, default: 0] += 1
    }

    private func receive(_ c: Client) {
        while c.step != .done && c.step != .failed {
            let n = recv(c.fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if n <= 0 { return }  // EAGAIN, or ECONNREFUSED while nobody listens: retransmission will tell
            guard let m = try? Message(decoding: Array(buffer[0..<n])), m.transactionID == c.txid else { continue }
            handle(c, m)
        }
    }

    private func handle(_ c: Client, _ m: Message) {
        let isError = m.type.messageClass == .errorResponse
        let code: Int? = {
            if case .errorCode(let e)? = try? m.value(.errorCode) { return e.code }
            return nil
        }()
        if isError && (code == 401 || code == 438) && (c.step == .challenge || code == 438) {
            guard case .nonce(let nonce)? = try? m.value(.nonce) else { return fail(c, "no-nonce") }
            if case .realm(let realm)? = try? m.value(.realm) { c.realm = realm }
            c.nonce = nonce
            if code == 401 { stats.challenges += 1 } else { stats.stale += 1 }
            if c.key == nil || code == 401 {
                if let k = keys[c.realm] {
                    c.key = k
                } else if let k = try? IntegrityKey.longTerm(username: username, realm: c.realm, password: password) {
                    keys[c.realm] = k
                    c.key = k
                } else {
                    return fail(c, "bad-realm")
                }
            }
            if c.step == .challenge { c.step = .allocate }
            c.txid = .random()
            c.request =
                c.step == .bind
                ? channelBindRequest(c, username: username, transactionID: c.txid) : allocateRequest(c, authenticated: true)
            c.tries = 0
            return send(c)
        }
        if isError { return fail(c, "\(m.type.method)-\(code.map(String.init) ?? "error")") }
        guard m.type.messageClass == .successResponse else { return }
        switch c.step {
        case .challenge, .allocate:
            guard case .xorRelayedAddress(let relay)? = try? m.value(.xorRelayedAddress),
                case .v4(let ip) = relay.ip
            else { return fail(c, "no-relayed-address") }
            c.relayedIP = ip
            c.relayedPort = relay.port
            stats.allocated += 1
            if bindChannels {
                c.step = .bind
                c.txid = .random()
                c.request = channelBindRequest(c, username: username, transactionID: c.txid)
                c.tries = 0
                send(c)
            } else {
                c.step = .done
            }
        case .bind:
            stats.bound += 1
            c.step = .done
        case .done, .failed:
            break
        }
    }

    private func allocateRequest(_ c: Client, authenticated: Bool) -> [UInt8] {
        var attributes: [Attribute] = [.requestedTransport(17)]
        if authenticated { attributes += [.username(username), .realm(c.realm), .nonce(c.nonce)] }
        let m = Message(type: MessageType(method: .allocate, class: .request), transactionID: c.txid, attributes: attributes)
        return m.encode(integrity: authenticated ? c.key : nil)
    }
}

/// A ChannelBind of `c`'s channel to its peer (127.0.0.1, `c.peerPort`) under `c`'s
/// long-term credentials: the set-up's, and again each time a refresher renews it.
func channelBindRequest(_ c: Client, username: String, transactionID: TransactionID) -> [UInt8] {
    let peer = TransportAddress(ip: .v4(0x7F00_0001), port: c.peerPort)
    let m = Message(
        type: MessageType(method: .channelBind, class: .request), transactionID: transactionID,
        attributes: [
            .channelNumber(c.channel), .xorPeerAddress(peer), .username(username), .realm(c.realm), .nonce(c.nonce),
        ])
    return m.encode(integrity: c.key)
}

/// Creates `count` clients, bound to 127.S.x.y (`perIP` per address) and connected to the target.
func makeClients(
    _ count: Int, firstIndex: Int = 0, net: UInt32, perIP: Int, target: (ip: UInt32, port: UInt16),
    buffer: Int32?
) -> [Client] {
    (0..<count).map { i in
        let index = firstIndex + i
        let ip = net + 1 + UInt32(index / perIP)
        let fd = boundSocket(ip, buffer: buffer)
        connectTo(fd, target.ip, target.port)
        return Client(index: index, fd: fd, sourceIP: ip)
    }
}

// MARK: - Relayed traffic

let recvBatch = 64
let recvSize = 2048

/// One direction of relayed traffic: who sends, the window, and the counts.
final class Direction {
    let name: String
    let senders: [Int32]
    let frameLength: Int
    /// Per sender, `batch` copies of its frame back to back.
    var frames: [UnsafeMutableRawPointer] = []
    var next = 0
    var sent = 0
    var received = 0
    var writtenOff = 0
    var lastProgress = 0.0
    var tag: UInt64 = 0
    var active = false

    init(name: String, senders: [Int32], frameLength: Int, batch: Int) {
        self.name = name
        self.senders = senders
        self.frameLength = frameLength
        frames = senders.map { _ in
            let p = UnsafeMutableRawPointer.allocate(byteCount: batch * frameLength, alignment: 16)
            p.initializeMemory(as: UInt8.self, repeating: 0, count: batch * frameLength)
            return p
        }
    }

    var inflight: Int { max(0, sent - received - writtenOff) }

    func reset() {
        sent = 0
        received = 0
        writtenOff = 0
        next = 0
    }
}

struct PhaseResult {
    var name = ""
    var seconds = 0.0
    var upSent = 0, upReceived = 0, upLost = 0
    var downSent = 0, downReceived = 0, downLost = 0
    var upMeasured = 0, downMeasured = 0, upSentMeasured = 0, downSentMeasured = 0
    var invalid = 0, stale = 0, errors = 0
    /// Paced: sends skipped and refused, the latest send (ms), one-way delays (µs).
    var skipped = 0, refused = 0, lateMaxMs = 0.0
    var delayP50 = 0.0, delayP99 = 0.0, delayMax = 0.0
    var serverCPU: Double?
    var generatorCPU = 0.0
    var idleSeconds = 0.0
    var kernel = UDPCounters()
}

/// Packets sent and arrived so far, each way.
struct Counts {
    var upSent = 0, upReceived = 0, downSent = 0, downReceived = 0
}

/// The bookkeeping every kind of relayed traffic does around a phase: the
/// counts and CPU times where the measured interval begins, the rates and CPU
/// over it, the wait for what is still on its way, and the totals and the
/// kernel's UDP drops over the whole phase.
struct PhaseMeter {
    let serverPID: Int32?
    let kernelBefore = UDPCounters.read()
    private var marks = Counts()
    private var serverMark = 0.0
    private var selfMark = 0.0

    init(serverPID: Int32?) { self.serverPID = serverPID }

    /// The measured interval begins.
    mutating func startMeasuring(_ counts: Counts) {
        marks = counts
        serverMark = serverPID.flatMap(processCPU) ?? 0
        selfMark = selfCPU()
    }

    /// The measured interval ends: what arrived and was sent in it, and the CPU both sides used.
    func stopMeasuring(_ counts: Counts, seconds: Double, idle: Double, into result: inout PhaseResult) {
        result.seconds = seconds
        result.upMeasured = counts.upReceived - marks.upReceived
        result.downMeasured = counts.downReceived - marks.downReceived
        result.upSentMeasured = counts.upSent - marks.upSent
        result.downSentMeasured = counts.downSent - marks.downSent
        if let pid = serverPID, let cpu = processCPU(pid) { result.serverCPU = cpu - serverMark }
        result.generatorCPU = selfCPU() - selfMark
        result.idleSeconds = idle
    }

    /// Waits for whatever is still on its way, until nothing arrives for 100 ms (at most 1 s).
    static func drainInFlight(from start: Double, counts: () -> Counts, receive: (Int32) -> Void) {
        var now = start
        let drainEnd = now + 1
        var lastArrival = now
        while now < drainEnd && now - lastArrival < 0.1 {
            let before = counts()
            guard before.upSent > before.upReceived || before.downSent > before.downReceived else { return }
            receive(5)
            now = monotonicSeconds()
            let after = counts()
            if after.upReceived + after.downReceived != before.upReceived + before.downReceived { lastArrival = now }
        }
    }

    /// The phase is over: totals, losses, what the receivers refused, and the kernel's drops.
    func finish(_ counts: Counts, invalid: Int, stale: Int, errors: Int, into result: inout PhaseResult) {
        let kernelAfter = UDPCounters.read()
        result.kernel = UDPCounters(
            inErrors: kernelAfter.inErrors - kernelBefore.inErrors,
            rcvbufErrors: kernelAfter.rcvbufErrors - kernelBefore.rcvbufErrors,
            sndbufErrors: kernelAfter.sndbufErrors - kernelBefore.sndbufErrors,
            noPorts: kernelAfter.noPorts - kernelBefore.noPorts)
        result.upSent = counts.upSent
        result.upReceived = counts.upReceived
        result.upLost = max(0, counts.upSent - counts.upReceived)
        result.downSent = counts.downSent
        result.downReceived = counts.downReceived
        result.downLost = max(0, counts.downSent - counts.downReceived)
        result.invalid = invalid
        result.stale = stale
        result.errors = errors
    }
}

final class Traffic {
    let clients: [Client]
    let peers: [Int32]
    let payload: Int
    let window: Int
    let batch: Int
    let gso: Bool
    let timeout: Double
    let serverPID: Int32?
    let up: Direction
    let down: Direction
    /// Receivers: clients (down) then peers (up); their slot is their epoll token.
    let receivers: [Int32]
    let epoll: Int32
    var ready = [UInt64](repeating: 0, count: 256)
    let recvBuffers: UnsafeMutableRawPointer
    let recvIov: UnsafeMutablePointer<iovec>
    let recvMsgs: UnsafeMutablePointer<bench_mmsghdr>
    let sendIov: UnsafeMutablePointer<iovec>
    let sendMsgs: UnsafeMutablePointer<bench_mmsghdr>
    var invalid = 0
    var stale = 0
    var errors = 0

    init(
        clients: [Client], peers: [Int32], payload: Int, window: Int, batch: Int, gso: Bool, timeout: Double,
        serverPID: Int32?
    ) {
        self.clients = clients
        self.peers = peers
        self.payload = payload
        self.window = window
        self.batch = batch
        self.timeout = timeout
        self.serverPID = serverPID
        up = Direction(name: "up", senders: clients.map(\.fd), frameLength: 4 + payload, batch: batch)
        down = Direction(name: "down", senders: peers, frameLength: payload, batch: batch)
        var useGSO = gso
        if useGSO {
            useGSO =
                clients.allSatisfy { enableGSO($0.fd, segment: 4 + payload) }
                && peers.allSatisfy { enableGSO($0, segment: payload) }
        }
        self.gso = useGSO
        receivers = clients.map(\.fd) + peers
        epoll = bench_epoll_create()
        if epoll < 0 { fail("epoll_create: \(errnoText())") }
        for (slot, fd) in receivers.enumerated() where bench_epoll_add(epoll, fd, UInt64(slot)) != 0 {
            fail("epoll_ctl: \(errnoText())")
        }
        (recvBuffers, recvIov, recvMsgs) = makeReceiveSlots(count: recvBatch, size: recvSize)
        sendIov = .allocate(capacity: batch)
        sendMsgs = .allocate(capacity: batch)
    }

    /// Writes each sender's frame (with this phase's tag) `batch` times into its buffer.
    private func prepare(_ d: Direction, upward: Bool) {
        var g = SystemRandomNumberGenerator()
        d.tag = g.next()
        for (i, base) in d.frames.enumerated() {
            for k in 0..<batch {
                let p = base + k * d.frameLength
                var at = 0
                if upward {
                    storeBE16(p, 0, clients[i].channel)
                    storeBE16(p, 2, UInt16(payload))
                    at = 4
                }
                p.storeBytes(of: d.tag, toByteOffset: at, as: UInt64.self)
                storeBE32(p, at + 8, UInt32(i))
            }
        }
    }

    /// Sends one batch on the direction's next sender; returns packets sent (0 on EAGAIN).
    private func sendBatch(_ d: Direction) -> Int {
        let i = d.next
        d.next = d.next + 1 == d.senders.count ? 0 : d.next + 1
        let fd = d.senders[i]
        let n = min(batch, window - d.inflight)
        guard n > 0 else { return 0 }
        let r: Int
        if gso {
            let bytes = Glibc.send(fd, d.frames[i], n * d.frameLength, Int32(MSG_DONTWAIT))
            r = bytes > 0 ? bytes / d.frameLength : bytes
        } else {
            for k in 0..<n {
                sendIov[k] = iovec(iov_base: d.frames[i] + k * d.frameLength, iov_len: d.frameLength)
                var m = bench_mmsghdr()
                m.msg_hdr.msg_iov = sendIov + k
                m.msg_hdr.msg_iovlen = 1
                sendMsgs[k] = m
            }
            r = Int(bench_sendmmsg(fd, sendMsgs, UInt32(n), Int32(MSG_DONTWAIT)))
        }
        if r > 0 {
            if d.inflight == 0 { d.lastProgress = monotonicSeconds() }
            d.sent += r
            return r
        }
        if errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR { errors += 1 }
        return 0
    }

    /// Reads everything waiting on receiver `slot` (clients first, then peers).
    private func drain(_ slot: Int, now: Double) {
        let isClient = slot < clients.count
        let index = isClient ? slot : slot - clients.count
        let fd = receivers[slot]
        let d = isClient ? down : up
        while true {
            for i in 0..<recvBatch { recvMsgs[i].msg_hdr.msg_flags = 0 }
            let r = Int(bench_recvmmsg(fd, recvMsgs, UInt32(recvBatch), Int32(MSG_DONTWAIT), nil))
            if r <= 0 {
                if r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR { errors += 1 }
                return
            }
            var good = 0
            for k in 0..<r {
                let len = Int(recvMsgs[k].msg_len)
                let p = recvBuffers + k * recvSize
                var at = 0
                if isClient {
                    // ChannelData: our channel, our length, then the payload.
                    guard len == 4 + payload, loadBE16(p, 0) == clients[index].channel, Int(loadBE16(p, 2)) == payload
                    else {
                        invalid += 1
                        continue
                    }
                    at = 4
                } else {
                    guard len == payload else {
                        invalid += 1
                        continue
                    }
                }
                guard p.loadUnaligned(fromByteOffset: at, as: UInt64.self) == d.tag, d.active else {
                    stale += 1
                    continue
                }
                guard loadBE32(p, at + 8) == UInt32(index) else {
                    invalid += 1
                    continue
                }
                good += 1
            }
            if good > 0 {
                d.received += good
                d.lastProgress = now
                // Late arrivals of packets already written off give their window back only once.
                if d.sent - d.received < d.writtenOff { d.writtenOff = max(0, d.sent - d.received) }
            }
            if r < recvBatch { return }
        }
    }

    /// Waits up to `ms` milliseconds for receivers with datagrams and reads them.
    private func receive(ms: Int32) {
        let n = ready.withUnsafeMutableBufferPointer { bench_epoll_wait(epoll, $0.baseAddress, Int32($0.count), ms) }
        guard n > 0 else { return }
        let now = monotonicSeconds()
        for i in 0..<Int(n) {
            let slot = Int(ready[i])
            if slot < receivers.count { drain(slot, now: now) }
        }
    }

    func run(phase: String, warmup: Double, duration: Double) -> PhaseResult {
        let directions: [Direction]
        switch phase {
        case "up": directions = [up]
        case "down": directions = [down]
        default: directions = [up, down]
        }
        for d in [up, down] {
            d.reset()
            d.active = false
        }
        prepare(up, upward: true)
        prepare(down, upward: false)
        for d in directions { d.active = true }
        invalid = 0
        stale = 0
        errors = 0
        var result = PhaseResult()
        result.name = phase
        var meter = PhaseMeter(serverPID: serverPID)
        let start = monotonicSeconds()
        let measureStart = start + warmup
        let end = measureStart + duration
        var measuring = false
        var idle = 0.0
        var now = start
        for d in directions { d.lastProgress = now }
        while now < end {
            if !measuring && now >= measureStart {
                measuring = true
                meter.startMeasuring(counts)
                idle = 0
            }
            var sentNow = 0
            for d in directions {
                var budget = 8
                while budget > 0 && window - d.inflight >= min(batch, window) {
                    let r = sendBatch(d)
                    if r == 0 { break }
                    sentNow += r
                    budget -= 1
                }
            }
            if sentNow > 0 {
                receive(ms: 0)
                now = monotonicSeconds()
            } else {
                let t0 = monotonicSeconds()
                receive(ms: 1)
                now = monotonicSeconds()
                idle += now - t0
            }
            for d in directions where d.inflight > 0 && now - d.lastProgress > timeout {
                d.writtenOff += d.inflight
                d.lastProgress = now
            }
        }
        meter.stopMeasuring(counts, seconds: now - measureStart, idle: idle, into: &result)
        PhaseMeter.drainInFlight(from: now, counts: { counts }, receive: { receive(ms: $0) })
        for d in [up, down] { d.active = false }
        meter.finish(counts, invalid: invalid, stale: stale, errors: errors, into: &result)
        return result
    }

    private var counts: Counts {
        Counts(upSent: up.sent, upReceived: up.received, downSent: down.sent, downReceived: down.received)
    }
}

// MARK: - Paced (voice-like) traffic

/// One-way delays, in 10 µs buckets up to 200 ms (the last bucket: 200 ms or more).
struct DelayHistogram {
    var buckets = [Int](repeating: 0, count: 20_001)

    mutating func record(sentAt: UInt64, now: UInt64) {
        let micros = now >= sentAt ? (now - sentAt) / 1000 : 0
        buckets[Int(min(micros / 10, UInt64(buckets.count - 1)))] += 1
    }

    mutating func reset() { for i in buckets.indices { buckets[i] = 0 } }

    /// The `q` quantile (0...1) in µs, the bucket's middle; 0 when empty.
    func percentile(_ q: Double) -> Double {
        let total = buckets.reduce(0, +)
        guard total > 0 else { return 0 }
        let rank = max(1, Int((q * Double(total)).rounded(.up)))
        var seen = 0
        for (bucket, n) in buckets.enumerated() {
            seen += n
            if seen >= rank { return Double(bucket * 10 + 5) }
        }
        return Double(buckets.count * 10)
    }
}

/// Creates `count` clients for paced traffic: one source address each (127.S.x.y), all
/// bound to the port of a wildcard socket that carries their traffic once they have
/// allocated (SO_REUSEADDR on all of them; while a client's own socket is open it gets
/// its answers, being the more specific match).
func makeSharedClients(_ count: Int, net: UInt32, target: (ip: UInt32, port: UInt16), buffer: Int32) -> (
    clients: [Client], shared: Int32
) {
    let shared = udpSocket(family: AF_INET, nonBlocking: true)
    setSocketBuffer(shared, option: SO_RCVBUF, bytes: buffer)
    setSocketBuffer(shared, option: SO_SNDBUF, bytes: buffer)
    if bench_reuseaddr(shared) != 0 || withSockaddr(0, 0, { bind(shared, $0, $1) }) != 0 {
        fail("bind the shared client socket: \(errnoText())")
    }
    let port = localPort(shared)
    let clients = (0..<count).map { index -> Client in
        let ip = net + 1 + UInt32(index)
        let fd = udpSocket(family: AF_INET, nonBlocking: true)
        if bench_reuseaddr(fd) != 0 || withSockaddr(ip, port, { bind(fd, $0, $1) }) != 0 {
            fail("bind \(ipText(ip)):\(port): \(errnoText())" + (errno == EMFILE ? " (raise ulimit -n)" : ""))
        }
        connectTo(fd, target.ip, target.port)
        return Client(index: index, fd: fd, sourceIP: ip)
    }
    return (clients, shared)
}

/// Voice-paced relayed traffic (`--rate`): flow k of N sends its packet k/(N·R) s into
/// every period of 1/R s, in each active direction. Clients send through one wildcard
/// socket and their peers are one socket, so the generator's own cost per packet is a
/// share of a sendmmsg and of a recvmmsg.
final class PacedTraffic {
    let clients: [Client]
    let shared: Int32
    let peer: Int32
    let server: (ip: UInt32, port: UInt16)
    let payload: Int
    let rate: Double
    let serverPID: Int32?
    /// Per flow, its ChannelData frame (up) and its bare payload (down), stamped before each send.
    let upFrames: UnsafeMutableRawPointer
    let downFrames: UnsafeMutableRawPointer
    var upLength: Int { 4 + payload }
    /// A batch being built: its messages, their addresses and IP_PKTINFO control data.
    let sendMsgs: UnsafeMutablePointer<bench_mmsghdr>
    let sendIov: UnsafeMutablePointer<iovec>
    let sendNames: UnsafeMutablePointer<sockaddr_in>
    let sendControl: UnsafeMutableRawPointer
    let controlSpace = Int(bench_PKTINFO_SPACE)
    let recvBuffers: UnsafeMutableRawPointer
    let recvMsgs: UnsafeMutablePointer<bench_mmsghdr>
    var tag: UInt64 = 0
    var delays = DelayHistogram()
    var recording = false
    var invalid = 0, stale = 0, errors = 0
    /// Keeps the flows' allocations alive (`--refresh`); its answers come on the shared socket.
    var refresher: Refresher?

    /// Per direction: scheduled sends since the phase began (made or skipped), made,
    /// arrived, skipped (the generator fell a whole round behind), refused (EAGAIN),
    /// and the latest a send left after its time.
    struct Flow {
        var scheduled = 0, sent = 0, received = 0, skipped = 0, refused = 0
        var lateMax = 0.0
        var active = false
    }
    var up = Flow()
    var down = Flow()

    init(
        clients: [Client], shared: Int32, server: (ip: UInt32, port: UInt16), payload: Int, rate: Double, serverPID: Int32?,
        buffer: Int32
    ) {
        self.clients = clients
        self.shared = shared
        self.server = server
        self.payload = payload
        self.rate = rate
        self.serverPID = serverPID
        peer = boundSocket(0x7F00_0001, buffer: buffer)
        upFrames = .allocate(byteCount: clients.count * (4 + payload), alignment: 16)
        upFrames.initializeMemory(as: UInt8.self, repeating: 0, count: clients.count * (4 + payload))
        downFrames = .allocate(byteCount: clients.count * payload, alignment: 16)
        downFrames.initializeMemory(as: UInt8.self, repeating: 0, count: clients.count * payload)
        sendMsgs = .allocate(capacity: recvBatch)
        sendIov = .allocate(capacity: recvBatch)
        sendNames = .allocate(capacity: recvBatch)
        sendControl = .allocate(byteCount: recvBatch * Int(bench_PKTINFO_SPACE), alignment: 16)
        let slots = makeReceiveSlots(count: recvBatch, size: recvSize)
        recvBuffers = slots.buffers
        recvMsgs = slots.msgs
    }

    /// The peer socket's port: every client binds its channel to it.
    var peerPort: UInt16 { localPort(peer) }

    /// Closes the clients' own sockets: from now on their traffic is the shared socket's.
    func takeOver() {
        for c in clients { close(c.fd) }
    }

    private func prepare() {
        var g = SystemRandomNumberGenerator()
        tag = g.next()
        for (i, c) in clients.enumerated() {
            let u = upFrames + i * upLength
            storeBE16(u, 0, c.channel)
            storeBE16(u, 2, UInt16(payload))
            u.storeBytes(of: tag, toByteOffset: 4, as: UInt64.self)
            storeBE32(u, 12, UInt32(i))
            let d = downFrames + i * payload
            d.storeBytes(of: tag, toByteOffset: 0, as: UInt64.self)
            storeBE32(d, 8, UInt32(i))
        }
    }

    /// Flows sending in this phase: the first `flows` clients.
    var flows = 0

    /// Sends what is due in one direction, in sendmmsg batches of up to 64.
    private func sendDue(upward: Bool, since start: Double, now: Double) {
        var f = upward ? up : down
        defer { if upward { up = f } else { down = f } }
        let n = flows
        let interval = 1 / (Double(n) * rate)
        let due = Int(((now - start) / interval).rounded(.down)) + 1
        if due - f.scheduled > n {
            let skip = due - f.scheduled - n
            f.skipped += skip
            f.scheduled += skip
        }
        while f.scheduled < due {
            var count = 0
            let stamp = nowNanoseconds()
            while f.scheduled < due && count < recvBatch {
                let late = now - (start + Double(f.scheduled) * interval)
                if late > f.lateMax { f.lateMax = late }
                let i = f.scheduled % n
                f.scheduled += 1
                let c = clients[i]
                var m = bench_mmsghdr()
                if upward {
                    let frame = upFrames + i * upLength
                    frame.storeBytes(of: stamp, toByteOffset: 16, as: UInt64.self)
                    sendIov[count] = iovec(iov_base: frame, iov_len: upLength)
                    sendNames[count] = sockaddrIn(server.ip, server.port)
                    let control = sendControl + count * controlSpace
                    m.msg_hdr.msg_control = control
                    m.msg_hdr.msg_controllen = Int(bench_pktinfo(control, c.sourceIP))
                } else {
                    let frame = downFrames + i * payload
                    frame.storeBytes(of: stamp, toByteOffset: 12, as: UInt64.self)
                    sendIov[count] = iovec(iov_base: frame, iov_len: payload)
                    sendNames[count] = sockaddrIn(c.relayedIP, c.relayedPort)
                }
                m.msg_hdr.msg_name = UnsafeMutableRawPointer(sendNames + count)
                m.msg_hdr.msg_namelen = socklen_t(MemoryLayout<sockaddr_in>.size)
                m.msg_hdr.msg_iov = sendIov + count
                m.msg_hdr.msg_iovlen = 1
                sendMsgs[count] = m
                count += 1
            }
            var done = 0
            while done < count {
                let r = Int(bench_sendmmsg(upward ? shared : peer, sendMsgs + done, UInt32(count - done), Int32(MSG_DONTWAIT)))
                if r > 0 {
                    done += r
                    continue
                }
                if errno == EAGAIN || errno == EWOULDBLOCK { f.refused += count - done } else { errors += 1 }
                break
            }
            f.sent += done
        }
    }

    private var counts: Counts {
        Counts(upSent: up.sent, upReceived: up.received, downSent: down.sent, downReceived: down.received)
    }

    /// Reads everything waiting on the shared client socket (down) or the peer (up).
    private func drain(upward: Bool) {
        let fd = upward ? peer : shared
        while true {
            for i in 0..<recvBatch { recvMsgs[i].msg_hdr.msg_flags = 0 }
            let r = Int(bench_recvmmsg(fd, recvMsgs, UInt32(recvBatch), Int32(MSG_DONTWAIT), nil))
            if r <= 0 {
                if r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR { errors += 1 }
                return
            }
            let now = nowNanoseconds()
            var good = 0
            for k in 0..<r {
                let len = Int(recvMsgs[k].msg_len)
                let p = recvBuffers + k * recvSize
                if !upward, let refresher,
                    refresher.handle(UnsafeRawBufferPointer(start: p, count: len), now: monotonicSeconds())
                {
                    continue
                }
                let at = upward ? 0 : 4
                guard len == payload + at, len >= at + 20 else {
                    invalid += 1
                    continue
                }
                let index = Int(loadBE32(p, at + 8))
                guard index < flows, !upward ? (loadBE16(p, 0) == clients[index].channel && Int(loadBE16(p, 2)) == payload) : true
                else {
                    invalid += 1
                    continue
                }
                guard p.loadUnaligned(fromByteOffset: at, as: UInt64.self) == tag, upward ? up.active : down.active else {
                    stale += 1
                    continue
                }
                if recording { delays.record(sentAt: p.loadUnaligned(fromByteOffset: at + 12, as: UInt64.self), now: now) }
                good += 1
            }
            if upward { up.received += good } else { down.received += good }
            if r < recvBatch { return }
        }
    }

    /// The peer and the shared client socket, polled on every turn of the send loop (kept, not rebuilt each time).
    private lazy var receivers = [
        pollfd(fd: peer, events: Int16(POLLIN), revents: 0), pollfd(fd: shared, events: Int16(POLLIN), revents: 0),
    ]

    func receive(ms: Int32) {
        guard poll(&receivers, 2, ms) > 0 else { return }
        if receivers[0].revents != 0 { drain(upward: true) }
        if receivers[1].revents != 0 { drain(upward: false) }
    }

    func run(phase: String, warmup: Double, duration: Double, flows: Int) -> PhaseResult {
        self.flows = max(1, min(flows, clients.count))
        up = Flow()
        down = Flow()
        prepare()
        up.active = phase != "down"
        down.active = phase != "up"
        invalid = 0
        stale = 0
        errors = 0
        delays.reset()
        recording = false
        var result = PhaseResult()
        result.name = phase
        var meter = PhaseMeter(serverPID: serverPID)
        let start = monotonicSeconds()
        let measureStart = start + warmup
        let end = measureStart + duration
        var measuring = false
        var idle = 0.0
        var now = start
        let period = 1 / (Double(self.flows) * rate)
        while now < end {
            if !measuring && now >= measureStart {
                measuring = true
                meter.startMeasuring(counts)
                idle = 0
                recording = true
                up.lateMax = 0
                down.lateMax = 0
            }
            if up.active { sendDue(upward: true, since: start, now: now) }
            if down.active { sendDue(upward: false, since: start, now: now) }
            refresher?.tick(now: now)
            // At any real load the next send is due within microseconds: wait only when idle.
            let t0 = monotonicSeconds()
            let nextDue = start + Double(min(up.active ? up.scheduled : .max, down.active ? down.scheduled : .max)) * period
            let wait = nextDue - t0 > 0.002
            receive(ms: wait ? 1 : 0)
            now = monotonicSeconds()
            if wait { idle += now - t0 }
        }
        meter.stopMeasuring(counts, seconds: now - measureStart, idle: idle, into: &result)
        recording = false
        PhaseMeter.drainInFlight(from: now, counts: { counts }, receive: { receive(ms: $0) })
        up.active = false
        down.active = false
        meter.finish(counts, invalid: invalid, stale: stale, errors: errors, into: &result)
        result.skipped = up.skipped + down.skipped
        result.refused = up.refused + down.refused
        result.lateMaxMs = 1000 * max(up.lateMax, down.lateMax)
        result.delayP50 = delays.percentile(0.5)
        result.delayP99 = delays.percentile(0.99)
        result.delayMax = delays.percentile(1)
        return result
    }
}

/// The last line: the generator's CPU over its whole life, for the caller's accounting of
/// what else ran on the machine meanwhile.
func printDone() {
    print("done cpu_seconds=\(fmt(selfCPU())) wall_seconds=\(fmt(monotonicSeconds() - processStart))")
    fflush(nil)
}

// MARK: - Main

let processStart = monotonicSeconds()
let args = Arguments(
    Array(CommandLine.arguments.dropFirst()),
    options: [
        "target", "mode", "user", "clients", "clients-per-ip", "source-net", "server-pid", "setup-timeout", "phases",
        "duration", "warmup", "payload", "window", "batch", "timeout-ms", "settle", "rate", "ramp", "flows",
        "ramp-phase", "refresh",
    ],
    flagNames: ["probe", "no-gso"],
    usage: usage)

guard let targetText = args.string("target") else { fail("--target is required\n\(usage)") }
guard let target = parseV4(targetText) else { fail("--target '\(targetText)': expected IPV4:PORT") }
guard target.ip >> 24 == 127 else { fail("--target \(targetText) refused: benchmarks may only send to loopback (127.0.0.0/8)") }
let userSpec = args.string("user") ?? "alice:wonderland"
guard let colon = userSpec.firstIndex(of: ":") else { fail("--user must be NAME:PASSWORD") }
let username = String(userSpec[..<colon])
let password = String(userSpec[userSpec.index(after: colon)...])
guard let net = parseNet(args.string("source-net") ?? "127.2") else { fail("--source-net must be 127.B") }
let perIP = args.int("clients-per-ip", default: 50, range: 1...60000)
let serverPID: Int32? = args.string("server-pid").map { text in
    guard let pid = Int32(text), pid > 0 else { fail("--server-pid must be a process id") }
    return pid
}
let mode = args.string("mode") ?? "relay"
signal(SIGPIPE, SIG_IGN)

if args.has("probe") {
    let timeout = args.double("duration", default: 5, range: 0.1...60)
    let clients = makeClients(1, net: net, perIP: 1, target: target, buffer: nil)
    let allocator = Allocator(username: username, password: password, bindChannels: false, window: 1)
    let start = monotonicSeconds()
    allocator.run(clients, deadline: start + timeout)
    if allocator.stats.allocated == 1 {
        print(
            "probe ok target=\(targetText) after=\(fmt(monotonicSeconds() - start))s relayed=\(ipText(clients[0].relayedIP)):\(clients[0].relayedPort)"
        )
        exit(0)
    }
    printError("probe: no allocation from \(targetText) within \(timeout) s (\(allocator.stats.failureText))")
    exit(1)
}

let setupTimeout = args.double("setup-timeout", default: 60, range: 1...3600)

switch mode {
case "allocate":
    let count = args.int("clients", default: 1000, range: 1...1_000_000)
    let window = args.int("window", default: 64, range: 1...100_000)
    let settle = args.double("settle", default: 1, range: 0...60)
    let clients = makeClients(count, net: net, perIP: perIP, target: target, buffer: nil)
    // Readings before: the clients' sockets already exist, so what changes is the server's.
    let rssBefore = serverPID.flatMap { procField("/proc/\($0)/status", "VmRSS") }
    let fdsBefore = serverPID.flatMap(openFDs)
    let slabBefore = procField("/proc/meminfo", "Slab")
    let cpuBefore = serverPID.flatMap(processCPU)
    let meBefore = selfCPU()
    let allocator = Allocator(username: username, password: password, bindChannels: false, window: window)
    allocator.run(clients, deadline: monotonicSeconds() + setupTimeout)
    let s = allocator.stats
    let cpuAfter = serverPID.flatMap(processCPU)
    let meAfter = selfCPU()
    if settle > 0 { usleep(UInt32(settle * 1_000_000)) }
    let rssAfter = serverPID.flatMap { procField("/proc/\($0)/status", "VmRSS") }
    let fdsAfter = serverPID.flatMap(openFDs)
    let slabAfter = procField("/proc/meminfo", "Slab")
    var line =
        "allocate clients=\(count) allocated=\(s.allocated) failed=\(s.failed) seconds=\(fmt(s.seconds)) "
        + "aps=\(Int((Double(s.allocated) / max(s.seconds, 1e-9)).rounded())) challenges=\(s.challenges) "
        + "stale=\(s.stale) retransmits=\(s.retransmits) failures=\(s.failureText) window=\(window) "
        + "gen_cpu=\(Int((100 * (meAfter - meBefore) / max(s.seconds, 1e-9)).rounded()))% "
        + "idle=\(Int((100 * s.idleSeconds / max(s.seconds, 1e-9)).rounded()))%"
    if let a = cpuBefore, let b = cpuAfter {
        line +=
            " server_cpu=\(Int((100 * (b - a) / max(s.seconds, 1e-9)).rounded()))%"
            + " server_us_per_alloc=\(fmt(1e6 * (b - a) / Double(max(s.allocated, 1)), 1))"
    }
    if let a = rssBefore, let b = rssAfter {
        line +=
            " rss_before_kib=\(a) rss_after_kib=\(b) rss_bytes_per_alloc=\(Int((Double(b - a) * 1024 / Double(max(s.allocated, 1))).rounded()))"
    }
    if let a = fdsBefore, let b = fdsAfter {
        line += " fds_before=\(a) fds_after=\(b) fds_per_alloc=\(fmt(Double(b - a) / Double(max(s.allocated, 1)), 2))"
    }
    if let a = slabBefore, let b = slabAfter {
        line += " slab_bytes_per_alloc=\(Int((Double(b - a) * 1024 / Double(max(s.allocated, 1))).rounded()))"
    }
    print(line)
    printDone()
    exit(s.allocated == count ? 0 : 1)

case "relay":
    let count = args.int("clients", default: 100, range: 1...10_000)
    let payload = args.int("payload", default: 100, range: 16...1200)
    let window = args.int("window", default: 256, range: 1...1_000_000)
    let rate = args.double("rate", default: 0, range: 0...10_000)
    let batch = args.int("batch", default: 32, range: 1...64)
    let duration = args.double("duration", default: 3, range: 0.05...3600)
    let warmup = args.double("warmup", default: 0.5, range: 0...60)
    let timeout = Double(args.int("timeout-ms", default: 50, range: 1...10_000)) / 1000
    let phases = (args.string("phases") ?? "up,down,both").split(separator: ",").map(String.init)
    for p in phases where !["up", "down", "both"].contains(p) { fail("--phases: unknown phase '\(p)' (up, down, both)") }
    let buffer: Int32 = 4 << 20
    if rate > 0 && payload < 20 { fail("--rate needs --payload of at least 20 (tag, flow and send time)") }
    if rate > 0 && count > 60_000 { fail("--rate: at most 60000 clients (one source address each)") }
    var paced: PacedTraffic?
    let clients: [Client]
    let peers: [Int32]
    if rate > 0 {
        let made = makeSharedClients(count, net: net, target: target, buffer: buffer)
        clients = made.clients
        let traffic = PacedTraffic(
            clients: clients, shared: made.shared, server: target, payload: payload, rate: rate, serverPID: serverPID,
            buffer: buffer)
        for c in clients {
            c.peerPort = traffic.peerPort
            c.channel = 0x4000 + UInt16(c.index & 0xFFF)
        }
        paced = traffic
        peers = []
    } else {
        clients = makeClients(count, net: net, perIP: perIP, target: target, buffer: buffer)
        peers = clients.map { c -> Int32 in
            let fd = boundSocket(0x7F00_0001, buffer: buffer)
            c.peerPort = localPort(fd)
            c.channel = 0x4000 + UInt16(c.index & 0xFFF)
            return fd
        }
    }
    let allocator = Allocator(username: username, password: password, bindChannels: true, window: 64)
    allocator.run(clients, deadline: monotonicSeconds() + setupTimeout)
    let s = allocator.stats
    print(
        "setup clients=\(count) allocated=\(s.allocated) bound=\(s.bound) failed=\(s.failed) seconds=\(fmt(s.seconds)) "
            + "challenges=\(s.challenges) stale=\(s.stale) retransmits=\(s.retransmits) failures=\(s.failureText)")
    guard s.bound == count else {
        printError("turn-load: only \(s.bound) of \(count) clients got an allocation and a channel (\(s.failureText))")
        exit(1)
    }
    for (c, fd) in zip(clients, peers) { connectTo(fd, c.relayedIP, c.relayedPort) }
    paced?.takeOver()
    let traffic: Traffic? =
        paced != nil
        ? nil
        : Traffic(
            clients: clients, peers: peers, payload: payload, window: window, batch: batch,
            gso: !args.has("no-gso"), timeout: timeout, serverPID: serverPID)
    var failedPhase = false
    let flows = args.int("flows", default: count, range: 1...count)
    if let text = args.string("refresh") {
        guard let traffic = paced, let period = Double(text), period >= 0.5, period <= 290 else {
            fail("--refresh needs --rate and a period in 0.5...290 s (permissions last 300 s)")
        }
        let refresher = Refresher(clients: clients, shared: traffic.shared, server: target, username: username, period: period)
        refresher.keep(flows: flows, now: monotonicSeconds())
        traffic.refresher = refresher
    }
    var steps = phases.map { (phase: $0, flows: flows) }
    let rampPhase = args.string("ramp-phase") ?? "both"
    guard ["up", "down", "both"].contains(rampPhase) else { fail("--ramp-phase: up, down or both") }
    if let ramp = args.string("ramp") {
        guard rate > 0 else { fail("--ramp needs --rate") }
        for text in ramp.split(separator: ",") {
            guard let n = Int(text), (1...count).contains(n) else {
                fail("--ramp: '\(text)' is not a flow count in 1...\(count)")
            }
            steps.append((phase: rampPhase, flows: n))
        }
    }
    for (phase, flows) in steps {
        let r =
            paced?.run(phase: phase, warmup: warmup, duration: duration, flows: flows)
            ?? traffic!.run(phase: phase, warmup: warmup, duration: duration)
        let secs = max(r.seconds, 1e-9)
        let upPPS = Double(r.upMeasured) / secs
        let downPPS = Double(r.downMeasured) / secs
        let sentAll = r.upSent + r.downSent
        let lostAll = r.upLost + r.downLost
        var line =
            "phase=\(phase) seconds=\(fmt(r.seconds)) up_pps=\(Int(upPPS.rounded())) down_pps=\(Int(downPPS.rounded())) "
            + "total_pps=\(Int((upPPS + downPPS).rounded())) "
            + "up_sent=\(r.upSent) up_received=\(r.upReceived) up_lost=\(r.upLost) "
            + "down_sent=\(r.downSent) down_received=\(r.downReceived) down_lost=\(r.downLost) "
            + "loss_pct=\(fmt(100 * Double(lostAll) / Double(max(sentAll, 1)), 3)) "
            + "invalid=\(r.invalid) stale=\(r.stale) errors=\(r.errors) "
            + "kernel_rcvbuf_errors=\(r.kernel.rcvbufErrors) kernel_in_errors=\(r.kernel.inErrors) "
            + "kernel_sndbuf_errors=\(r.kernel.sndbufErrors) kernel_noports=\(r.kernel.noPorts) "
            + "gen_cpu=\(Int((100 * r.generatorCPU / secs).rounded()))% idle=\(Int((100 * r.idleSeconds / secs).rounded()))%"
        if let cpu = r.serverCPU {
            let relayed = Double(r.upMeasured + r.downMeasured)
            line +=
                " server_cpu=\(Int((100 * cpu / secs).rounded()))%"
                + " server_ms_per_1000=\(fmt(relayed > 0 ? 1000 * 1000 * cpu / relayed : 0, 3))"
        }
        if rate > 0 {
            let offered: Double = rate * Double(flows) * (phase == "both" ? 2 : 1)
            line +=
                " rate=\(fmt(rate, 1)) flows=\(flows) offered_pps=\(Int(offered.rounded()))"
                + " late_max_ms=\(fmt(r.lateMaxMs, 2)) skipped=\(r.skipped) refused=\(r.refused)"
                + " delay_p50_us=\(Int(r.delayP50)) delay_p99_us=\(Int(r.delayP99)) delay_max_us=\(Int(r.delayMax))"
                + " clients=\(count) payload=\(payload) paced=1"
        } else {
            line +=
                " clients=\(count) payload=\(payload) window=\(window) batch=\(batch) gso=\(traffic?.gso == true ? 1 : 0)"
        }
        print(line)
        fflush(nil)
        if r.upMeasured + r.downMeasured == 0 { failedPhase = true }
    }
    if let traffic = paced, let refresher = traffic.refresher {
        refresher.release(deadline: monotonicSeconds() + 3) { traffic.receive(ms: $0) }
        print(refresher.summary)
        if refresher.failed > 0 { failedPhase = true }
    }
    printDone()
    exit(failedPhase ? 1 : 0)

default:
    fail("--mode must be relay or allocate")
}
