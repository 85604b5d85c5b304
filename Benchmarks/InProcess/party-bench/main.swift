// party-bench: a party's costs, each beside its baseline in one run.
//
//   forward  the relay's work per delivered voice frame: rooms of 25 members with
//            3 speakers each at 50 frames/s, frames interleaved across rooms as
//            voice arrives: the room core's decision (PartyServer.forward: the
//            sender bound to its session, speaker selection, the member list)
//            plus the hop-by-hop sealing of each copy under the receiving
//            member's session (SecureEndpoint.sealMedia), against the bare
//            ChaCha20-Poly1305 seal of the same bytes (what any relay that
//            re-encrypts per member pays at least), in alternating slices.
//   join     PartyService and PartyConnections on loopback UDP: from the join
//            request to the first frame of the room heard (p50, p95 over the
//            joins), and after a leave, until every remaining member sends under
//            a fresh key (p50, p95).
//
// Usage: party-bench [--seconds S] [--joins N] [--part forward|join|all]
//
// A target of the main package, as secure-bench is: make test's smoke run reuses its build.
import Foundation
import Logging
import NIOCore
import Party
import Relay
import STUN
import Secure
import ServiceLifecycle
import Synchronization
import Transport
import TusaBase

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("party-bench: \(message)\n".utf8))
    exit(1)
}

func monotonicSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

let usage = "usage: party-bench [--seconds S (0.2-120, default 3)] [--joins N (1-200, default 20)] [--part forward|join|all]"
func parseArguments() -> (seconds: Double, joins: Int, part: String) {
    var seconds = 3.0
    var joins = 20
    var part = "all"
    var argv = CommandLine.arguments.dropFirst()
    while let flag = argv.popFirst() {
        guard let value = argv.popFirst() else { fail(usage) }
        switch flag {
        case "--seconds":
            guard let s = Double(value), (0.2...120).contains(s) else { fail(usage) }
            seconds = s
        case "--joins":
            guard let n = Int(value), (1...200).contains(n) else { fail(usage) }
            joins = n
        case "--part":
            guard ["forward", "join", "all"].contains(value) else { fail(usage) }
            part = value
        default: fail(usage)
        }
    }
    return (seconds, joins, part)
}
let (seconds, joins, part) = parseArguments()

// MARK: forward

/// Every action the endpoint has waiting.
func drain(_ e: SecureEndpoint) -> [SecureOutput] {
    var out: [SecureOutput] = []
    while let a = e.pollAction() { out.append(a) }
    return out
}

