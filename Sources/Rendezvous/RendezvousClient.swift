import Secure
import TusaBase

/// The client side of the rendezvous, sans-IO (a ``SansIOCore``): it answers the
/// server's challenge, seals payloads to peers, opens what peers sent, pings to keep
/// its registration alive and times out what the server does not answer.
///
/// The driver feeds it ``Input/connected`` once the TCP connection is up and
/// ``Input/received(_:)`` with whatever arrives, and writes every ``Action/write(_:)``
/// to the connection. Requests (``lookup(_:now:)``, ``send(_:to:now:)``) return the id
/// their answer will carry (``Event/lookup(id:key:online:)``, ``Event/sent(id:)``,
/// ``Event/refused(code:detail:id:)`` or ``Event/timedOut(id:)``).
public struct RendezvousClient: Sendable {
    public enum Event: Equatable, Sendable {
        /// Registered; TURN credentials when the relay hands them out, and where it
        /// hosts parties when it does.
        case registered(TURNGrant?, party: PartyGrant?)
        case lookup(id: UInt32, key: PublicKey, online: Bool)
        /// Where party room `room` is hosted now (the answer to ``RendezvousClient/locate(room:follow:now:)``),
        /// or, with no room, where a new one goes (``RendezvousClient/place(now:)``).
        case located(id: UInt32, room: String, party: PartyGrant)
        /// The key's contacts now (the answer to ``RendezvousClient/changeContacts(add:remove:now:)``).
        case contacts(id: UInt32, keys: [PublicKey])
        /// The parties this key may see (the answer to ``RendezvousClient/parties(now:)``).
        case parties(id: UInt32, [PartyEntry], more: Bool)
        /// The server passed request `id` on.
        case sent(id: UInt32)
        /// A payload from a peer, opened and authenticated as coming from `from`.
        case received(from: PublicKey, payload: [UInt8])
        /// A payload claiming to come from `from` that does not open: dropped.
        case unopenable(from: PublicKey)
        /// The server refused request `id` (or the connection, when nil).
        case refused(code: RendezvousErrorCode, detail: String, id: UInt32?)
        /// No answer to request `id` in time (nil: to the registration).
        case timedOut(id: UInt32?)
        case pong
    }

    public enum Input: Sendable {
        /// The connection is up: the registration's time starts.
        case connected
        /// Bytes from the server.
        case received([UInt8])
    }

    public enum Action: Equatable, Sendable {
        /// Write these bytes to the connection.
        case write([UInt8])
        case event(Event)
        /// The stream is not the rendezvous protocol: the connection is useless (close it).
        case failed(RendezvousError)
    }

    public struct Timing: Sendable {
        /// How long the server has to confirm the registration.
        public var registration: Duration = .seconds(10)
        /// How long a lookup or send waits for the server's answer.
        public var request: Duration = .seconds(10)
        /// How often a registered client pings (the server closes silent connections after 90 s).
        public var ping: Duration = .seconds(30)
        public init() {}
    }

    public let identity: PrivateKey
    public let timing: Timing
    public private(set) var isRegistered = false
    private var framer = RendezvousFrame()
    /// The server's challenge on this connection (what a relay's load proof covers).
    private var challenge: [UInt8] = []
    private var nextID: UInt32 = 1
    private var failed = false
    private var registrationDeadline: Timestamp?
    private var requestDeadlines: [UInt32: Timestamp] = [:]
    private var pingAt: Timestamp?
    private var actions: [Action] = []

    public init(identity: PrivateKey, timing: Timing = .init()) {
        self.identity = identity
        self.timing = timing
    }

    /// Asks whether `key` is online; the answer is `.lookup` with the returned id.
    public mutating func lookup(_ key: PublicKey, now: Timestamp) -> UInt32 {
        let id = takeID(now: now)
        actions.append(.write(RendezvousFrame.frame(.lookup(id: id, key: key))))
        return id
    }

    /// Asks which relay hosts party room `room` now (`follow`: whether it moved,
    /// nothing placed; ``RendezvousMessage/locate(id:room:follow:)``); the answer is
    /// `.located` or `.refused` (`.noRelay`) with the returned id.
    public mutating func locate(room: String, follow: Bool = false, now: Timestamp) -> UInt32 {
        let id = takeID(now: now)
        actions.append(.write(RendezvousFrame.frame(.locate(id: id, room: room, follow: follow))))
        return id
    }

    /// Asks where a new room goes; the answer is `.located` with no room, or
    /// `.refused` (`.noRelay`), with the returned id.
    public mutating func place(now: Timestamp) -> UInt32 {
        let id = takeID(now: now)
        actions.append(.write(RendezvousFrame.frame(.place(id: id))))
        return id
    }

    /// Asks for the parties this key may see; the answer is `.parties` with the returned id.
    public mutating func parties(now: Timestamp) -> UInt32 {
        let id = takeID(now: now)
        actions.append(.write(RendezvousFrame.frame(.parties(id: id))))
        return id
    }

    /// Adds and removes contacts (both empty: asks for them); the answer is
    /// `.contacts` or `.refused` with the returned id.
    public mutating func changeContacts(add: [PublicKey], remove: [PublicKey], now: Timestamp) -> UInt32 {
        let id = takeID(now: now)
        actions.append(.write(RendezvousFrame.frame(.changeContacts(id: id, add: add, remove: remove))))
        return id
    }

