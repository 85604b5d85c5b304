import Party
import Secure
import Testing
import TusaBase

/// A relay's room core and members' cores wired together on a virtual clock:
/// what a member sends reaches the server at once, and what the server sends
/// reaches its members, until nothing is left to deliver. A filter can drop
/// packets toward a member; every voice frame delivered is kept per member.
struct PartyHarness {
    var server: PartyServer
    var members: [PartySession: PartyMember] = [:]
    var events: [PartySession: [PartyMemberEvent]] = [:]
    var serverEvents: [PartyServerEvent] = []
    /// Voice frames the relay sent to each session, as sent.
    var framesTo: [PartySession: [[UInt8]]] = [:]
    /// Returns false to lose a packet toward a session.
    var deliverTo: (PartySession, [UInt8]) -> Bool = { _, _ in true }
    /// Returns false to lose a packet from a session toward the relay.
    var acceptFrom: (PartySession, [UInt8]) -> Bool = { _, _ in true }
    var now = Timestamp.seconds(10)
    private var nextSeed: UInt64 = 100

    /// The relay's ticket key, kept across ``restartRelay()`` as an identity file keeps it.
    let ticketKey = SecretKey.random()
    private var incarnation: UInt64 = 1
    private let configuration: PartyServer.Configuration
    var identities: [PartySession: PrivateKey] = [:]

    init(configuration: PartyServer.Configuration = .init()) {
        self.configuration = configuration
        server = PartyServer(
            configuration: configuration, tickets: RoomTicketAuthority(key: ticketKey, incarnation: incarnation),
            random: SeededRandom(seed: 1))
    }

    /// The relay process restarts with the same identity: every room and session gone.
    mutating func restartRelay() {
        incarnation += 1
        server = PartyServer(
            configuration: configuration, tickets: RoomTicketAuthority(key: ticketKey, incarnation: incarnation),
            random: SeededRandom(seed: incarnation))
    }

    /// What a member's driver does on `.connectionLost`: a new session with the relay (as `session`), then `.reconnected`.
    mutating func reconnect(_ old: PartySession, as session: PartySession? = nil) {
        let new = session ?? old
        guard let key = identities[old] else { return }
        if new != old {
            members[new] = members.removeValue(forKey: old)
            events[new] = events.removeValue(forKey: old)
            identities[new] = key
        }
        server.handle(.opened(new, key: key.publicKey), now: now)
        input(new, .reconnected)
    }

    /// A member with a fresh identity, its session open at the relay.
    @discardableResult
    mutating func connect(_ session: PartySession, configuration: PartyMember.Configuration = .init()) -> PublicKey {
        let identity = PrivateKey.generate()
        identities[session] = identity
        nextSeed += 1
        members[session] = PartyMember(identity: identity, configuration: configuration, random: SeededRandom(seed: nextSeed))
        server.handle(.opened(session, key: identity.publicKey), now: now)
        return identity.publicKey
    }

    mutating func input(_ session: PartySession, _ input: PartyMember.Input) {
        members[session]?.handle(input, now: now)
        pump()
    }

    /// One voice frame from `session`, through the relay; the sealed packet, if any.
    @discardableResult
    mutating func speak(_ session: PartySession, _ audio: [UInt8], level: AudioLevel = .init(level: 30, voiced: true))
        -> [UInt8]?
    {
        guard let frame = members[session]?.seal(audio, timestamp: 0, level: level, now: now) else { return nil }
        server.handle(.received(session, frame), now: now)
        pump()
        return frame
    }

    /// Sends raw bytes from `session` to the relay.
    mutating func raw(_ session: PartySession, _ bytes: [UInt8]) {
        server.handle(.received(session, bytes), now: now)
        pump()
    }

    mutating func disconnect(_ session: PartySession) {
        server.handle(.closed(session), now: now)
        members[session]?.handle(.disconnected, now: now)
        pump()
    }

    /// Moves the clock on in `step`s, running every core's timers.
    mutating func advance(by total: Duration, step: Duration = .milliseconds(10)) {
        let end = now + total
        while now < end {
            now = min(now + step, end)
            for s in members.keys {
                if let d = members[s]?.nextDeadline, d <= now { members[s]?.handleTimeout(now: now) }
            }
            if let d = server.nextDeadline, d <= now { server.handleTimeout(now: now) }
            pump()
        }
    }

    mutating func pump() {
        var busy = true
        while busy {
            busy = false
            for s in members.keys.sorted(by: { $0.value < $1.value }) {
                while let action = members[s]?.pollAction() {
                    busy = true
                    switch action {
                    case .send(let bytes):
                        guard acceptFrom(s, bytes) else { continue }
                        server.handle(.received(s, bytes), now: now)
                    case .event(let e): events[s, default: []].append(e)
                    }
                }
            }
            while let action = server.pollAction() {
                busy = true
                switch action {
                case .send(let target, let bytes):
                    if bytes.first == PartyPacketType.media.rawValue { framesTo[target, default: []].append(bytes) }
                    guard deliverTo(target, bytes) else { continue }
                    members[target]?.handle(.received(bytes), now: now)
                case .event(let e): serverEvents.append(e)
                }
            }
        }
    }

    /// The audio `session` heard, in order, from `sender`.
    func heard(_ session: PartySession, from sender: MemberID) -> [[UInt8]] {
        (events[session] ?? []).compactMap {
            if case .audio(let from, _, let audio, _) = $0, from == sender { audio } else { nil }
        }
    }

    func dropped(_ session: PartySession) -> [FrameOpenError] {
        (events[session] ?? []).compactMap { if case .dropped(let e) = $0 { e } else { nil } }
    }

    func refusals(_ session: PartySession) -> [PartyErrorCode] {
        (events[session] ?? []).compactMap { if case .refused(let code, _) = $0 { code } else { nil } }
    }

    func id(_ session: PartySession) -> MemberID? { members[session]?.me }

    /// A room created by `creator` and joined by the rest, in order.
    mutating func room(_ creator: PartySession, _ others: [PartySession], name: String = "Hearthstone") -> String? {
        input(creator, .create(name: name, maxMembers: nil, invite: []))
        guard let room = members[creator]?.room else { return nil }
        for s in others { input(s, .join(room: room)) }
        return room
    }
}

let alice = PartySession(1)
let bob = PartySession(2)
let carol = PartySession(3)
let dave = PartySession(4)
let erin = PartySession(5)

/// `#require` for a value that a mutating call returned (the macro cannot wrap one).
func unwrap<T>(_ value: T?, sourceLocation: SourceLocation = #_sourceLocation) throws -> T {
    try #require(value, sourceLocation: sourceLocation)
}
