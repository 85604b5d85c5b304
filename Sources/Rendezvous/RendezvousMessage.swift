import Foundation
import Secure

/// TURN credentials the rendezvous hands a registered peer: coturn's REST-API
/// scheme (username `EXPIRY:KEYID`, password base64(HMAC-SHA1(secret, username))),
/// valid until `expiry` (Unix seconds) on the relay's TURN service.
public struct TURNGrant: Codable, Equatable, Sendable {
    public var username: String
    public var password: String
    /// Unix seconds after which the relay refuses them.
    public var expiry: UInt64
    /// Where to use them, e.g. `turn:198.51.100.7:3478?transport=udp`.
    public var uris: [String]

    public init(username: String, password: String, expiry: UInt64, uris: [String]) {
        self.username = username
        self.password = password
        self.expiry = expiry
        self.uris = uris
    }
}

/// Where a relay hosts parties, as its rendezvous tells registered peers: the
/// party service's address (`HOST:PORT`, UDP) and the relay's static key (base64).
public struct PartyGrant: Codable, Equatable, Sendable {
    public var address: String
    public var key: String

    public init(address: String, key: String) {
        self.address = address
        self.key = key
    }
}

/// Why the rendezvous refused something. The raw values travel on the wire.
public enum RendezvousErrorCode: String, Codable, Sendable, CaseIterable {
    /// The frame is not a rendezvous message (bad JSON, missing or wrong fields).
    case malformed
    /// The frame is longer than `RendezvousFrame.maximumLength`.
    case tooLarge = "too-large"
    /// The request needs a registration first.
    case notRegistered = "not-registered"
    /// The registration proof does not match the key.
    case badProof = "bad-proof"
    /// This connection already registered.
    case alreadyRegistered = "already-registered"
    /// A newer connection registered the same key; this one is closed.
    case replaced
    /// The peer was registered lately but is not now.
    case offline
    /// No peer with this key has registered lately.
    case unknownPeer = "unknown-peer"
    /// Too many requests from this connection (it is closed), or too many posts
    /// from its key (the post is refused, the connection stays).
    case rateLimited = "rate-limited"
    /// Registration took too long, or the connection idled out.
    case timeout
    /// The server holds too many connections.
    case full
    /// No live relay hosts parties now (the answer to `locate`).
    case noRelay = "no-relay"
}

