import Foundation
import Logging
import NIOCore
import NIOPosix
import Party
import Relay
import Rendezvous
import STUN
import Secure
import ServiceLifecycle
import Synchronization
import TestSupport
import Testing
import Transport
import TusaBase

// Parties over real loopback UDP: the relay's PartyService in process, members
// as PartyConnections (Noise IK sessions with the relay's identity), the cores
// underneath as in the virtual-clock tests.

private let quiet: Logger = {
    var logger = Logger(label: "tusa.test.party")
    logger.logLevel = .warning
    return logger
}()

/// Every event a connection reported, kept for checks that wait for one.
private final class EventLog: Sendable {
    private final class Box: Sendable {
        let events = Mutex<[PartyMemberEvent]>([])
    }
    private let box = Box()

    init(_ connection: PartyConnection) {
        let box = self.box
        Task {
            for await e in connection.events { box.events.withLock { $0.append(e) } }
        }
    }

    var all: [PartyMemberEvent] { box.events.withLock { $0 } }

    func audio(from member: MemberID) -> [[UInt8]] {
        all.compactMap { if case .audio(let from, _, let audio, _) = $0, from == member { audio } else { nil } }
    }

    var keysReceived: Int { all.filter { if case .keyReceived = $0 { true } else { false } }.count }
    var rekeys: Int { all.filter { if case .sendingUnder = $0 { true } else { false } }.count }
    var ended: LeaveReason? { all.lazy.compactMap { if case .ended(let r) = $0 { r } else { nil } }.first }
    var rejoinedAs: MemberID? { all.lazy.compactMap { if case .rejoined(_, _, let me, _) = $0 { me } else { nil } }.last }
    var lostCount: Int { all.filter { if case .connectionLost = $0 { true } else { false } }.count }

    /// Whether `condition` held within `limit` (polled; the deadline only bounds a failure).
    func wait(within limit: Duration = .seconds(10), _ condition: (EventLog) -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if condition(self) { return true }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return condition(self)
    }
}

/// A party relay running as `tusa relay` runs it, until `stop()`.
private struct RunningPartyRelay {
    let service: PartyService
    let group: ServiceGroup
    let task: Task<Void, any Error>
    let address: TransportAddress

    static func start(identity: Identity, at address: TransportAddress = TransportAddress(ip: .v4(0x7F00_0001), port: 0))
        async throws -> RunningPartyRelay
    {
        let service = PartyService(address: address, identity: identity, logger: quiet)
        let group = ServiceGroup(configuration: .init(services: [service], logger: quiet))
        let task = Task { try await group.run() }
        do {
            return RunningPartyRelay(service: service, group: group, task: task, address: try await service.boundAddress())
        } catch {
            task.cancel()
            throw error
        }
    }

    /// On a number nothing else takes between a stop and a start (not the kernel's
    /// pick); drawn again if one is taken before the relay binds it.
    static func startOnAQuietPort(identity: Identity) async throws -> RunningPartyRelay {
        var attempt = 0
        while true {
            attempt += 1
            do {
                return try await start(identity: identity, at: TransportAddress(ip: .v4(0x7F00_0001), port: QuietPort.draw()))
            } catch  where attempt < 5 && "\(error)".contains("Address already in use") {
                continue
            }
        }
    }

    /// The same number again, until `limit` if something holds it a moment.
    static func start(identity: Identity, at address: TransportAddress, retryingFor limit: Duration)
        async throws -> RunningPartyRelay
    {
        let deadline = ContinuousClock.now + limit
        while true {
            do { return try await start(identity: identity, at: address) } catch
                where ContinuousClock.now < deadline && "\(error)".contains("Address already in use")
            {
                try await Task.sleep(for: .milliseconds(50))
            }
        }
    }

    func stop() async {
        await group.triggerGracefulShutdown()
        _ = try? await task.value
    }
}

/// A relay of a directory (its tickets keyed from the directory's secret: it drains
/// on shutdown) with one member in a room of its own, its events logged.
private struct DrainingRelay {
    let identity: Identity
    let address: TransportAddress
    let member: PartyConnection
    let log: EventLog
    let group: ServiceGroup
    let running: Task<Void, any Error>

