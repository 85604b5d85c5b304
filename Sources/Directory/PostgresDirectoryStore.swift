import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PostgresNIO
import Relay
import Rendezvous
import Secure
import Synchronization

/// The directory's rows in PostgreSQL (postgres-nio): the same posts and keys
/// seen as ``SQLiteDirectoryStore``, in a server that outlives the directory
/// process and that several directory nodes share. One schema with numbered
/// migrations, applied at start (one node at a time, under an advisory lock).
///
/// Each node that opens the database is numbered (`nodes`, a heartbeat every 2 s)
/// and writes, beside its rows, what the other nodes are to hear (`NOTIFY
/// tusa_directory`, see ``RendezvousCluster``): keys registered and gone here
/// (also kept in `presence`), posts, drops, and the signals it sends to keys
/// registered at another node (`signals` holds one too long for a notification).
/// A node is gone when its heartbeat is 3 s old and its session has ended (it
/// stopped, or was killed: its session lock is free), or its heartbeat is 6 s old
/// (cut off): whichever node notices first deletes its presence and says so.
///
/// Two connections: one for writes, made again on the next write when the server
/// dropped it (a PostgreSQL restart costs the writes in flight their retries,
/// nothing more); one that holds the node's session lock and listens, made again
/// a second after it is lost, each time reading back what a gap may have hidden.
public actor PostgresDirectoryStore: RendezvousStore {
    /// Migration N (from 1) is `migrations[N - 1]`, its statements in order.
    static let migrations: [[String]] = [
        [
            """
            CREATE TABLE posts (id BIGINT PRIMARY KEY, recipient BYTEA NOT NULL, sender BYTEA NOT NULL,
                sealed BYTEA NOT NULL, posted_at BIGINT NOT NULL)
            """,
            "CREATE INDEX posts_by_time ON posts (posted_at)",
            "CREATE TABLE seen (key BYTEA PRIMARY KEY, at BIGINT NOT NULL)",
        ],
        [
            "CREATE TABLE nodes (id SERIAL PRIMARY KEY, started_at BIGINT NOT NULL, heartbeat_at BIGINT NOT NULL)",
            "CREATE TABLE presence (key BYTEA PRIMARY KEY, node INTEGER NOT NULL, since BIGINT NOT NULL)",
            "CREATE INDEX presence_by_node ON presence (node)",
            """
            CREATE TABLE signals (id BIGSERIAL PRIMARY KEY, node INTEGER NOT NULL, recipient BYTEA NOT NULL,
                sender BYTEA NOT NULL, sealed BYTEA NOT NULL, sent_at BIGINT NOT NULL)
            """,
        ],
        ["CREATE TABLE contacts (owner BYTEA NOT NULL, contact BYTEA NOT NULL, PRIMARY KEY (owner, contact))"],
        [
            """
            CREATE TABLE reaches (sender BYTEA NOT NULL, recipient BYTEA NOT NULL, at BIGINT NOT NULL,
                PRIMARY KEY (sender, recipient))
            """
        ],
        [
            """
            CREATE TABLE parties (id TEXT PRIMARY KEY, name TEXT NOT NULL, creator BYTEA NOT NULL, relay BYTEA NOT NULL,
                max_members INTEGER NOT NULL, member_count INTEGER NOT NULL, updated_at BIGINT NOT NULL)
            """,
            // A party's members (not invited, in join order) and invited keys.
            """
            CREATE TABLE party_members (party TEXT NOT NULL REFERENCES parties (id) ON DELETE CASCADE,
                key BYTEA NOT NULL, invited BOOLEAN NOT NULL, position INTEGER NOT NULL, PRIMARY KEY (party, invited, key))
            """,
            "CREATE INDEX party_members_by_key ON party_members (key)",
        ],
    ]

    /// The schema this build knows.
    public static var schemaVersion: Int { migrations.count }
    /// The transaction lock nodes migrate under, one at a time (not the lock a
    /// directory of schema 1 held while it served: a node waits for no such one).
    static let migrationLock: Int64 = 0x7475_7361_6d69_6772  // "tusamigr"
    /// Node N holds the session lock (nodeLockClass, N) while it lives.
    static let nodeLockClass: Int32 = 0x7475_7361  // "tusa"
    /// Where the nodes' notices travel.
    static let channel = "tusa_directory"
    /// The database server's clock in milliseconds: heartbeats compare on one clock.
    static let serverMilliseconds = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"
    static let heartbeatInterval: Duration = .seconds(2)
    /// A node whose heartbeat is older than this is gone.
    static let silentNodeMilliseconds: Int64 = 6_000
    /// A node whose heartbeat is older than this is gone if its lock is free.
    static let lockTestedAfterMilliseconds: Int64 = 3_000
    /// This process's notices so far (each is numbered).
    static let noticesSent = Mutex<UInt64>(0)
    /// A notification carries at most 8,000 bytes; a longer notice goes by row.
    static let longestNotice = 7_900

    public let location: PostgresLocation
    let logger: Logger
    private var connection: PostgresConnection?
    /// The listening connection made at open (holding the node's lock), until ``follow(_:)`` takes it.
    var link: PostgresConnection?
    private var connectionsMade = 0
    /// This node's number (`nodes.id`), from ``open(_:logger:)`` on.
    public private(set) var node: UInt32 = 0
    /// Keys registered at this node now, since when: published again should the
    /// other nodes have taken this one for gone.
    var registeredHere: [PublicKey: UInt64] = [:]
    /// Heartbeats so far.
    var heartbeats = 0
    /// When a problem with the database was last logged (once a minute).
    var lastComplaint: ContinuousClock.Instant?

    private init(location: PostgresLocation, logger: Logger) {
        self.location = location
        self.logger = logger
    }

    /// Connects, brings the schema up to date and numbers this node.
    public static func open(_ location: PostgresLocation, logger: Logger) async throws(DirectoryError)
        -> PostgresDirectoryStore
    {
        let store = PostgresDirectoryStore(location: location, logger: logger)
        do {
            try await store.prepare()
        } catch {
            await store.close()
            throw error
        }
        return store
    }

    /// A new connection to the server.
    func makeConnection() async throws -> PostgresConnection {
        connectionsMade += 1
        var configuration: PostgresConnection.Configuration
        switch location.server {
        case .tcp(let host, let port):
            configuration = .init(
                host: host, port: port, username: location.user, password: location.password,
                database: location.database, tls: try location.tls.connectionTLS())
        case .unixSocket(let folder, let port):
            configuration = .init(
                unixSocketPath: "\(folder)/.s.PGSQL.\(port)", username: location.user, password: location.password,
                database: location.database)
        }
        configuration.options.connectTimeout = .seconds(5)
        let made = try await PostgresConnection.connect(
            on: MultiThreadedEventLoopGroup.singleton.any(), configuration: configuration, id: connectionsMade,
            logger: logger
        ).get()
        // The server drops a session whose peer vanished within about 25 s (not the
        // system's two hours): a node cut off by the network is soon gone.
        do {
            try await made.query("SET tcp_keepalives_idle = 10", logger: logger)
            try await made.query("SET tcp_keepalives_interval = 5", logger: logger)
            try await made.query("SET tcp_keepalives_count = 3", logger: logger)
        } catch {
            try? await made.close()
            throw error
        }
        return made
    }

    /// The connection for writes, made again when the server dropped it.
    private func connected() async throws -> PostgresConnection {
        if let connection, !connection.isClosed { return connection }
        connection = nil
        let made = try await makeConnection()
        connection = made
        return made
    }

    /// Brings the schema up to date (one node at a time: the others wait for the
    /// lock, then find it done) and numbers this node.
    private func prepare() async throws(DirectoryError) {
        let connection: PostgresConnection
        do { connection = try await connected() } catch {
            throw DirectoryError("cannot reach the database \(location): \(Self.reason(error))")
        }
        let logger = self.logger
        let location = self.location
        let applied: [Int]
        do {
            applied = try await connection.withTransaction(logger: logger) { c in
                // Another node migrating holds it for moments; a wait longer than this is a fault.
                try await c.query("SET LOCAL lock_timeout = '15s'", logger: logger)
                try await c.query("SELECT pg_advisory_xact_lock(\(Self.migrationLock))", logger: logger)
                try await c.query(
                    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)",
                    logger: logger)
                var current = 0
                for try await v in try await c.query(
                    "SELECT COALESCE(MAX(version), 0) FROM schema_migrations", logger: logger
                ).decode(Int32.self) {
                    current = Int(v)
                }
                guard current <= Self.schemaVersion else {
                    throw DirectoryError.newerSchema(in: "\(location)", found: current, known: Self.schemaVersion)
                }
                guard current >= 0 else { throw DirectoryError.badSchema(in: "\(location)", found: current) }
                var applied: [Int] = []
                for version in (current + 1)..<(Self.schemaVersion + 1) {
                    for statement in Self.migrations[version - 1] {
                        try await c.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                    }
                    let now = Int64(Date().timeIntervalSince1970)
                    try await c.query(
                        "INSERT INTO schema_migrations (version, applied_at) VALUES (\(Int32(version)), \(now))",
                        logger: logger)
                    applied.append(version)
                }
                return applied
            }
        } catch {
            if let inner = (error as? PostgresTransactionError)?.closureError as? DirectoryError { throw inner }
            throw DirectoryError("cannot bring \(location) to schema version \(Self.schemaVersion): \(Self.reason(error))")
        }
        for version in applied {
            logger.info("directory database: schema version \(version)", metadata: ["database": "\(location)"])
        }
        // Numbered and locked on the connection that will listen, before its row
        // exists: from its first moment, a node the others see is a node that lives.
        do {
            let link = try await makeConnection()
            self.link = link
            for try await id in try await link.query(
                "SELECT nextval(pg_get_serial_sequence('nodes', 'id'))::INTEGER", logger: logger
            ).decode(Int32.self) {
                node = UInt32(clamping: id)
            }
            try await Self.lockNode(node, on: link, logger: logger)
            try await link.query(
                """
                INSERT INTO nodes (id, started_at, heartbeat_at)
                VALUES (\(Int32(clamping: node)), \(unescaped: Self.serverMilliseconds), \(unescaped: Self.serverMilliseconds))
                """, logger: logger)
        } catch {
            throw DirectoryError("cannot register this directory node in \(location): \(Self.reason(error))")
        }
        guard node != 0 else { throw DirectoryError("\(location) gave this directory node no number") }
        logger.info("directory node \(node)", metadata: ["database": "\(location)"])
    }

    public func prune(unixSeconds: UInt64, postsFor: Duration, seenFor: Duration) async throws {
        let now = Int64(clamping: unixSeconds)
        let postsSince = now - postsFor.components.seconds
        let seenSince = now - seenFor.components.seconds
        try await transaction { c, logger in
            try await c.query("DELETE FROM posts WHERE posted_at <= \(postsSince)", logger: logger)
            // A key with contacts is remembered until the core forgets them (its
            // RendezvousServerConfiguration.contactsFor counts from this row).
            try await c.query(
                "DELETE FROM seen WHERE at <= \(seenSince) AND NOT EXISTS (SELECT 1 FROM contacts WHERE contacts.owner = seen.key)",
                logger: logger)
            try await c.query(
                "DELETE FROM reaches WHERE at <= \(now - RendezvousServer.strangerMemory.components.seconds)", logger: logger)
            // A signal's row lives until its node reads it; one nobody read in a minute never will be.
            try await c.query(
                "DELETE FROM signals WHERE sent_at < \(unescaped: Self.serverMilliseconds) - 60000", logger: logger)
        }
    }

    public func load(unixSeconds: UInt64, postsFor: Duration, seenFor: Duration) async throws -> RendezvousSnapshot {
        try await prune(unixSeconds: unixSeconds, postsFor: postsFor, seenFor: seenFor)
        return try await Self.snapshot(on: try await connected(), logger: logger)
    }

    /// Every post kept, in posting order (all nodes'), and every key seen.
    static func snapshot(on c: PostgresConnection, logger: Logger) async throws -> RendezvousSnapshot {
        var snapshot = RendezvousSnapshot()
        let posts = try await c.query(
            "SELECT id, recipient, sender, sealed, posted_at FROM posts ORDER BY posted_at, id", logger: logger)
        for try await (id, recipient, sender, sealed, at) in posts.decode(
            (Int64, ByteBuffer, ByteBuffer, ByteBuffer, Int64).self)
        {
            guard let to = key(recipient), let from = key(sender), id > 0, at >= 0 else { continue }
            snapshot.posts.append(
                RendezvousPost(
                    id: UInt64(id), to: to, from: from, sealed: Array(sealed.readableBytesView), unixSeconds: UInt64(at)))
        }
        for try await (bytes, at) in try await c.query("SELECT key, at FROM seen", logger: logger).decode(
            (ByteBuffer, Int64).self)
        {
            guard let key = key(bytes), at >= 0 else { continue }
            snapshot.seen[key] = UInt64(at)
        }
        for try await (owner, contact) in try await c.query("SELECT owner, contact FROM contacts", logger: logger).decode(
            (ByteBuffer, ByteBuffer).self)
        {
            guard let owner = key(owner), let contact = key(contact) else { continue }
            snapshot.contacts[owner, default: []].insert(contact)
        }
        for try await (sender, recipient, at) in try await c.query(
            "SELECT sender, recipient, at FROM reaches ORDER BY at", logger: logger
        ).decode((ByteBuffer, ByteBuffer, Int64).self) {
            guard let from = key(sender), let to = key(recipient), at >= 0 else { continue }
            snapshot.reaches.append(RendezvousReach(from: from, to: to, unixSeconds: UInt64(at)))
        }
        var reader = PartyRowReader()
        for try await (party, bytes, invited) in try await c.query(
            "SELECT party, key, invited FROM party_members ORDER BY party, position", logger: logger
        ).decode((String, ByteBuffer, Bool).self) {
            guard let key = key(bytes) else { continue }
            reader.member(of: party, key, invited: invited)
        }
        for try await (id, name, creator, relay, maxMembers, count, at) in try await c.query(
            "SELECT id, name, creator, relay, max_members, member_count, updated_at FROM parties ORDER BY id", logger: logger
        ).decode((String, String, ByteBuffer, ByteBuffer, Int32, Int32, Int64).self) {
            guard let creator = key(creator), let relay = key(relay), at >= 0 else { continue }
            snapshot.parties.append(
                reader.party(
                    id: id, name: name, creator: creator, relay: relay, maxMembers: Int(maxMembers), memberCount: Int(count),
                    unixSeconds: UInt64(at)))
        }
        return snapshot
    }

    /// The records in a few statements whatever their number (arrays through
    /// UNNEST, one round trip each): posts upserted, drops deleted, keys seen
    /// upserted, this node's presence, then one notification for each thing the
    /// other nodes are to hear, in order. Order is kept where it matters: a post
    /// and its drop in one batch end deleted, and a key seen twice keeps the later time.
    public func write(_ records: [RendezvousRecord]) async throws {
        guard !records.isEmpty else { return }
        var posts: [UInt64: RendezvousPost] = [:]
        var dropped: [Int64] = []
        var seen: [PublicKey: UInt64] = [:]
        /// Registered here since (nil: gone), the last word for each key.
        var presence: [PublicKey: UInt64?] = [:]
        var notices: [RendezvousClusterEvent] = []
        /// Strangers reached, the latest time for each pair.
        var reaches: [[UInt8]: RendezvousReach] = [:]
        /// Contact rows to delete, then to insert, in the order the records came.
        var contactChanges: [(owner: PublicKey, add: [PublicKey], remove: [PublicKey])] = []
        /// Party rooms as last said.
        var partyChanges: [String: PartyRows.Change] = [:]
        let node = self.node
        for record in records {
            switch record {
            case .posted(let post):
                posts[post.id] = post
                notices.append(.posted(post))
            case .dropped(let ids):
                dropped += ids.map { Int64(clamping: $0) }
                notices.append(.dropped(ids))
            case .seen(let key, let unixSeconds): seen[key] = unixSeconds
            case .online(let key, let unixSeconds):
                presence[key] = .some(unixSeconds)
                notices.append(.online(key, ClusterPresence(node: node, unixSeconds: unixSeconds)))
            case .offline(let key):
                presence[key] = .some(nil)
                notices.append(.offline(key, node: node))
            case .signal(let signal): notices.append(.signal(signal))
            case .relayLoad(let key, let load): notices.append(.relayLoad(key, load))
            case .relayGone(let key): notices.append(.relayGone(key))
            case .roomMoved(let room, let relay): notices.append(.roomMoved(room: room, relay: relay))
            case .placed(let relay): notices.append(.placed(relay: relay))
            case .reached(let reach):
                reaches[reach.from.bytes + reach.to.bytes] = reach
                notices.append(.reached(reach))
            case .contacts(let owner, let add, let remove):
                contactChanges.append((owner, add, remove))
                notices.append(.contacts(owner: owner, add: add, remove: remove))
            case .party(let party):
                partyChanges[party.listing.room] = .listed(party)
                notices.append(.party(party))
            case .partyClosed(let room, let relay):
                // Listed on this relay earlier in the batch: whatever the row said before goes.
                if case .listed(let party)? = partyChanges[room], party.relay == relay {
                    partyChanges[room] = .gone
                } else {
                    partyChanges[room] = .closed(relay)
                }
                notices.append(.partyClosed(room: room, relay: relay))
            }
        }
        let parties = PartyRows(partyChanges)
        let ordered = posts.values.sorted { $0.id < $1.id }
        let ids = ordered.map { Int64(clamping: $0.id) }
        let recipients = ordered.map { ByteBuffer(bytes: $0.to.bytes) }
        let senders = ordered.map { ByteBuffer(bytes: $0.from.bytes) }
        let sealed = ordered.map { ByteBuffer(bytes: $0.sealed) }
        let postedAt = ordered.map { Int64(clamping: $0.unixSeconds) }
        let keys = Array(seen.keys)
        let keyBytes = keys.map { ByteBuffer(bytes: $0.bytes) }
        let seenAt = keys.map { Int64(clamping: seen[$0] ?? 0) }
        let arrived = presence.compactMap { key, since in since.map { (key, $0) } }
        let arrivedKeys = arrived.map { ByteBuffer(bytes: $0.0.bytes) }
        let arrivedNodes = arrived.map { _ in Int32(clamping: node) }
        let arrivedSince = arrived.map { Int64(clamping: $0.1) }
        let left = presence.filter { $0.value == nil }.map { ByteBuffer(bytes: $0.key.bytes) }
        let reached = Array(reaches.values)
        let reachSenders = reached.map { ByteBuffer(bytes: $0.from.bytes) }
        let reachRecipients = reached.map { ByteBuffer(bytes: $0.to.bytes) }
        let reachedAt = reached.map { Int64(clamping: $0.unixSeconds) }
        try await transaction { c, logger in
            if !ids.isEmpty {
                try await c.query(
                    """
                    INSERT INTO posts (id, recipient, sender, sealed, posted_at)
                    SELECT * FROM UNNEST(\(ids)::BIGINT[], \(recipients)::BYTEA[], \(senders)::BYTEA[],
                        \(sealed)::BYTEA[], \(postedAt)::BIGINT[])
                    ON CONFLICT (id) DO UPDATE SET recipient = EXCLUDED.recipient, sender = EXCLUDED.sender,
                        sealed = EXCLUDED.sealed, posted_at = EXCLUDED.posted_at
                    """, logger: logger)
            }
            if !dropped.isEmpty {
                try await c.query("DELETE FROM posts WHERE id = ANY(\(dropped))", logger: logger)
            }
            if !keys.isEmpty {
                try await c.query(
                    """
                    INSERT INTO seen (key, at) SELECT * FROM UNNEST(\(keyBytes)::BYTEA[], \(seenAt)::BIGINT[])
                    ON CONFLICT (key) DO UPDATE SET at = EXCLUDED.at
                    """, logger: logger)
            }
            if !arrived.isEmpty {
                try await c.query(
                    """
                    INSERT INTO presence (key, node, since)
                    SELECT * FROM UNNEST(\(arrivedKeys)::BYTEA[], \(arrivedNodes)::INTEGER[], \(arrivedSince)::BIGINT[])
                    ON CONFLICT (key) DO UPDATE SET node = EXCLUDED.node, since = EXCLUDED.since
                    """, logger: logger)
            }
            if !left.isEmpty {
                try await c.query(
                    "DELETE FROM presence WHERE node = \(Int32(clamping: node)) AND key = ANY(\(left)::BYTEA[])",
                    logger: logger)
            }
            if !reached.isEmpty {
                try await c.query(
                    """
                    INSERT INTO reaches (sender, recipient, at)
                    SELECT * FROM UNNEST(\(reachSenders)::BYTEA[], \(reachRecipients)::BYTEA[], \(reachedAt)::BIGINT[])
                    ON CONFLICT (sender, recipient) DO UPDATE SET at = GREATEST(reaches.at, EXCLUDED.at)
                    """, logger: logger)
            }
            for change in contactChanges {
                let owner = ByteBuffer(bytes: change.owner.bytes)
                if !change.remove.isEmpty {
                    let removed = change.remove.map { ByteBuffer(bytes: $0.bytes) }
                    try await c.query(
                        "DELETE FROM contacts WHERE owner = \(owner) AND contact = ANY(\(removed)::BYTEA[])", logger: logger)
                }
                if !change.add.isEmpty {
                    let added = change.add.map { ByteBuffer(bytes: $0.bytes) }
                    try await c.query(
                        """
                        INSERT INTO contacts (owner, contact) SELECT \(owner), k FROM UNNEST(\(added)::BYTEA[]) AS k
                        ON CONFLICT DO NOTHING
                        """, logger: logger)
                }
            }
            try await parties.write(on: c, logger: logger)
            try await Self.notify(notices, from: node, on: c, logger: logger)
        }
        for (key, since) in presence { registeredHere[key] = since }
    }

    /// Tells the other nodes (when `c`'s transaction commits), in order; a notice
    /// too long for a notification goes by its row (a signal is written to
    /// `signals` for it, a post is in `posts` already).
    static func notify(
        _ events: [RendezvousClusterEvent], from node: UInt32, on c: PostgresConnection, logger: Logger
    ) async throws {
        guard !events.isEmpty else { return }
        var texts: [String] = []
        /// The next number of this process's notices.
        func numbered(_ body: ClusterNotice.Body) -> String {
            ClusterNotice(
                origin: node,
                sequence: noticesSent.withLock {
                    $0 += 1
                    return $0
                }, body
            ).encode()
        }
        for event in events {
            let text = numbered(.event(event))
            guard text.utf8.count > longestNotice else {
                texts.append(text)
                continue
            }
            switch event {
            case .signal(let s):
                let rows = try await c.query(
                    """
                    INSERT INTO signals (node, recipient, sender, sealed, sent_at)
                    VALUES (\(Int32(clamping: s.node)), \(ByteBuffer(bytes: s.to.bytes)), \(ByteBuffer(bytes: s.from.bytes)),
                        \(ByteBuffer(bytes: s.sealed)), \(unescaped: serverMilliseconds))
                    RETURNING id
                    """, logger: logger)
                for try await id in rows.decode(Int64.self) {
                    texts.append(numbered(.signalRow(UInt64(id), node: s.node)))
                }
            case .posted(let post): texts.append(numbered(.postRow(post.id)))
            case .dropped(let ids):
                // Never this long in practice; split so that each fits.
                for part in stride(from: 0, to: ids.count, by: 200).map({ Array(ids[$0..<min($0 + 200, ids.count)]) }) {
                    texts.append(numbered(.event(.dropped(part))))
                }
            // A key and a number, a relay's figures, a room id, a relay's key, two keys and a time: always short.
            // A contact change is at most RendezvousMessage.maximumContactChange keys: about 3 KB;
            // a party's listing at most PartyListing.shownMembers and .shownInvited keys: about 5 KB.
            case .online, .offline, .nodeGone, .relayLoad, .relayGone, .roomMoved, .contacts, .placed, .reached, .party,
                .partyClosed:
                texts.append(text)
            }
        }
        let rows = try await c.query(
            "SELECT pg_notify(\(channel), n) FROM UNNEST(\(texts)::TEXT[]) AS n", logger: logger)
        for try await _ in rows {}
    }

    /// Takes node `node`'s session lock on `c` (a reaper testing it may hold it a moment).
    static func lockNode(_ node: UInt32, on c: PostgresConnection, logger: Logger) async throws {
        for attempt in 0..<20 {
            if attempt > 0 { try await Task.sleep(for: .milliseconds(100)) }
            for try await held in try await c.query(
                "SELECT pg_try_advisory_lock(\(nodeLockClass), \(Int32(clamping: node)))", logger: logger
            ).decode(Bool.self) where held {
                return
            }
        }
        throw DirectoryError("the session lock of directory node \(node) is held by another session")
    }

    /// Says this node is gone (its presence deleted, the others told) and disconnects.
    public func close() async {
        if let connection, !connection.isClosed, node != 0 {
            let node = self.node
            try? await transaction { c, logger in
                try await c.query("DELETE FROM presence WHERE node = \(Int32(clamping: node))", logger: logger)
                try await c.query("DELETE FROM nodes WHERE id = \(Int32(clamping: node))", logger: logger)
                try await Self.notify([.nodeGone(node)], from: node, on: c, logger: logger)
            }
        }
        try? await connection?.close()
        connection = nil
        try? await link?.close()
        link = nil
    }

    /// How long one transaction may take before its connection is closed (a
    /// server gone silent fails the write, and its retry, instead of holding every
    /// acknowledgement behind it until TCP gives up).
    static let transactionDeadline: Duration = .seconds(10)

    /// `body` in one transaction: all of it, or (it threw) none. Within
    /// ``transactionDeadline``, else the connection is closed and the next call
    /// connects again. The store expects one caller at a time (the rendezvous's
    /// record writer): two transactions at once would share the connection.
    private func transaction(
        _ body: (PostgresConnection, Logger) async throws -> Void
    ) async throws {
        let logger = self.logger
        do {
            let c = try await connected()
            let watchdog = Task {
                try await Task.sleep(for: Self.transactionDeadline)
                try? await c.close()
            }
            defer { watchdog.cancel() }
            try await c.withTransaction(logger: logger) { c in try await body(c, logger) }
        } catch {
            throw DirectoryError("\(location): \(Self.reason(error))")
        }
    }

    static func key(_ buffer: ByteBuffer) -> PublicKey? {
        try? PublicKey(bytes: Array(buffer.readableBytesView))
    }

    /// The server's own words when it said something, else the client's error.
    static func reason(_ error: any Error) -> String {
        if let e = error as? PostgresTransactionError {
            if let inner = e.closureError ?? e.beginError ?? e.commitError { return reason(inner) }
        }
        if let e = error as? PSQLError {
            if let message = e.serverInfo?[.message] { return message }
            if let underlying = e.underlying { return "\(e.code): \(underlying)" }
            return "\(e.code)"
        }
        if let e = error as? DirectoryError { return e.description }
        return "\(error)"
    }
}

