import Foundation
import Logging
import NIOCore
import Relay
import Rendezvous
import SQLiteNIO
import Secure

/// The directory's rows in an SQLite file (sqlite-nio): posts (invitations), the
/// keys seen, each key's contacts, the strangers each reached in the last hour and
/// the party rooms relays listed (with their members), so that a directory that restarts, or is killed, still delivers
/// what was posted and still tells "offline" from "unknown". One schema with
/// numbered migrations, applied when the file is opened.
public actor SQLiteDirectoryStore: RendezvousStore {
    /// Migration N (from 1) is `migrations[N - 1]`, its statements in order.
    static let migrations: [[String]] = [
        [
            """
            CREATE TABLE posts (id INTEGER PRIMARY KEY, recipient BLOB NOT NULL, sender BLOB NOT NULL,
                sealed BLOB NOT NULL, posted_at INTEGER NOT NULL)
            """,
            "CREATE INDEX posts_by_time ON posts (posted_at)",
            "CREATE TABLE seen (key BLOB PRIMARY KEY, at INTEGER NOT NULL)",
        ],
        ["CREATE TABLE contacts (owner BLOB NOT NULL, contact BLOB NOT NULL, PRIMARY KEY (owner, contact))"],
        [
            """
            CREATE TABLE reaches (sender BLOB NOT NULL, recipient BLOB NOT NULL, at INTEGER NOT NULL,
                PRIMARY KEY (sender, recipient))
            """
        ],
        [
            """
            CREATE TABLE parties (id TEXT PRIMARY KEY, name TEXT NOT NULL, creator BLOB NOT NULL, relay BLOB NOT NULL,
                max_members INTEGER NOT NULL, member_count INTEGER NOT NULL, updated_at INTEGER NOT NULL)
            """,
            // A party's members (invited 0, in join order) and invited keys (invited 1).
            """
            CREATE TABLE party_members (party TEXT NOT NULL REFERENCES parties (id) ON DELETE CASCADE,
                key BLOB NOT NULL, invited INTEGER NOT NULL, position INTEGER NOT NULL, PRIMARY KEY (party, invited, key))
            """,
            "CREATE INDEX party_members_by_key ON party_members (key)",
        ],
    ]

    /// The schema this build knows.
    public static var schemaVersion: Int { migrations.count }

    private let connection: SQLiteConnection
    private var closed = false
    public let path: String

    private init(connection: SQLiteConnection, path: String) {
        self.connection = connection
        self.path = path
    }

    /// Opens (or makes) the file and brings its schema up to date.
    public static func open(path: String, logger: Logger) async throws(DirectoryError) -> SQLiteDirectoryStore {
        let connection: SQLiteConnection
        do { connection = try await SQLiteConnection.open(storage: .file(path: path), logger: logger) } catch {
            throw DirectoryError("cannot open the database \(path): \(Self.reason(error))")
        }
        let store = SQLiteDirectoryStore(connection: connection, path: path)
        do {
            try await store.prepare(logger: logger)
        } catch {
            try? await connection.close()
            throw error
        }
        return store
    }

    private func prepare(logger: Logger) async throws(DirectoryError) {
        do {
            // WAL: a commit is in the file once written, whatever kills the process next.
            _ = try await connection.query("PRAGMA journal_mode = WAL", [])
            _ = try await connection.query("PRAGMA synchronous = NORMAL", [])
            _ = try await connection.query("PRAGMA busy_timeout = 5000", [])
            _ = try await connection.query("PRAGMA foreign_keys = ON", [])
            _ = try await connection.query(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)", [])
        } catch {
            throw DirectoryError("\(path) is not a usable SQLite database: \(Self.reason(error))")
        }
        let current: Int
        do {
            let rows = try await connection.query("SELECT MAX(version) AS v FROM schema_migrations", [])
            current = rows.first?.column("v")?.integer.map { Int($0) } ?? 0
        } catch {
            throw DirectoryError("cannot read the schema version of \(path): \(Self.reason(error))")
        }
        guard current <= Self.schemaVersion else {
            throw .newerSchema(in: path, found: current, known: Self.schemaVersion)
        }
        guard current >= 0 else { throw .badSchema(in: path, found: current) }
        for version in (current + 1)..<(Self.schemaVersion + 1) {
            do {
                try await transaction {
                    for statement in Self.migrations[version - 1] { _ = try await connection.query(statement, []) }
                    _ = try await connection.query(
                        "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)",
                        [.integer(version), .integer(Int(Date().timeIntervalSince1970))])
                }
            } catch {
                throw DirectoryError("cannot bring \(path) to schema version \(version): \(Self.reason(error))")
            }
            logger.info("directory database: schema version \(version)", metadata: ["database": "\(path)"])
        }
    }

    public func prune(unixSeconds: UInt64, postsFor: Duration, seenFor: Duration) async throws {
        let now = Int(clamping: unixSeconds)
        let postsSince = now - Int(clamping: postsFor.components.seconds)
        let seenSince = now - Int(clamping: seenFor.components.seconds)
        try await transaction {
            _ = try await connection.query("DELETE FROM posts WHERE posted_at <= ?", [.integer(postsSince)])
            // A key with contacts is remembered until the core forgets them (its
            // RendezvousServerConfiguration.contactsFor counts from this row).
            _ = try await connection.query(
                "DELETE FROM seen WHERE at <= ? AND NOT EXISTS (SELECT 1 FROM contacts WHERE contacts.owner = seen.key)",
                [.integer(seenSince)])
            _ = try await connection.query(
                "DELETE FROM reaches WHERE at <= ?",
                [.integer(now - Int(clamping: RendezvousServer.strangerMemory.components.seconds))])
        }
    }

    public func load(unixSeconds: UInt64, postsFor: Duration, seenFor: Duration) async throws -> RendezvousSnapshot {
        try await prune(unixSeconds: unixSeconds, postsFor: postsFor, seenFor: seenFor)
        var snapshot = RendezvousSnapshot()
        for row in try await connection.query(
            "SELECT id, recipient, sender, sealed, posted_at FROM posts ORDER BY id", [])
        {
            guard let id = row.column("id")?.integer, let to = Self.key(row.column("recipient")),
                let from = Self.key(row.column("sender")), let sealed = row.column("sealed")?.blob,
                let at = row.column("posted_at")?.integer, id > 0, at >= 0
            else { continue }  // a row this tusa did not write: left alone
            snapshot.posts.append(
                RendezvousPost(
                    id: UInt64(id), to: to, from: from, sealed: Array(sealed.readableBytesView), unixSeconds: UInt64(at)))
        }
        for row in try await connection.query("SELECT key, at FROM seen", []) {
            guard let key = Self.key(row.column("key")), let at = row.column("at")?.integer, at >= 0 else { continue }
            snapshot.seen[key] = UInt64(at)
        }
        for row in try await connection.query("SELECT owner, contact FROM contacts", []) {
            guard let owner = Self.key(row.column("owner")), let contact = Self.key(row.column("contact")) else { continue }
            snapshot.contacts[owner, default: []].insert(contact)
        }
        for row in try await connection.query("SELECT sender, recipient, at FROM reaches ORDER BY at", []) {
            guard let from = Self.key(row.column("sender")), let to = Self.key(row.column("recipient")),
                let at = row.column("at")?.integer, at >= 0
            else { continue }
            snapshot.reaches.append(RendezvousReach(from: from, to: to, unixSeconds: UInt64(at)))
        }
        var reader = PartyRowReader()
        for row in try await connection.query("SELECT party, key, invited FROM party_members ORDER BY party, position", []) {
            guard let party = row.column("party")?.string, let key = Self.key(row.column("key")),
                let invited = row.column("invited")?.integer
            else { continue }
            reader.member(of: party, key, invited: invited != 0)
        }
        for row in try await connection.query(
            "SELECT id, name, creator, relay, max_members, member_count, updated_at FROM parties ORDER BY id", [])
        {
            guard let id = row.column("id")?.string, let name = row.column("name")?.string,
                let creator = Self.key(row.column("creator")), let relay = Self.key(row.column("relay")),
                let maxMembers = row.column("max_members")?.integer, let count = row.column("member_count")?.integer,
                let at = row.column("updated_at")?.integer, at >= 0
            else { continue }
            snapshot.parties.append(
                reader.party(
                    id: id, name: name, creator: creator, relay: relay, maxMembers: maxMembers, memberCount: count,
                    unixSeconds: UInt64(at)))
        }
        return snapshot
    }

    public func write(_ records: [RendezvousRecord]) async throws {
        guard !records.isEmpty else { return }
        try await transaction {
            for record in records {
                switch record {
                case .posted(let post):
                    _ = try await connection.query(
                        "INSERT OR REPLACE INTO posts (id, recipient, sender, sealed, posted_at) VALUES (?, ?, ?, ?, ?)",
                        [
                            .integer(Int(clamping: post.id)), Self.blob(post.to.bytes), Self.blob(post.from.bytes),
                            Self.blob(post.sealed), .integer(Int(clamping: post.unixSeconds)),
                        ])
                case .dropped(let ids):
                    for id in ids {
                        _ = try await connection.query("DELETE FROM posts WHERE id = ?", [.integer(Int(clamping: id))])
                    }
                case .seen(let key, let unixSeconds):
                    _ = try await connection.query(
                        "INSERT OR REPLACE INTO seen (key, at) VALUES (?, ?)",
                        [Self.blob(key.bytes), .integer(Int(clamping: unixSeconds))])
                case .contacts(let owner, let add, let remove):
                    for key in remove {
                        _ = try await connection.query(
                            "DELETE FROM contacts WHERE owner = ? AND contact = ?",
                            [Self.blob(owner.bytes), Self.blob(key.bytes)])
                    }
                    for key in add {
                        _ = try await connection.query(
                            "INSERT OR IGNORE INTO contacts (owner, contact) VALUES (?, ?)",
                            [Self.blob(owner.bytes), Self.blob(key.bytes)])
                    }
                case .reached(let reach):
                    _ = try await connection.query(
                        "INSERT OR REPLACE INTO reaches (sender, recipient, at) VALUES (?, ?, ?)",
                        [
                            Self.blob(reach.from.bytes), Self.blob(reach.to.bytes),
                            .integer(Int(clamping: reach.unixSeconds)),
                        ])
                case .party(let party):
                    try await write(party)
                case .partyClosed(let room, let relay):
                    _ = try await connection.query(
                        "DELETE FROM parties WHERE id = ? AND relay = ?", [.text(room), Self.blob(relay.bytes)])
                case .online, .offline, .signal, .relayLoad, .relayGone, .roomMoved, .placed:
                    // For other nodes: a file on this machine is one node's alone (node 0 makes none).
                    break
                }
            }
        }
    }

    /// A party's row and its members' rows, as its relay listed it last.
    private func write(_ party: RendezvousParty) async throws {
        let listing = party.listing
        guard let (creator, members) = PartyMemberRow.rows(of: party) else { return }
        _ = try await connection.query("DELETE FROM parties WHERE id = ?", [.text(listing.room)])
        _ = try await connection.query(
            """
            INSERT INTO parties (id, name, creator, relay, max_members, member_count, updated_at)
            VALUES (?, ?, ?, ?, ?, ?, ?)
            """,
            [
                .text(listing.room), .text(listing.name), Self.blob(creator.bytes), Self.blob(party.relay.bytes),
                .integer(listing.maxMembers), .integer(listing.memberCount), .integer(Int(clamping: party.unixSeconds)),
            ])
        for member in members {
            _ = try await connection.query(
                "INSERT OR IGNORE INTO party_members (party, key, invited, position) VALUES (?, ?, ?, ?)",
                [.text(listing.room), Self.blob(member.key.bytes), .integer(member.invited ? 1 : 0), .integer(member.position)])
        }
    }

    /// Closes the file; later calls do nothing (sqlite-nio's own close must run once).
    public func close() async {
        guard !closed else { return }
        closed = true
        try? await connection.close()
    }

    /// `body` in one transaction: all of it, or (it threw) none.
    private func transaction(_ body: () async throws -> Void) async throws {
        _ = try await connection.query("BEGIN IMMEDIATE", [])
        do {
            try await body()
            _ = try await connection.query("COMMIT", [])
        } catch {
            _ = try? await connection.query("ROLLBACK", [])
            throw error
        }
    }

    private static func blob(_ bytes: [UInt8]) -> SQLiteData { .blob(ByteBuffer(bytes: bytes)) }

    private static func key(_ data: SQLiteData?) -> PublicKey? {
        guard let buffer = data?.blob else { return nil }
        return try? PublicKey(bytes: Array(buffer.readableBytesView))
    }

    private static func reason(_ error: any Error) -> String {
        (error as? SQLiteError)?.message ?? "\(error)"
    }
}
