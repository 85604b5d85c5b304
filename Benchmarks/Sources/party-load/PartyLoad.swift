// tusa's party relay as the server: every member a real party member, its own identity,
// a Noise IK session with the relay (`SecureEndpoint`) and the room client's core
// (`PartyMember`), which creates or joins its room and hands its sender keys to the
// others through the relay.
import BenchSupport
import Party
import Secure
import TusaBase

#if canImport(Glibc)
    import Glibc
#endif

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

final class PartyLoad: RoomLoad {
    var members: [Member] = []
    let payload: Int
    let relay: TransportAddress
    /// Room ids, once their creators are in.
    var roomIDs: [String?]
    var protocolErrors: [String: Int] = [:]
    let audio: [UInt8]

    init(
        rooms: Int, size: Int, speakers: Int, rate: Double, payload: Int, relay: (ip: UInt32, port: UInt16),
        relayKey: PublicKey, net: UInt32
    ) {
        self.payload = payload
        let relayAddress = TransportAddress(ip: .v4(relay.ip), port: relay.port)
        self.relay = relayAddress
        roomIDs = Array(repeating: nil, count: rooms)
        var g = SystemRandomNumberGenerator()
        audio = (0..<payload).map { _ in UInt8.random(in: 0...255, using: &g) }
        super.init(rooms: rooms, size: size, speakers: speakers, rate: rate, relay: relay, net: net)
        let now = clock
        members = (0..<rooms * size).map { i in
            Member(index: i, ip: ip(of: i), room: i / size, relay: relayAddress, relayKey: relayKey, now: now)
        }
    }

    var clock: Timestamp { Timestamp(nanoseconds: nowNanoseconds()) }

    var anyLost: Bool { members.contains { $0.lost } }

    // MARK: sending

    override func sendFrame(from index: Int, timestamp: UInt32, level: UInt8) -> Bool {
        let m = members[index]
        guard let frame = m.core.seal(audio, timestamp: timestamp, level: AudioLevel(level: level, voiced: true), now: clock)
        else { return false }
        return sendHop(m, frame)
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
        let slot = nextSlot()
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

    override func deliver(_ datagram: UnsafeMutableRawBufferPointer, to index: Int, seconds: Double) {
        let m = members[index]
        // A voice frame shows its timestamp, whose top byte is the phase (never 0), in the
        // hop's RTP header; control packets carry 0. Frames not sampled are counted from it.
        if openEvery > 1, datagram.count >= 12 + 16, datagram[0] & 0xC0 == 0x80, datagram[1] & 0x7F == PartyHop.payloadType,
            datagram[4] != 0, !sampled()
        {
            countDelivery(
                stamp: UInt32(datagram[4]) << 24 | UInt32(datagram[5]) << 16 | UInt32(datagram[6]) << 8 | UInt32(datagram[7]))
            return
        }
        let now = clock
        let result = m.endpoint.receive(datagram, from: relay, now: now)
        switch result {
        case .media(_, let header, let range) where header.payloadType == PartyHop.payloadType:
            let hop = UnsafeRawBufferPointer(rebasing: datagram[range])
            if hop.first == PartyPacketType.media.rawValue, hop.count >= PartyFrameHeader.fixedLength {
                // 5-8: the frame's RTP timestamp, whose top byte is the phase.
                countDelivery(stamp: UInt32(hop[5]) << 24 | UInt32(hop[6]) << 16 | UInt32(hop[7]) << 8 | UInt32(hop[8]))
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

    /// Runs the members' timers that are due (each member at most every 10 ms).
    override func timers() {
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

    /// The length of a delivered frame on the wire (RTP 12 + party header + SFrame + audio + tags).
    var deliveredLength: Int {
        let m = members[0]
        guard let frame = m.core.seal(audio, timestamp: 0, level: AudioLevel(level: 127, voiced: false), now: clock)
        else { return 0 }
        return 12 + frame.count + 16
    }
}
