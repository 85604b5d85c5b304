import Secure
import TusaBase

/// One member's session with the relay (the driver's name for it: a Noise
/// session, a TCP connection).
public struct PartySession: Hashable, Sendable, CustomStringConvertible {
    public var value: UInt64
    public init(_ value: UInt64) { self.value = value }
    public var description: String { "session \(value)" }
}

/// The relay's room rules, sans-IO: rooms and their rosters, who may join, kick
/// and close, forwarding of voice frames to the other members (never mixed,
/// never opened: the relay holds no sender key), speaker selection and the
/// binding of each member id to the session that joined with it.
///
/// Inputs are what members' sessions deliver (already authenticated by the
/// hop-by-hop layer, with the static key that session proved); actions are
/// packets for sessions and events for the operator. ``forward(_:from:now:)``
/// is the hot path: it returns the sessions to send a frame to, unchanged.
public struct PartyServer: SansIOCore {
    public struct Configuration: Sendable {
        /// Members a room may hold (`tusa relay --max-party-size`).
        public var maxMembers = 50
        /// Rooms the relay hosts at once.
        public var maxRooms = 10_000
        /// Longest room name, in UTF-8 bytes.
        public var maxNameLength = 64
        public var speakers = SpeakerSelector.Configuration()
        /// How long a room whose last member's session was lost waits for a
        /// member to come back (``PartyControl/rejoin(ticket:member:highest:)``).
        public var dormantFor: Duration = .seconds(60)
        /// What every room id starts with: a relay of a directory puts its tag
        /// there (``RoomHome/roomPrefix(for:)``), so the directory finds its rooms.
        public var roomPrefix = ""
        public init() {}
    }

    public enum Input: Sendable {
        /// A session authenticated `key` (the driver saw a handshake complete: the
        /// first, a rekey, or the member's reconnection; the same key again is no change).
        case opened(PartySession, key: PublicKey)
        /// A packet from a session (media or control).
        case received(PartySession, [UInt8])
        /// The session closed or timed out.
        case closed(PartySession)
        /// The relay is short of memory (true) or no longer (false): while it is, new
        /// rooms and joins are refused and members coming back (rejoins) are still taken.
        case memoryShort(Bool)
        /// The relay is shutting down, and a directory places its rooms elsewhere:
        /// every member is told to move (``PartyControl/moving``); no room or member
        /// is taken from now on, and one that rejoins here is told to move again.
        case draining
    }

    public enum Action: Sendable {
        case send(PartySession, [UInt8])
        case event(PartyServerEvent)
    }

    public struct Room: Sendable {
        public let id: String
        public let name: String
        public let creator: PublicKey
        public let maxMembers: Int
        /// Keys allowed to join besides the creator; empty: anyone with the id.
        public let invited: Set<PublicKey>
        /// What the relay vouches for, handed to members for a rejoin.
        public let ticket: RoomTicket
        public fileprivate(set) var members: [MemberID: Member] = [:]
        /// Changes each time a member joins or leaves (numbered across all rooms: a
        /// room closed and brought back never repeats a number).
        public fileprivate(set) var revision: UInt64 = 0
        fileprivate var nextMember: UInt16 = 1
        fileprivate var speakers: SpeakerSelector
        /// Members whose session was lost, by id: the same key may take the seat back.
        fileprivate var departed: [MemberID: PublicKey] = [:]
        /// In a room rebuilt from a ticket, the seats below this number are the
        /// old members': whoever comes back with one takes it (the relay never saw who held it).
        fileprivate var restoredBelow: UInt16 = 0

        public var roster: [RosterEntry] {
            members.values.sorted { $0.id < $1.id }.map {
                RosterEntry(member: $0.id, key: $0.key, creator: $0.key == creator, muted: $0.muted)
            }
        }
    }

    public struct Member: Sendable {
        public let id: MemberID
        public let key: PublicKey
        public let session: PartySession
        public fileprivate(set) var muted = false
    }

