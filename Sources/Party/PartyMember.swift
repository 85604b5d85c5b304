import Foundation
import Rendezvous
import Secure
import TusaBase

/// A member's side of a party, sans-IO: joining, the roster, and the sender
/// keys that seal its voice end to end.
///
/// - On joining, the member makes a fresh sender key, uses it at once and hands
///   it, sealed to each member's static key (``Sealing``), to every member the
///   roster shows, and to no one else.
/// - When someone joins, every member moves its key one ratchet step on and
///   hands the newcomer only the new step: what was said before cannot be opened
///   by the newcomer. The others follow the step on their own.
/// - When someone leaves or is kicked, every remaining member makes a fresh key,
///   hands it to the others and seals under it once they all acknowledged it or
///   ``Configuration/rekeyDeadline`` passed: what is said after cannot be opened
///   by the one who left. The same every ``Configuration/rotation`` anyway.
///
/// - When the session with the relay is lost (the relay is silent for
///   ``Configuration/lostAfter`` though pinged, or restarted), the member keeps
///   its room, roster and keys and waits for its driver to reconnect
///   (``Input/reconnected``); it then rejoins with the relay's ``RoomTicket``,
///   into its old seat when it can, and hands its current key to whoever is
///   there: the others hear a gap, nothing else changes.
///
/// - Before the first key it hands each member, it tells that member how it
///   encodes (``Configuration/audioFormat``), sealed the same way; what each other
///   member said is in ``audioFormats`` and comes with each of its frames.
///
/// Inputs are the relay's packets and the user's requests; actions are packets
/// for the relay and events for the app. ``seal(_:timestamp:level:now:)`` is the
/// hot path for outgoing voice; incoming voice comes out as `.audio` events.
public struct PartyMember: SansIOCore {
    public struct Configuration: Sendable {
        /// How long a fresh key waits for every member's acknowledgement before it is used anyway.
        public var rekeyDeadline: Duration = .seconds(1)
        /// A fresh key this often even when nobody joins or leaves.
        public var rotation: Duration = .seconds(15 * 60)
        /// How long a join or create waits for the relay's answer (longer than the
        /// control channel takes to give a silent hop up, 11.75 s).
        public var joinTimeout: Duration = .seconds(15)
        /// A ping goes to the relay when nothing came from it for this long.
        public var pingAfter: Duration = .milliseconds(500)
        /// …and this soon when what stopped was a voice stream (the last thing heard
        /// was a voice frame): a NAT rebinding or a path change mid-talkspurt, which
        /// the ping repairs (the relay's session follows it to the new address). The
        /// relay drops silence, so every pause in the room's speech costs one ping.
        public var pingAfterVoice: Duration = .milliseconds(100)
        /// Nothing from the relay for this long, pings included: the session is lost.
        public var lostAfter: Duration = .seconds(2)
        /// How long a member whose session was lost tries to rejoin before the room ends for it.
        public var rejoinTimeout: Duration = .seconds(30)
        /// Report every sender key used or handed over as a `.keyLog` line
        /// (``KeyLog/partyLine(kid:base:)``), for `tusa interop decrypt`. Off: whoever reads them hears the room.
        public var keyLog = false
        /// How this member encodes its voice, told to each other member once, before
        /// the first sender key it hands over (nil: told not, and its listeners assume their own).
        public var audioFormat: PartyAudioFormat?
        public init() {}
    }

    public enum Input: Sendable {
        /// A packet from the relay (control or media).
        case received([UInt8])
        case create(name: String, maxMembers: Int?, invite: [PublicKey])
        case join(room: String)
        case leave
        case kick(MemberID)
        case close
        case mute(Bool)
        /// Asks who is in a room, without joining it (answered by a `.described` event).
        case describe(room: String)
        /// Pings the relay now (its acknowledgement comes back on whatever path the relay uses for us).
        case ping
        /// The session with the relay is gone: the member waits to rejoin (``reconnected``).
        case disconnected
        /// A new session with the relay is up (after ``Action/event(_:)`` `.connectionLost`): rejoin.
        case reconnected
        /// The room is hosted on another relay now (the directory says so; two of
        /// its nodes moved it at once): leave this relay's session for that one,
        /// keeping the seat, ticket and keys (``Action/event(_:)`` `.connectionLost`).
        case relocate
    }