/// A PostgreSQL server and database, as `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`
/// names it (libpq's form; `?host=/run/postgresql` for a Unix socket folder,
/// `?sslmode=require` for TLS).
public struct PostgresLocation: Equatable, Sendable, CustomStringConvertible {
    public enum Server: Equatable, Sendable {
        case tcp(host: String, port: Int)
        /// The server's socket folder and port (the socket is `FOLDER/.s.PGSQL.PORT`).
        case unixSocket(folder: String, port: Int)
    }

    public enum TLSMode: String, Equatable, Sendable {
        case disable, prefer, require

        func connectionTLS() throws -> PostgresConnection.Configuration.TLS {
            switch self {
            case .disable: return .disable
            case .prefer: return .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
            case .require: return .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
            }
        }
    }

    public var server: Server
    public var user: String
    public var password: String?
    public var database: String
    public var tls: TLSMode

    public init(server: Server, user: String, password: String? = nil, database: String, tls: TLSMode = .disable) {
        self.server = server
        self.user = user
        self.password = password
        self.database = database
        self.tls = tls
    }

    /// Parses a `postgres://` or `postgresql://` URL.
    public init(url text: String) throws(DirectoryError) {
        let usage = "postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        guard let url = URLComponents(string: text), url.scheme == "postgres" || url.scheme == "postgresql" else {
            throw DirectoryError("--database \(Self.redacted(text)) is not a PostgreSQL URL (\(usage))")
        }
        // The percent-encoded parts, decoded once here (the decoded getters differ
        // between platforms, and a second decoding would change a password).
        guard let user = url.percentEncodedUser.flatMap({ $0.removingPercentEncoding }), !user.isEmpty else {
            throw DirectoryError("--database \(Self.redacted(text)) names no user (\(usage))")
        }
        let password = try url.percentEncodedPassword.map { encoded throws(DirectoryError) in
            guard let decoded = encoded.removingPercentEncoding else {
                throw DirectoryError("--database: the password is not valid percent-encoding (write % as %25)")
            }
            return decoded
        }
        let database = String(url.percentEncodedPath.drop(while: { $0 == "/" })).removingPercentEncoding ?? ""
        guard !database.isEmpty, !database.contains("/") else {
            throw DirectoryError("--database \(Self.redacted(text)) names no database (\(usage))")
        }
        let port = url.port ?? 5432
        guard (1...65535).contains(port) else { throw DirectoryError("--database: port \(port) is not 1-65535") }
        var socketFolder: String?
        var tls = TLSMode.disable
        for item in url.queryItems ?? [] {
            switch item.name {
            case "host":
                guard let folder = item.value, folder.hasPrefix("/") else {
                    throw DirectoryError("--database: host= must be a socket folder such as /run/postgresql")
                }
                socketFolder = folder
            case "sslmode":
                switch item.value {
                case "disable": tls = .disable
                case "prefer", "allow": tls = .prefer
                case "require", "verify-ca", "verify-full": tls = .require
                default: throw DirectoryError("--database: sslmode must be disable, prefer or require")
                }
            default:
                throw DirectoryError("--database: unknown parameter '\(item.name)' (host= and sslmode= are known)")
            }
        }
        if let socketFolder {
            server = .unixSocket(folder: socketFolder, port: port)
        } else {
            guard let host = url.host, !host.isEmpty else {
                throw DirectoryError("--database \(Self.redacted(text)) names no host (\(usage))")
            }
            server = .tcp(host: host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host, port: port)
        }
        self.user = user
        self.password = password
        self.database = database
        self.tls = tls
    }

    /// The URL without its password.
    public var description: String {
        let secret = password == nil ? "" : ":***"
        switch server {
        case .tcp(let host, let port):
            let h = host.contains(":") ? "[\(host)]" : host
            return "postgres://\(user)\(secret)@\(h):\(port)/\(database)" + (tls == .disable ? "" : "?sslmode=\(tls)")
        case .unixSocket(let folder, let port):
            return "postgres://\(user)\(secret)@localhost:\(port)/\(database)?host=\(folder)"
        }
    }

    /// The text with whatever stands between `://` and the last `@` before the
    /// host reduced to the user: never the password, however the URL is malformed.
    static func redacted(_ text: String) -> String {
        guard let scheme = text.range(of: "://") else { return text }
        let rest = text[scheme.upperBound...]
        guard let at = rest.lastIndex(of: "@") else { return text }
        let userInfo = rest[..<at]
        guard let colon = userInfo.firstIndex(of: ":") else { return text }
        return String(text[..<scheme.upperBound]) + userInfo[..<colon] + ":***" + rest[at...]
    }
}