    /// Counters the relay exports.
    public struct Statistics: Sendable, Hashable {
        public var framesIn: UInt64 = 0
        public var framesForwarded: UInt64 = 0
        /// Frames that claimed another member's id (or came from no member): dropped.
        public var framesSpoofed: UInt64 = 0
        /// Frames not forwarded because their sender was not among the speakers, or muted.
        public var framesNotSelected: UInt64 = 0
        public var controlRefused: UInt64 = 0
        /// Copies of frames the relay's socket did not take (its send buffer full): counted by
        /// the service that writes them, not by this core.
        public var copiesDropped: UInt64 = 0
        public init() {}
    }

    public let configuration: Configuration
    public private(set) var rooms: [String: Room] = [:]
    public private(set) var statistics = Statistics()
    /// Members in all rooms now.
    public var memberCount: Int { membership.count }
    private var sessionKeys: [PartySession: PublicKey] = [:]
    /// The last ``Room/revision`` given.
    private var revisions: UInt64 = 0
    /// Where each session is a member (one room per session).
    private var membership: [PartySession: (room: String, member: MemberID)] = [:]
    private var channels: [PartySession: ControlChannel] = [:]
    private let tickets: RoomTicketAuthority
    /// Rooms emptied by lost sessions, since when: a member's rejoin brings one back.
    private var dormant: [String: Timestamp] = [:]
    /// No later than the earliest resend due on any channel (recomputed at each timeout).
    private var resendDue: Timestamp?
    /// See ``Input/memoryShort(_:)``.
    public private(set) var memoryShort = false
    /// See ``Input/draining``.
    public private(set) var draining = false
    /// The time of the input being handled.
    private var now = Timestamp.zero
    /// A frame's copies, among the rest: taken in order without shifting the others each time.
    private var actions = ActionQueue<Action>()
    private var random: any SecureRandom

    /// - Parameter tickets: issues and checks room tickets; the relay keys it from
    ///   its identity so that a restarted relay takes its members back. By
    ///   default a random key: no room outlives the process.
    public init(
        configuration: Configuration = .init(), tickets: RoomTicketAuthority? = nil,
        random: some SecureRandom = SystemRandom()
    ) {
        self.configuration = configuration
        var random: any SecureRandom = random
        self.tickets =
            tickets ?? RoomTicketAuthority(key: .random(), incarnation: UInt64(random.uint32()) << 32 | UInt64(random.uint32()))
        self.random = random
    }

    // MARK: SansIOCore

    public mutating func handle(_ input: Input, now: Timestamp) {
        self.now = now
        switch input {
        case .opened(let session, let key):
            // A new handshake on a session we hold for the same key (a rekey, or the member
            // reconnecting) changes nothing here: a restarted client shows itself by a new
            // control channel. One we dropped (it stopped answering) opens afresh.
            if sessionKeys[session] == key, channels[session] != nil { return }
            if sessionKeys[session] != nil { remove(session, reason: .disconnected) }
            sessionKeys[session] = key
            channels[session] = ControlChannel(id: random.uint32())
        case .received(let session, let bytes):
            guard let first = bytes.first else { return }
            if first == PartyPacketType.media.rawValue {
                for target in forward(bytes, from: session, now: now) { actions.append(.send(target, bytes)) }
            } else {
                control(bytes, from: session)
            }
        case .closed(let session):
            remove(session, reason: .disconnected)
            sessionKeys[session] = nil
            channels[session] = nil
        case .memoryShort(let short):
            memoryShort = short
        case .draining:
            draining = true
            for session in membership.keys.sorted(by: { $0.value < $1.value }) { send(session, .moving) }
        }
    }

    /// Resends unacknowledged control messages; a session that acknowledged
    /// nothing through every attempt is taken as gone.
    public mutating func handleTimeout(now: Timestamp) {
        self.now = now
        guard let due = resendDue, due <= now else { return }
        var next: Timestamp?
        for session in Array(channels.keys) {
            guard var channel = channels[session] else { continue }
            guard let d = channel.nextDeadline else { continue }
            if d <= now {
                for bytes in channel.resend(now: now) { actions.append(.send(session, bytes)) }
                if channel.failed {
                    channels[session] = nil
                    remove(session, reason: .disconnected)
                    sessionKeys[session] = nil
                    continue
                }
                channels[session] = channel
            }
            if let d = channel.nextDeadline { next = min(next ?? d, d) }
        }
        resendDue = next
    }

