import Rendezvous

/// Where a rendezvous keeps what outlives a connection (``RendezvousRecord``): a
/// directory's database. ``RendezvousService`` loads it before it serves, and
/// writes each record before it acknowledges what made it.
public protocol RendezvousStore: Sendable {
    /// What is still kept at Unix time `unixSeconds`: posts younger than `postsFor`
    /// in posting order, keys seen within `seenFor`. Older ones are deleted.
    func load(unixSeconds: UInt64, postsFor: Duration, seenFor: Duration) async throws -> RendezvousSnapshot
    /// Writes the records, in order, all or none.
    func write(_ records: [RendezvousRecord]) async throws
    /// Deletes what is no longer kept at Unix time `unixSeconds` (as ``load`` does).
    func prune(unixSeconds: UInt64, postsFor: Duration, seenFor: Duration) async throws
    func close() async
}