/// Party rooms changed in one batch of records, as arrays for UNNEST: every room
/// listed is deleted (its members with it) and written again; a room closed is
/// deleted if it is still its relay's.
struct PartyRows {
    enum Change {
        case listed(RendezvousParty)
        /// Closed on this relay: deleted if the row is still its.
        case closed(PublicKey)
        /// Listed and closed in the same batch: deleted whatever relay the row names.
        case gone
    }

    var changed: [String] = []
    var closed: [String] = []
    var closedOn: [ByteBuffer] = []
    var ids: [String] = []
    var names: [String] = []
    var creators: [ByteBuffer] = []
    var relays: [ByteBuffer] = []
    var maxMembers: [Int32] = []
    var counts: [Int32] = []
    var at: [Int64] = []
    var memberParties: [String] = []
    var memberKeys: [ByteBuffer] = []
    var memberInvited: [Bool] = []
    var memberPositions: [Int32] = []

    init(_ changes: [String: Change]) {
        for (room, change) in changes.sorted(by: { $0.key < $1.key }) {
            let party: RendezvousParty
            switch change {
            case .closed(let relay):
                closed.append(room)
                closedOn.append(ByteBuffer(bytes: relay.bytes))
                continue
            case .gone:
                changed.append(room)
                continue
            case .listed(let listed):
                changed.append(room)
                party = listed
            }
            guard let (creator, members) = PartyMemberRow.rows(of: party) else { continue }
            ids.append(room)
            names.append(party.listing.name)
            creators.append(ByteBuffer(bytes: creator.bytes))
            relays.append(ByteBuffer(bytes: party.relay.bytes))
            maxMembers.append(Int32(clamping: party.listing.maxMembers))
            counts.append(Int32(clamping: party.listing.memberCount))
            at.append(Int64(clamping: party.unixSeconds))
            for member in members {
                memberParties.append(room)
                memberKeys.append(ByteBuffer(bytes: member.key.bytes))
                memberInvited.append(member.invited)
                memberPositions.append(Int32(member.position))
            }
        }
    }