    public var nextDeadline: Timestamp? { resendDue }

    public mutating func pollAction() -> Action? {
        actions.popFirst()
    }

    // MARK: the hot path

    /// The sessions a voice frame from `session` goes to: every other member of
    /// its room, when the frame's member id is the session's own and its sender
    /// is among the speakers. Empty otherwise (counted).
    public mutating func forward(_ frame: [UInt8], from session: PartySession, now: Timestamp) -> [PartySession] {
        var targets: [PartySession] = []
        forward(frame, from: session, now: now, into: &targets)
        return targets
    }

    /// The same into `targets` (emptied first, its storage kept): a relay reuses one
    /// array for every frame, and seals the copies itself instead of taking one
    /// ``Action/send(_:_:)`` per copy from ``pollAction()``.
    public mutating func forward(_ frame: [UInt8], from session: PartySession, now: Timestamp, into targets: inout [PartySession])
    {
        targets.removeAll(keepingCapacity: true)
        statistics.framesIn += 1
        // The room is found once (its id hashed once) and used in place: a copy would
        // copy the selector's tables on every packet.
        guard let (sender, level) = PartyFrameHeader.peek(frame), let place = membership[session],
            place.member == sender, let at = rooms.index(forKey: place.room),
            let me = rooms.values[at].members[sender]
        else {
            statistics.framesSpoofed += 1
            return
        }
        guard !me.muted, rooms.values[at].speakers.admit(sender, level: level, now: now) else {
            statistics.framesNotSelected += 1
            return
        }
        let members = rooms.values[at].members
        targets.reserveCapacity(members.count - 1)
        for (id, m) in members where id != sender { targets.append(m.session) }
        statistics.framesForwarded += UInt64(targets.count)
    }

    // MARK: control

    private mutating func control(_ bytes: [UInt8], from session: PartySession) {
        guard var channel = channels[session], let key = sessionKeys[session] else { return }
        let received: ControlChannel.Received
        do { received = try channel.receive(bytes, newID: random.uint32()) } catch {
            channels[session] = channel
            refuse(session, .malformed, "\(error)")
            return
        }
        channels[session] = channel
        // The member's client restarted on the same session (same key, same peer):
        // whatever it was in is gone for it; the others see it leave and rekey.
        if received.restarted { remove(session, reason: .disconnected) }
        if let ack = received.ack { actions.append(.send(session, ack)) }
        for error in received.malformed { refuse(session, .malformed, "\(error)") }
        for message in received.messages {
            // An earlier message of the batch may have closed the session's room or the session.
            guard sessionKeys[session] != nil else { return }
            handle(message, from: session, key: key)
        }
    }