    static func start(drainDeadline: Duration) async throws -> DrainingRelay {
        let identity = Identity.generate()
        let service = PartyService(
            address: TransportAddress(ip: .v4(0x7F00_0001), port: 0), identity: identity, ticketSecret: "directory s3cret",
            drainDeadline: drainDeadline, logger: quiet)
        let group = ServiceGroup(configuration: .init(services: [service], logger: quiet))
        let running = Task { try await group.run() }
        do {
            let address = try await service.boundAddress()
            let member = try await PartyConnection.connect(
                to: address, relayKey: identity.publicKey, identity: .generate(), logger: quiet)
            let log = EventLog(member)
            _ = try await member.create(name: "Factorio")
            return DrainingRelay(
                identity: identity, address: address, member: member, log: log, group: group, running: running)
        } catch {
            running.cancel()
            throw error
        }
    }

    /// Shuts the relay down; how long it took to exit.
    func shutDown() async -> Duration {
        let asked = ContinuousClock.now
        await group.triggerGracefulShutdown()
        _ = try? await running.value
        return ContinuousClock.now - asked
    }
}

/// With `tls`, the relay takes members over TLS too, on a port of its own
/// (`boundTLSAddresses()`), showing that certificate.
private func withPartyRelay(
    maxMembers: Int = 50, tls: TestCertificate? = nil, _ body: (TransportAddress, PublicKey, PartyService) async throws -> Void
) async throws {
    var rooms = PartyServer.Configuration()
    rooms.maxMembers = maxMembers
    let identity = Identity.generate()
    let service = PartyService(
        address: TransportAddress(ip: .v4(0x7F00_0001), port: 0), identity: identity, configuration: rooms,
        tls: tls.map {
            PartyService.TLSStreams(ports: [0], certificateFile: $0.certificateFile, privateKeyFile: $0.privateKeyFile)
        },
        logger: quiet)
    let group = ServiceGroup(configuration: .init(services: [service], logger: quiet))
    let running = Task { try await group.run() }
    defer { running.cancel() }
    let address = try await service.boundAddress()
    do { try await body(address, identity.publicKey, service) } catch {
        await group.triggerGracefulShutdown()
        throw error
    }
    await group.triggerGracefulShutdown()
    _ = try? await running.value
}

