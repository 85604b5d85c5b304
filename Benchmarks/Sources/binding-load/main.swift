// binding-load: a STUN Binding load generator for loopback benchmarks.
//
// N connected UDP sockets spread over T threads. Each socket keeps at most `window`
// requests in flight, sends them in batches with sendmmsg, and reads answers with
// recvmmsg. Only Binding success responses whose transaction id carries this socket's
// 8-byte tag are counted. Responses come back in order from a single-threaded server,
// so an answer to sequence number s also writes off every older request still
// outstanding (lost on the way); a socket that hears nothing for `--timeout-ms` writes
// off its whole window. The run lasts warmup + duration and then stops by itself.
//
// Transaction id layout (12 bytes): 8-byte random per-socket tag, 4-byte sequence number.

import BenchSupport
import CMultiMsg

#if canImport(Glibc)
    import Glibc
#endif

let usage = """
    usage: binding-load --target HOST:PORT [options]
      --target HOST:PORT   loopback only (127.0.0.0/8 or [::1])
      --duration SECONDS   measured time (default 5; with --probe: how long to wait)
      --warmup SECONDS     unmeasured time before (default 1)
      --sockets N          UDP sockets (default 8)
      --threads N          sending threads, sockets spread round-robin (default 1)
      --window N           max requests in flight per socket (default 32)
      --batch N            requests per sendmmsg (default 32)
      --timeout-ms N       write off a silent socket's window after N ms (default 20)
      --no-gso             send each batch with sendmmsg instead of one UDP GSO write per batch
      --probe              send one request every 100 ms until one is answered; exit 0 if so
    prints: sent=N received=M seconds=S rps=R send_rps=X lost=L invalid=I errors=E cpu=C% idle=P% ...
      (idle: share of the time the generator sat in poll() with every window full)
    """

struct Config {
    var target: SocketAddress
    var duration: Double
    var warmup: Double
    var sockets: Int
    var threads: Int
    var window: Int
    var batch: Int
    var timeout: Double
    /// Send each batch as one UDP GSO write (UDP_SEGMENT = request size): the
    /// kernel splits it, so the generator spends far less per request and
    /// out-runs servers that answer one datagram at a time.
    var gso: Bool
}

/// Linux UDP_SEGMENT (socket option at level SOL_UDP): GSO segment size.
let udpSegmentOption: Int32 = 103
let solUDP: Int32 = 17
/// The kernel's UDP_MAX_SEGMENTS on Linux 6.1.
let maxGSOSegments = 64

/// Turns on GSO for a socket; false where the kernel refuses.
func enableGSO(_ fd: Int32, segment: Int) -> Bool {
    var size = Int32(segment)
    return setsockopt(fd, solUDP, udpSegmentOption, &size, socklen_t(MemoryLayout<Int32>.size)) == 0
}

let recvBatch = 64
let recvBufferSize = 512

/// Connects a non-blocking UDP socket to the target: it then sends only there and the
/// kernel drops datagrams from anyone else.
func connectedSocket(_ target: SocketAddress) -> Int32 {
    let fd = udpSocket(family: target.family, nonBlocking: true)
    setSocketBuffer(fd, option: SO_RCVBUF, bytes: 4 << 20)
    setSocketBuffer(fd, option: SO_SNDBUF, bytes: 4 << 20)
    let rc = target.withSockaddr { connect(fd, $0, $1) }
    if rc != 0 { fail("connect \(target): \(errnoText())") }
    return fd
}

func randomTag() -> UInt64 {
    var g = SystemRandomNumberGenerator()
    return g.next()
}

/// One socket's state.
struct Flow {
    let fd: Int32
    let tag: UInt64  // stored raw at txid bytes 0..<8 (offset 8 in the message)
    var nextSeq: UInt32 = 0  // next sequence number to send
    var ackNext: UInt32 = 0  // oldest sequence number neither answered nor written off
    var lastProgress: Double = 0

    var inflight: Int { Int(nextSeq &- ackNext) }
}