func forwarding() {
    let roomSize = 25
    let rooms = 4
    let speakers = 3
    var t = Timestamp.seconds(1)
    var config = SecureConfiguration()
    config.handshakeRate = 1e9
    config.handshakeBurst = 1e9
    config.acceptUnknownPeers = true
    let relayIdentity = Identity.generate()
    let relay = SecureEndpoint(identity: relayIdentity, configuration: config, now: t)
    var server = PartyServer()
    var members: [(session: PartySession, peer: PeerID, core: PartyMember)] = []
    // Each member: a secure session with the relay (handshake through the cores), then a join.
    for i in 0..<(roomSize * rooms) {
        let identity = Identity.generate()
        let address = TransportAddress(ip: .v4(0x0A00_0000 + UInt32(i)), port: 4000)
        let relayAddress = TransportAddress(ip: .v4(0x7F00_0001), port: 3481)
        let member = SecureEndpoint(identity: identity, configuration: config, now: t)
        let relayAtMember = member.addPeer(relayIdentity.publicKey, address: relayAddress)
        member.handle(.connect(relayAtMember), now: t)
        func sends(_ o: [SecureOutput]) -> [[UInt8]] { o.compactMap { if case .send(let b, _) = $0 { b } else { nil } } }
        guard var initiation = sends(drain(member)).first, relay.receive(&initiation, from: address, now: t) == .handled,
            var response = sends(drain(relay)).first, member.receive(&response, from: relayAddress, now: t) == .handled,
            var confirm = sends(drain(member)).first
        else { fail("handshake \(i) did not complete") }
        _ = relay.receive(&confirm, from: address, now: t)
        var peer: PeerID?
        for case .event(.established(let p, _, _)) in drain(relay) { peer = p }
        guard let peer else { fail("no session for member \(i)") }
        let session = PartySession(UInt64(peer.rawValue))
        server.handle(.opened(session, key: identity.publicKey), now: t)
        members.append((session, peer, PartyMember(identity: identity.privateKey)))
    }
    // Rooms: the first member of each creates, the others join (control through the cores).
    func deliver() {
        var busy = true
        while busy {
            busy = false
            for i in members.indices {
                while let a = members[i].core.pollAction() {
                    busy = true
                    if case .send(let bytes) = a { server.handle(.received(members[i].session, bytes), now: t) }
                }
            }
            while let a = server.pollAction() {
                busy = true
                if case .send(let s, let bytes) = a, let i = members.firstIndex(where: { $0.session == s }) {
                    members[i].core.handle(.received(bytes), now: t)
                }
            }
        }
    }
    for r in 0..<rooms {
        let first = r * roomSize
        members[first].core.handle(.create(name: "room \(r)", maxMembers: nil, invite: []), now: t)
        deliver()
        guard let id = members[first].core.room else { fail("room \(r) was not created") }
        for i in (first + 1)..<(first + roomSize) {
            members[i].core.handle(.join(room: id), now: t)
            deliver()
        }
    }
    // Each room's speakers' frames (as the relay receives them), interleaved across rooms.
    let audio = [UInt8](repeating: 0x5A, count: 60)
    var frames: [(session: PartySession, bytes: [UInt8])] = []
    for step in 0..<50 {
        for r in 0..<rooms {
            for k in 0..<speakers {
                let i = r * roomSize + k
                guard
                    let f = members[i].core.seal(
                        audio, timestamp: UInt32(step * 160), level: AudioLevel(level: 30, voiced: true), now: t)
                else { fail("member \(i) cannot seal") }
                frames.append((members[i].session, f))
            }
        }
    }
    let peers = Dictionary(uniqueKeysWithValues: members.map { ($0.session, $0.peer) })
    var out = [UInt8](repeating: 0, count: 2048)
    let key = SecretKey.random()
    let nonce = [UInt8](repeating: 7, count: AEAD.nonceLength)
    var delivered = 0
    var relayTime = 0.0
    var bare = 0
    var bareTime = 0.0
    var cursor = 0
    for _ in 0..<10 {
        var start = monotonicSeconds()
        while monotonicSeconds() - start < seconds / 20 {
            for _ in 0..<64 {
                let (session, bytes) = frames[cursor % frames.count]
                cursor += 1
                if cursor % frames.count == 0 { t = t + .milliseconds(20) }
                for target in server.forward(bytes, from: session, now: t) {
                    guard let peer = peers[target] else { continue }
                    _ = try? bytes.withUnsafeBytes { p in
                        try out.withUnsafeMutableBytes { o in
                            try relay.sealMedia(
                                to: peer, payloadType: PartyHop.payloadType, timestamp: 0, payload: p, into: o, now: t)
                        }
                    }
                    delivered += 1
                }
            }
        }
        relayTime += monotonicSeconds() - start
        start = monotonicSeconds()
        while monotonicSeconds() - start < seconds / 20 {
            for _ in 0..<64 {
                let bytes = frames[bare % frames.count].bytes
                _ = try? nonce.withUnsafeBytes { n in
                    try bytes.withUnsafeBytes { p in
                        try out.withUnsafeMutableBytes { o in
                            try AEAD.seal(
                                key: key, nonce: n, ad: UnsafeRawBufferPointer(start: nil, count: 0), plaintext: p, into: o)
                        }
                    }
                }
                bare += 1
            }
        }
        bareTime += monotonicSeconds() - start
    }
    let perDelivered = relayTime / Double(delivered) * 1e9
    let perBare = bareTime / Double(bare) * 1e9
    print(
        String(
            format:
                "forward: %d delivered in %.2f s = %.0f delivered frames/s on one core (%.0f ns each: forwarding decision + hop sealing), %d rooms of %d, %d speakers; bare AEAD seal of the same frame in the same run: %.0f ns; forward / bare %.2f",
            delivered, relayTime, Double(delivered) / relayTime, perDelivered, rooms, roomSize, speakers, perBare,
            perDelivered / perBare))
    let s = server.statistics
    if s.framesSpoofed > 0 || delivered == 0 { fail("frames dropped as spoofed: \(s.framesSpoofed), delivered \(delivered)") }
}

