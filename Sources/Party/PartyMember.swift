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
        /// The session with the relay is gone; the room is left without a word.
        case disconnected
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
        case ended(LeaveReason)
    }

    public let configuration: Configuration
    public let identity: PrivateKey
    public private(set) var phase: Phase = .idle
    /// The other members, as the relay told us (their static keys included).
    public private(set) var roster: [MemberID: RosterEntry] = [:]
    public private(set) var keyring = PartyKeyring()
    /// Members that have not yet acknowledged the pending key.
    public private(set) var awaitingAck: Set<MemberID> = []
    private var pendingSince: Timestamp?
    private var currentSince: Timestamp?
    private var epoch: UInt16 = 0
    private var sequence: UInt16 = 0
    private var muted = false
    private var channel: ControlChannel
    /// The time of the input being handled.
    private var now = Timestamp.zero
    private var actions: [Action] = []
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
            guard case .inRoom = phase else { return }
            send(.leave)
            end(.left)
        case .kick(let member):
            guard case .inRoom = phase else { return }
            send(.kick(member: member))
        case .close:
            guard case .inRoom = phase else { return }
            send(.close)
        case .mute(let m):
            muted = m
            if case .inRoom = phase { send(.mute(m)) }
        case .disconnected:
            // The next session numbers its control messages from 1 again, as the relay does.
            channel = ControlChannel(id: random.uint32())
            if case .idle = phase { return }
            if case .ended = phase { return }
            end(.disconnected)
        }
    }

    public mutating func handleTimeout(now: Timestamp) {
        self.now = now
        for bytes in channel.resend(now: now) { actions.append(.send(bytes)) }
        if channel.failed {
            if case .joining = phase {
                phase = .idle
                emit(.refused(code: .noSuchRoom, detail: "the relay does not answer"))
            } else if case .inRoom = phase {
                end(.disconnected)
            }
            channel = ControlChannel(id: random.uint32())
            return
        }
        switch phase {
        case .joining(let since) where now >= since + configuration.joinTimeout:
            phase = .idle
            emit(.refused(code: .noSuchRoom, detail: "the relay did not answer within \(configuration.joinTimeout)"))
        case .inRoom(let room, _, let me):
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
            if let since = pendingSince {
                own = since + configuration.rekeyDeadline
            } else {
                own = currentSince.map { $0 + configuration.rotation }
            }
        default: own = nil
        }
        return [own, channel.nextDeadline].compactMap { $0 }.min()
    }

    public mutating func pollAction() -> Action? {
        actions.isEmpty ? nil : actions.removeFirst()
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
        if first == PartyPacketType.media.rawValue {
            do {
                let (header, audio) = try open(bytes)
                emit(.audio(from: header.sender, header: header, audio: audio))
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
        // The relay restarted: the room we were in is gone for it.
        if received.restarted, case .inRoom = phase { end(.disconnected) }
        if let ack = received.ack { actions.append(.send(ack)) }
        for message in received.messages { handle(message, now: now) }
    }

    private mutating func handle(_ message: PartyControl, now: Timestamp) {
        switch message {
        case .joined(let room, let name, let me, let members):
            guard case .joining = phase else { return }
            phase = .inRoom(room: room, name: name, me: me)
            roster = [:]
            for m in members where m.member != me { roster[m.member] = m }
            keyring = PartyKeyring()
            epoch = 0
            // A new key, used at once: nothing was said under it that anyone should not hear.
            let key = SenderKey.fresh(member: me, epoch: epoch, random: &random)
            keyring.use(key)
            currentSince = now
            for m in roster.keys { deliver(key, to: m, room: room) }
            emit(.joined(room: room, name: name, me: me, roster: members))
        case .memberJoined(let entry):
            guard case .inRoom(let room, _, let me) = phase, entry.member != me else { return }
            roster[entry.member] = entry
            // The newcomer gets the next step only; the others follow it on their own.
            if let key = keyring.ratchetCurrent() { deliver(key, to: entry.member, room: room) }
            if let pending = keyring.pending {
                deliver(pending, to: entry.member, room: room)
                awaitingAck.insert(entry.member)
            }
            emit(.memberJoined(entry))
        case .memberLeft(let member, let reason):
            guard case .inRoom(let room, _, let me) = phase, roster.removeValue(forKey: member) != nil else { return }
            keyring.remove(member)
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
            if case .joining = phase { phase = .idle }
            emit(.refused(code: code, detail: detail))
        case .create, .join, .leave, .kick, .close, .mute:
            emit(.malformed(.malformed("a member's request sent to a member")))
        }
    }

    // MARK: keys

    /// A fresh key for everyone still here, used once they have it.
    private mutating func rekey(room: String, me: MemberID, now: Timestamp) {
        epoch &+= 1
        let key = SenderKey.fresh(member: me, epoch: epoch, random: &random)
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

    /// Seals `key` to `member`'s static key and sends it through the relay.
    private mutating func deliver(_ key: SenderKey, to member: MemberID, room: String) {
        guard let entry = roster[member], let recipient = entry.publicKey else { return }
        var payload = Self.keyLabel
        payload.append(UInt8(room.utf8.count))
        payload += Array(room.utf8)
        payload.appendUInt64(key.id.kid)
        payload += key.baseBytes
        guard let sealed = try? Sealing.seal(payload, from: identity, to: recipient) else { return }
        send(.key(member: member, sealed: Data(sealed)))
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
        let label = Self.keyLabel.count
        guard payload.count > label, Array(payload[..<label]) == Self.keyLabel else {
            emit(.badKey(from: member, why: "not a party key"))
            return
        }
        let roomLength = Int(payload[label])
        let rest = payload.dropFirst(label + 1)
        guard rest.count == roomLength + 8 + SecretKey.length, Array(rest.prefix(roomLength)) == Array(room.utf8) else {
            emit(.badKey(from: member, why: "for another room"))
            return
        }
        let kidBytes = Array(rest.dropFirst(roomLength).prefix(8))
        let kid = kidBytes.reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        guard let id = SenderKeyID(kid: kid), id.member == member,
            let base = try? SecretKey(bytes: rest.suffix(SecretKey.length))
        else {
            emit(.badKey(from: member, why: "a key for another member"))
            return
        }
        keyring.add(SenderKey(id: id, base: base))
        send(.keyAck(member: member, kid: kid))
        emit(.keyReceived(id))
    }

    private static let keyLabel = Array("tusa-party-key-v1".utf8)

    // MARK: helpers

    private mutating func startJoining(_ now: Timestamp) -> Bool {
        switch phase {
        case .idle, .ended:
            phase = .joining(since: now)
            return true
        case .joining, .inRoom:
            emit(.refused(code: .alreadyInRoom, detail: "already joining or in a room"))
            return false
        }
    }

    private mutating func end(_ reason: LeaveReason) {
        phase = .ended(reason)
        roster = [:]
        keyring = PartyKeyring()
        awaitingAck = []
        pendingSince = nil
        currentSince = nil
        emit(.ended(reason))
    }

    private mutating func send(_ message: PartyControl) { actions.append(.send(channel.send(message, now: now))) }
    private mutating func emit(_ event: PartyMemberEvent) { actions.append(.event(event)) }
}

/// What a member's party core tells the app.
public enum PartyMemberEvent: Sendable {
    case joined(room: String, name: String, me: MemberID, roster: [RosterEntry])
    case memberJoined(RosterEntry)
    case memberLeft(MemberID, LeaveReason)
    case memberMuted(MemberID, Bool)
    /// A voice frame, opened.
    case audio(from: MemberID, header: PartyFrameHeader, audio: [UInt8])
    /// A voice frame that did not open.
    case dropped(FrameOpenError)
    case keyReceived(SenderKeyID)
    /// Our own frames are sealed under this key from now on (after a rekey).
    case sendingUnder(SenderKeyID)
    case badKey(from: MemberID, why: String)
    case refused(code: PartyErrorCode, detail: String)
    case malformed(PartyWireError)
    case ended(LeaveReason)
}