@Suite("Parties over loopback UDP through the relay's PartyService", .serialized)
struct PartyServiceTests {
    @Test func membersJoinHearEachOtherAndAKickRekeys() async throws {
        try await withPartyRelay { relay, relayKey, service in
            let alice = try await PartyConnection.connect(to: relay, relayKey: relayKey, identity: .generate(), logger: quiet)
            let bob = try await PartyConnection.connect(to: relay, relayKey: relayKey, identity: .generate(), logger: quiet)
            let carol = try await PartyConnection.connect(to: relay, relayKey: relayKey, identity: .generate(), logger: quiet)
            let logs = [alice, bob, carol].map(EventLog.init)
            let created = try await alice.create(name: "Hearthstone")
            #expect(created.name == "Hearthstone" && created.roster.count == 1)
            let b = try await bob.join(created.room)
            let c = try await carol.join(created.room)
            #expect(c.roster.count == 3 && c.roster.filter(\.creator).count == 1)
            #expect(service.roomCount == 1 && service.memberCount == 3)
            // Each member holds the other two's keys.
            for log in logs { #expect(await log.wait { $0.keysReceived >= 2 }, "\(log.all)") }

            let words: [[UInt8]] = (0..<5).map { i in [UInt8](repeating: UInt8(i + 1), count: 60) }
            for (i, w) in words.enumerated() {
                alice.send(w, timestamp: UInt32(i * 160), level: AudioLevel(level: 30, voiced: true))
            }
            for log in logs[1...] {
                #expect(await log.wait { $0.audio(from: created.me).count == 5 }, "\(log.all)")
                #expect(log.audio(from: created.me) == words)
            }

            // The creator removes Carol: she learns it, the others make fresh keys and switch.
            alice.kick(c.me)
            #expect(await logs[2].wait { $0.ended == .kicked })
            #expect(await logs[0].wait { $0.rekeys >= 1 })
            #expect(await logs[1].wait { $0.rekeys >= 1 })
            let after: [UInt8] = Array(repeating: 0x77, count: 60)
            bob.send(after, timestamp: 9_000, level: AudioLevel(level: 20, voiced: true))
            #expect(await logs[0].wait { $0.audio(from: b.me).last == after })
            #expect(logs[2].audio(from: b.me).isEmpty)
            #expect(service.statistics.framesSpoofed == 0)
            #expect(service.statistics.framesForwarded >= 11)

            // The last one out closes the room.
            alice.leave()
            bob.leave()
            #expect(await eventually { service.roomCount == 0 })
            for c in [alice, bob, carol] { await c.close() }
        }
    }

    /// The relay process restarts (same identity file, same port) in the middle of
    /// a party: every member notices within seconds, handshakes again and rejoins
    /// its seat with its keys; the room is heard again, nobody is dropped.
    @Test func aRestartedRelayHasEveryMemberBackInItsSeat() async throws {
        let identity = Identity.generate()
        let first = try await RunningPartyRelay.startOnAQuietPort(identity: identity)
        let connections = try await (0..<3).asyncMap { _ in
            try await PartyConnection.connect(
                to: first.address, relayKey: identity.publicKey, identity: .generate(), logger: quiet)
        }
        let logs = connections.map(EventLog.init)
        let created = try await connections[0].create(name: "Valheim")
        var ids = [created.me]
        for c in connections[1...] { ids.append(try await c.join(created.room).me) }
        for log in logs { #expect(await log.wait { $0.keysReceived >= 2 }, "\(log.all)") }

        await first.stop()
        let restartedAt = ContinuousClock.now
        let second = try await RunningPartyRelay.start(identity: identity, at: first.address, retryingFor: .seconds(3))
        defer { Task { await second.stop() } }
        for (log, id) in zip(logs, ids) {
            #expect(await log.wait(within: .seconds(15)) { $0.rejoinedAs != nil }, "\(log.all.suffix(5))")
            #expect(log.rejoinedAs == id, "back in seat \(id)")
            #expect(log.ended == nil)
        }
        let back = ContinuousClock.now - restartedAt
        #expect(second.service.roomCount == 1 && second.service.memberCount == 3)

        // Everyone is heard again, under the keys they had.
        for (i, c) in connections.enumerated() {
            let word = [UInt8](repeating: UInt8(0x40 + i), count: 60)
            // A few frames: the first may race the last key handed over.
            for n in 0..<10 {
                c.send(word, timestamp: UInt32(50_000 + n * 160), level: AudioLevel(level: 25, voiced: true))
                try await Task.sleep(for: .milliseconds(20))
            }
            for (j, log) in logs.enumerated() where j != i {
                #expect(await log.wait { $0.audio(from: ids[i]).last == word }, "member \(j) hears \(ids[i])")
            }
        }
        #expect(second.service.statistics.framesSpoofed == 0)
        print("party relay restart: every member back in its seat \(back) after the new relay started")
        for c in connections { await c.close() }
    }

    /// A draining relay waits for its members to go, but not for ever: a peer that
    /// goes on sending (an older client that does not know "moving") holds its exit
    /// only until `drainDeadline`.
    @Test func aDrainingRelayHeldByAPeerStillSendingExitsAtItsDeadline() async throws {
        let relay = try await DrainingRelay.start(drainDeadline: .seconds(2))
        defer { relay.running.cancel() }
        // The other peer: a session with the relay, sending every 50 ms whatever it is told.
        let other = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate(), configuration: .init())
        let peer = try await other.connect(to: relay.identity.publicKey, at: relay.address)
        let sending = Task {
            var n: UInt32 = 0
            while !Task.isCancelled {
                other.send([0x01, 0x02, 0x03], to: peer, payloadType: PartyHop.payloadType, timestamp: n)
                n &+= 160
                try? await Task.sleep(for: .milliseconds(50))
            }
        }
        defer { sending.cancel() }
        try await Task.sleep(for: .milliseconds(200))
        let took = await relay.shutDown()
        #expect(took >= .milliseconds(1900) && took < .milliseconds(3500), "exited \(took) after the shutdown (deadline 2 s)")
        sending.cancel()
        await other.close()
        await relay.member.close()
    }

    /// A draining relay tells its members to move and exits a second after the last
    /// one went quiet, well before its deadline (3 s here); the member was told.
    @Test func aDrainingRelayExitsOnceItsMembersAreQuiet() async throws {
        let relay = try await DrainingRelay.start(drainDeadline: .seconds(3))
        defer { relay.running.cancel() }
        let log = relay.log
        for n in 0..<5 {
            relay.member.send([0x55, 0x66], timestamp: UInt32(n * 160), level: AudioLevel(level: 30, voiced: true))
            try await Task.sleep(for: .milliseconds(20))
        }
        let took = await relay.shutDown()
        #expect(await log.wait { log in log.all.contains { if case .relayDraining = $0 { true } else { false } } })
        #expect(took >= .milliseconds(900) && took < .milliseconds(2500), "exited \(took) after the shutdown")
        await relay.member.close()
    }

    /// Two relays of one directory (room tickets keyed from its secret). The
    /// directory, which had the room on the first, now says the second (two of its
    /// nodes had moved it at once and have agreed since): members in the room,
    /// asking now and then, follow it there on their own, keep their seats and keys,
    /// and are heard there.
    @Test func membersFollowTheirRoomToTheRelayTheDirectoryNowNames() async throws {
        let secret = "directory s3cret"
        let identities = [Identity.generate(), Identity.generate()]
        // Rooms named as a directory's relays name them (a tag of the relay's key first).
        let services = identities.map {
            var rooms = PartyServer.Configuration()
            rooms.roomPrefix = RoomHome.roomPrefix(for: $0.publicKey)
            return PartyService(
                address: TransportAddress(ip: .v4(0x7F00_0001), port: 0), identity: $0, configuration: rooms,
                ticketSecret: secret, logger: quiet)
        }
        let group = ServiceGroup(configuration: .init(services: services, logger: quiet))
        let running = Task { try await group.run() }
        defer { running.cancel() }
        var places: [(address: TransportAddress, key: PublicKey)] = []
        for (service, identity) in zip(services, identities) {
            places.append((try await service.boundAddress(), identity.publicKey))
        }
        let named = Mutex(places[0])
        let asked = Mutex(0)
        /// Each ask's `follow`: a member that hears its relay never asks to place the room.
        let follows = Mutex<[Bool]>([])
        let locate: PartyConnection.Locator = { _, follow in
            asked.withLock { $0 += 1 }
            follows.withLock { $0.append(follow) }
            return named.withLock { $0 }
        }
        let connections = try await (0..<2).asyncMap { _ in
            try await PartyConnection.connect(
                to: places[0].address, relayKey: places[0].key, identity: .generate(), locate: locate,
                locateEvery: .milliseconds(200), logger: quiet)
        }
        let logs = connections.map(EventLog.init)
        let created = try await connections[0].create(name: "Deep Rock Galactic")
        let joined = try await connections[1].join(created.room)
        for log in logs { #expect(await log.wait { $0.keysReceived >= 1 }, "\(log.all)") }
        // Asked, and told the same relay: nobody moves.
        #expect(await logs[0].wait { _ in asked.withLock { $0 } >= 4 })
        #expect(logs.allSatisfy { $0.lostCount == 0 })
        #expect(follows.withLock { $0.allSatisfy { $0 } }, "\(follows.withLock { $0 })")

        named.withLock { $0 = places[1] }
        for (log, id) in zip(logs, [created.me, joined.me]) {
            #expect(await log.wait { $0.rejoinedAs != nil }, "\(log.all.suffix(5))")
            #expect(log.rejoinedAs == id, "back in seat \(id)")
            #expect(log.ended == nil)
        }
        for c in connections { #expect(c.relayKey == places[1].key) }
        // Leaving for the room's new relay, each asked where to go as one that moves.
        #expect(follows.withLock { $0.filter { !$0 }.count } >= 2, "\(follows.withLock { $0 })")
        #expect(services[1].roomCount == 1 && services[1].memberCount == 2)
        let word = [UInt8](repeating: 0x5A, count: 60)
        for n in 0..<10 {
            connections[0].send(word, timestamp: UInt32(90_000 + n * 160), level: AudioLevel(level: 25, voiced: true))
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(await logs[1].wait { $0.audio(from: created.me).last == word })
        for c in connections { await c.close() }
        await group.triggerGracefulShutdown()
        _ = try? await running.value
    }

    /// The party socket sends with DF set and the path MTU not applied (PROBE): a
    /// datagram the kernel may not fragment takes no IP identification (for party
    /// packets, all below any path's MTU, it was 3 % of the relay's CPU). Found among
    /// this process's descriptors by its bound port.
    @Test func thePartySocketSendsWithDontFragment() async throws {
        try await withPartyRelay { relay, _, _ in
            var modes: [Int32] = []
            let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
            for name in fds {
                guard let fd = Int32(name) else { continue }
                // The relay binds 127.0.0.1 here: an IPv4 socket.
                var bound = sockaddr_in()
                var length = socklen_t(MemoryLayout<sockaddr_in>.size)
                var type: Int32 = 0
                var typeLength = socklen_t(MemoryLayout<Int32>.size)
                guard getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &typeLength) == 0, type == Int32(SOCK_DGRAM.rawValue),
                    withUnsafeMutablePointer(
                        to: &bound,
                        {
                            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
                        }) == 0,
                    bound.sin_family == sa_family_t(AF_INET), UInt16(bigEndian: bound.sin_port) == relay.port
                else { continue }
                var mode: Int32 = -1
                var modeLength = socklen_t(MemoryLayout<Int32>.size)
                if getsockopt(fd, Int32(IPPROTO_IP), IP_MTU_DISCOVER, &mode, &modeLength) == 0 { modes.append(mode) }
            }
            #expect(!modes.isEmpty, "no UDP socket of this process is bound to port \(relay.port)")
            #expect(modes.allSatisfy { $0 == IP_PMTUDISC_PROBE }, "\(modes)")
        }
    }

    /// A room of fifty over real sockets: the roster a newcomer is handed outgrows
    /// a packet (and the 2 KiB a member reads a datagram into) past fifteen members,
    /// so it travels in parts; every member gets every other's key and hears a speaker.
    @Test func aRoomOfFiftyFormsAndIsHeard() async throws {
        try await withPartyRelay { relay, relayKey, service in
            var members: [PartyConnection] = []
            for _ in 0..<50 {
                members.append(
                    try await PartyConnection.connect(
                        to: relay, relayKey: relayKey, identity: .generate(), transport: .udp, logger: quiet))
            }
            let logs = members.map(EventLog.init)
            let created = try await members[0].create(name: "Raid night")
            var last: PartyJoined?
            for m in members[1...] { last = try await m.join(created.room) }
            #expect(last?.roster.count == 50)
            #expect(service.memberCount == 50)
            for (i, log) in logs.enumerated() {
                #expect(await log.wait(within: .seconds(30)) { $0.keysReceived >= 49 }, "member \(i): \(log.keysReceived) keys")
            }
            let word = [UInt8](repeating: 0x5A, count: 60)
            for n in 0..<5 {
                members[7].send(word, timestamp: UInt32(n * 160), level: AudioLevel(level: 25, voiced: true))
            }
            let speaker = try #require(await members[7].read { $0.me })
            for (i, log) in logs.enumerated() where i != 7 {
                #expect(
                    await log.wait { $0.audio(from: speaker).last == word },
                    "member \(i) hears the speaker \(speaker): \(log.all.suffix(4))")
            }
            for m in members { await m.close() }
        }
    }

    /// An invite list past ``PartyControl/maximumInvited`` is refused before anything
    /// is sent; one within it makes its room.
    @Test func anInviteListPastTheLimitIsRefusedAtOnce() async throws {
        try await withPartyRelay { relay, relayKey, _ in
            let member = try await PartyConnection.connect(
                to: relay, relayKey: relayKey, identity: .generate(), transport: .udp, logger: quiet)
            let keys = (0...PartyControl.maximumInvited).map { _ in PrivateKey.generate().publicKey }
            await #expect {
                try await member.create(name: "Raid", invite: keys)
            } throws: { error in
                guard case PartyConnectionError.refused(.malformed, let why) = error else { return false }
                return why.contains("at most \(PartyControl.maximumInvited) keys")
            }
            let created = try await member.create(name: String(repeating: "N", count: 64), invite: Array(keys.dropLast()))
            #expect(!created.room.isEmpty)
            await member.close()
        }
    }

    /// A member whose UDP is blocked joins over TCP (RFC 4571 on the party port), or
    /// over TLS where only TLS passes (RFC 4571 inside, on the relay's TLS port):
    /// same room, same keys, heard both ways; a member on UDP beside it.
    @Test(arguments: [PartyTransport.tcp, .tls])
    func aMemberOverAStreamIsInTheRoomLikeAnyOther(_ transport: PartyTransport) async throws {
        let certificate = transport == .tls ? try TestCertificate.make() : nil
        try await withPartyRelay(tls: certificate) { relay, relayKey, service in
            let streamAt = transport == .tls ? try #require(try await service.boundTLSAddresses().first) : relay
            #expect(streamAt.port != relay.port || transport == .tcp)
            let udp = try await PartyConnection.connect(
                to: relay, relayKey: relayKey, identity: .generate(), transport: .udp, logger: quiet)
            let tcp = try await PartyConnection.connect(
                to: streamAt, relayKey: relayKey, identity: .generate(), transport: transport, logger: quiet)
            #expect(await tcp.overTCP)
            #expect(!(await udp.overTCP))
            let logs = [udp, tcp].map(EventLog.init)
            let created = try await udp.create(name: "Rust")
            let joined = try await tcp.join(created.room)
            for log in logs { #expect(await log.wait { $0.keysReceived >= 1 }, "\(log.all)") }
            let words: [[UInt8]] = (0..<10).map { i in [UInt8](repeating: UInt8(0x30 + i), count: 80) }
            for (i, w) in words.enumerated() {
                udp.send(w, timestamp: UInt32(i * 160), level: AudioLevel(level: 20, voiced: true))
                tcp.send(w.reversed(), timestamp: UInt32(i * 160), level: AudioLevel(level: 20, voiced: true))
            }
            #expect(await logs[1].wait { $0.audio(from: created.me) == words }, "\(logs[1].all.suffix(3))")
            #expect(await logs[0].wait { $0.audio(from: joined.me) == words.map { $0.reversed() } })
            #expect(service.memberCount == 2)
            for c in [udp, tcp] { await c.close() }
        }
    }

    /// A frame from a member over TCP comes in no UDP read burst: its copies for the
    /// members on UDP leave at once, not with whatever datagram the relay reads next
    /// (a listener's ping comes 100 ms after a voice stream stops, then every 500 ms).
    @Test func aStreamMembersWordsReachTheMembersOnUDPAtOnce() async throws {
        try await withPartyRelay { relay, relayKey, _ in
            let udp = try await PartyConnection.connect(
                to: relay, relayKey: relayKey, identity: .generate(), transport: .udp, logger: quiet)
            let tcp = try await PartyConnection.connect(
                to: relay, relayKey: relayKey, identity: .generate(), transport: .tcp, logger: quiet)
            let logs = [udp, tcp].map(EventLog.init)
            let created = try await udp.create(name: "Rust")
            let joined = try await tcp.join(created.room)
            for log in logs { #expect(await log.wait { $0.keysReceived >= 1 }, "\(log.all)") }
            var delays: [Duration] = []
            for i in 0..<7 {
                try await Task.sleep(for: .milliseconds(150))
                let start = ContinuousClock.now
                tcp.send(
                    [UInt8](repeating: UInt8(0x40 + i), count: 80), timestamp: UInt32(i * 160),
                    level: AudioLevel(level: 20, voiced: true))
                #expect(await logs[0].wait { $0.audio(from: joined.me).count == i + 1 })
                delays.append(start.duration(to: .now))
            }
            // The median: one frame may meet the machine busy elsewhere.
            #expect(delays.sorted()[delays.count / 2] < .milliseconds(50), "\(delays)")
            for c in [udp, tcp] { await c.close() }
        }
    }

    /// The same key back again and again (`tusa party list` then `join`, a client
    /// restarted): each new session is answered, whatever the last one left. That it
    /// is answered at once, with no wait for the roaming interval, is pinned on the
    /// virtual clock (`SecureEndpointTests.aPeerRestartedOnAnotherPortIsHeardAtOnce`):
    /// the wall time here is the machine's (1.3 s once beside two CPU hogs).
    @Test func theSameKeyReconnectingIsAnsweredEveryTime() async throws {
        try await withPartyRelay { relay, relayKey, _ in
            let bob = Identity.generate()
            for round in 0..<8 {
                let c = try await PartyConnection.connect(
                    to: relay, relayKey: relayKey, identity: bob, transport: .udp, logger: quiet)
                let answer: Result<RoomDescription?, any Error>
                do { answer = .success(try await c.describe("nosuchroomxx", timeout: .seconds(3))) } catch {
                    answer = .failure(error)
                }
                #expect((try? answer.get()) == .some(nil), "round \(round): \(answer)")
                await c.close()
            }
        }
    }

    /// The party port's number taken for TCP (members whose UDP is blocked come
    /// there): the relay says so and does not start half-way.
    @Test func aPartyPortWhoseTCPNumberIsTakenIsAClearError() async throws {
        // A number whose UDP side nothing else takes meanwhile (not the kernel's pick).
        let port = Int(QuietPort.draw())
        let squatter = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: port).get()
        defer { squatter.close(promise: nil) }
        let service = PartyService(
            address: TransportAddress(ip: .v4(0x7F00_0001), port: UInt16(port)), identity: .generate(), logger: quiet)
        let group = ServiceGroup(configuration: .init(services: [service], logger: quiet))
        let running = Task { try await group.run() }
        defer { running.cancel() }
        do {
            let bound = try await service.boundAddress()
            Issue.record("the relay started on \(bound) although tcp \(port) is taken")
        } catch {
            #expect("\(error)".contains("cannot serve parties over TCP"), "\(error)")
        }
    }

    @Test func theRelayRefusesClearly() async throws {
        try await withPartyRelay(maxMembers: 2) { relay, relayKey, _ in
            let a = try await PartyConnection.connect(to: relay, relayKey: relayKey, identity: .generate(), logger: quiet)
            let b = try await PartyConnection.connect(to: relay, relayKey: relayKey, identity: .generate(), logger: quiet)
            let c = try await PartyConnection.connect(to: relay, relayKey: relayKey, identity: .generate(), logger: quiet)
            await #expect(throws: PartyConnectionError.refused(.noSuchRoom, "no room nosuchroom")) {
                _ = try await c.join("nosuchroom")
            }
            let room = try await a.create(name: "Dota 2").room
            _ = try await b.join(room)
            do {
                _ = try await c.join(room)
                Issue.record("a third member joined a room of two")
            } catch let error as PartyConnectionError {
                if case .refused(.full, _) = error {} else { Issue.record("\(error)") }
            }
            await #expect(throws: PartyConnectionError.busy) { _ = try await a.join(room) }
            for x in [a, b, c] { await x.close() }
        }
        // A relay that is not there (or holds another key) is a typed error, not a hang.
        let nobody = TransportAddress(ip: .v4(0x7F00_0001), port: 9)
        await #expect(throws: PartyConnectionError.self) {
            _ = try await PartyConnection.connect(
                to: nobody, relayKey: PrivateKey.generate().publicKey, identity: .generate(), timeout: .milliseconds(500),
                logger: quiet)
        }
    }
}

private func eventually(within limit: Duration = .seconds(10), _ condition: () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + limit
    while ContinuousClock.now < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(5))
    }
    return condition()
}

extension Sequence {
    fileprivate func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var out: [T] = []
        for e in self { out.append(try await transform(e)) }
        return out
    }
}