    public enum Action: Sendable {
        /// A packet for the relay.
        case send([UInt8])
        case event(PartyMemberEvent)
    }

    public enum Phase: Hashable, Sendable {
        case idle
        /// A create or join is waiting for the relay's answer since the timestamp.
        case joining(since: Timestamp)
        case inRoom(room: String, name: String, me: MemberID)
        /// The session with the relay was lost at `since`; keys and roster are kept for the rejoin.
        case rejoining(room: String, name: String, me: MemberID, since: Timestamp)
        case ended(LeaveReason)
    }

    public let configuration: Configuration
    public let identity: PrivateKey
    public private(set) var phase: Phase = .idle
    /// The other members, as the relay told us (their static keys included).
    public private(set) var roster: [MemberID: RosterEntry] = [:]
    public private(set) var keyring = PartyKeyring()
    /// How each other member said it encodes its voice (``Configuration/audioFormat``).
    public private(set) var audioFormats: [MemberID: PartyAudioFormat] = [:]
    /// The members told this member's own format since it joined or rejoined (once
    /// each: it does not change).
    private var toldFormat: Set<MemberID> = []
    /// Members not back yet after a rejoin, whose keys are kept for when they are.
    private var away: [MemberID: RosterEntry] = [:]
    /// Members that have not yet acknowledged the pending key.
    public private(set) var awaitingAck: Set<MemberID> = []
    private var pendingSince: Timestamp?
    private var currentSince: Timestamp?
    private var epoch: UInt16 = 0
    private var sequence: UInt16 = 0
    private var muted = false
    private var channel: ControlChannel
    /// The relay's ticket for the room, for a rejoin.
    public private(set) var ticket: RoomTicket?
    /// When the relay was last heard from, and last pinged.
    private var lastHeard = Timestamp.zero
    private var lastPing: Timestamp?
    /// When the last voice frame came from the relay.
    private var lastVoice: Timestamp?
    /// The time of the input being handled.
    private var now = Timestamp.zero
    private var actions = ActionQueue<Action>()
    private var random: any SecureRandom

    public init(identity: PrivateKey, configuration: Configuration = .init(), random: some SecureRandom = SystemRandom()) {
        self.identity = identity
        self.configuration = configuration
        var random: any SecureRandom = random
        channel = ControlChannel(id: random.uint32())
        self.random = random
    }

    public var me: MemberID? {
        if case .inRoom(_, _, let me) = phase { return me }
        return nil
    }

    public var room: String? {
        if case .inRoom(let room, _, _) = phase { return room }
        return nil
    }

    /// The room this member is getting back into after losing its session (nil otherwise).
    public var rejoining: String? {
        if case .rejoining(let room, _, _, _) = phase { return room }
        return nil
    }

    // MARK: SansIOCore

    public mutating func handle(_ input: Input, now: Timestamp) {
        self.now = now
        switch input {
        case .received(let bytes):
            received(bytes, now: now)
        case .create(let name, let maxMembers, let invite):
            guard startJoining(now) else { return }
            send(.create(name: name, maxMembers: maxMembers, invite: invite.map(\.base64)))
        case .join(let room):
            guard startJoining(now) else { return }
            send(.join(room: room))
        case .leave:
            switch phase {
            case .inRoom, .rejoining:
                send(.leave)
                end(.left)
            default: return
            }
        case .kick(let member):
            guard case .inRoom = phase else { return }
            send(.kick(member: member))
        case .close:
            guard case .inRoom = phase else { return }
            send(.close)
        case .mute(let m):
            muted = m
            if case .inRoom = phase { send(.mute(m)) }
        case .describe(let room):
            send(.describe(room: room))
        case .ping:
            lastPing = now
            send(.ping)
        case .disconnected:
            // The next session numbers its control messages from 1 again, as the relay does.
            channel = ControlChannel(id: random.uint32())
            switch phase {
            case .idle, .ended, .rejoining: return
            case .joining: end(.disconnected)
            case .inRoom: lose()
            }
        case .reconnected:
            channel = ControlChannel(id: random.uint32())
            lastHeard = now
            if case .rejoining = phase { sendRejoin() }
        case .relocate:
            // Without a ticket there is no seat to take elsewhere: stay.
            guard case .inRoom = phase, ticket != nil else { return }
            lose()
        }
    }

