import Foundation
import Secure

/// Several directory nodes on one database serve as one rendezvous: each tells the
/// others (through the database: PostgreSQL's NOTIFY) who registered and left
/// here, what was posted, and the sealed payloads sent from here to a key
/// registered there. What one node says to the others is a ``RendezvousClusterEvent``;
/// what it says travels as a ``ClusterNotice``.
///
/// A node is numbered by the database (from 1; 0 is a rendezvous alone). Its posts
/// carry its number in their ids' top bits, so nodes never number two posts alike.
public enum RendezvousCluster {
    /// The bits of a post id below the node's number.
    public static let postCounterBits = 40

    /// The first post id a node numbers.
    public static func firstPostID(node: UInt32) -> UInt64 { UInt64(node) << UInt64(postCounterBits) | 1 }

    /// The node that numbered a post.
    public static func node(ofPost id: UInt64) -> UInt32 { UInt32(truncatingIfNeeded: id >> UInt64(postCounterBits)) }
}

/// A key registered at a node of the cluster, since when (Unix seconds).
///
/// When one key registers at two nodes, the registration a node hears of after
/// its own replaces its own (its connection is told so and closed): a client that
/// moved is where it went. Two registrations made at once, each before its node
/// heard of the other, replace each other: both connections are closed.
public struct ClusterPresence: Equatable, Sendable {
    public var node: UInt32
    public var unixSeconds: UInt64

    public init(node: UInt32, unixSeconds: UInt64) {
        self.node = node
        self.unixSeconds = unixSeconds
    }
}

/// A sealed payload sent to a key registered at another node.
public struct ClusterSignal: Equatable, Sendable {
    public var to: PublicKey
    /// The node it is registered at.
    public var node: UInt32
    public var from: PublicKey
    public var sealed: [UInt8]

    public init(to: PublicKey, node: UInt32, from: PublicKey, sealed: [UInt8]) {
        self.to = to
        self.node = node
        self.from = from
        self.sealed = sealed
    }
}

/// What another node of the cluster said (``RendezvousServer/Input/cluster(_:)``).
public enum RendezvousClusterEvent: Equatable, Sendable {
    /// A key registered there.
    case online(PublicKey, ClusterPresence)
    /// A key registered there left.
    case offline(PublicKey, node: UInt32)
    /// A sealed payload for a key registered here.
    case signal(ClusterSignal)
    /// A post written there (already a row in the database).
    case posted(RendezvousPost)
    /// Posts no longer kept.
    case dropped([UInt64])
    /// A node stopped, or went silent: none of its keys are registered any more.
    case nodeGone(UInt32)
    /// A relay reported its load there; placed on here as well.
    case relayLoad(PublicKey, RelayLoad)
    /// A relay that reported there is gone.
    case relayGone(PublicKey)
    /// A party room placed again there, on this relay.
    case roomMoved(room: String, relay: PublicKey)
    /// A key's contacts changed there.
    case contacts(owner: PublicKey, add: [PublicKey], remove: [PublicKey])
    /// A new room was placed there on this relay.
    case placed(relay: PublicKey)
    /// A key registered there reached a stranger from its stranger budget: spent here too.
    case reached(RendezvousReach)
    /// A party room opened or changed, as its relay (reporting there) listed it.
    case party(RendezvousParty)
    /// A party room closed there on `relay`, or gone with it.
    case partyClosed(room: String, relay: PublicKey)
}

/// One ``RendezvousClusterEvent`` as a node sends it to the others: a JSON object
/// naming the node it comes from (a node hears its own notices and skips them).
/// A payload too long for the carrier goes as a `ref` instead: the number of the
/// row that holds it, which the receiving node reads.
public struct ClusterNotice: Equatable, Sendable {
    public enum Body: Equatable, Sendable {
        case event(RendezvousClusterEvent)
        /// A signal (for `node`) or a post (for every node) kept in a row, by number.
        case signalRow(UInt64, node: UInt32)
        case postRow(UInt64)
    }

    public var origin: UInt32
    /// The notice's number at its node: two alike in one transaction stay two
    /// (PostgreSQL delivers identical notifications of a transaction once).
    public var sequence: UInt64
    public var body: Body

    public init(origin: UInt32, sequence: UInt64 = 0, _ body: Body) {
        self.origin = origin
        self.sequence = sequence
        self.body = body
    }

    private struct Wire: Codable {
        var v = 1
        var origin: UInt32
        var n: UInt64?
        var type: String
        var key: String?
        var node: UInt32?
        var at: UInt64?
        var to: String?
        var from: String?
        var sealed: String?
        var ids: [UInt64]?
        var id: UInt64?
        var load: RelayLoad?
        var room: String?
        var add: [String]?
        var remove: [String]?
        var party: PartyListing?
    }

