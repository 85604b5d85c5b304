import Rendezvous
import Secure

/// A party as both stores keep it: a `parties` row and its `party_members` rows,
/// the members in join order, then the invited keys, each numbered in its list.
struct PartyMemberRow {
    var key: PublicKey
    var invited: Bool
    var position: Int

    /// `party`'s creator and member rows (nil: a listing that does not check, never written).
    static func rows(of party: RendezvousParty) -> (creator: PublicKey, members: [PartyMemberRow])? {
        guard let (creator, members, invited) = try? party.listing.checked() else { return nil }
        let rows =
            members.enumerated().map { PartyMemberRow(key: $1, invited: false, position: $0) }
            + invited.enumerated().map { PartyMemberRow(key: $1, invited: true, position: $0) }
        return (creator, rows)
    }
}

/// What a store reads back: first the `party_members` rows (in each party's order),
/// then each `parties` row, made a party with them.
struct PartyRowReader {
    private var keys: [String: (members: [PublicKey], invited: [PublicKey])] = [:]

    mutating func member(of party: String, _ key: PublicKey, invited: Bool) {
        if invited {
            keys[party, default: ([], [])].invited.append(key)
        } else {
            keys[party, default: ([], [])].members.append(key)
        }
    }

    func party(
        id: String, name: String, creator: PublicKey, relay: PublicKey, maxMembers: Int, memberCount: Int,
        unixSeconds: UInt64
    ) -> RendezvousParty {
        var listing = PartyListing(
            room: id, name: name, creator: creator, maxMembers: maxMembers, members: keys[id]?.members ?? [],
            invited: keys[id]?.invited ?? [])
        listing.memberCount = max(memberCount, listing.members.count)
        return RendezvousParty(listing: listing, relay: relay, unixSeconds: unixSeconds)
    }
}