    public mutating func handleTimeout(now: Timestamp) {
        self.now = now
        for bytes in channel.resend(now: now) { actions.append(.send(bytes)) }
        if channel.failed {
            channel = ControlChannel(id: random.uint32())
            if case .joining = phase {
                phase = .idle
                emit(.refused(code: .noSuchRoom, detail: "the relay does not answer"))
            } else if case .inRoom = phase {
                lose()
            }
            return
        }
        switch phase {
        case .joining(let since) where now >= since + configuration.joinTimeout:
            phase = .idle
            emit(.refused(code: .noSuchRoom, detail: "the relay did not answer within \(configuration.joinTimeout)"))
        case .rejoining(_, _, _, let since) where now >= since + configuration.rejoinTimeout:
            end(.disconnected)
        case .inRoom(let room, _, let me):
            if now >= lastHeard + configuration.lostAfter {
                lose()
                return
            }
            if now >= pingDue {
                lastPing = now
                send(.ping)
            }
            if let since = pendingSince, now >= since + configuration.rekeyDeadline {
                switchToPending(now: now)
            }
            if pendingSince == nil, let since = currentSince, now >= since + configuration.rotation {
                rekey(room: room, me: me, now: now)
            }
        default:
            break
        }
    }

    public var nextDeadline: Timestamp? {
        let own: Timestamp?
        switch phase {
        case .joining(let since): own = since + configuration.joinTimeout
        case .inRoom:
            let keys = pendingSince.map { $0 + configuration.rekeyDeadline } ?? currentSince.map { $0 + configuration.rotation }
            own = [keys, pingDue, lastHeard + configuration.lostAfter].compactMap { $0 }.min()
        case .rejoining(_, _, _, let since): own = since + configuration.rejoinTimeout
        default: own = nil
        }
        return [own, channel.nextDeadline].compactMap { $0 }.min()
    }

    /// When the relay, silent since `lastHeard`, is pinged next: sooner when a
    /// voice stream stopped and nothing was pinged since.
    private var pingDue: Timestamp {
        if lastVoice == lastHeard, (lastPing ?? .zero) < lastHeard { return lastHeard + configuration.pingAfterVoice }
        return max(lastHeard, lastPing ?? lastHeard) + configuration.pingAfter
    }

    public mutating func pollAction() -> Action? {
        actions.popFirst()
    }

    // MARK: the hot path

    /// Seals one voice frame for the room: the packet to send to the relay, or
    /// nil when not in a room, muted, or without a key.
    public mutating func seal(_ audio: [UInt8], timestamp: UInt32, level: AudioLevel, now: Timestamp) -> [UInt8]? {
        guard !muted, case .inRoom = phase, let key = keyring.current else { return nil }
        sequence &+= 1
        return try? PartyFrame.seal(
            audio, key: key, counter: keyring.nextCounter(), sequence: sequence, timestamp: timestamp, level: level)
    }

    /// Opens a voice frame the relay forwarded.
    public mutating func open(_ bytes: [UInt8]) throws(FrameOpenError) -> (header: PartyFrameHeader, audio: [UInt8]) {
        let header: PartyFrameHeader
        do { header = try PartyFrameHeader.decode(bytes) } catch { throw .malformed(error) }
        guard roster[header.sender] != nil else { throw .noKey(SenderKeyID(member: header.sender, epoch: 0, step: 0)) }
        return (header, try keyring.open(bytes, header: header))
    }

