import Secure
import TusaBase

/// What a relay tells the directory about itself every 2 s (`tusa relay --directory`).
public struct RelayLoad: Codable, Equatable, Sendable {
    /// Where it hosts parties, if it does.
    public var party: PartyGrant?
    /// Its TURN URIs, handed out with the directory's credentials.
    public var turnURIs: [String]
    /// What it may relay, bits a second (`--capacity-mbps`), and relays now.
    public var capacityBitsPerSecond: UInt64
    public var bitsPerSecond: UInt64
    public var packetsPerSecond: UInt64
    public var allocations: Int
    public var rooms: Int
    public var members: Int
    /// Its CPU use over the last period, in cores.
    public var cpu: Double
    /// Shutting down: no new work goes to it.
    public var draining: Bool

    public init(
        party: PartyGrant? = nil, turnURIs: [String] = [], capacityBitsPerSecond: UInt64, bitsPerSecond: UInt64 = 0,
        packetsPerSecond: UInt64 = 0, allocations: Int = 0, rooms: Int = 0, members: Int = 0, cpu: Double = 0,
        draining: Bool = false
    ) {
        self.party = party
        self.turnURIs = turnURIs
        self.capacityBitsPerSecond = capacityBitsPerSecond
        self.bitsPerSecond = bitsPerSecond
        self.packetsPerSecond = packetsPerSecond
        self.allocations = allocations
        self.rooms = rooms
        self.members = members
        self.cpu = cpu
        self.draining = draining
    }

    /// The proof that a report comes from a relay that holds the directory's shared
    /// secret: a MAC over the key it registered with, the connection's challenge and
    /// the report itself, so that it is good for this report on this connection only
    /// (no one on the path can change what it says, or replay it elsewhere).
    public static func proof(secret: String, key: PublicKey, challenge: [UInt8], load: RelayLoad) -> [UInt8] {
        Blake2b.hash(
            parts: [Array("tusa relay load".utf8), key.bytes, challenge, load.canonicalBytes],
            key: Blake2b.hash(Array(secret.utf8)), outputLength: 32)
    }

    /// Every field, in a fixed order and form (what the proof covers).
    var canonicalBytes: [UInt8] {
        let fields: [String] = [
            party?.address ?? "-", party?.key ?? "-", turnURIs.joined(separator: " "), "\(capacityBitsPerSecond)",
            "\(bitsPerSecond)", "\(packetsPerSecond)", "\(allocations)", "\(rooms)", "\(members)", "\(cpu)",
            draining ? "1" : "0",
        ]
        return Array(fields.joined(separator: "\n").utf8)
    }
}

/// The relays a directory knows, from their reports, and where new work goes,
/// sans-IO: a relay counts as down 6 s after its last report (or at once when its
/// connection closes); new work goes to the less loaded of two live relays picked
/// at random among those below 70 % of their capacity (so that placements made at
/// the same moment do not all land on one), and what it is expected to use is
/// reserved there until the relay's reports can show it.
public struct RelayRegistry: Sendable {
    public struct Configuration: Sendable {
        /// A relay silent this long is down (LiveKit's nodes report every 2 s, down after 5).
        public var downAfter: Duration = .seconds(6)
        /// Above this share of its capacity a relay takes no new work.
        public var ceiling = 0.7
        /// What one placement is expected to add, and for how long it is reserved.
        public var reservation: UInt64 = 100_000
        public var reservedFor: Duration = .seconds(10)
        /// Reservations on one relay stop adding up past this share of its capacity:
        /// a flood of registrations cannot make every relay look full.
        public var reservationCeiling = 0.1
        /// Relays this close (a share of capacity) to the least loaded one count as equally loaded.
        public var leastLoadedBand = 0.02
        public init() {}
    }

    public struct Relay: Sendable, Equatable {
        public var key: PublicKey
        public var load: RelayLoad
        public var heard: Timestamp
        /// Placements not yet in its reports: bits a second, until when.
        public var reservations: [(bits: UInt64, until: Timestamp)]

        public static func == (a: Relay, b: Relay) -> Bool {
            a.key == b.key && a.load == b.load && a.heard == b.heard && a.reservations.count == b.reservations.count
        }