    public func encode() -> String {
        var w = Wire(origin: origin, n: sequence, type: "")
        switch body {
        case .event(.online(let key, let presence)):
            (w.type, w.key, w.node, w.at) = ("online", key.base64, presence.node, presence.unixSeconds)
        case .event(.offline(let key, let node)): (w.type, w.key, w.node) = ("offline", key.base64, node)
        case .event(.signal(let s)):
            (w.type, w.to, w.node, w.from, w.sealed) = ("signal", s.to.base64, s.node, s.from.base64, b64(s.sealed))
        case .event(.posted(let p)):
            (w.type, w.id, w.to, w.from, w.sealed, w.at) = (
                "posted", p.id, p.to.base64, p.from.base64, b64(p.sealed), p.unixSeconds
            )
        case .event(.dropped(let ids)): (w.type, w.ids) = ("dropped", ids)
        case .event(.nodeGone(let node)): (w.type, w.node) = ("node-gone", node)
        case .event(.relayLoad(let key, let load)): (w.type, w.key, w.load) = ("relay-load", key.base64, load)
        case .event(.relayGone(let key)): (w.type, w.key) = ("relay-gone", key.base64)
        case .event(.roomMoved(let room, let relay)): (w.type, w.room, w.key) = ("room-moved", room, relay.base64)
        case .event(.placed(let relay)): (w.type, w.key) = ("placed", relay.base64)
        case .event(.reached(let r)): (w.type, w.from, w.to, w.at) = ("reached", r.from.base64, r.to.base64, r.unixSeconds)
        case .event(.contacts(let owner, let add, let remove)):
            (w.type, w.key, w.add, w.remove) = ("contacts", owner.base64, add.map(\.base64), remove.map(\.base64))
        case .event(.party(let p)): (w.type, w.party, w.key, w.at) = ("party", p.listing, p.relay.base64, p.unixSeconds)
        case .event(.partyClosed(let room, let relay)): (w.type, w.room, w.key) = ("party-closed", room, relay.base64)
        case .signalRow(let id, let node): (w.type, w.id, w.node) = ("signal-row", id, node)
        case .postRow(let id): (w.type, w.id) = ("post-row", id)
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? String(decoding: encoder.encode(w), as: UTF8.self)) ?? ""
    }

    public init(decoding text: String) throws(RendezvousError) {
        let w: Wire
        do { w = try JSONDecoder().decode(Wire.self, from: Data(text.utf8)) } catch {
            throw .malformed("not a cluster notice (JSON object with \"origin\" and \"type\")")
        }
        guard w.v == 1 else { throw .malformed("cluster notice version \(w.v) (this tusa knows 1)") }
        func need<T>(_ v: T?, _ name: String) throws(RendezvousError) -> T {
            guard let v else { throw .malformed("cluster \(w.type): missing \"\(name)\"") }
            return v
        }
        func key(_ s: String?, _ name: String) throws(RendezvousError) -> PublicKey {
            guard let k = PublicKey(base64: try need(s, name)) else {
                throw .malformed("cluster \(w.type): \"\(name)\" is not a 32-byte base64 key")
            }
            return k
        }
        func keys(_ list: [String]?, _ name: String) throws(RendezvousError) -> [PublicKey] {
            try (list ?? []).map { (s: String) throws(RendezvousError) -> PublicKey in try key(s, name) }
        }
        func bytes(_ s: String?, _ name: String) throws(RendezvousError) -> [UInt8] {
            guard let d = Data(base64Encoded: try need(s, name)) else {
                throw .malformed("cluster \(w.type): \"\(name)\" is not base64")
            }
            return Array(d)
        }
        origin = w.origin
        sequence = w.n ?? 0
        switch w.type {
        case "online":
            body = .event(
                .online(
                    try key(w.key, "key"),
                    ClusterPresence(node: try need(w.node, "node"), unixSeconds: try need(w.at, "at"))))
        case "offline": body = .event(.offline(try key(w.key, "key"), node: try need(w.node, "node")))
        case "signal":
            body = .event(
                .signal(
                    ClusterSignal(
                        to: try key(w.to, "to"), node: try need(w.node, "node"), from: try key(w.from, "from"),
                        sealed: try bytes(w.sealed, "sealed"))))
        case "posted":
            body = .event(
                .posted(
                    RendezvousPost(
                        id: try need(w.id, "id"), to: try key(w.to, "to"), from: try key(w.from, "from"),
                        sealed: try bytes(w.sealed, "sealed"), unixSeconds: try need(w.at, "at"))))
        case "dropped": body = .event(.dropped(try need(w.ids, "ids")))
        case "node-gone": body = .event(.nodeGone(try need(w.node, "node")))
        case "relay-load": body = .event(.relayLoad(try key(w.key, "key"), try need(w.load, "load")))
        case "relay-gone": body = .event(.relayGone(try key(w.key, "key")))
        case "room-moved":
            let room = try need(w.room, "room")
            guard (1...RendezvousServer.longestRoomID).contains(room.utf8.count) else {
                throw .malformed("cluster room-moved: a room id of \(room.utf8.count) bytes")
            }
            body = .event(.roomMoved(room: room, relay: try key(w.key, "key")))
        case "placed": body = .event(.placed(relay: try key(w.key, "key")))
        case "reached":
            body = .event(
                .reached(
                    RendezvousReach(from: try key(w.from, "from"), to: try key(w.to, "to"), unixSeconds: try need(w.at, "at"))))
        case "contacts":
            body = .event(
                .contacts(owner: try key(w.key, "key"), add: try keys(w.add, "add"), remove: try keys(w.remove, "remove")))
        case "party":
            let listing = try need(w.party, "party")
            _ = try listing.checked()
            body = .event(
                .party(RendezvousParty(listing: listing, relay: try key(w.key, "key"), unixSeconds: try need(w.at, "at"))))
        case "party-closed": body = .event(.partyClosed(room: try need(w.room, "room"), relay: try key(w.key, "key")))
        case "signal-row": body = .signalRow(try need(w.id, "id"), node: try need(w.node, "node"))
        case "post-row": body = .postRow(try need(w.id, "id"))
        default: throw .malformed("unknown cluster notice type \"\(w.type)\"")
        }
    }
}

private func b64(_ bytes: [UInt8]) -> String { Data(bytes).base64EncodedString() }
