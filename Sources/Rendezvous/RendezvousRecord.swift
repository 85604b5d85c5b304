import Secure

/// What the rendezvous keeps beyond a connection, for a store to write down
/// (``RendezvousAction/record(_:)``) and give back after a restart
/// (``RendezvousServer/Input/restore(_:unixSeconds:)``): posts are rows first,
/// and a directory that restarts still delivers them and still knows who was here.
public enum RendezvousRecord: Equatable, Sendable {
    /// A payload kept for its recipient.
    case posted(RendezvousPost)
    /// Posts no longer kept (expired, or pushed out of a full box by newer ones).
    case dropped([UInt64])
    /// A key registered at this Unix time.
    case seen(PublicKey, unixSeconds: UInt64)
    /// `owner`'s contacts changed: these keys added, these removed (the other nodes
    /// of a cluster hear it too).
    case contacts(owner: PublicKey, add: [PublicKey], remove: [PublicKey])
    /// A key reached a stranger it had not reached in the last hour, from its
    /// stranger budget: kept for the hour, so that a restart, and every node of a
    /// cluster (which hear it too), count it against the same budget.
    case reached(RendezvousReach)
    /// A party room opened or changed, as its relay listed it (the other nodes of a
    /// cluster hear it too).
    case party(RendezvousParty)
    /// A party room closed on `relay`, or gone with it (held on another relay, it stays).
    case partyClosed(room: String, relay: PublicKey)
    // For the other nodes of a cluster (``RendezvousCluster``): made only by a node
    // that shares its database with others.
    /// A key registered here, at this Unix time.
    case online(PublicKey, unixSeconds: UInt64)
    /// A key registered here left.
    case offline(PublicKey)
    /// A sealed payload sent from here to a key registered at another node.
    case signal(ClusterSignal)
    /// A relay reported its load here (the other nodes place rooms on it too).
    case relayLoad(PublicKey, RelayLoad)
    /// A relay that reported here is gone (its connection closed).
    case relayGone(PublicKey)
    /// A party room placed again here, on this relay (its own was gone or
    /// draining): every node sends it there from now on.
    case roomMoved(room: String, relay: PublicKey)
    /// A new room was placed here on this relay (``RendezvousMessage/place(id:)``):
    /// every node reserves what it is expected to use there, as this one did.
    case placed(relay: PublicKey)
}

/// A payload posted for a peer (an invitation), numbered by the rendezvous.
public struct RendezvousPost: Equatable, Sendable {
    public var id: UInt64
    public var to: PublicKey
    public var from: PublicKey
    public var sealed: [UInt8]
    /// When it was posted (Unix time, seconds).
    public var unixSeconds: UInt64

    public init(id: UInt64, to: PublicKey, from: PublicKey, sealed: [UInt8], unixSeconds: UInt64) {
        self.id = id
        self.to = to
        self.from = from
        self.sealed = sealed
        self.unixSeconds = unixSeconds
    }
}

/// A stranger reached from a key's stranger budget
/// (``RendezvousServerConfiguration/strangerBurst``), and when (Unix seconds).
public struct RendezvousReach: Equatable, Sendable {
    public var from: PublicKey
    public var to: PublicKey
    public var unixSeconds: UInt64

    public init(from: PublicKey, to: PublicKey, unixSeconds: UInt64) {
        self.from = from
        self.to = to
        self.unixSeconds = unixSeconds
    }
}

/// What a store gives back at start: the posts still kept, in posting order, the
/// keys seen, with when, every key's contacts, and the strangers reached in the
/// last hour, oldest first, and the party rooms held. Given again later (a cluster's
/// node after a gap in what the others said), posts already held are not taken
/// twice, and the contacts replace what the node knew.
public struct RendezvousSnapshot: Equatable, Sendable {
    public var posts: [RendezvousPost]
    public var seen: [PublicKey: UInt64]
    public var contacts: [PublicKey: Set<PublicKey>]
    public var reaches: [RendezvousReach]
    public var parties: [RendezvousParty]

    public init(
        posts: [RendezvousPost] = [], seen: [PublicKey: UInt64] = [:], contacts: [PublicKey: Set<PublicKey>] = [:],
        reaches: [RendezvousReach] = [], parties: [RendezvousParty] = []
    ) {
        self.posts = posts
        self.seen = seen
        self.contacts = contacts
        self.reaches = reaches
        self.parties = parties
    }
}