    // MARK: what the relay says

    private mutating func received(_ bytes: [UInt8], now: Timestamp) {
        guard let first = bytes.first else { return }
        lastHeard = now
        if first == PartyPacketType.media.rawValue {
            lastVoice = now
            do {
                let (header, audio) = try open(bytes)
                emit(.audio(from: header.sender, header: header, audio: audio, format: audioFormats[header.sender]))
            } catch {
                emit(.dropped(error))
            }
            return
        }
        let received: ControlChannel.Received
        do { received = try channel.receive(bytes, newID: random.uint32()) } catch {
            emit(.malformed(error))
            return
        }
        if let ack = received.ack { actions.append(.send(ack)) }
        for error in received.malformed { emit(.malformed(error)) }
        // The relay restarted on this session: the room we were in is gone for it; rejoin at once.
        if received.restarted, case .inRoom = phase {
            lose(reconnect: false)
            sendRejoin()
        }
        for message in received.messages { handle(message, now: now) }
    }

    private mutating func handle(_ message: PartyControl, now: Timestamp) {
        switch message {
        case .joined(let room, let name, let me, let members, let ticket):
            switch phase {
            case .joining:
                startFresh(room: room, name: name, me: me, roster: members, ticket: ticket)
                emit(.joined(room: room, name: name, me: me, roster: members))
            case .rejoining(let oldRoom, _, let oldMe, _) where oldRoom == room && oldMe == me:
                resume(room: room, name: name, me: me, roster: members, ticket: ticket)
                emit(.rejoined(room: room, name: name, me: me, roster: members))
            case .rejoining:
                // Another seat: keys name the member id, so the old ones are no use.
                startFresh(room: room, name: name, me: me, roster: members, ticket: ticket)
                emit(.rejoined(room: room, name: name, me: me, roster: members))
            default:
                return
            }
        case .memberJoined(let entry):
            guard case .inRoom(let room, _, let me) = phase, entry.member != me else { return }
            // Someone else in a seat whose holder we knew before a rejoin: the old holder's keys are not theirs.
            if let was = away.removeValue(forKey: entry.member), was.key != entry.key {
                keyring.remove(entry.member)
                forgetFormat(of: entry.member)
            }
            roster[entry.member] = entry
            // The newcomer gets the next step only; the others follow it on their own.
            if let key = keyring.ratchetCurrent() {
                log(key)
                deliver(key, to: entry.member, room: room)
            }
            if let pending = keyring.pending {
                deliver(pending, to: entry.member, room: room)
                awaitingAck.insert(entry.member)
            }
            emit(.memberJoined(entry))
        case .memberLeft(let member, let reason):
            guard case .inRoom(let room, _, let me) = phase, roster.removeValue(forKey: member) != nil else { return }
            keyring.remove(member)
            forgetFormat(of: member)
            awaitingAck.remove(member)
            emit(.memberLeft(member, reason))
            rekey(room: room, me: me, now: now)
        case .memberMuted(let member, let m):
            if roster[member] != nil { roster[member]?.muted = m }
            emit(.memberMuted(member, m))
        case .key(let from, let sealed):
            acceptKey(Array(sealed), from: from)
        case .keyAck(let by, let kid):
            guard keyring.pending?.id.kid == kid else { return }
            awaitingAck.remove(by)
            if awaitingAck.isEmpty { switchToPending(now: now) }
        case .closed(let reason):
            end(reason)
        case .refused(let code, let detail):
            emit(.refused(code: code, detail: detail))
            switch phase {
            case .joining: phase = .idle
            case .rejoining: end(.disconnected)
            default: break
            }
        case .described(let room, let description):
            emit(.described(room: room, description))
        case .moving:
            // The relay is going: find where the room goes next (the driver asks) and rejoin there.
            guard case .inRoom(let room, _, _) = phase else { return }
            emit(.relayDraining(room: room))
            lose()
        case .create, .join, .rejoin, .ping, .describe, .leave, .kick, .close, .mute:
            emit(.malformed(.malformed("a member's request sent to a member")))
        }
    }