/// One rendezvous message. Binary fields travel as base64 in JSON objects, one per
/// frame (`RendezvousFrame`): `{"type":"hello","challenge":"…","key":"…"}`.
public enum RendezvousMessage: Equatable, Sendable {
    /// Server → client, first: a registration challenge and the server's per-connection key.
    case hello(challenge: [UInt8], serverKey: PublicKey)
    /// Client → server: register under `key`; `proof` shows the client holds its private half.
    case register(key: PublicKey, proof: [UInt8])
    /// Server → client: registered; TURN credentials when the relay serves TURN with
    /// a secret, where it hosts parties when it does.
    case registered(turn: TURNGrant?, party: PartyGrant? = nil)
    /// Client → server: is this peer online? (`id` comes back in the answer.)
    case lookup(id: UInt32, key: PublicKey)
    /// Server → client: the answer to `lookup`.
    case lookupResult(id: UInt32, key: PublicKey, online: Bool)
    /// Client → server: deliver a sealed payload to `to`.
    case send(id: UInt32, to: PublicKey, sealed: [UInt8])
    /// Server → client: delivered (the answer to `send`), or kept (to `post`).
    case sent(id: UInt32)
    /// Client → server: keep a sealed payload for `to` (a day), delivered now if it is
    /// online and at each registration of `to` until then (invitations).
    case post(id: UInt32, to: PublicKey, sealed: [UInt8])
    /// Server → client: a sealed payload from `from`.
    case deliver(from: PublicKey, sealed: [UInt8])
    /// Server → client: a refusal; `id` names the request when there was one.
    case error(code: RendezvousErrorCode, detail: String, id: UInt32?)
    /// Keepalive, either way; answered with `pong`.
    case ping
    case pong
    /// Relay → directory, every 2 s once registered: its load, and the proof that it
    /// holds the directory's relay secret (``RelayLoad/proof(secret:key:challenge:load:)``). No answer.
    case load(RelayLoad, proof: [UInt8])
    /// Client → server: which relay hosts party room `room` now? A joiner asks, and
    /// a member whose relay went silent: a room whose relay is gone is placed again
    /// (``RelayRegistry/host(room:now:)``). With `follow`, a member that still hears
    /// its relay asks whether the room moved, and nothing is placed
    /// (``RelayRegistry/current(room:)``).
    case locate(id: UInt32, room: String, follow: Bool = false)
    /// Server → client: the answer to `locate` (and to `place`, with no room).
    case located(id: UInt32, room: String, party: PartyGrant)
    /// Client → server: a new room is to be made: on which relay? With relays
    /// reporting, the directory places it (below 70 % of a relay's capacity, the less
    /// loaded of two picked at random, its expected use reserved there); answered
    /// with `located` and an empty room.
    case place(id: UInt32)
    /// Client → server: change this key's contacts, the keys it takes posts and sends
    /// from freely (at most ``maximumContactChange`` keys a request; both empty: only
    /// asks). Anyone else is a stranger to it: a sender reaches few strangers an hour,
    /// and a recipient's box keeps few of their posts. Answered with `contacts`.
    case changeContacts(id: UInt32, add: [PublicKey], remove: [PublicKey])
    /// Server → client: the key's contacts now (the answer to `changeContacts`).
    case contacts(id: UInt32, keys: [PublicKey])
    /// Relay → directory: its rooms opened, changed and closed since it last said (on
    /// a new connection, all of them), proven as `load` is
    /// (``RelayRooms/proof(secret:key:challenge:rooms:)``). No answer.
    case rooms(RelayRooms, proof: [UInt8])
    /// Client → server: the parties this key may see (its own, those it is invited
    /// to, its friends' open ones), answered with `partyList`.
    case parties(id: UInt32)
    /// Server → client: the answer to `parties`, each with where it is now; `more`
    /// when there were more than one answer holds.
    case partyList(id: UInt32, parties: [PartyEntry], more: Bool)

    /// The most keys one `changeContacts` adds and removes together (a change travels
    /// to a cluster's other nodes in one notification).
    public static let maximumContactChange = 64

    private struct Wire: Codable {
        var type: String
        var id: UInt32?
        var key: String?
        var challenge: String?
        var proof: String?
        var to: String?
        var from: String?
        var sealed: String?
        var online: Bool?
        var code: String?
        var detail: String?
        var turn: TURNGrant?
        var party: PartyGrant?
        var load: RelayLoad?
        var room: String?
        var add: [String]?
        var remove: [String]?
        var keys: [String]?
        var follow: Bool?
        var rooms: RelayRooms?
        var parties: [PartyEntry]?
        var more: Bool?
    }