        /// Its use with what is reserved, as a share of its capacity.
        public func utilisation(now: Timestamp) -> Double {
            let reserved = reservations.filter { now < $0.until }.reduce(UInt64(0)) { $0 &+ $1.bits }
            return Double(load.bitsPerSecond &+ reserved) / Double(max(1, load.capacityBitsPerSecond))
        }
    }

    public let configuration: Configuration
    public private(set) var relays: [PublicKey: Relay] = [:]
    private var random: SplitMix64
    /// Rooms placed again (their own relay gone or draining), and where: a room
    /// stays where it was sent while that relay lives, whatever joins the cluster.
    private var moved: [String: PublicKey] = [:]
    /// At most this many moves are remembered (a flood of bogus room ids cannot grow it further).
    static let movedLimit = 100_000

    public init(configuration: Configuration = .init(), seed: UInt64 = UInt64.random(in: .min ... .max)) {
        self.configuration = configuration
        random = SplitMix64(seed: seed)
    }

    public mutating func report(_ key: PublicKey, _ load: RelayLoad, now: Timestamp) {
        var relay = relays[key] ?? Relay(key: key, load: load, heard: now, reservations: [])
        relay.load = load
        relay.heard = now
        relay.reservations.removeAll { now >= $0.until }
        relays[key] = relay
    }

    /// Its connection closed: down now.
    public mutating func remove(_ key: PublicKey) { relays[key] = nil }

    /// Relays heard within ``Configuration/downAfter``, by key.
    public func live(now: Timestamp) -> [Relay] {
        relays.values.filter { isLive($0, now: now) }.sorted { $0.key.base64 < $1.key.base64 }
    }

    /// Whether relay `key` was heard within ``Configuration/downAfter``.
    public func isLive(_ key: PublicKey, now: Timestamp) -> Bool { relays[key].map { isLive($0, now: now) } ?? false }

    private func isLive(_ relay: Relay, now: Timestamp) -> Bool { now - relay.heard < configuration.downAfter }

    /// Where new work goes (nil: no live relay has room), with its reservation made
    /// unless `reserving` is false (a hint, not a placement).
    public mutating func place(
        now: Timestamp, reserving: Bool = true, where eligible: (RelayLoad) -> Bool = { _ in true }
    ) -> Relay? {
        let candidates = live(now: now).filter {
            !$0.load.draining && eligible($0.load) && $0.utilisation(now: now) < configuration.ceiling
        }
        guard !candidates.isEmpty else { return nil }
        let first = candidates[Int(random.next() % UInt64(candidates.count))]
        var chosen = first
        if candidates.count > 1 {
            var second = first
            while second.key == first.key { second = candidates[Int(random.next() % UInt64(candidates.count))] }
            if second.utilisation(now: now) < first.utilisation(now: now) { chosen = second }
        }
        if reserving { reserve(on: chosen.key, now: now) }
        return relays[chosen.key]
    }

    /// The least loaded live relay (its use with what is reserved) that is not
    /// draining and that `eligible` takes, whatever its share of its capacity: where
    /// a 1:1 call's TURN allocations go. Relays within ``Configuration/leastLoadedBand``
    /// of the least loaded count as equals, one picked at random: calls granted
    /// between two reports do not all go to one of several idle relays.
    public mutating func leastLoaded(now: Timestamp, where eligible: (RelayLoad) -> Bool = { _ in true }) -> Relay? {
        let candidates = live(now: now).filter { !$0.load.draining && eligible($0.load) }
        guard let least = candidates.map({ $0.utilisation(now: now) }).min() else { return nil }
        let equals = candidates.filter { $0.utilisation(now: now) <= least + configuration.leastLoadedBand }
        return equals[Int(random.next() % UInt64(equals.count))]
    }

    /// What one placement is expected to use, reserved on `key` until its reports can
    /// show it (up to ``Configuration/reservationCeiling``): for a placement made here,
    /// or at another node of the cluster (``RendezvousRecord/placed(relay:)``).
    public mutating func reserve(on key: PublicKey, now: Timestamp) {
        guard let relay = relays[key] else { return }
        let reserved = relay.reservations.filter { now < $0.until }.reduce(UInt64(0)) { $0 &+ $1.bits }
        let cap = Double(relay.load.capacityBitsPerSecond) * configuration.reservationCeiling
        if Double(reserved &+ configuration.reservation) <= cap {
            relays[key]?.reservations.append((configuration.reservation, now + configuration.reservedFor))
        }
    }