/// Message vectors for sendmmsg/recvmmsg, allocated once per thread.
struct Vectors {
    let sendBuffers: UnsafeMutableRawPointer
    let sendIov: UnsafeMutablePointer<iovec>
    let sendMsgs: UnsafeMutablePointer<bench_mmsghdr>
    let recvBuffers: UnsafeMutableRawPointer
    let recvIov: UnsafeMutablePointer<iovec>
    let recvMsgs: UnsafeMutablePointer<bench_mmsghdr>

    init(batch: Int) {
        let h = STUNWire.headerLength
        sendBuffers = .allocate(byteCount: batch * h, alignment: 16)
        sendIov = .allocate(capacity: batch)
        sendMsgs = .allocate(capacity: batch)
        for i in 0..<batch {
            let p = sendBuffers + i * h
            storeBE16(p, 0, STUNWire.bindingRequest)
            storeBE16(p, 2, 0)
            storeBE32(p, 4, STUNWire.magicCookie)
            sendIov[i] = iovec(iov_base: p, iov_len: h)
            var m = bench_mmsghdr()
            m.msg_hdr.msg_iov = sendIov + i
            m.msg_hdr.msg_iovlen = 1
            sendMsgs[i] = m
        }
        (recvBuffers, recvIov, recvMsgs) = makeReceiveSlots(count: recvBatch, size: recvBufferSize)
    }
}

struct Counters {
    var sent = 0
    var received = 0
    var lost = 0
    var invalid = 0
    var errors = 0
    var idleSeconds = 0.0  // time spent in poll() waiting for answers
}

/// One thread's share of the sockets. Results are read only after the thread is joined.
final class Worker: @unchecked Sendable {
    let config: Config
    var flows: [Flow]
    let measureStart: Double
    let end: Double
    var counters = Counters()
    var measuredSeconds = 0.0

    init(config: Config, fds: [Int32], measureStart: Double, end: Double) {
        self.config = config
        self.flows = fds.map { Flow(fd: $0, tag: randomTag()) }
        self.measureStart = measureStart
        self.end = end
    }

    func run() {
        let v = Vectors(batch: config.batch)
        let window = config.window
        let batch = config.batch
        let sendThreshold = min(batch, window)
        let timeout = config.timeout
        var pollfds = flows.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
        var c = Counters()
        var counting = false
        var countStart = 0.0
        var now = monotonicSeconds()

        while now < end {
            if !counting && now >= measureStart {
                counting = true
                countStart = now
                c = Counters()
            }
            var activity = 0
            for fi in flows.indices {
                let fd = flows[fi].fd
                let tag = flows[fi].tag

                // Drain answers.
                while true {
                    for i in 0..<recvBatch { v.recvMsgs[i].msg_hdr.msg_flags = 0 }
                    let r = Int(bench_recvmmsg(fd, v.recvMsgs, UInt32(recvBatch), Int32(MSG_DONTWAIT), nil))
                    if r <= 0 {
                        if r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR { c.errors += 1 }
                        break
                    }
                    activity += r
                    for i in 0..<r {
                        let len = Int(v.recvMsgs[i].msg_len)
                        let p = v.recvBuffers + i * recvBufferSize
                        guard len >= STUNWire.headerLength,
                            v.recvMsgs[i].msg_hdr.msg_flags & Int32(MSG_TRUNC) == 0,
                            loadBE16(p, 0) == STUNWire.bindingSuccess,
                            Int(loadBE16(p, 2)) == len - STUNWire.headerLength,
                            len & 3 == 0,
                            loadBE32(p, 4) == STUNWire.magicCookie,
                            p.loadUnaligned(fromByteOffset: 8, as: UInt64.self) == tag
                        else {
                            c.invalid += 1
                            continue
                        }
                        c.received += 1
                        let seq = loadBE32(p, 16)
                        let ahead = Int(seq &- flows[fi].ackNext)
                        if ahead < flows[fi].inflight {
                            c.lost += ahead  // older requests overtaken: dropped somewhere
                            flows[fi].ackNext = seq &+ 1
                            flows[fi].lastProgress = now
                        }
                    }
                    if r < recvBatch { break }
                }

                // Write off a window that has gone silent (tail losses).
                var inflight = flows[fi].inflight
                if inflight > 0 && now - flows[fi].lastProgress > timeout {
                    c.lost += inflight
                    flows[fi].ackNext = flows[fi].nextSeq
                    inflight = 0
                }

                // Refill the window.
                let room = window - inflight
                if room >= sendThreshold {
                    let n = min(room, batch, config.gso ? maxGSOSegments : batch)
                    var seq = flows[fi].nextSeq
                    for i in 0..<n {
                        let p = v.sendBuffers + i * STUNWire.headerLength
                        p.storeBytes(of: tag, toByteOffset: 8, as: UInt64.self)
                        storeBE32(p, 16, seq)
                        seq &+= 1
                    }
                    let r: Int
                    if config.gso {
                        // One write of n requests back to back; the kernel cuts it.
                        let bytes = send(fd, v.sendBuffers, n * STUNWire.headerLength, Int32(MSG_DONTWAIT))
                        r = bytes > 0 ? bytes / STUNWire.headerLength : bytes
                    } else {
                        r = Int(bench_sendmmsg(fd, v.sendMsgs, UInt32(n), Int32(MSG_DONTWAIT)))
                    }
                    if r > 0 {
                        if inflight == 0 { flows[fi].lastProgress = now }
                        flows[fi].nextSeq &+= UInt32(r)
                        c.sent += r
                        activity += r
                    } else if r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR {
                        c.errors += 1  // e.g. ECONNREFUSED: nobody listening (yet)
                    }
                }
            }
            if activity == 0 {
                _ = poll(&pollfds, nfds_t(pollfds.count), 1)
                let after = monotonicSeconds()
                if counting { c.idleSeconds += after - now }
                now = after
            } else {
                now = monotonicSeconds()
            }
        }
        counters = c
        measuredSeconds = counting ? now - countStart : 0
    }
}

