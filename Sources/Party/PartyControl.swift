import Foundation
import Secure

/// A member as the roster shows it: its id in the room and the static key its
/// session with the relay proved. Members seal their sender keys to exactly the
/// keys their roster shows.
public struct RosterEntry: Codable, Hashable, Sendable {
    public var member: MemberID
    /// The member's static X25519 public key, base64.
    public var key: String
    public var creator: Bool
    public var muted: Bool

    public init(member: MemberID, key: PublicKey, creator: Bool, muted: Bool = false) {
        self.member = member
        self.key = key.base64
        self.creator = creator
        self.muted = muted
    }

    public var publicKey: PublicKey? { PublicKey(base64: key) }
}

/// A room as the relay shows it to someone who may join it (`tusa party list`).
public struct RoomDescription: Codable, Hashable, Sendable {
    public var room: String
    public var name: String
    public var maxMembers: Int
    public var members: [RosterEntry]

    public init(room: String, name: String, maxMembers: Int, members: [RosterEntry]) {
        self.room = room
        self.name = name
        self.maxMembers = maxMembers
        self.members = members
    }
}

/// Why a member is no longer in a room.
public enum LeaveReason: String, Codable, Hashable, Sendable {
    case left
    case kicked
    /// Its session with the relay closed or went silent.
    case disconnected
    case roomClosed = "room-closed"
}

/// Why the relay refused a party request. The raw values travel on the wire.
public enum PartyErrorCode: String, Codable, Hashable, Sendable {
    case malformed
    case noSuchRoom = "no-such-room"
    case notInvited = "not-invited"
    case full
    case notInRoom = "not-in-room"
    case alreadyInRoom = "already-in-room"
    case notCreator = "not-creator"
    case noSuchMember = "no-such-member"
    case tooManyRooms = "too-many-rooms"
    case badName = "bad-name"
    /// A rejoin's room ticket was not issued by this relay, or the room it names was closed.
    case badTicket = "bad-ticket"
    /// The relay is shutting down (draining): it takes no new room or member.
    case draining
}

/// A party control message, inside the member's hop-by-hop session with the
/// relay, numbered and acknowledged by a ``ControlChannel``. `key` and `keyAck` name the other member:
/// the recipient when a member sends, the sender when the relay delivers.
public enum PartyControl: Codable, Hashable, Sendable {
    // Member → relay.
    case create(name: String, maxMembers: Int?, invite: [String])
    case join(room: String)
    case leave
    case kick(member: MemberID)
    case close
    case mute(Bool)
    /// Back into a room after the session with the relay was lost (a network
    /// change, a relay restart), as member `member` again if that seat is still
    /// this key's. `highest` is the highest member id the member has seen (a room
    /// the relay rebuilds from the ticket numbers newcomers above it).
    case rejoin(ticket: RoomTicket, member: MemberID, highest: MemberID)
    /// Nothing but an acknowledgement wanted: is the relay still there?
    case ping
    /// Who is in a room, asked without joining it.
    case describe(room: String)
    // Both ways, through the relay, which reads neither the key nor whose it is.
    case key(member: MemberID, sealed: Data)
    case keyAck(member: MemberID, kid: UInt64)
    // Relay → member.
    case joined(room: String, name: String, you: MemberID, roster: [RosterEntry], ticket: RoomTicket?)
    case memberJoined(RosterEntry)
    case memberLeft(member: MemberID, reason: LeaveReason)
    case memberMuted(member: MemberID, muted: Bool)
    case closed(reason: LeaveReason)
    case refused(code: PartyErrorCode, detail: String)
    /// The answer to `describe`: nil when there is no such room or the asker may not join it.
    case described(room: String, RoomDescription?)
    /// The relay is shutting down: ask the directory where the room goes next, and
    /// rejoin there with the ticket (``PartyConnection`` does, given a locator).
    case moving

    /// The most keys a room's invite list holds. The list rides in the `create` and
    /// in the room ticket, which goes with every `joined` answer and every rejoin.
    /// A message longer than a packet travels in parts (``ControlChannel``), so
    /// this is not a packet's limit: it keeps each join's ticket small.
    public static let maximumInvited = 24

    /// `ping` as JSON, the bytes the coder makes of it. Every member in a quiet room
    /// pings twice a second, so it is written and read without a coder: on a relay
    /// with a thousand members, decoding pings with `JSONDecoder` was most of the
    /// relay's CPU while nobody spoke.
    static let pingJSON: [UInt8] = Array(#"{"ping":{}}"#.utf8)

    /// The message as JSON (``ControlChannel`` frames it).
    public func encodedJSON() -> [UInt8] {
        if case .ping = self { return Self.pingJSON }
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        // Encoding these plain values cannot fail.
        return Array((try? encoder.encode(self)) ?? Data("{}".utf8))
    }

    /// Reads a message from its JSON.
    public init(json: some Collection<UInt8>) throws(PartyWireError) {
        if json.elementsEqual(Self.pingJSON) {
            self = .ping
            return
        }
        do {
            self = try JSONDecoder().decode(PartyControl.self, from: Data(json))
        } catch {
            throw .malformed("\(error)")
        }
    }
}
