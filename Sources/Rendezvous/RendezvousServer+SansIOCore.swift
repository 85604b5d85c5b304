import Secure
import TusaBase

extension RendezvousServer: SansIOCore {
    /// What the driver tells the server about its connections.
    public enum Input: Sendable {
        /// A new connection: the server greets it with a challenge.
        case accepted(ConnectionID)
        /// Bytes from a connection; `unixSeconds` dates TURN credentials (the core reads no clock).
        case received(ConnectionID, [UInt8], unixSeconds: UInt64)
        /// The driver saw the connection close.
        case closed(ConnectionID)
        /// What a store kept before this process started (``RendezvousRecord``), with
        /// the Unix time now: given before the first connection.
        case restore(RendezvousSnapshot, unixSeconds: UInt64)
        /// The host is short of memory (true) or no longer (false): while it is,
        /// nothing new is kept (posts are refused); sending to an online peer goes on.
        case memoryShort(Bool)
        /// What another directory node said (``RendezvousCluster``), with the Unix time now.
        case cluster(RendezvousClusterEvent, unixSeconds: UInt64)
        /// What the database holds (read at start and after a gap in what the other
        /// nodes said): the posts, and who is registered at the other nodes.
        case clusterResync(RendezvousSnapshot, presence: [PublicKey: ClusterPresence], unixSeconds: UInt64)
        /// The rooms of the relay this rendezvous runs in (``RendezvousServerConfiguration/party``),
        /// as that relay would list them to a directory: the first list is all of them.
        case localRooms(RelayRooms, unixSeconds: UInt64)
    }

    public typealias Action = RendezvousAction

    public mutating func handle(_ input: Input, now: Timestamp) {
        switch input {
        case .received(_, _, let unix), .restore(_, let unix), .cluster(_, let unix), .clusterResync(_, _, let unix),
            .localRooms(_, let unix):
            unixClock = (unix, now)
        case .accepted, .closed, .memoryShort: break
        }
        let actions: [RendezvousAction]
        switch input {
        case .accepted(let id): actions = accept(id, now: now)
        case .received(let id, let bytes, let unixSeconds): actions = receive(id, bytes, now: now, unixSeconds: unixSeconds)
        case .closed(let id):
            closed(id, now: now)
            actions = []
        case .restore(let snapshot, let unixSeconds):
            restore(snapshot, unixSeconds: unixSeconds, now: now)
            actions = []
        case .memoryShort(let short):
            memoryShort = short
            actions = []
        case .cluster(let event, let unixSeconds): actions = cluster(event, now: now, unixSeconds: unixSeconds)
        case .clusterResync(let snapshot, let presence, let unixSeconds):
            actions = clusterResync(snapshot, presence: presence, unixSeconds: unixSeconds, now: now)
        case .localRooms(let rooms, let unixSeconds):
            listLocalRooms(rooms, now: now, unixSeconds: unixSeconds)
            actions = []
        }
        // Rooms held: looked at for their relays' going from now on, whatever else is due.
        if partySweepAt == nil, parties.count > 0 { partySweepAt = now + Self.partySweep }
        emit(actions)
    }

    /// Connections that did not register in time or went silent are closed; peers
    /// forgotten after `rememberFor`.
    public mutating func handleTimeout(now: Timestamp) {
        emit(poll(now: now))
    }

    /// The records an input made go before its actions: a post is written down before it is acknowledged.
    private mutating func emit(_ actions: [RendezvousAction]) {
        pending += records.map(RendezvousAction.record)
        records.removeAll()
        pending += actions
    }

    public mutating func pollAction() -> RendezvousAction? {
        pending.isEmpty ? nil : pending.removeFirst()
    }
}
