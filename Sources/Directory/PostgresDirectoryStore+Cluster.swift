import Logging
import NIOCore
import PostgresNIO
import Relay
import Rendezvous
import Secure
import Synchronization

// What the other directory nodes on the database say, heard on a connection of
// its own (LISTEN), and this node's heartbeat on the same connection.
extension PostgresDirectoryStore {
    /// Returns as soon as the task is cancelled: the loop is cancelled too (its
    /// connection closed), but what it awaits in the database driver at that
    /// moment (a LISTEN being set up, a connection being made) is not waited for.
    public func follow(_ deliver: @escaping @Sendable (RendezvousClusterUpdate) -> Void) async {
        let loop = Task { await self.followLoop(deliver) }
        let ended = Flag()
        Task {
            await loop.value
            ended.raise()
        }
        await withTaskCancellationHandler {
            await ended.wait()
        } onCancel: {
            loop.cancel()
            ended.raise()
        }
    }

    private func followLoop(_ deliver: @escaping @Sendable (RendezvousClusterUpdate) -> Void) async {
        while !Task.isCancelled {
            let started = ContinuousClock.now
            do {
                try await followOnce(deliver)
            } catch {
                guard !Task.isCancelled else { return }
                complain("directory database: lost the other nodes' notices, listening again: \(Self.reason(error))")
            }
            // At once after a connection that served a while (the others test this
            // node's lock 3 s after its last heartbeat); a second apart while it fails.
            try? await Task.sleep(for: ContinuousClock.now - started > .seconds(10) ? .milliseconds(100) : .seconds(1))
        }
    }

    /// One listening connection, until it fails or the task is cancelled (which
    /// closes the connection: nothing waits on a database that went silent).
    private func followOnce(_ deliver: @escaping @Sendable (RendezvousClusterUpdate) -> Void) async throws {
        let c: PostgresConnection
        if let made = link, !made.isClosed {
            c = made
        } else {
            c = try await makeConnection()
            do { try await Self.lockNode(node, on: c, logger: logger) } catch {
                try? await c.close()
                throw error
            }
        }
        link = nil
        let logger = self.logger
        let ended: Result<Void, any Error>
        do {
            try await listen(on: c, logger: logger, deliver)
            ended = .success(())
        } catch {
            ended = .failure(error)
        }
        try? await c.close()
        try ended.get()
    }