    public func encode() -> [UInt8] {
        var w = Wire(type: "")
        switch self {
        case .hello(let c, let k):
            w.type = "hello"
            w.challenge = b64(c)
            w.key = k.base64
        case .register(let k, let p):
            w.type = "register"
            w.key = k.base64
            w.proof = b64(p)
        case .registered(let t, let p):
            w.type = "registered"
            w.turn = t
            w.party = p
        case .lookup(let id, let k):
            w.type = "lookup"
            w.id = id
            w.key = k.base64
        case .lookupResult(let id, let k, let o):
            w.type = "lookup-result"
            w.id = id
            w.key = k.base64
            w.online = o
        case .send(let id, let to, let s):
            w.type = "send"
            w.id = id
            w.to = to.base64
            w.sealed = b64(s)
        case .sent(let id):
            w.type = "sent"
            w.id = id
        case .post(let id, let to, let s):
            w.type = "post"
            w.id = id
            w.to = to.base64
            w.sealed = b64(s)
        case .deliver(let f, let s):
            w.type = "deliver"
            w.from = f.base64
            w.sealed = b64(s)
        case .error(let c, let d, let id):
            w.type = "error"
            w.code = c.rawValue
            w.detail = d
            w.id = id
        case .ping: w.type = "ping"
        case .pong: w.type = "pong"
        case .load(let l, let p):
            w.type = "load"
            w.load = l
            w.proof = b64(p)
        case .locate(let id, let room, let follow):
            w.type = "locate"
            w.id = id
            w.room = room
            if follow { w.follow = true }
        case .place(let id):
            w.type = "place"
            w.id = id
        case .located(let id, let room, let party):
            w.type = "located"
            w.id = id
            w.room = room
            w.party = party
        case .changeContacts(let id, let add, let remove):
            w.type = "change-contacts"
            w.id = id
            w.add = add.map(\.base64)
            w.remove = remove.map(\.base64)
        case .contacts(let id, let keys):
            w.type = "contacts"
            w.id = id
            w.keys = keys.map(\.base64)
        case .rooms(let rooms, let proof):
            w.type = "rooms"
            w.rooms = rooms
            w.proof = b64(proof)
        case .parties(let id):
            w.type = "parties"
            w.id = id
        case .partyList(let id, let parties, let more):
            w.type = "party-list"
            w.id = id
            w.parties = parties
            w.more = more
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? Array(encoder.encode(w))) ?? []  // encoding plain strings and numbers cannot fail
    }

    public init(decoding frame: [UInt8]) throws(RendezvousError) {
        let w: Wire
        do { w = try JSONDecoder().decode(Wire.self, from: Data(frame)) } catch {
            throw .malformed("not a rendezvous message (JSON object with a \"type\")")
        }
        func need<T>(_ v: T?, _ name: String) throws(RendezvousError) -> T {
            guard let v else { throw .malformed("\(w.type): missing \"\(name)\"") }
            return v
        }
        func key(_ s: String?, _ name: String) throws(RendezvousError) -> PublicKey {
            let s = try need(s, name)
            guard let k = PublicKey(base64: s) else { throw .malformed("\(w.type): \"\(name)\" is not a 32-byte base64 key") }
            return k
        }
        func keys(_ list: [String]?, _ name: String) throws(RendezvousError) -> [PublicKey] {
            try (list ?? []).map { (s: String) throws(RendezvousError) -> PublicKey in try key(s, name) }
        }
        func bytes(_ s: String?, _ name: String) throws(RendezvousError) -> [UInt8] {
            let s = try need(s, name)
            guard let d = Data(base64Encoded: s) else { throw .malformed("\(w.type): \"\(name)\" is not base64") }
            return Array(d)
        }
        switch w.type {
        case "hello": self = .hello(challenge: try bytes(w.challenge, "challenge"), serverKey: try key(w.key, "key"))
        case "register": self = .register(key: try key(w.key, "key"), proof: try bytes(w.proof, "proof"))
        case "registered": self = .registered(turn: w.turn, party: w.party)
        case "lookup": self = .lookup(id: try need(w.id, "id"), key: try key(w.key, "key"))
        case "lookup-result":
            self = .lookupResult(id: try need(w.id, "id"), key: try key(w.key, "key"), online: try need(w.online, "online"))
        case "send": self = .send(id: try need(w.id, "id"), to: try key(w.to, "to"), sealed: try bytes(w.sealed, "sealed"))
        case "sent": self = .sent(id: try need(w.id, "id"))
        case "post": self = .post(id: try need(w.id, "id"), to: try key(w.to, "to"), sealed: try bytes(w.sealed, "sealed"))
        case "deliver": self = .deliver(from: try key(w.from, "from"), sealed: try bytes(w.sealed, "sealed"))
        case "error":
            let raw = try need(w.code, "code")
            guard let code = RendezvousErrorCode(rawValue: raw) else { throw .malformed("error: unknown code \"\(raw)\"") }
            self = .error(code: code, detail: w.detail ?? "", id: w.id)
        case "ping": self = .ping
        case "pong": self = .pong
        case "load": self = .load(try need(w.load, "load"), proof: try bytes(w.proof, "proof"))
        case "locate": self = .locate(id: try need(w.id, "id"), room: try need(w.room, "room"), follow: w.follow ?? false)
        case "place": self = .place(id: try need(w.id, "id"))
        case "located":
            self = .located(id: try need(w.id, "id"), room: try need(w.room, "room"), party: try need(w.party, "party"))
        case "change-contacts":
            self = .changeContacts(id: try need(w.id, "id"), add: try keys(w.add, "add"), remove: try keys(w.remove, "remove"))
        case "contacts": self = .contacts(id: try need(w.id, "id"), keys: try keys(w.keys, "keys"))
        case "rooms": self = .rooms(try need(w.rooms, "rooms"), proof: try bytes(w.proof, "proof"))
        case "parties": self = .parties(id: try need(w.id, "id"))
        case "party-list":
            self = .partyList(id: try need(w.id, "id"), parties: try need(w.parties, "parties"), more: w.more ?? false)
        default: throw .malformed("unknown message type \"\(w.type)\"")
        }
    }
}