    private mutating func handle(_ message: PartyControl, from session: PartySession, key: PublicKey) {
        switch message {
        case .create(let name, let maxMembers, let invite):
            guard !memoryShort else { return refuse(session, .tooManyRooms, "the relay is short of memory") }
            guard !draining else { return refuse(session, .draining, "the relay is shutting down") }
            create(name: name, maxMembers: maxMembers, invite: invite, by: session, key: key)
        case .join(let id):
            guard !memoryShort else { return refuse(session, .full, "the relay is short of memory") }
            guard !draining else { return refuse(session, .draining, "the relay is shutting down") }
            join(id, session: session, key: key)
        case .rejoin(let ticket, let member, let highest):
            rejoin(ticket, member: member, highest: highest, session: session, key: key)
            // Taken back (its seat must not be lost), and told to move on at once.
            if draining, membership[session] != nil { send(session, .moving) }
        case .ping:
            break  // the channel's acknowledgement is the answer
        case .describe(let id):
            send(session, .described(room: id, describe(id, for: key)))
        case .leave:
            guard membership[session] != nil else { return refuse(session, .notInRoom, "not in a room") }
            remove(session, reason: .left)
        case .kick(let target):
            guard let (roomID, _) = membership[session], let room = rooms[roomID] else {
                return refuse(session, .notInRoom, "not in a room")
            }
            guard room.creator == key else { return refuse(session, .notCreator, "only the creator kicks") }
            guard let victim = room.members[target] else { return refuse(session, .noSuchMember, "no member \(target)") }
            send(victim.session, .closed(reason: .kicked))
            remove(victim.session, reason: .kicked)
        case .close:
            guard let (roomID, _) = membership[session], let room = rooms[roomID] else {
                return refuse(session, .notInRoom, "not in a room")
            }
            guard room.creator == key else { return refuse(session, .notCreator, "only the creator closes the room") }
            closeRoom(roomID, reason: .roomClosed)
        case .mute(let muted):
            guard let (roomID, me) = membership[session], var room = rooms[roomID] else {
                return refuse(session, .notInRoom, "not in a room")
            }
            room.members[me]?.muted = muted
            if muted { room.speakers.remove(me) }
            rooms[roomID] = room
            broadcast(room, .memberMuted(member: me, muted: muted), except: nil)
        case .key(let to, let sealed):
            relay(from: session, to: to) { .key(member: $0, sealed: sealed) }
        case .keyAck(let to, let kid):
            relay(from: session, to: to) { .keyAck(member: $0, kid: kid) }
        case .joined, .described, .memberJoined, .memberLeft, .memberMuted, .closed, .refused, .moving:
            refuse(session, .malformed, "a relay's message sent to the relay")
        }
    }

    /// A room as shown to `key`: only to whoever may join it (invited, its creator, or anyone for an open room).
    public func describe(_ id: String, for key: PublicKey) -> RoomDescription? {
        guard let room = rooms[id], room.invited.isEmpty || room.creator == key || room.invited.contains(key) else { return nil }
        return RoomDescription(room: id, name: room.name, maxMembers: room.maxMembers, members: room.roster)
    }

    private mutating func create(name: String, maxMembers: Int?, invite: [String], by session: PartySession, key: PublicKey) {
        guard membership[session] == nil else { return refuse(session, .alreadyInRoom, "leave the current room first") }
        guard !name.isEmpty, name.utf8.count <= configuration.maxNameLength, !name.contains(where: \.isNewline) else {
            return refuse(session, .badName, "a room name is 1-\(configuration.maxNameLength) bytes on one line")
        }
        guard rooms.count < configuration.maxRooms else { return refuse(session, .tooManyRooms, "the relay is full") }
        guard invite.count <= PartyControl.maximumInvited else {
            return refuse(
                session, .malformed, "a room's invite list holds at most \(PartyControl.maximumInvited) keys, not \(invite.count)"
            )
        }
        var invited = Set<PublicKey>()
        for text in invite {
            guard let k = PublicKey(base64: text) else { return refuse(session, .malformed, "bad invited key \(text)") }
            invited.insert(k)
        }
        let limit = min(max(maxMembers ?? configuration.maxMembers, 2), configuration.maxMembers)
        var id: String
        repeat { id = configuration.roomPrefix + Self.roomID(&random) } while rooms[id] != nil
        rooms[id] = Room(
            id: id, name: name, creator: key, maxMembers: limit, invited: invited,
            ticket: tickets.issue(room: id, name: name, creator: key, maxMembers: limit, invited: invited),
            speakers: SpeakerSelector(configuration: configuration.speakers))
        actions.append(.event(.roomCreated(id: id, name: name, creator: key)))
        join(id, session: session, key: key)
    }

