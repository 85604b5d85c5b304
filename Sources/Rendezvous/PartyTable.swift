import Secure
import TusaBase

/// A party room the directory holds: its relay's listing, which relay said it,
/// and when (Unix seconds): a row of the directory's `parties` table
/// (``RendezvousRecord/party(_:)``, ``RendezvousSnapshot/parties``).
public struct RendezvousParty: Equatable, Sendable {
    public var listing: PartyListing
    public var relay: PublicKey
    public var unixSeconds: UInt64

    public init(listing: PartyListing, relay: PublicKey, unixSeconds: UInt64) {
        self.listing = listing
        self.relay = relay
        self.unixSeconds = unixSeconds
    }
}

/// The directory's parties, sans-IO: rooms as their relays list them
/// (``RelayRooms``), who may see each, and when a room is gone.
///
/// A room is gone when its relay says it closed; when the relay, connected again,
/// lists all its rooms without it (it restarted); or when its relay has been down
/// for ``keptFor`` and no other relay has listed it since (its members, sent
/// elsewhere, did not bring it back there).
///
/// Who sees a room: its creator, members and invited keys; for a room anyone with
/// its id may join, also the creator's contacts (its friends: the keys it takes
/// calls and invitations from). An invite-only room is shown to no one else.
struct PartyTable: Sendable {
    struct Row: Sendable {
        var party: RendezvousParty
        var creator: PublicKey
        /// Creator, members and invited.
        var keys: Set<PublicKey>
        var open: Bool
        /// When it was listed (the last time its relay is known live, unless later in ``relayLive``).
        var listed: Timestamp
    }

    /// How long a room outlives its relay's last report when no relay lists it again.
    static let keptFor: Duration = .seconds(60)
    /// At most this many rooms are held (a relay's bogus flood cannot grow the table further).
    static let limit = 200_000

    private(set) var rows: [String: Row] = [:]
    /// Rooms by every key they name.
    private var byKey: [PublicKey: Set<String>] = [:]
    /// Open rooms by creator.
    private var openByCreator: [PublicKey: Set<String>] = [:]
    /// Relays listing all their rooms now: their rooms not listed yet.
    private var syncing: [PublicKey: Set<String>] = [:]
    /// When each relay of rooms held was last seen live (by ``expire(now:live:)``).
    private var relayLive: [PublicKey: Timestamp] = [:]

    var count: Int { rows.count }

    /// A room opened or changed (on `party.relay`): true when that changed what is held
    /// (false: listed as it was, or not taken, the table being full).
    @discardableResult
    mutating func put(_ party: RendezvousParty, now: Timestamp) -> Bool {
        guard let (creator, members, invited) = try? party.listing.checked() else { return false }
        let room = party.listing.room
        syncing[party.relay]?.remove(room)
        if let held = rows[room], held.party.listing == party.listing, held.party.relay == party.relay {
            rows[room]?.listed = now
            return false
        }
        if rows[room] == nil, rows.count >= Self.limit { return false }
        remove(room)
        let row = Row(
            party: party, creator: creator, keys: Set(members + invited + [creator]), open: invited.isEmpty, listed: now)
        rows[room] = row
        for key in row.keys { byKey[key, default: []].insert(room) }
        if row.open { openByCreator[creator, default: []].insert(room) }
        return true
    }

    /// A room closed by `relay` (any relay when nil): true when it was held there.
    @discardableResult
    mutating func close(_ room: String, on relay: PublicKey? = nil) -> Bool {
        guard let row = rows[room], relay.map({ $0 == row.party.relay }) ?? true else { return false }
        remove(room)
        return true
    }

    /// `relay` starts listing all its rooms (a new connection).
    mutating func startSync(of relay: PublicKey) {
        syncing[relay] = Set(rows.filter { $0.value.party.relay == relay }.keys)
    }

    /// `relay` listed all its rooms: those it held before and did not list are gone (returned, closed).
    mutating func finishSync(of relay: PublicKey) -> [String] {
        let gone = (syncing.removeValue(forKey: relay) ?? []).filter { rows[$0]?.party.relay == relay }.sorted()
        for room in gone { remove(room) }
        return gone
    }

    /// `relay`'s connection closed before it listed all its rooms: none is taken for gone.
    mutating func abandonSync(of relay: PublicKey) { syncing[relay] = nil }

    /// Rooms whose relay has been down (not `live`) for ``keptFor``: closed, returned with their relays.
    mutating func expire(now: Timestamp, live: (PublicKey) -> Bool) -> [(room: String, relay: PublicKey)] {
        var gone: [(room: String, relay: PublicKey)] = []
        var seen: [PublicKey: Bool] = [:]
        for (room, row) in rows {
            let relay = row.party.relay
            let isLive = seen[relay] ?? live(relay)
            seen[relay] = isLive
            if !isLive, now - max(row.listed, relayLive[relay] ?? row.listed) >= Self.keptFor { gone.append((room, relay)) }
        }
        for (relay, isLive) in seen where isLive { relayLive[relay] = now }
        relayLive = relayLive.filter { seen[$0.key] != nil }
        gone.sort { $0.room < $1.room }
        for (room, _) in gone { remove(room) }
        return gone
    }

    /// The rooms `key` may see (see the type's notes): its own, those it is in or
    /// invited to, then its friends' open ones (so that these never push the others
    /// out of an answer), each group by name then id. `owners` are the keys that
    /// have `key` among their contacts.
    func visible(to key: PublicKey, owners: Set<PublicKey>) -> [RendezvousParty] {
        let direct = byKey[key] ?? []
        var friends = Set<String>()
        for owner in owners { if let created = openByCreator[owner] { friends.formUnion(created) } }
        func sorted(_ rooms: Set<String>) -> [RendezvousParty] {
            rooms.compactMap { rows[$0]?.party }.sorted {
                ($0.listing.name, $0.listing.room) < ($1.listing.name, $1.listing.room)
            }
        }
        return sorted(direct) + sorted(friends.subtracting(direct))
    }

    private mutating func remove(_ room: String) {
        guard let row = rows.removeValue(forKey: room) else { return }
        for key in row.keys {
            byKey[key]?.remove(room)
            if byKey[key]?.isEmpty == true { byKey[key] = nil }
        }
        if row.open {
            openByCreator[row.creator]?.remove(room)
            if openByCreator[row.creator]?.isEmpty == true { openByCreator[row.creator] = nil }
        }
    }
}
