import Rendezvous
import Secure

/// Where a rendezvous keeps what outlives a connection (``RendezvousRecord``): a
/// directory's database. ``RendezvousService`` loads it before it serves, and
/// writes each record before it acknowledges what made it.
///
/// A database several directory nodes share (``RendezvousCluster``) numbers each
/// node, carries what each writes to the others, and tells who is registered where.
public protocol RendezvousStore: Sendable {
    /// What is still kept at Unix time `unixSeconds`: posts younger than `postsFor`
    /// in posting order, keys seen within `seenFor` (older ones are deleted, but for
    /// keys with contacts), every key's contacts, and the strangers reached in the
    /// last hour.
    func load(unixSeconds: UInt64, postsFor: Duration, seenFor: Duration) async throws -> RendezvousSnapshot
    /// Writes the records, in order, all or none; a shared database also tells the
    /// other nodes what they say (who registered and left here, posts, signals).
    func write(_ records: [RendezvousRecord]) async throws
    /// Deletes what is no longer kept at Unix time `unixSeconds` (as ``load`` does).
    func prune(unixSeconds: UInt64, postsFor: Duration, seenFor: Duration) async throws
    func close() async
    /// This node's number among those that share the database (from 1), 0 when
    /// no other node can share it (``RendezvousServerConfiguration/node``).
    var node: UInt32 { get async }
    /// What the other nodes say, handed to `deliver` as it comes, until the task is
    /// cancelled: first (and again after any gap, such as a lost connection to the
    /// database) a ``RendezvousClusterUpdate/resync(_:presence:)``, then each event.
    /// A store no other node shares returns at once.
    func follow(_ deliver: @escaping @Sendable (RendezvousClusterUpdate) -> Void) async
}

extension RendezvousStore {
    public var node: UInt32 { get async { 0 } }
    public func follow(_ deliver: @escaping @Sendable (RendezvousClusterUpdate) -> Void) async {}
}

/// What a shared database says of the other directory nodes (``RendezvousStore/follow(_:)``).
public enum RendezvousClusterUpdate: Sendable {
    /// One event, in the order the nodes wrote them.
    case event(RendezvousClusterEvent)
    /// Everything kept (posts the others wrote among them) and everyone registered
    /// at the other live nodes, as of now: what a gap may have hidden.
    case resync(RendezvousSnapshot, presence: [PublicKey: ClusterPresence])
}