    /// Seals `payload` to `peer` and frames it for the server; the answer is `.sent`
    /// or `.refused` with the returned id.
    public mutating func send(_ payload: [UInt8], to peer: PublicKey, now: Timestamp) throws -> UInt32 {
        let sealed = try Sealing.seal(payload, from: identity, to: peer)
        let frame = RendezvousFrame.frame(.send(id: nextID, to: peer, sealed: sealed))
        guard frame.count - 2 <= RendezvousFrame.maximumLength else { throw RendezvousError.tooLarge(frame.count - 2) }
        let id = takeID(now: now)
        actions.append(.write(frame))
        return id
    }

    /// Seals `payload` to `peer` for the server to keep a day and deliver whenever
    /// `peer` is registered (an invitation); the answer is `.sent` or `.refused`.
    public mutating func post(_ payload: [UInt8], to peer: PublicKey, now: Timestamp) throws -> UInt32 {
        let sealed = try Sealing.seal(payload, from: identity, to: peer)
        let frame = RendezvousFrame.frame(.post(id: nextID, to: peer, sealed: sealed))
        guard frame.count - 2 <= RendezvousFrame.maximumLength else { throw RendezvousError.tooLarge(frame.count - 2) }
        let id = takeID(now: now)
        actions.append(.write(frame))
        return id
    }

    /// A relay's report to the directory (no answer), proven with the directory's
    /// relay secret over this connection's challenge (``RelayLoad/proof(secret:key:challenge:load:)``).
    public mutating func report(_ load: RelayLoad, secret: String) {
        let proof = RelayLoad.proof(secret: secret, key: identity.publicKey, challenge: challenge, load: load)
        actions.append(.write(RendezvousFrame.frame(.load(load, proof: proof))))
    }

    /// A relay's rooms to the directory (no answer), proven as ``report(_:secret:)`` is.
    public mutating func report(_ rooms: RelayRooms, secret: String) {
        let proof = RelayRooms.proof(secret: secret, key: identity.publicKey, challenge: challenge, rooms: rooms)
        actions.append(.write(RendezvousFrame.frame(.rooms(rooms, proof: proof))))
    }

    private mutating func takeID(now: Timestamp) -> UInt32 {
        defer { nextID &+= 1 }
        requestDeadlines[nextID] = now + timing.request
        return nextID
    }

    private mutating func receive(_ bytes: [UInt8], now: Timestamp) throws(RendezvousError) {
        for frame in try framer.append(bytes) {
            switch try RendezvousMessage(decoding: frame) {
            case .hello(let challenge, let serverKey):
                self.challenge = challenge
                guard let proof = try? RegistrationProof.make(identity: identity, serverKey: serverKey, challenge: challenge)
                else {
                    throw .malformed("hello: the server's key is not usable")
                }
                actions.append(.write(RendezvousFrame.frame(.register(key: identity.publicKey, proof: proof))))
            case .registered(let turn, let party):
                isRegistered = true
                registrationDeadline = nil
                pingAt = now + timing.ping
                actions.append(.event(.registered(turn, party: party)))
            case .lookupResult(let id, let key, let online):
                requestDeadlines[id] = nil
                actions.append(.event(.lookup(id: id, key: key, online: online)))
            case .sent(let id):
                requestDeadlines[id] = nil
                actions.append(.event(.sent(id: id)))
            case .contacts(let id, let keys):
                requestDeadlines[id] = nil
                actions.append(.event(.contacts(id: id, keys: keys)))
            case .located(let id, let room, let party):
                requestDeadlines[id] = nil
                actions.append(.event(.located(id: id, room: room, party: party)))
            case .partyList(let id, let parties, let more):
                requestDeadlines[id] = nil
                actions.append(.event(.parties(id: id, parties, more: more)))
            case .deliver(let from, let sealed):
                do {
                    actions.append(.event(.received(from: from, payload: try Sealing.open(sealed, from: from, to: identity))))
                } catch {
                    actions.append(.event(.unopenable(from: from)))
                }
            case .error(let code, let detail, let id):
                if let id { requestDeadlines[id] = nil } else { registrationDeadline = nil }
                if id == nil && code == .replaced { isRegistered = false }
                actions.append(.event(.refused(code: code, detail: detail, id: id)))
            case .ping:
                actions.append(.write(RendezvousFrame.frame(.pong)))
            case .pong:
                actions.append(.event(.pong))
            case .register, .lookup, .send, .post, .load, .locate, .place, .changeContacts, .rooms, .parties:
                throw .malformed("a client message from the server")
            }
        }
    }
}

extension RendezvousClient: SansIOCore {
    public mutating func handle(_ input: Input, now: Timestamp) {
        guard !failed else { return }
        switch input {
        case .connected:
            if !isRegistered { registrationDeadline = now + timing.registration }
        case .received(let bytes):
            do { try receive(bytes, now: now) } catch {
                failed = true
                registrationDeadline = nil
                requestDeadlines = [:]
                pingAt = nil
                actions.append(.failed(error))
            }
        }
    }

    public mutating func handleTimeout(now: Timestamp) {
        if let at = registrationDeadline, at <= now {
            registrationDeadline = nil
            actions.append(.event(.timedOut(id: nil)))
        }
        for (id, at) in requestDeadlines.sorted(by: { $0.key < $1.key }) where at <= now {
            requestDeadlines[id] = nil
            actions.append(.event(.timedOut(id: id)))
        }
        if let at = pingAt, at <= now {
            actions.append(.write(RendezvousFrame.frame(.ping)))
            pingAt = now + timing.ping
        }
    }

    public var nextDeadline: Timestamp? {
        ([registrationDeadline, pingAt] + requestDeadlines.values.map { Optional($0) }).compactMap { $0 }.min()
    }

    public mutating func pollAction() -> Action? {
        actions.isEmpty ? nil : actions.removeFirst()
    }
}
