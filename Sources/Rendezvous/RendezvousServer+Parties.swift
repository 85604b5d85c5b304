import Secure
import TusaBase

// The directory's parties (``PartyTable``): what relays list, what users see.
extension RendezvousServer {
    /// How often rooms of relays down too long are looked for.
    static let partySweep: Duration = .seconds(5)
    /// Members an answer's entry names (its count says how many are in).
    static let answerMembers = 16
    /// What an answer's entries may add up to, well inside a frame.
    static let answerBudget = 12_000

    /// A relay's `rooms` report, proven: the rooms it opened, changed and closed
    /// written down; at the end of its first list on a connection (all its rooms),
    /// those it held before and did not list are gone.
    mutating func listRooms(_ rooms: RelayRooms, of relay: PublicKey, on id: ConnectionID, now: Timestamp, unixSeconds: UInt64) {
        list(rooms, of: relay, first: listingRooms.insert(id).inserted, now: now, unixSeconds: unixSeconds)
    }

    /// The rooms of the relay this rendezvous runs in, listed as a directory's relay
    /// lists its own (a listing that does not check is not taken: ``PartyTable/put(_:now:)``).
    mutating func listLocalRooms(_ rooms: RelayRooms, now: Timestamp, unixSeconds: UInt64) {
        guard let key = ownRelay else { return }
        let first = !listingLocalRooms
        listingLocalRooms = true
        list(rooms, of: key, first: first, now: now, unixSeconds: unixSeconds)
    }

    /// The relay this rendezvous runs in (``RendezvousServerConfiguration/party``), when it hosts parties.
    var ownRelay: PublicKey? { configuration.party.flatMap { PublicKey(base64: $0.key) } }

    private mutating func list(_ rooms: RelayRooms, of relay: PublicKey, first: Bool, now: Timestamp, unixSeconds: UInt64) {
        if first { parties.startSync(of: relay) }
        for listing in rooms.open where !movedAway(listing.room, from: relay, now: now) {
            let party = RendezvousParty(listing: listing, relay: relay, unixSeconds: unixSeconds)
            if parties.put(party, now: now) { records.append(.party(party)) }
        }
        // A room that moved to another relay is that one's now.
        for room in rooms.closed where parties.close(room, on: relay) { records.append(.partyClosed(room: room, relay: relay)) }
        if rooms.complete {
            for room in parties.finishSync(of: relay) { records.append(.partyClosed(room: room, relay: relay)) }
        }
    }

    /// Whether `room` is held on another live relay that the directory sends its
    /// members to: a relay that lost the room's members to it (they followed the
    /// room there) does not take it back by listing what it has left.
    private func movedAway(_ room: String, from relay: PublicKey, now: Timestamp) -> Bool {
        guard let holder = parties.rows[room]?.party.relay, holder != relay, liveRelays(now: now)(holder) else { return false }
        return relayRegistry.current(room: room)?.key == holder
    }

    /// Whether a relay reports now (the relay this rendezvous runs in always does),
    /// as a test that holds nothing of this server (for ``PartyTable/expire(now:live:)``).
    func liveRelays(now: Timestamp) -> (PublicKey) -> Bool {
        let (registry, own) = (relayRegistry, ownRelay)
        return { $0 == own || registry.isLive($0, now: now) }
    }

    /// The parties `key` may see, with where each is now (none placed: a relay down
    /// names none), at most what one answer holds (true: some were left out).
    func partyEntries(for key: PublicKey, now: Timestamp) -> ([PartyEntry], Bool) {
        var entries: [PartyEntry] = []
        var size = 0
        for party in parties.visible(to: key, owners: contactOf[key] ?? []) {
            var listing = party.listing
            listing.members = Array(listing.members.prefix(Self.answerMembers))
            let grant = whereIs(party, now: now)
            let bytes =
                PartyEntry.estimatedSize(of: listing) + 80 + (grant.map { $0.address.utf8.count + $0.key.utf8.count } ?? 0)
            guard size + bytes <= Self.answerBudget else { return (entries, true) }
            size += bytes
            entries.append(PartyEntry(listing: listing, party: grant))
        }
        return (entries, false)
    }

    /// Where a listed room is now: on the relay that listed it while that one is
    /// live and takes rooms, else where this directory knows it moved, if that relay
    /// is live (nil: joining through the directory places it again).
    private func whereIs(_ party: RendezvousParty, now: Timestamp) -> PartyGrant? {
        if party.relay == ownRelay { return configuration.party }
        if relayRegistry.isLive(party.relay, now: now), let relay = relayRegistry.relays[party.relay], !relay.load.draining,
            let grant = relay.load.party
        {
            return grant
        }
        guard let moved = relayRegistry.current(room: party.listing.room), relayRegistry.isLive(moved.key, now: now) else {
            return nil
        }
        return moved.load.party
    }

    /// Rooms a store or the database holds, taken in: at a start all of them (their
    /// relays, once connected, list theirs again); after a gap in what the other
    /// nodes said, the rows are the truth but for rooms of relays that report here
    /// (this node's own word on them may still be on its way to the database).
    mutating func takeParties(_ rows: [RendezvousParty], now: Timestamp) {
        let reportingHere = Set(relayConnections.values).union(ownRelay.map { [$0] } ?? [])
        let listed = Set(rows.map(\.listing.room))
        for room in parties.rows.keys where !listed.contains(room) {
            if let relay = parties.rows[room]?.party.relay, !reportingHere.contains(relay) { parties.close(room) }
        }
        for row in rows where !reportingHere.contains(row.relay) { parties.put(row, now: now) }
    }
}