    private func listen(
        on c: PostgresConnection, logger: Logger, _ deliver: @escaping @Sendable (RendezvousClusterUpdate) -> Void
    ) async throws {
        try await withTaskCancellationHandler {
            try await c.listen(on: Self.channel) { notices in
                // Listening from here on: what was said before is in the rows.
                for gone in try await beat(on: c) { deliver(.event(.nodeGone(gone))) }
                deliver(.resync(try await Self.snapshot(on: c, logger: logger), presence: try await presence(on: c)))
                // Notices and heartbeats are handled in turn, one query on the connection at a time.
                let (work, feed) = AsyncStream<String?>.makeStream()
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask {
                        for try await notice in notices { feed.yield(notice.payload) }
                        throw DirectoryError("the database closed the listening connection")
                    }
                    group.addTask {
                        while true {
                            try await Task.sleep(for: Self.heartbeatInterval)
                            feed.yield(nil)
                        }
                    }
                    group.addTask {
                        for await item in work {
                            if let payload = item {
                                if let event = try await self.event(from: payload, on: c) { deliver(.event(event)) }
                            } else {
                                for gone in try await self.beat(on: c) { deliver(.event(.nodeGone(gone))) }
                            }
                        }
                    }
                    defer { group.cancelAll() }
                    try await group.next()
                }
            }
        } onCancel: {
            let closing: EventLoopFuture<Void> = c.close()
            _ = closing
        }
    }

    /// This node's heartbeat; nodes whose session ended (their lock is free) or
    /// that fell silent are deleted with their presence and said to be gone
    /// (returned). Should the others have taken this node for gone, it is numbered
    /// as before and its peers written and told again: those not registered at
    /// another node since (a row there is a later registration).
    private func beat(on c: PostgresConnection) async throws -> [UInt32] {
        // The first time, every other node's lock is tried: a directory restarted
        // after a kill does not take its former self's peers for online a moment.
        let fresh = heartbeats == 0 ? 0 : Self.lockTestedAfterMilliseconds
        heartbeats += 1
        let me = Int32(clamping: node)
        var alive = false
        for try await _ in try await c.query(
            "UPDATE nodes SET heartbeat_at = \(unescaped: Self.serverMilliseconds) WHERE id = \(me) RETURNING id",
            logger: logger
        ).decode(Int32.self) {
            alive = true
        }
        if !alive {
            logger.warning("directory node \(node) was taken for gone: registering it and its peers again")
            let keys = Array(registeredHere.keys)
            let logger = self.logger
            let node = self.node
            let here = registeredHere
            try await c.withTransaction(logger: logger) { c in
                var back: [PublicKey] = []
                try await c.query(
                    """
                    INSERT INTO nodes (id, started_at, heartbeat_at)
                    VALUES (\(me), \(unescaped: Self.serverMilliseconds), \(unescaped: Self.serverMilliseconds))
                    ON CONFLICT (id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at
                    """, logger: logger)
                if !keys.isEmpty {
                    let bytes = keys.map { ByteBuffer(bytes: $0.bytes) }
                    let nodes = keys.map { _ in me }
                    let since = keys.map { Int64(clamping: here[$0] ?? 0) }
                    for try await inserted in try await c.query(
                        """
                        INSERT INTO presence (key, node, since)
                        SELECT * FROM UNNEST(\(bytes)::BYTEA[], \(nodes)::INTEGER[], \(since)::BIGINT[])
                        ON CONFLICT (key) DO NOTHING RETURNING key
                        """, logger: logger
                    ).decode(ByteBuffer.self) {
                        if let key = Self.key(inserted) { back.append(key) }
                    }
                }
                try await Self.notify(
                    back.map { .online($0, ClusterPresence(node: node, unixSeconds: here[$0] ?? 0)) }, from: node, on: c,
                    logger: logger)
            }
        }
        var gone: [UInt32] = []
        let logger = self.logger
        let node = self.node
        try await c.withTransaction(logger: logger) { c in
            // CASE fixes the order: this node's own lock is never tried, nor that of a
            // node whose heartbeat is fresh (its listening connection may be being
            // made again) or stale (gone anyway). A lock tried is held to the commit.
            for try await id in try await c.query(
                """
                WITH t AS (SELECT \(unescaped: Self.serverMilliseconds) AS now)
                DELETE FROM nodes USING t WHERE CASE
                    WHEN nodes.id = \(me) THEN false
                    WHEN nodes.heartbeat_at < t.now - \(Self.silentNodeMilliseconds) THEN true
                    WHEN nodes.heartbeat_at > t.now - \(fresh) THEN false
                    ELSE pg_try_advisory_xact_lock(\(Self.nodeLockClass), nodes.id) END
                RETURNING nodes.id
                """, logger: logger
            ).decode(Int32.self) {
                gone.append(UInt32(clamping: id))
            }
            guard !gone.isEmpty else { return }
            let ids = gone.map { Int32(clamping: $0) }
            try await c.query("DELETE FROM presence WHERE node = ANY(\(ids)::INTEGER[])", logger: logger)
            try await Self.notify(gone.map { .nodeGone($0) }, from: node, on: c, logger: logger)
        }
        for id in gone {
            logger.info("directory node \(id) is gone (its session ended, or silent \(Self.silentNodeMilliseconds / 1000) s)")
        }
        return gone
    }

    /// Who is registered at the other live nodes.
    private func presence(on c: PostgresConnection) async throws -> [PublicKey: ClusterPresence] {
        var presence: [PublicKey: ClusterPresence] = [:]
        for try await (bytes, node, since) in try await c.query(
            "SELECT p.key, p.node, p.since FROM presence p JOIN nodes n ON n.id = p.node WHERE p.node <> \(Int32(clamping: self.node))",
            logger: logger
        ).decode((ByteBuffer, Int32, Int64).self) {
            guard let key = Self.key(bytes), node > 0, since >= 0 else { continue }
            presence[key] = ClusterPresence(node: UInt32(node), unixSeconds: UInt64(since))
        }
        return presence
    }

    /// The event a notification carries (read from its row when it names one); nil
    /// for this node's own, and for what is not a notice (logged once a minute).
    private func event(from payload: String, on c: PostgresConnection) async throws -> RendezvousClusterEvent? {
        let notice: ClusterNotice
        do { notice = try ClusterNotice(decoding: payload) } catch {
            complain("directory database: a notification on \(Self.channel) that is not a notice, skipped: \(error)")
            return nil
        }
        guard notice.origin != node else { return nil }
        switch notice.body {
        case .event(let event): return event
        case .signalRow(let id, let node):
            guard node == self.node else { return nil }
            for try await (to, from, sealed) in try await c.query(
                "DELETE FROM signals WHERE id = \(Int64(clamping: id)) RETURNING recipient, sender, sealed", logger: logger
            ).decode((ByteBuffer, ByteBuffer, ByteBuffer).self) {
                guard let to = Self.key(to), let from = Self.key(from) else { return nil }
                return .signal(ClusterSignal(to: to, node: node, from: from, sealed: Array(sealed.readableBytesView)))
            }
            return nil
        case .postRow(let id):
            for try await (to, from, sealed, at) in try await c.query(
                "SELECT recipient, sender, sealed, posted_at FROM posts WHERE id = \(Int64(clamping: id))", logger: logger
            ).decode((ByteBuffer, ByteBuffer, ByteBuffer, Int64).self) {
                guard let to = Self.key(to), let from = Self.key(from), at >= 0 else { return nil }
                return .posted(
                    RendezvousPost(id: id, to: to, from: from, sealed: Array(sealed.readableBytesView), unixSeconds: UInt64(at)))
            }
            return nil
        }
    }

    /// Logs `message` as an error, at most once a minute.
    func complain(_ message: String) {
        let now = ContinuousClock.now
        guard lastComplaint.map({ now - $0 > .seconds(60) }) ?? true else { return }
        lastComplaint = now
        logger.error("\(message)")
    }
}

/// Raised once; ``wait()`` returns once it is (at once if it was).
private final class Flag: Sendable {
    private let state = Mutex<(raised: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func raise() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            guard !state.raised else { return [] }
            state.raised = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    func wait() async {
        await withCheckedContinuation { (waiter: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                if state.raised { return true }
                state.waiters.append(waiter)
                return false
            }
            if now { waiter.resume() }
        }
    }
}