    // MARK: joining and rejoining

    /// Into a room with a fresh key, used at once: nothing was said under it that anyone should not hear.
    private mutating func startFresh(room: String, name: String, me: MemberID, roster members: [RosterEntry], ticket: RoomTicket?)
    {
        phase = .inRoom(room: room, name: name, me: me)
        self.ticket = ticket
        lastHeard = now
        roster = [:]
        away = [:]
        for m in members where m.member != me { roster[m.member] = m }
        keyring = PartyKeyring()
        audioFormats = [:]
        toldFormat = []
        pendingSince = nil
        awaitingAck = []
        epoch = 0
        let key = SenderKey.fresh(member: me, epoch: epoch, random: &random)
        keyring.use(key)
        log(key)
        currentSince = now
        for m in roster.keys { deliver(key, to: m, room: room) }
    }

    /// Back in the old seat with the old keys: whoever is there gets the key in
    /// use (and the one waiting, if a rekey was under way), as a newcomer would.
    private mutating func resume(room: String, name: String, me: MemberID, roster members: [RosterEntry], ticket: RoomTicket?) {
        phase = .inRoom(room: room, name: name, me: me)
        self.ticket = ticket ?? self.ticket
        lastHeard = now
        // Members not (yet) back keep their keys here until they are, or another takes the seat.
        var previous = roster
        roster = [:]
        for m in members where m.member != me {
            roster[m.member] = m
            if let was = previous.removeValue(forKey: m.member), was.key != m.key {
                keyring.remove(m.member)
                forgetFormat(of: m.member)
            }
        }
        away.merge(previous) { _, new in new }
        toldFormat = []  // whoever is there now may not have it (one who left forgot it)
        if let current = keyring.current {
            for m in roster.keys { deliver(current, to: m, room: room) }
        }
        if let pending = keyring.pending {
            pendingSince = now
            awaitingAck = Set(roster.keys)
            for m in roster.keys { deliver(pending, to: m, room: room) }
        }
    }

    /// The session with the relay is lost (or, `reconnect` false, the relay
    /// forgot us on a session that works): keep everything for the rejoin, or
    /// end, with no ticket to rejoin with.
    private mutating func lose(reconnect: Bool = true) {
        guard case .inRoom(let room, let name, let me) = phase, ticket != nil else { return end(.disconnected) }
        phase = .rejoining(room: room, name: name, me: me, since: now)
        lastPing = nil
        if reconnect { emit(.connectionLost(room: room)) }
    }

    private mutating func sendRejoin() {
        guard case .rejoining(_, _, let me, _) = phase, let ticket else { return }
        // Those not back since an earlier rejoin count too: their seats are theirs.
        let highest = max(roster.keys.max() ?? me, away.keys.max() ?? me, me)
        send(.rejoin(ticket: ticket, member: me, highest: highest))
    }

    // MARK: keys

    /// A fresh key for everyone still here, used once they have it.
    private mutating func rekey(room: String, me: MemberID, now: Timestamp) {
        epoch &+= 1
        let key = SenderKey.fresh(member: me, epoch: epoch, random: &random)
        log(key)
        if roster.isEmpty {
            keyring.use(key)
            currentSince = now
            pendingSince = nil
            awaitingAck = []
            emit(.sendingUnder(key.id))
            return
        }
        keyring.prepare(key)
        pendingSince = now
        awaitingAck = Set(roster.keys)
        for m in roster.keys { deliver(key, to: m, room: room) }
    }

    private mutating func switchToPending(now: Timestamp) {
        guard let key = keyring.promotePending() else { return }
        pendingSince = nil
        currentSince = now
        awaitingAck = []
        emit(.sendingUnder(key.id))
    }