private func b64(_ bytes: [UInt8]) -> String { Data(bytes).base64EncodedString() }

/// Errors of the rendezvous cores. Nothing from the network traps: every bad input is one of these.
public enum RendezvousError: Error, Equatable, Sendable, CustomStringConvertible {
    case malformed(String)
    case tooLarge(Int)
    /// A sealed payload that does not open: tampered, or not for this key.
    case unsealable
    /// A refusal from the server.
    case refused(RendezvousErrorCode, String)

    public var description: String {
        switch self {
        case .malformed(let why): "malformed rendezvous message: \(why)"
        case .tooLarge(let n): "rendezvous frame of \(n) bytes (at most \(RendezvousFrame.maximumLength))"
        case .unsealable: "a sealed payload that does not open (tampered, or not for this key)"
        case .refused(let code, let detail): "rendezvous refused (\(code.rawValue)): \(detail)"
        }
    }
}

/// Frames on the rendezvous TCP stream: a 2-byte big-endian length, then that many
/// bytes of one JSON message. At most `maximumLength` bytes a frame.
public struct RendezvousFrame: Sendable {
    public static let maximumLength = 16_384
    private var buffer: [UInt8] = []

    public init() {}

    /// Whether bytes of a frame not yet whole are held.
    public var isPartial: Bool { !buffer.isEmpty }

    public static func frame(_ message: RendezvousMessage) -> [UInt8] { frame(body: message.encode()) }

    /// `body` behind its length (at most `maximumLength` bytes, or the stream breaks).
    public static func frame(body: [UInt8]) -> [UInt8] {
        [UInt8(truncatingIfNeeded: body.count >> 8), UInt8(truncatingIfNeeded: body.count)] + body
    }

    /// Adds stream bytes; returns the complete frames so far. A frame announced longer
    /// than `maximumLength` is an error (the stream cannot be resynchronised after it).
    public mutating func append(_ bytes: some Collection<UInt8>) throws(RendezvousError) -> [[UInt8]] {
        buffer.append(contentsOf: bytes)
        var frames: [[UInt8]] = []
        var offset = 0
        while buffer.count - offset >= 2 {
            let length = Int(buffer[offset]) << 8 | Int(buffer[offset + 1])
            guard length <= Self.maximumLength else {
                buffer = []
                throw .tooLarge(length)
            }
            guard buffer.count - offset - 2 >= length else { break }
            frames.append(Array(buffer[(offset + 2)..<(offset + 2 + length)]))
            offset += 2 + length
        }
        if offset > 0 { buffer.removeFirst(offset) }
        return frames
    }
}
