import Foundation
import Secure

/// A party room as its relay describes it to the directory (``RelayRooms``), and
/// as the directory shows it to the users who may see it (``PartyEntry``): its id,
/// name, creator and members, never anything said in it.
public struct PartyListing: Codable, Hashable, Sendable {
    public var room: String
    public var name: String
    /// The creator's static key, base64.
    public var creator: String
    public var maxMembers: Int
    /// Members in the room now (``members`` shows at most ``shownMembers`` of them).
    public var memberCount: Int
    /// Members' static keys, base64, in the order they joined.
    public var members: [String]
    /// Keys the creator invited, base64; empty for a room anyone with its id may join.
    public var invited: [String]

    /// Members a listing names (a listing, and the notice that carries it to the
    /// other nodes of a cluster, stay well inside their carriers' limits).
    public static let shownMembers = 64
    /// Invited keys a listing names (a room's own limit).
    public static let shownInvited = 24

    public init(
        room: String, name: String, creator: PublicKey, maxMembers: Int, members: [PublicKey], invited: [PublicKey]
    ) {
        self.room = room
        self.name = name
        self.creator = creator.base64
        self.maxMembers = maxMembers
        memberCount = members.count
        self.members = members.prefix(Self.shownMembers).map(\.base64)
        self.invited = Array(invited.map(\.base64).sorted().prefix(Self.shownInvited))
    }

    /// The listing's keys, checked: an id and name a room may have, keys that are
    /// keys, within the limits.
    public func checked() throws(RendezvousError) -> (creator: PublicKey, members: [PublicKey], invited: [PublicKey]) {
        guard (1...RendezvousServer.longestRoomID).contains(room.utf8.count) else {
            throw .malformed("a party's room id is 1-\(RendezvousServer.longestRoomID) bytes, not \(room.utf8.count)")
        }
        guard name.utf8.count <= Self.longestName else {
            throw .malformed("party \(room): a name of \(name.utf8.count) bytes (at most \(Self.longestName))")
        }
        guard members.count <= Self.shownMembers, invited.count <= Self.shownInvited else {
            throw .malformed(
                "party \(room): \(members.count) members and \(invited.count) invited named (at most \(Self.shownMembers) and \(Self.shownInvited))"
            )
        }
        guard maxMembers >= 0, memberCount >= members.count else {
            throw .malformed("party \(room): \(memberCount) members counted, \(members.count) named, at most \(maxMembers)")
        }
        func key(_ text: String, _ what: String) throws(RendezvousError) -> PublicKey {
            guard let k = PublicKey(base64: text) else { throw .malformed("party \(room): \(what) is not a 32-byte base64 key") }
            return k
        }
        let creator = try key(creator, "its creator")
        let members = try members.map { (s: String) throws(RendezvousError) -> PublicKey in try key(s, "a member") }
        let invited = try invited.map { (s: String) throws(RendezvousError) -> PublicKey in try key(s, "an invited key") }
        return (creator, members, invited)
    }

    /// The longest name a listing carries (in UTF-8 bytes).
    public static let longestName = 256
}

/// What a relay of a directory tells it about its rooms (``RendezvousMessage/rooms(_:proof:)``):
/// rooms opened or changed since it last said, rooms closed, and, on a new
/// connection, all its rooms, in as many messages as they take, the last one
/// `complete`: a room the directory holds on this relay that was not among them
/// is gone (the relay restarted without it).
public struct RelayRooms: Codable, Equatable, Sendable {
    public var open: [PartyListing]
    public var closed: [String]
    public var complete: Bool

    public init(open: [PartyListing] = [], closed: [String] = [], complete: Bool = false) {
        self.open = open
        self.closed = closed
        self.complete = complete
    }

    /// The proof that it comes from a relay that holds the directory's shared secret,
    /// over this report on this connection only (as ``RelayLoad/proof(secret:key:challenge:load:)``).
    public static func proof(secret: String, key: PublicKey, challenge: [UInt8], rooms: RelayRooms) -> [UInt8] {
        Blake2b.hash(
            parts: [Array("tusa relay rooms".utf8), key.bytes, challenge, rooms.canonicalBytes],
            key: Blake2b.hash(Array(secret.utf8)), outputLength: 32)
    }

    /// Every field in a fixed order and form: JSON with sorted keys (what the proof covers).
    var canonicalBytes: [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? Array(encoder.encode(self))) ?? []
    }

    /// `open` and `closed` cut into reports that each fit a rendezvous frame, the
    /// last one `complete` when this is the relay's whole list.
    public static func reports(open: [PartyListing], closed: [String], complete: Bool) -> [RelayRooms] {
        var reports: [RelayRooms] = []
        var current = RelayRooms()
        var size = 0
        func cut() {
            reports.append(current)
            current = RelayRooms()
            size = 0
        }
        for listing in open {
            let bytes = PartyEntry.estimatedSize(of: listing)
            if size + bytes > Self.reportBudget, !current.open.isEmpty || !current.closed.isEmpty { cut() }
            current.open.append(listing)
            size += bytes
        }
        for room in closed {
            if size + room.utf8.count + 3 > Self.reportBudget { cut() }
            current.closed.append(room)
            size += room.utf8.count + 3
        }
        if !current.open.isEmpty || !current.closed.isEmpty || reports.isEmpty { cut() }
        reports[reports.count - 1].complete = complete
        return reports.filter { !$0.open.isEmpty || !$0.closed.isEmpty || $0.complete }
    }

    /// What one report's listings may add up to, well inside a frame with the proof around it.
    static let reportBudget = 12_000
}

/// A party as the directory shows it: the relay's listing and where the room is
/// now (``RendezvousMessage/partyList(id:parties:more:)``).
public struct PartyEntry: Codable, Equatable, Sendable {
    public var listing: PartyListing
    public var party: PartyGrant?

    public init(listing: PartyListing, party: PartyGrant?) {
        self.listing = listing
        self.party = party
    }

    /// About what `listing` takes in JSON (a key is 44 base64 characters and its quotes and comma).
    static func estimatedSize(of listing: PartyListing) -> Int {
        160 + listing.room.utf8.count + listing.name.utf8.count * 6 + (1 + listing.members.count + listing.invited.count) * 47
    }
}