    /// The relay that hosts party room `room` now (nil: no live relay hosts parties).
    ///
    /// While the relay it was made on (``RoomHome/tag(ofRoom:)``) or last placed on
    /// (here) is live and not draining, that one; else the live relay of highest
    /// ``RoomHome`` weight for it, remembered here so that the room stays there when
    /// relays come and go. The weight alone decides, not the load (which nodes see
    /// a moment apart): every node that knows the same live relays places a room the
    /// same. A node that moves a room tells the others (``RendezvousRecord/roomMoved(room:relay:)``,
    /// ``remember(room:on:now:)``): they keep it there too, also once its own relay is back.
    ///
    /// `placed` is set when this call moved the room (the others are to be told).
    public mutating func host(room: String, now: Timestamp, placed: inout Bool) -> Relay? {
        placed = false
        let hosts = partyHosts(now: now)
        if let key = moved[room], let relay = hosts.first(where: { $0.key == key }) { return relay }
        if let tag = RoomHome.tag(ofRoom: room), let home = hosts.first(where: { RoomHome.tag(of: $0.key) == tag }) {
            return home
        }
        guard
            let chosen = hosts.max(by: {
                RoomHome.weight(room: room, relay: $0.key) < RoomHome.weight(room: room, relay: $1.key)
            })
        else { return nil }
        if moved[room] != nil || moved.count < Self.movedLimit {
            placed = moved[room] != chosen.key
            moved[room] = chosen.key
        }
        return chosen
    }

    /// Where `room` is now as far as this node knows, placing nothing: the relay it
    /// was moved to, else the relay it was made on, live or not (nil: this node knows
    /// neither). A member that still hears its relay asks this, to follow a room
    /// that moved: a relay whose reports lapsed while its members hear it is not
    /// left by them for that alone (a member that lost it asks
    /// ``host(room:now:placed:)``, which places the room again).
    public func current(room: String) -> Relay? {
        if let key = moved[room], let relay = relays[key], relay.load.party != nil, !relay.load.draining { return relay }
        guard let tag = RoomHome.tag(ofRoom: room) else { return nil }
        // A draining relay sends its members on itself.
        return relays.values.first { RoomHome.tag(of: $0.key) == tag && $0.load.party != nil && !$0.load.draining }
    }

    /// ``host(room:now:placed:)``, when no one is to be told.
    public mutating func host(room: String, now: Timestamp) -> Relay? {
        var placed = false
        return host(room: room, now: now, placed: &placed)
    }

    /// Live relays that take rooms now.
    private func partyHosts(now: Timestamp) -> [Relay] {
        live(now: now).filter { $0.load.party != nil && !$0.load.draining }
    }

    /// Another node moved `room` to `relay`: it is hosted there while that relay lives.
    ///
    /// Two nodes may move one room at once, each to the relay of highest weight it
    /// sees live, and see different relays live (a report not yet passed on). Each
    /// then hears the other's move: the heavier relay of the two wins at both, so
    /// they agree. A node whose own move wins, its relay live, keeps it and returns
    /// it: the other nodes are to hear it again (the one that moved the room
    /// elsewhere takes it, being the lighter; no two nodes ever both keep their own,
    /// so the telling ends). A move to a relay not live here loses to the other.
    public mutating func remember(room: String, on relay: PublicKey, now: Timestamp) -> PublicKey? {
        if let mine = moved[room], mine != relay,
            partyHosts(now: now).contains(where: { $0.key == mine }),
            RoomHome.weight(room: room, relay: mine) > RoomHome.weight(room: room, relay: relay)
        {
            return mine
        }
        if moved[room] != nil || moved.count < Self.movedLimit { moved[room] = relay }
        return nil
    }

    /// Forgets relays down for longer than a minute, and moves to them.
    public mutating func expire(now: Timestamp) {
        relays = relays.filter { now - $0.value.heard < configuration.downAfter + .seconds(60) }
        moved = moved.filter { relays[$0.value] != nil }
    }
}