// MARK: join and rekey on loopback

final class Log: Sendable {
    let events = Mutex<[(Double, PartyMemberEvent)]>([])
    func add(_ e: PartyMemberEvent) { events.withLock { $0.append((monotonicSeconds(), e)) } }
    func first(after t: Double, _ match: (PartyMemberEvent) -> Bool) -> Double? {
        events.withLock { $0.first { $0.0 >= t && match($0.1) }?.0 }
    }
}

func percentile(_ values: [Double], _ p: Double) -> Double {
    let s = values.sorted()
    guard !s.isEmpty else { return .nan }
    return s[min(s.count - 1, Int((Double(s.count - 1) * p).rounded()))]
}

func waitFor(_ seconds: Double, _ condition: () -> Bool) async -> Bool {
    let end = monotonicSeconds() + seconds
    while monotonicSeconds() < end {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(1))
    }
    return condition()
}

func joinAndRekey() async {
    var logger = Logger(label: "party-bench")
    logger.logLevel = .error
    let identity = Identity.generate()
    let service = PartyService(address: TransportAddress(ip: .v4(0x7F00_0001), port: 0), identity: identity, logger: logger)
    let group = ServiceGroup(configuration: .init(services: [service], logger: logger))
    let running = Task { try await group.run() }
    guard let relay = try? await service.boundAddress() else { fail("the party service did not start") }
    func member() async -> (PartyConnection, Log) {
        let log = Log()
        guard
            let c = try? await PartyConnection.connect(
                to: relay, relayKey: identity.publicKey, identity: .generate(),
                audio: { from, header, _, format in
                    log.add(.audio(from: from, header: header, audio: [], format: format))
                }, logger: logger)
        else { fail("cannot connect to the party service") }
        Task { for await e in c.events { log.add(e) } }
        return (c, log)
    }
    // A speaker keeps talking in the room (a frame every 20 ms).
    let (speaker, _) = await member()
    guard let room = try? await speaker.create(name: "bench") else { fail("cannot create a room") }
    let (listener, listenerLog) = await member()
    guard (try? await listener.join(room.room)) != nil else { fail("cannot join") }
    let talking = Task {
        var ts: UInt32 = 0
        while !Task.isCancelled {
            speaker.send([UInt8](repeating: 1, count: 60), timestamp: ts, level: AudioLevel(level: 30, voiced: true))
            ts &+= 160
            try? await Task.sleep(for: .milliseconds(20))
        }
    }
    var joinTimes: [Double] = []
    var rekeyTimes: [Double] = []
    for _ in 0..<joins {
        let (newcomer, log) = await member()
        let start = monotonicSeconds()
        guard (try? await newcomer.join(room.room)) != nil else { fail("a join failed") }
        guard await waitFor(5, { log.first(after: start) { if case .audio = $0 { true } else { false } } != nil }),
            let heard = log.first(after: start, { if case .audio = $0 { true } else { false } })
        else { fail("the newcomer heard nothing within 5 s") }
        joinTimes.append(heard - start)
        // It leaves: the speaker and the listener make fresh keys; the listener's is in use once the
        // speaker (and no one else) acknowledged it.
        let left = monotonicSeconds()
        await newcomer.close()
        guard await waitFor(5, { listenerLog.first(after: left) { if case .sendingUnder = $0 { true } else { false } } != nil }),
            let rekeyed = listenerLog.first(after: left, { if case .sendingUnder = $0 { true } else { false } })
        else { fail("no rekey within 5 s of a leave") }
        rekeyTimes.append(rekeyed - left)
    }
    talking.cancel()
    await speaker.close()
    await listener.close()
    await group.triggerGracefulShutdown()
    _ = try? await running.value
    print(
        String(
            format:
                "join: from the join request to the first frame heard, over %d joins on loopback: p50 %.1f ms, p95 %.1f ms; rekey after a leave, until a remaining member sends under a fresh key: p50 %.1f ms, p95 %.1f ms",
            joins, percentile(joinTimes, 0.5) * 1000, percentile(joinTimes, 0.95) * 1000, percentile(rekeyTimes, 0.5) * 1000,
            percentile(rekeyTimes, 0.95) * 1000))
}

if part == "forward" || part == "all" { forwarding() }
if part == "join" || part == "all" { await joinAndRekey() }
