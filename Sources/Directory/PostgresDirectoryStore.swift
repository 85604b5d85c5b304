import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PostgresNIO
import Relay
import Rendezvous
import Secure

/// The directory's rows in PostgreSQL (postgres-nio): the same posts and keys
/// seen as ``SQLiteDirectoryStore``, in a server that outlives the directory
/// process and that several processes can reach. One schema with numbered
/// migrations, applied at start.
///
/// One connection, made again on the next write when the server dropped it (a
/// PostgreSQL restart costs the writes in flight their retries, nothing more).
///
/// One directory per database for now: each numbers its own posts and keeps its
/// own peers, so the connection holds a session advisory lock, and a second
/// directory (or relay) pointed at the same database is refused with one line
/// rather than let it overwrite the first one's rows.
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
        ]
    ]

    /// The schema this build knows.
    public static var schemaVersion: Int { migrations.count }
    /// The session lock the serving directory holds for as long as it is connected.
    static let servingLock: Int64 = 0x7475_7361_6e6f_6465  // "tusanode"

    public let location: PostgresLocation
    private let logger: Logger
    private var connection: PostgresConnection?
    private var nextID = 0

    private init(location: PostgresLocation, logger: Logger) {
        self.location = location
        self.logger = logger
    }

    /// Connects and brings the schema up to date.
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

    private func connected() async throws -> PostgresConnection {
        if let connection, !connection.isClosed { return connection }
        connection = nil
        nextID += 1
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
            on: MultiThreadedEventLoopGroup.singleton.any(), configuration: configuration, id: nextID, logger: logger
        ).get()
        // The server drops a session whose peer vanished within about 25 s (not the
        // system's two hours), so a directory cut off by the network and back does
        // not find its own old session still holding the lock below for long.
        do {
            try await made.query("SET tcp_keepalives_idle = 10", logger: logger)
            try await made.query("SET tcp_keepalives_interval = 5", logger: logger)
            try await made.query("SET tcp_keepalives_count = 3", logger: logger)
        } catch {
            try? await made.close()
            throw error
        }
        // A directory that just stopped (or was killed) may hold the lock for a moment
        // more, until the server sees its session end: a few tries over two seconds.
        var serving = false
        do {
            for attempt in 0..<10 where !serving {
                if attempt > 0 { try await Task.sleep(for: .milliseconds(200)) }
                for try await held in try await made.query(
                    "SELECT pg_try_advisory_lock(\(Self.servingLock))", logger: logger
                ).decode(Bool.self) {
                    serving = held
                }
            }
        } catch {
            try? await made.close()
            throw error
        }
        guard serving else {
            try? await made.close()
            throw DirectoryError(
                "another tusa directory serves \(location): one directory per database (several nodes on one database are not built yet)"
            )
        }
        connection = made
        return made
    }

    /// Brings the schema up to date. The serving lock (taken in ``connected()``)
    /// makes this directory the database's only one, so nobody migrates beside it.
    private func prepare() async throws(DirectoryError) {
        let connection: PostgresConnection
        do { connection = try await connected() } catch let error as DirectoryError { throw error } catch {
            throw DirectoryError("cannot reach the database \(location): \(Self.reason(error))")
        }
        let current: Int
        do {
            try await connection.query(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)",
                logger: logger)
            var version = 0
            for try await v in try await connection.query(
                "SELECT COALESCE(MAX(version), 0) FROM schema_migrations", logger: logger
            ).decode(Int32.self) {
                version = Int(v)
            }
            current = version
        } catch {
            throw DirectoryError("\(location) is not a usable directory database: \(Self.reason(error))")
        }
        guard current <= Self.schemaVersion else {
            throw .newerSchema(in: "\(location)", found: current, known: Self.schemaVersion)
        }
        for version in (current + 1)..<(Self.schemaVersion + 1) {
            do {
                try await connection.withTransaction(logger: logger) { c in
                    for statement in Self.migrations[version - 1] {
                        try await c.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                    }
                    let now = Int64(Date().timeIntervalSince1970)
                    try await c.query(
                        "INSERT INTO schema_migrations (version, applied_at) VALUES (\(Int32(version)), \(now))", logger: logger)
                }
            } catch {
                throw DirectoryError("cannot bring \(location) to schema version \(version): \(Self.reason(error))")
            }
            logger.info("directory database: schema version \(version)", metadata: ["database": "\(location)"])
        }
    }

    public func prune(unixSeconds: UInt64, postsFor: Duration, seenFor: Duration) async throws {
        let now = Int64(clamping: unixSeconds)
        let postsSince = now - postsFor.components.seconds
        let seenSince = now - seenFor.components.seconds
        try await transaction { c, logger in
            try await c.query("DELETE FROM posts WHERE posted_at <= \(postsSince)", logger: logger)
            try await c.query("DELETE FROM seen WHERE at <= \(seenSince)", logger: logger)
        }
    }

    public func load(unixSeconds: UInt64, postsFor: Duration, seenFor: Duration) async throws -> RendezvousSnapshot {
        try await prune(unixSeconds: unixSeconds, postsFor: postsFor, seenFor: seenFor)
        let c = try await connected()
        var snapshot = RendezvousSnapshot()
        let posts = try await c.query(
            "SELECT id, recipient, sender, sealed, posted_at FROM posts ORDER BY id", logger: logger)
        for try await (id, recipient, sender, sealed, at) in posts.decode(
            (Int64, ByteBuffer, ByteBuffer, ByteBuffer, Int64).self)
        {
            guard let to = Self.key(recipient), let from = Self.key(sender), id > 0, at >= 0 else { continue }
            snapshot.posts.append(
                RendezvousPost(
                    id: UInt64(id), to: to, from: from, sealed: Array(sealed.readableBytesView), unixSeconds: UInt64(at)))
        }
        for try await (key, at) in try await c.query("SELECT key, at FROM seen", logger: logger).decode(
            (ByteBuffer, Int64).self)
        {
            guard let key = Self.key(key), at >= 0 else { continue }
            snapshot.seen[key] = UInt64(at)
        }
        return snapshot
    }

    /// The records in three statements whatever their number (arrays through
    /// UNNEST, one round trip each): posts upserted, drops deleted, keys seen
    /// upserted. Order is kept where it matters: a post and its drop in one batch
    /// end deleted, and a key seen twice keeps the later time.
    public func write(_ records: [RendezvousRecord]) async throws {
        guard !records.isEmpty else { return }
        var posts: [UInt64: RendezvousPost] = [:]
        var dropped: [Int64] = []
        var seen: [PublicKey: UInt64] = [:]
        for record in records {
            switch record {
            case .posted(let post): posts[post.id] = post
            case .dropped(let ids): dropped += ids.map { Int64(clamping: $0) }
            case .seen(let key, let unixSeconds): seen[key] = unixSeconds
            }
        }
        let ordered = posts.values.sorted { $0.id < $1.id }
        let ids = ordered.map { Int64(clamping: $0.id) }
        let recipients = ordered.map { ByteBuffer(bytes: $0.to.bytes) }
        let senders = ordered.map { ByteBuffer(bytes: $0.from.bytes) }
        let sealed = ordered.map { ByteBuffer(bytes: $0.sealed) }
        let postedAt = ordered.map { Int64(clamping: $0.unixSeconds) }
        let keys = Array(seen.keys)
        let keyBytes = keys.map { ByteBuffer(bytes: $0.bytes) }
        let seenAt = keys.map { Int64(clamping: seen[$0] ?? 0) }
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
        }
    }

    public func close() async {
        if let connection {
            _ = try? await connection.query("SELECT pg_advisory_unlock(\(Self.servingLock))", logger: logger)
            try? await connection.close()
        }
        connection = nil
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

    private static func key(_ buffer: ByteBuffer) -> PublicKey? {
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