    /// A member back after losing its session: into the room as it stands, or as
    /// the ticket describes it when this relay lost it (a restart) or it emptied
    /// while its members were away; into its old seat when that seat is still its own.
    private mutating func rejoin(
        _ ticket: RoomTicket, member: MemberID, highest: MemberID, session: PartySession, key: PublicKey
    ) {
        guard membership[session] == nil else { return refuse(session, .alreadyInRoom, "leave the current room first") }
        guard tickets.verify(ticket) else {
            return refuse(session, .badTicket, "the ticket for \(ticket.room) was not issued by this relay")
        }
        let reclaim: Bool
        // Rebuilt from a ticket (now or earlier): its old seats are open to whoever comes back with one.
        let rebuilt: Bool
        if let room = rooms[ticket.room] {
            rebuilt = room.restoredBelow > 0
            let free = room.members[member] == nil
            reclaim =
                room.members[member]?.key == key || (free && (room.departed[member] == key || member.value < room.restoredBelow))
        } else {
            let wasDormant = dormant[ticket.room].map { now < $0 + configuration.dormantFor } ?? false
            guard ticket.incarnation != tickets.incarnation || wasDormant else {
                return refuse(session, .badTicket, "room \(ticket.room) was closed")
            }
            guard rooms.count < configuration.maxRooms else { return refuse(session, .tooManyRooms, "the relay is full") }
            guard let creator = PublicKey(base64: ticket.creator) else {
                return refuse(session, .badTicket, "the ticket names no creator key")
            }
            let invited = Set(ticket.invited.compactMap { PublicKey(base64: $0) })
            let limit = min(max(ticket.maxMembers, 2), configuration.maxMembers)
            dormant[ticket.room] = nil
            rooms[ticket.room] = Room(
                id: ticket.room, name: ticket.name, creator: creator, maxMembers: limit, invited: invited,
                ticket: tickets.issue(
                    room: ticket.room, name: ticket.name, creator: creator, maxMembers: limit, invited: invited),
                speakers: SpeakerSelector(configuration: configuration.speakers))
            actions.append(.event(.roomRestored(id: ticket.room, name: ticket.name, creator: creator)))
            reclaim = true
            rebuilt = true
        }
        // Newcomers are numbered above every member the rejoining one has seen.
        if highest.value < UInt16.max, var room = rooms[ticket.room] {
            room.nextMember = max(room.nextMember, highest.value + 1)
            if reclaim, rebuilt {
                room.restoredBelow = max(room.restoredBelow, highest.value + 1)
            }
            rooms[ticket.room] = room
        }
        join(ticket.room, session: session, key: key, as: reclaim ? member : nil)
    }

    private mutating func join(_ roomID: String, session: PartySession, key: PublicKey, as requested: MemberID? = nil) {
        guard membership[session] == nil else { return refuse(session, .alreadyInRoom, "leave the current room first") }
        guard var room = rooms[roomID] else { return refuse(session, .noSuchRoom, "no room \(roomID)") }
        guard room.invited.isEmpty || room.creator == key || room.invited.contains(key) else {
            return refuse(session, .notInvited, "not invited to \(roomID)")
        }
        // One seat per key: a member that rejoins (new network, restarted client) replaces its old session.
        if let old = room.members.values.first(where: { $0.key == key }) {
            remove(old.session, reason: .disconnected, keepEmptyRoom: true)
            guard let again = rooms[roomID] else { return refuse(session, .noSuchRoom, "no room \(roomID)") }
            room = again
        }
        guard room.members.count < room.maxMembers else {
            return refuse(session, .full, "\(roomID) holds \(room.maxMembers) members")
        }
        let id: MemberID
        if let requested, room.members[requested] == nil {
            id = requested
            if requested.value >= room.nextMember { room.nextMember = requested.value &+ 1 }
        } else {
            id = MemberID(room.nextMember)
            room.nextMember &+= 1
        }
        room.departed[id] = nil
        let member = Member(id: id, key: key, session: session)
        room.members[id] = member
        revisions += 1
        room.revision = revisions
        rooms[roomID] = room
        membership[session] = (roomID, id)
        let entry = RosterEntry(member: id, key: key, creator: room.creator == key)
        broadcast(room, .memberJoined(entry), except: id)
        send(session, .joined(room: roomID, name: room.name, you: id, roster: room.roster, ticket: room.ticket))
        actions.append(.event(.memberJoined(room: roomID, member: id, key: key)))
    }

