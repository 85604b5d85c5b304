import Foundation
import Secure
import TusaBase

/// What a relay vouches for about a room it created, handed to every member on
/// joining: the room's id, name, creator, size and invite list under a MAC only
/// the relay can make (a key derived from its identity). A member whose relay
/// restarted (and lost its rooms) hands the ticket back with its rejoin, and the
/// relay, with the same identity, rebuilds the room exactly as it was made: no
/// member can rename it, make itself creator or widen the invite list.
///
/// `incarnation` names the relay process that issued it: a ticket from the
/// running process never brings back a room that process closed or that
/// emptied; only rooms a previous process held come back.
public struct RoomTicket: Codable, Hashable, Sendable {
    public var room: String
    public var name: String
    /// The creator's static key, base64.
    public var creator: String
    public var maxMembers: Int
    /// Invited keys, base64, sorted; empty: anyone with the id.
    public var invited: [String]
    public var incarnation: UInt64
    /// BLAKE2b-256 under the relay's ticket key over the fields above.
    public var mac: Data

    /// The bytes the MAC covers: every field, length-prefixed.
    var covered: [UInt8] {
        var out = Array("tusa-room-ticket-v1".utf8)
        for field in [room, name, creator] + invited {
            out.appendUInt32(UInt32(field.utf8.count))
            out += Array(field.utf8)
        }
        out.appendUInt32(UInt32(invited.count))
        out.appendUInt64(UInt64(max(0, maxMembers)))
        out.appendUInt64(incarnation)
        return out
    }
}

/// Issues and checks ``RoomTicket``s for one relay process.
public struct RoomTicketAuthority: Sendable {
    private let key: SecretKey
    /// This process's incarnation, drawn at start.
    public let incarnation: UInt64

    /// Tickets keyed from the relay's identity: a restarted relay with the same
    /// identity file accepts the tickets its previous process issued.
    public init(identity: PrivateKey, incarnation: UInt64) {
        let derived = identity.secret.withUnsafeBytes { s in
            Blake2b.hash(Array("tusa party room tickets".utf8), key: Array(s), outputLength: 32)
        }
        // Cannot fail: 32 bytes.
        self.init(key: (try? SecretKey(bytes: derived)) ?? .random(), incarnation: incarnation)
    }

    /// Tickets keyed from a directory's relay secret (`tusa relay --directory-secret`):
    /// every relay of that directory accepts the others' tickets, so a room whose
    /// relay died or drained is rebuilt, as it was made, on the relay the directory
    /// places it on next (``RoomHome``).
    public init(directorySecret: String, incarnation: UInt64) {
        // (The secret hashed first: a key is at most 64 bytes, a secret any length.)
        let derived = Blake2b.hash(
            Array("tusa party room tickets of a directory".utf8), key: Blake2b.hash(Array(directorySecret.utf8)),
            outputLength: 32)
        self.init(key: (try? SecretKey(bytes: derived)) ?? .random(), incarnation: incarnation)
    }

    public init(key: SecretKey, incarnation: UInt64) {
        self.key = key
        self.incarnation = incarnation
    }

    public func issue(
        room: String, name: String, creator: PublicKey, maxMembers: Int, invited: Set<PublicKey>
    ) -> RoomTicket {
        var ticket = RoomTicket(
            room: room, name: name, creator: creator.base64, maxMembers: maxMembers,
            invited: invited.map(\.base64).sorted(), incarnation: incarnation, mac: Data())
        ticket.mac = Data(mac(ticket))
        return ticket
    }

    /// True when this relay (this process or an earlier one with the same identity) issued `ticket` as it stands.
    public func verify(_ ticket: RoomTicket) -> Bool {
        let expected = mac(ticket)
        let given = Array(ticket.mac)
        guard given.count == expected.count else { return false }
        return expected.withUnsafeBytes { e in given.withUnsafeBytes { g in Sodium.constantTimeEqual(e, g) } }
    }

    private func mac(_ ticket: RoomTicket) -> [UInt8] {
        key.withUnsafeBytes { k in Blake2b.hash(ticket.covered, key: Array(k), outputLength: 32) }
    }
}