    func write(on c: PostgresConnection, logger: Logger) async throws {
        if !closed.isEmpty {
            try await c.query(
                """
                DELETE FROM parties USING UNNEST(\(closed)::TEXT[], \(closedOn)::BYTEA[]) AS gone (id, relay)
                WHERE parties.id = gone.id AND parties.relay = gone.relay
                """, logger: logger)
        }
        guard !changed.isEmpty else { return }
        try await c.query("DELETE FROM parties WHERE id = ANY(\(changed)::TEXT[])", logger: logger)
        guard !ids.isEmpty else { return }
        try await c.query(
            """
            INSERT INTO parties (id, name, creator, relay, max_members, member_count, updated_at)
            SELECT * FROM UNNEST(\(ids)::TEXT[], \(names)::TEXT[], \(creators)::BYTEA[], \(relays)::BYTEA[],
                \(maxMembers)::INTEGER[], \(counts)::INTEGER[], \(at)::BIGINT[])
            """, logger: logger)
        guard !memberParties.isEmpty else { return }
        try await c.query(
            """
            INSERT INTO party_members (party, key, invited, position)
            SELECT * FROM UNNEST(\(memberParties)::TEXT[], \(memberKeys)::BYTEA[], \(memberInvited)::BOOLEAN[],
                \(memberPositions)::INTEGER[])
            ON CONFLICT DO NOTHING
            """, logger: logger)
    }
}