    /// Seals `key` to `member`'s static key and sends it through the relay; before
    /// it, the first time since it joined or rejoined, sealed the same way in a message of its own,
    /// how this member encodes (``Configuration/audioFormat``). Control messages
    /// arrive in order and no frame opens before its key, so the member knows the
    /// format before the first frame it can hear. A member from before formats
    /// existed refuses the format message as not a key and reads the key as ever.
    private mutating func deliver(_ key: SenderKey, to member: MemberID, room: String) {
        guard let entry = roster[member], let recipient = entry.publicKey else { return }
        if let format = configuration.audioFormat, !toldFormat.contains(member) {
            var said: [UInt8] = []
            format.encode(into: &said)
            if let sealedFormat = try? Sealing.seal(
                Self.keyMessage(Self.formatLabel, room: room, kid: key.id.kid, said), from: identity, to: recipient)
            {
                send(.key(member: member, sealed: Data(sealedFormat)))
                toldFormat.insert(member)
            }
        }
        let payload = Self.keyMessage(Self.keyLabel, room: room, kid: key.id.kid, key.baseBytes)
        guard let sealed = try? Sealing.seal(payload, from: identity, to: recipient) else { return }
        send(.key(member: member, sealed: Data(sealed)))
    }

    /// What a member seals to another about one of its keys: `label ‖ the room id's
    /// length (1) ‖ the room id ‖ the key's KID (8) ‖ body` (the key's base secret, or
    /// the member's ``PartyAudioFormat``).
    private static func keyMessage(_ label: [UInt8], room: String, kid: UInt64, _ body: [UInt8]) -> [UInt8] {
        var message = label
        message.append(UInt8(room.utf8.count))
        message += Array(room.utf8)
        message.appendUInt64(kid)
        return message + body
    }

    /// A ``keyMessage(_:room:kid:_:)`` after its label: the KID and the body, or nil
    /// when it is cut short or for another room than `room`.
    private static func readKeyMessage(_ afterLabel: ArraySlice<UInt8>, room: String) -> (kid: UInt64, body: ArraySlice<UInt8>)? {
        guard let roomLength = afterLabel.first.map(Int.init) else { return nil }
        let rest = afterLabel.dropFirst()
        guard rest.count >= roomLength + 8, rest.prefix(roomLength).elementsEqual(room.utf8) else { return nil }
        let kid = rest.dropFirst(roomLength).prefix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        return (kid, rest.dropFirst(roomLength + 8))
    }

    private mutating func acceptKey(_ sealed: [UInt8], from member: MemberID) {
        guard case .inRoom(let room, _, _) = phase, let entry = roster[member], let sender = entry.publicKey else {
            emit(.badKey(from: member, why: "not a member we show"))
            return
        }
        let payload: [UInt8]
        do { payload = try Sealing.open(sealed, from: sender, to: identity) } catch {
            emit(.badKey(from: member, why: "does not open with its key"))
            return
        }
        if payload.starts(with: Self.formatLabel) {
            return acceptFormat(payload.dropFirst(Self.formatLabel.count), from: member, room: room)
        }
        guard payload.count > Self.keyLabel.count, payload.starts(with: Self.keyLabel) else {
            emit(.badKey(from: member, why: "not a party key"))
            return
        }
        guard let (kid, body) = Self.readKeyMessage(payload.dropFirst(Self.keyLabel.count), room: room),
            body.count == SecretKey.length
        else {
            emit(.badKey(from: member, why: "for another room"))
            return
        }
        guard let id = SenderKeyID(kid: kid), id.member == member, let base = try? SecretKey(bytes: Array(body)) else {
            emit(.badKey(from: member, why: "a key for another member"))
            return
        }
        let key = SenderKey(id: id, base: base)
        keyring.add(key)
        log(key)
        send(.keyAck(member: member, kid: kid))
        emit(.keyReceived(id))
    }

