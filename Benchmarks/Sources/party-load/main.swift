// party-load: parties at voice pacing against `tusa relay --party-port`, for loopback
// benchmarks (issues 15 and 17: room forwarding, one read and N-1 writes per frame), or
// against the C reference forwarder `room-forward` (--reference: the machine's limit).
//
// Every member is a real party member (PartyLoad.swift): its own identity, a Noise IK
// session with the relay (the root package's `SecureEndpoint`) and the room client's core
// (`PartyMember`), which creates or joins its room and hands its sender keys to the
// others through the relay. Members have one source address each (127.S.x.y) and all
// send and receive through one wildcard socket (the source set per datagram with
// IP_PKTINFO, the member found from each arrival's destination), so the generator's
// own cost per packet is a share of a sendmmsg or a recvmmsg (RoomLoad.swift).
//
// Setup: `--rooms` rooms of `--size` members; the first member of each creates it, the
// others join; then the generator waits until every member has every other's key.
// Then one measured phase per step of `--ramp` (default: all rooms): in the first N
// rooms, `--speakers` members each send one voiced frame (`--payload` bytes of audio,
// sealed end to end, then hop by hop) every 1/`--rate` s, the speakers' sends spread
// evenly over the period and interleaved across rooms. The relay forwards each frame
// to the room's other members: `--size` - 1 deliveries per frame. Every delivery is
// opened hop by hop (the Noise session) and counted by the phase it was sent in (with
// --open-every N, one in N; the others by the phase their hop's RTP timestamp shows); one
// frame per member each 50 ms is also opened end to end by the member's core (so the
// keys are shown to work, and the core hears its relay the way it does in a call).
// lost = expected - delivered after a drain. With --server-pid, the relay's CPU
// (utime+stime) over the measured seconds: CPU per 1000 delivered frames. Sends the
// generator could not make in time (a whole period behind) are `skipped`, kernel drops
// (machine-wide, /proc/net/snmp) are shown beside the loss.
//
// With --reference (ReferenceLoad.swift) the same rooms, pacing and counting against
// room-forward: members join with one datagram, frames are `--datagram` bytes sealed
// with ChaCha20-Poly1305 under a key derived from the member's address, and every
// delivery is opened with it.
//
// One line per phase: 'phase=party rooms=N ... delivered_pps= ... loss_pct= ...'.
import BenchSupport
import Secure

#if canImport(Glibc)
    import Glibc
#endif

let usage = """
    usage: party-load --target IPV4:PORT (--relay-key BASE64 | --relay-identity FILE | --reference) [options]
      --target IPV4:PORT     the relay's party port, loopback only (127.0.0.0/8)
      --relay-key BASE64     the relay's public key (tusa relay --identity FILE: its public-key line)
      --relay-identity FILE  or the relay's identity file itself
      --reference            the target is room-forward, the C reference (no sessions, no room core)
      --datagram BYTES       --reference: bytes on the wire per frame (default 120, tusa's at 60 bytes of audio)
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
      --join-rate R          handshakes (or joins) started per second while setting up (default 200)
      --setup-timeout S      give up setting up after S seconds (default 120)
      --open-every N         open one delivered frame in N, count the others by the phase their
                             clear header shows (default 1: open all)
    prints one 'setup ...' line, one 'phase=party ...' line per phase, then 'done ...'
    """

let args = Arguments(
    Array(CommandLine.arguments.dropFirst()),
    options: [
        "target", "relay-key", "relay-identity", "datagram", "rooms", "size", "speakers", "rate", "payload", "duration",
        "warmup", "ramp", "server-pid", "source-net", "join-rate", "setup-timeout", "open-every",
    ],
    flagNames: ["reference"],
    usage: usage)
guard let targetText = args.string("target"), let target = parseV4(targetText), target.ip >> 24 == 127 else {
    fail("--target IPV4:PORT on loopback is required\n\(usage)")
}
let reference = args.has("reference")
var relayKey: PublicKey?
if let text = args.string("relay-key") {
    guard let key = PublicKey(base64: text) else { fail("--relay-key: not a base64 public key") }
    relayKey = key
} else if let path = args.string("relay-identity") {
    do { relayKey = try Identity.read(from: path).publicKey } catch { fail("--relay-identity: \(error)") }
}
guard reference == (relayKey == nil) else {
    fail("give either --relay-key or --relay-identity (tusa's relay), or --reference (room-forward)\n\(usage)")
}
let rooms = args.int("rooms", default: 4, range: 1...400)
let size = args.int("size", default: 25, range: 2...200)
let speakers = args.int("speakers", default: 3, range: 1...size)
guard rooms * size <= 60_000 else { fail("--rooms x --size: at most 60000 members") }
let rate = args.double("rate", default: 50, range: 1...1000)
let payload = args.int("payload", default: 60, range: 1...1200)
let datagram = args.int("datagram", default: 120, range: ReferenceLoad.header + 4 + ReferenceLoad.tag...1400)
let duration = args.double("duration", default: 3, range: 0.1...600)
let warmup = args.double("warmup", default: 0.5, range: 0...60)
let serverPID = args.string("server-pid").map { text -> Int32 in
    guard let pid = Int32(text), pid > 0 else { fail("--server-pid: not a process id") }
    return pid
}
guard let net = parseNet(args.string("source-net") ?? "127.3") else { fail("--source-net: A.B with A = 127") }
let joinRate = args.double("join-rate", default: 200, range: 1...100_000)
let setupTimeout = args.double("setup-timeout", default: 120, range: 1...3600)
let openEvery = args.int("open-every", default: 1, range: 1...1000)
var steps = [rooms]
if let ramp = args.string("ramp") {
    steps = ramp.split(separator: ",").map { text in
        guard let n = Int(text), (1...rooms).contains(n) else { fail("--ramp: '\(text)' is not a room count in 1...\(rooms)") }
        return n
    }
}

let load: RoomLoad
let setup: (ok: Bool, seconds: Double, why: String)
let wire: Int
if let relayKey {
    let party = PartyLoad(
        rooms: rooms, size: size, speakers: speakers, rate: rate, payload: payload, relay: target, relayKey: relayKey,
        net: net)
    setup = party.setUp(joinRate: joinRate, timeout: setupTimeout)
    wire = setup.ok ? party.deliveredLength : 0
    load = party
} else {
    let forwarder = ReferenceLoad(
        rooms: rooms, size: size, speakers: speakers, rate: rate, datagram: datagram, relay: target, net: net)
    setup = forwarder.setUp(joinRate: joinRate, timeout: setupTimeout)
    wire = datagram
    load = forwarder
}
load.openEvery = openEvery
guard setup.ok else {
    print("setup FAILED after \(fmt(setup.seconds, 1)) s: \(setup.why)")
    exit(1)
}
print(
    "setup rooms=\(rooms) size=\(size) members=\(rooms * size) seconds=\(fmt(setup.seconds, 2))"
        + " datagram=\(wire) payload=\(reference ? wire : payload)")
var failed = false
for (i, n) in steps.enumerated() {
    let line = load.run(rooms: n, phase: i + 1, warmup: warmup, duration: duration, serverPID: serverPID)
    print(line)
    fflush(nil)
    if let party = load as? PartyLoad, party.anyLost {
        // Past the relay's ceiling, members' pings go unanswered and they give the relay
        // up: the ramp ends there. On the first step, the run failed.
        print("a member lost its session or room: \(party.setupState())")
        if i == 0 { failed = true } else { print("ramp ended after \(n) rooms: the relay was past its ceiling") }
        break
    }
}
print("done generator_cpu_total=\(fmt(selfCPU(), 2))")
exit(failed ? 1 : 0)