/// Sends one request every 100 ms until a matching success response arrives or time runs out.
func probe(_ target: SocketAddress, timeout: Double) -> Never {
    let fd = connectedSocket(target)
    let tag = randomTag()
    var req = [UInt8](repeating: 0, count: STUNWire.headerLength)
    var resp = [UInt8](repeating: 0, count: recvBufferSize)
    let start = monotonicSeconds()
    var seq: UInt32 = 0
    while monotonicSeconds() - start < timeout {
        req.withUnsafeMutableBytes { b in
            let p = b.baseAddress!
            storeBE16(p, 0, STUNWire.bindingRequest)
            storeBE16(p, 2, 0)
            storeBE32(p, 4, STUNWire.magicCookie)
            p.storeBytes(of: tag, toByteOffset: 8, as: UInt64.self)
            storeBE32(p, 16, seq)
        }
        seq += 1
        _ = send(fd, req, req.count, 0)
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let waitUntil = monotonicSeconds() + 0.1
        while case let left = waitUntil - monotonicSeconds(), left > 0 {
            guard poll(&pfd, 1, Int32(left * 1000) + 1) > 0 else { continue }
            let n = recv(fd, &resp, resp.count, 0)
            if n < 0 { continue }  // ECONNREFUSED while the server is not up yet: error consumed, wait on
            let ok = resp.withUnsafeMutableBytes { b -> Bool in
                let p = b.baseAddress!
                return n >= STUNWire.headerLength && loadBE16(p, 0) == STUNWire.bindingSuccess
                    && loadBE32(p, 4) == STUNWire.magicCookie
                    && p.loadUnaligned(fromByteOffset: 8, as: UInt64.self) == tag
            }
            if ok {
                print("probe ok target=\(target) after=\(format3(monotonicSeconds() - start))s")
                exit(0)
            }
        }
    }
    printError("probe: no Binding success response from \(target) within \(timeout) s")
    exit(1)
}

func format3(_ x: Double) -> String {
    let scaled = (x * 1000).rounded()
    let whole = Int(scaled) / 1000
    let frac = Int(scaled) % 1000
    let fracText = String(frac)
    return "\(whole)." + String(repeating: "0", count: 3 - fracText.count) + fracText
}

/// Runs every worker on its own thread (the first one on the calling thread) and joins them.
/// A plain function, not top-level code: top-level closures would be main-actor isolated
/// and trap when run on another thread.
nonisolated func runAll(_ workers: [Worker]) {
    var tids: [pthread_t] = []
    for w in workers.dropFirst() {
        var tid = pthread_t()
        let ctx = Unmanaged.passRetained(w).toOpaque()
        let rc = pthread_create(
            &tid, nil,
            { ctx in
                Unmanaged<Worker>.fromOpaque(ctx!).takeRetainedValue().run()
                return nil
            }, ctx)
        if rc != 0 { fail("pthread_create: \(rc)") }
        tids.append(tid)
    }
    workers[0].run()
    for tid in tids { pthread_join(tid, nil) }
}