    /// How `member` encodes: the room, the id of the key it was sent with (the
    /// member's own), the ``PartyAudioFormat``. The last one read holds. (A relay that
    /// replays one it forwarded before repeats what the member said: its format does
    /// not change while it runs.)
    private mutating func acceptFormat(_ said: ArraySlice<UInt8>, from member: MemberID, room: String) {
        guard let (kid, body) = Self.readKeyMessage(said, room: room), !body.isEmpty else {
            emit(.badKey(from: member, why: "an audio format for another room"))
            return
        }
        guard let id = SenderKeyID(kid: kid), id.member == member else {
            emit(.badKey(from: member, why: "an audio format for another member's key"))
            return
        }
        let format: PartyAudioFormat
        do { format = try PartyAudioFormat.decode(body) } catch {
            emit(.badKey(from: member, why: "its audio format does not read (\(error))"))
            return
        }
        audioFormats[member] = format
    }

    /// `member` is gone, or another holds its seat: what it said of its format, and
    /// that we told it ours, no longer hold.
    private mutating func forgetFormat(of member: MemberID) {
        audioFormats[member] = nil
        toldFormat.remove(member)
    }

    private static let keyLabel = Array("tusa-party-key-v1".utf8)
    private static let formatLabel = Array("tusa-party-format-v1".utf8)

    // MARK: helpers

    private mutating func startJoining(_ now: Timestamp) -> Bool {
        switch phase {
        case .idle, .ended:
            phase = .joining(since: now)
            return true
        case .joining, .inRoom, .rejoining:
            emit(.refused(code: .alreadyInRoom, detail: "already joining or in a room"))
            return false
        }
    }

    private mutating func end(_ reason: LeaveReason) {
        phase = .ended(reason)
        ticket = nil
        roster = [:]
        away = [:]
        keyring = PartyKeyring()
        audioFormats = [:]
        toldFormat = []
        awaitingAck = []
        pendingSince = nil
        currentSince = nil
        emit(.ended(reason))
    }

    private mutating func log(_ key: SenderKey) {
        if configuration.keyLog { emit(.keyLog(KeyLog.partyLine(kid: key.id.kid, base: key.base))) }
    }

    private mutating func send(_ message: PartyControl) {
        for packet in channel.send(message, now: now) { actions.append(.send(packet)) }
    }
    private mutating func emit(_ event: PartyMemberEvent) { actions.append(.event(event)) }
}

/// What a member's party core tells the app.
public enum PartyMemberEvent: Sendable {
    case joined(room: String, name: String, me: MemberID, roster: [RosterEntry])
    case memberJoined(RosterEntry)
    case memberLeft(MemberID, LeaveReason)
    case memberMuted(MemberID, Bool)
    /// A voice frame, opened, and how its sender said it encodes (nil: it did not say).
    case audio(from: MemberID, header: PartyFrameHeader, audio: [UInt8], format: PartyAudioFormat?)
    /// A voice frame that did not open.
    case dropped(FrameOpenError)
    case keyReceived(SenderKeyID)
    /// Our own frames are sealed under this key from now on (after a rekey).
    case sendingUnder(SenderKeyID)
    case badKey(from: MemberID, why: String)
    case refused(code: PartyErrorCode, detail: String)
    case malformed(PartyWireError)
    /// The session with the relay is lost; the member rejoins when its driver reconnects.
    case connectionLost(room: String)
    /// The relay is shutting down and told the member to move: `.connectionLost`
    /// follows, and the member rejoins where the directory places the room next.
    case relayDraining(room: String)
    /// The relay's answer to ``PartyMember/Input/describe(room:)``.
    case described(room: String, RoomDescription?)
    /// A key-log line (``Configuration/keyLog``): for the key log file, not for display.
    case keyLog(String)
    /// Back in the room after a lost session (`me` differs from before when the old seat was taken).
    case rejoined(room: String, name: String, me: MemberID, roster: [RosterEntry])
    case ended(LeaveReason)
}