    /// Takes `session` out of its room; the last member out closes it (unless
    /// `keepEmptyRoom`: its seat is being taken again at once). A member whose
    /// session was lost may take its seat back; a room it left empty waits
    /// ``Configuration/dormantFor`` for it.
    private mutating func remove(_ session: PartySession, reason: LeaveReason, keepEmptyRoom: Bool = false) {
        guard let (roomID, id) = membership.removeValue(forKey: session), var room = rooms[roomID] else { return }
        room.members[id] = nil
        revisions += 1
        room.revision = revisions
        room.speakers.remove(id)
        if reason == .disconnected, let key = sessionKeys[session] {
            if room.departed.count >= 2 * room.maxMembers, let oldest = room.departed.keys.min() {
                room.departed[oldest] = nil
            }
            room.departed[id] = key
        }
        actions.append(.event(.memberLeft(room: roomID, member: id, reason: reason)))
        if room.members.isEmpty, !keepEmptyRoom {
            rooms[roomID] = nil
            if reason == .disconnected { sleep(roomID) }
            actions.append(.event(.roomClosed(id: roomID)))
            return
        }
        rooms[roomID] = room
        broadcast(room, .memberLeft(member: id, reason: reason), except: nil)
    }

    /// Keeps a room emptied by lost sessions open to rejoins for a while (expired ones forgotten as others come).
    private mutating func sleep(_ roomID: String) {
        if dormant.count >= configuration.maxRooms {
            dormant = dormant.filter { now < $0.value + configuration.dormantFor }
            if dormant.count >= configuration.maxRooms, let oldest = dormant.min(by: { $0.value < $1.value }) {
                dormant[oldest.key] = nil
            }
        }
        dormant[roomID] = now
    }

    private mutating func closeRoom(_ roomID: String, reason: LeaveReason) {
        guard let room = rooms[roomID] else { return }
        for m in room.members.values {
            send(m.session, .closed(reason: reason))
            membership[m.session] = nil
            actions.append(.event(.memberLeft(room: roomID, member: m.id, reason: reason)))
        }
        rooms[roomID] = nil
        actions.append(.event(.roomClosed(id: roomID)))
    }

    /// Passes a sealed key (or its acknowledgement) to one member of the sender's
    /// room, naming the sender: the relay vouches for who sent it, not for what.
    private mutating func relay(from session: PartySession, to: MemberID, _ make: (MemberID) -> PartyControl) {
        guard let (roomID, me) = membership[session], let room = rooms[roomID] else {
            return refuse(session, .notInRoom, "not in a room")
        }
        guard let target = room.members[to], to != me else { return refuse(session, .noSuchMember, "no member \(to)") }
        send(target.session, make(me))
    }

    private mutating func broadcast(_ room: Room, _ message: PartyControl, except: MemberID?) {
        let json = message.encodedJSON()
        for (id, m) in room.members where id != except { send(m.session, json: json) }
    }

    private mutating func send(_ session: PartySession, _ message: PartyControl) {
        send(session, json: message.encodedJSON())
    }

    private mutating func send(_ session: PartySession, json: [UInt8]) {
        guard var channel = channels[session] else { return }
        for packet in channel.send(json: json, now: now) { actions.append(.send(session, packet)) }
        channels[session] = channel
        let due = now + ControlChannel.initialTimeout
        resendDue = min(resendDue ?? due, due)
    }

    private mutating func refuse(_ session: PartySession, _ code: PartyErrorCode, _ detail: String) {
        statistics.controlRefused += 1
        send(session, .refused(code: code, detail: detail))
    }

    /// 12 lowercase base32 characters (60 bits): short enough to type, too many to guess.
    static func roomID(_ random: inout any SecureRandom) -> String {
        let alphabet = Array("abcdefghijkmnpqrstuvwxyz23456789")
        var v = UInt64(random.uint32()) << 32 | UInt64(random.uint32())
        var s = ""
        for _ in 0..<12 {
            s.append(alphabet[Int(v & 31)])
            v >>= 5
        }
        return s
    }
}

/// What a relay's rooms report to the operator.
public enum PartyServerEvent: Hashable, Sendable {
    case roomCreated(id: String, name: String, creator: PublicKey)
    /// A room brought back from a member's ticket (after a relay restart, or after it emptied while its members were away).
    case roomRestored(id: String, name: String, creator: PublicKey)
    case memberJoined(room: String, member: MemberID, key: PublicKey)
    case memberLeft(room: String, member: MemberID, reason: LeaveReason)
    case roomClosed(id: String)
}