// MARK: - Main

let args = Arguments(
    Array(CommandLine.arguments.dropFirst()),
    options: ["target", "duration", "warmup", "sockets", "threads", "window", "batch", "timeout-ms"],
    flagNames: ["probe", "no-gso"],
    usage: usage)

guard let targetText = args.string("target") else { fail("--target is required\n\(usage)") }
guard let target = SocketAddress.parse(targetText) else {
    fail("--target '\(targetText)': expected IPV4:PORT or [IPV6]:PORT")
}
guard target.isLoopback else {
    fail("--target \(target) refused: benchmarks may only send to loopback (127.0.0.0/8, ::1)")
}

if args.has("probe") {
    probe(target, timeout: args.double("duration", default: 5, range: 0.1...60))
}

var config = Config(
    target: target,
    duration: args.double("duration", default: 5, range: 0.1...600),
    warmup: args.double("warmup", default: 1, range: 0...60),
    sockets: args.int("sockets", default: 8, range: 1...1024),
    threads: args.int("threads", default: 1, range: 1...64),
    window: args.int("window", default: 32, range: 1...65536),
    batch: args.int("batch", default: 32, range: 1...1024),
    timeout: Double(args.int("timeout-ms", default: 20, range: 1...10000)) / 1000,
    gso: !args.has("no-gso"))
config.threads = min(config.threads, config.sockets)

signal(SIGPIPE, SIG_IGN)
let fds = (0..<config.sockets).map { _ in connectedSocket(target) }
if config.gso && !fds.allSatisfy({ enableGSO($0, segment: STUNWire.headerLength) }) {
    config.gso = false  // no UDP GSO here: fall back to sendmmsg
}
let start = monotonicSeconds()
let measureStart = start + config.warmup
let end = measureStart + config.duration
let workers = (0..<config.threads).map { t in
    Worker(
        config: config,
        fds: stride(from: t, to: fds.count, by: config.threads).map { fds[$0] },
        measureStart: measureStart, end: end)
}

runAll(workers)
for fd in fds { close(fd) }

var total = Counters()
var seconds = 0.0
for w in workers {
    total.sent += w.counters.sent
    total.received += w.counters.received
    total.lost += w.counters.lost
    total.invalid += w.counters.invalid
    total.errors += w.counters.errors
    total.idleSeconds += w.counters.idleSeconds
    seconds = max(seconds, w.measuredSeconds)
}
// The generator's own CPU use over its whole run (warmup included), as a share of one core.
var selfUsage = rusage()
getrusage(RUSAGE_SELF.rawValue, &selfUsage)
let userSeconds = Double(selfUsage.ru_utime.tv_sec) + Double(selfUsage.ru_utime.tv_usec) * 1e-6
let systemSeconds = Double(selfUsage.ru_stime.tv_sec) + Double(selfUsage.ru_stime.tv_usec) * 1e-6
let cpuSeconds = userSeconds + systemSeconds
let cpuPercent = Int((100 * cpuSeconds / max(monotonicSeconds() - start, 1e-9)).rounded())
let rps = seconds > 0 ? Double(total.received) / seconds : 0
let sendRps = seconds > 0 ? Double(total.sent) / seconds : 0
print(
    "sent=\(total.sent) received=\(total.received) seconds=\(format3(seconds)) "
        + "rps=\(Int(rps.rounded())) send_rps=\(Int(sendRps.rounded())) "
        + "lost=\(total.lost) invalid=\(total.invalid) errors=\(total.errors) "
        + "cpu=\(cpuPercent)% idle=\(seconds > 0 ? Int((100 * total.idleSeconds / (seconds * Double(workers.count))).rounded()) : 0)% "
        + "sockets=\(config.sockets) threads=\(config.threads) window=\(config.window) batch=\(config.batch) gso=\(config.gso ? 1 : 0)"
)
