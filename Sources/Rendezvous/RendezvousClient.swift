import Secure

/// The client side of the rendezvous, sans-IO: it answers the server's challenge,
/// seals payloads to peers and opens what peers sent. The driver writes what it
/// returns to the TCP connection and feeds it what arrives.
public struct RendezvousClient: Sendable {
    public enum Event: Equatable, Sendable {
        /// Registered; TURN credentials when the relay hands them out.
        case registered(TURNGrant?)
        case lookup(id: UInt32, key: PublicKey, online: Bool)
        /// The server passed request `id` on.
        case sent(id: UInt32)
        /// A payload from a peer, opened and authenticated as coming from `from`.
        case received(from: PublicKey, payload: [UInt8])
        /// A payload claiming to come from `from` that does not open: dropped.
        case unopenable(from: PublicKey)
        /// The server refused request `id` (or the connection, when nil).
        case refused(code: RendezvousErrorCode, detail: String, id: UInt32?)
        case pong
    }

    public let identity: PrivateKey
    public private(set) var isRegistered = false
    private var framer = RendezvousFrame()
    private var nextID: UInt32 = 1

    public init(identity: PrivateKey) { self.identity = identity }

    /// Bytes from the server: the events they carry and the bytes to write back.
    /// Throws on a stream that is not the rendezvous protocol (the connection is then useless).
    public mutating func receive(_ bytes: some Collection<UInt8>) throws(RendezvousError) -> (events: [Event], reply: [UInt8]) {
        var events: [Event] = []
        var reply: [UInt8] = []
        for frame in try framer.append(bytes) {
            switch try RendezvousMessage(decoding: frame) {
            case .hello(let challenge, let serverKey):
                guard let proof = try? RegistrationProof.make(identity: identity, serverKey: serverKey, challenge: challenge) else {
                    throw .malformed("hello: the server's key is not usable")
                }
                reply += RendezvousFrame.frame(.register(key: identity.publicKey, proof: proof))
            case .registered(let turn):
                isRegistered = true
                events.append(.registered(turn))
            case .lookupResult(let id, let key, let online):
                events.append(.lookup(id: id, key: key, online: online))
            case .sent(let id):
                events.append(.sent(id: id))
            case .deliver(let from, let sealed):
                do { events.append(.received(from: from, payload: try Sealing.open(sealed, from: from, to: identity))) } catch {
                    events.append(.unopenable(from: from))
                }
            case .error(let code, let detail, let id):
                if id == nil && code == .replaced { isRegistered = false }
                events.append(.refused(code: code, detail: detail, id: id))
            case .ping:
                reply += RendezvousFrame.frame(.pong)
            case .pong:
                events.append(.pong)
            case .register, .lookup, .send:
                throw .malformed("a client message from the server")
            }
        }
        return (events, reply)
    }

    /// Asks whether `key` is online; the answer is `.lookup` with the returned id.
    public mutating func lookup(_ key: PublicKey) -> (id: UInt32, bytes: [UInt8]) {
        let id = takeID()
        return (id, RendezvousFrame.frame(.lookup(id: id, key: key)))
    }

    /// Seals `payload` to `peer` and frames it for the server; the answer is `.sent`
    /// or `.refused` with the returned id.
    public mutating func send(_ payload: [UInt8], to peer: PublicKey) throws -> (id: UInt32, bytes: [UInt8]) {
        let sealed = try Sealing.seal(payload, from: identity, to: peer)
        let id = takeID()
        let frame = RendezvousFrame.frame(.send(id: id, to: peer, sealed: sealed))
        guard frame.count - 2 <= RendezvousFrame.maximumLength else { throw RendezvousError.tooLarge(frame.count - 2) }
        return (id, frame)
    }

    public func ping() -> [UInt8] { RendezvousFrame.frame(.ping) }

    private mutating func takeID() -> UInt32 {
        defer { nextID &+= 1 }
        return nextID
    }
}
