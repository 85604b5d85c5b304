import Directory
import Foundation
import Logging
import Relay
import Rendezvous
import SQLiteNIO
import Secure
import Synchronization
import TestSupport
import Testing

/// A database to test a store on: an SQLite file, or a private PostgreSQL server.
private final class Backing: Sendable {
    let database: DirectoryDatabase
    private let sqlitePath: String?
    let postgres: PostgresServer?

    init(_ kind: String) throws {
        if kind == "sqlite" {
            let path = NSTemporaryDirectory() + "tusa-directory-\(UUID().uuidString).sqlite"
            sqlitePath = path
            postgres = nil
            database = .sqlite(path: path)
        } else {
            let server = try PostgresServer()
            postgres = server
            sqlitePath = nil
            database = try DirectoryDatabase(server.url)
        }
    }

    func open() async throws -> any RendezvousStore {
        try await database.open(logger: Logger(label: "test"))
    }

    func remove() {
        if let sqlitePath {
            for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: sqlitePath + suffix) }
        }
        postgres?.remove()
    }
}

private let postgresReady = PostgresServer.isInstalled

/// What a store's ``RendezvousStore/follow(_:)`` handed over, for checks that wait.
private final class Heard: Sendable {
    private let updates = Mutex<[RendezvousClusterUpdate]>([])

    func add(_ update: RendezvousClusterUpdate) { updates.withLock { $0.append(update) } }
    var all: [RendezvousClusterUpdate] { updates.withLock { $0 } }
    var events: [RendezvousClusterEvent] { all.compactMap { if case .event(let e) = $0 { e } else { nil } } }
    /// How many times the follower read the database afresh.
    var resyncs: Int { all.filter { if case .resync = $0 { true } else { false } }.count }

    /// Whether `condition` held within `seconds` (polled; the deadline only bounds a failure).
    func wait(seconds: Int = 5, _ condition: (Heard) -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + .seconds(seconds)
        while ContinuousClock.now < deadline {
            if condition(self) { return true }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return condition(self)
    }
}

@Suite("The directory's stores (SQLite, PostgreSQL)")
struct DirectoryStoreTests {
    private let logger = Logger(label: "test")
    private let alice = PrivateKey.generate().publicKey, bob = PrivateKey.generate().publicKey
    private let now: UInt64 = 1_800_000_000

    private func post(_ id: UInt64, at: UInt64, _ byte: UInt8) -> RendezvousPost {
        RendezvousPost(id: id, to: bob, from: alice, sealed: [byte, byte], unixSeconds: at)
    }

    /// SQLite always; PostgreSQL when installed (CI installs it).
    static let kinds = postgresReady ? ["sqlite", "postgres"] : ["sqlite"]

    @Test(arguments: kinds)
    func whatIsWrittenIsReadBackAfterReopeningInOrder(_ kind: String) async throws {
        let backing = try Backing(kind)
        defer { backing.remove() }
        let store = try await backing.open()
        try await store.write([.posted(post(1, at: now, 1)), .posted(post(2, at: now, 2)), .seen(alice, unixSeconds: now)])
        try await store.write([.posted(post(3, at: now + 5, 3)), .dropped([1]), .seen(alice, unixSeconds: now + 7)])
        // The same post written twice (a retried batch) is one row.
        try await store.write([.posted(post(3, at: now + 5, 3))])
        // Contacts: what is added and removed, in order; an addition retried is one row.
        let carol = PrivateKey.generate().publicKey
        try await store.write([
            .contacts(owner: bob, add: [alice, carol], remove: []), .contacts(owner: bob, add: [], remove: [carol]),
            .contacts(owner: alice, add: [bob], remove: []),
        ])
        try await store.write([.contacts(owner: bob, add: [alice], remove: [])])
        // Strangers reached: one row a pair, at its latest time, read back oldest first.
        try await store.write([
            .reached(RendezvousReach(from: alice, to: carol, unixSeconds: now + 1)),
            .reached(RendezvousReach(from: bob, to: carol, unixSeconds: now + 2)),
            .reached(RendezvousReach(from: alice, to: carol, unixSeconds: now + 3)),
        ])
        await store.close()

        let again = try await backing.open()
        let snapshot = try await again.load(unixSeconds: now + 10, postsFor: .seconds(86400), seenFor: .seconds(86400))
        #expect(snapshot.posts == [post(2, at: now, 2), post(3, at: now + 5, 3)])
        #expect(snapshot.seen == [alice: now + 7])
        #expect(snapshot.contacts == [bob: [alice], alice: [bob]])
        #expect(
            snapshot.reaches == [
                RendezvousReach(from: bob, to: carol, unixSeconds: now + 2),
                RendezvousReach(from: alice, to: carol, unixSeconds: now + 3),
            ])
        await again.close()
    }

    @Test(arguments: kinds)
    func rowsOlderThanTheyAreKeptAreDeletedAtLoad(_ kind: String) async throws {
        let carol = PrivateKey.generate().publicKey
        let backing = try Backing(kind)
        defer { backing.remove() }
        let store = try await backing.open()
        try await store.write([
            .posted(post(1, at: now - 90_000, 1)), .posted(post(2, at: now - 3600, 2)), .seen(alice, unixSeconds: now - 90_000),
            .seen(bob, unixSeconds: now - 60),
            // A stranger reached is kept for the hour its budget counts it.
            .reached(RendezvousReach(from: alice, to: bob, unixSeconds: now - 3600)),
            .reached(RendezvousReach(from: bob, to: alice, unixSeconds: now - 3599)),
            // A key with contacts is remembered as long as they are (the core forgets them).
            .seen(carol, unixSeconds: now - 90_000), .contacts(owner: carol, add: [alice], remove: []),
        ])
        let snapshot = try await store.load(unixSeconds: now, postsFor: .seconds(86400), seenFor: .seconds(86400))
        #expect(snapshot.posts.map(\.id) == [2])
        #expect(snapshot.seen == [bob: now - 60, carol: now - 90_000])
        #expect(snapshot.reaches == [RendezvousReach(from: bob, to: alice, unixSeconds: now - 3599)])
        // Once they are forgotten, so is the key.
        try await store.write([.contacts(owner: carol, add: [], remove: [alice])])
        let forgotten = try await store.load(unixSeconds: now, postsFor: .seconds(86400), seenFor: .seconds(86400))
        #expect(forgotten.seen == [bob: now - 60] && forgotten.contacts.isEmpty)
        // Gone from the database, not only from the answer.
        let later = try await store.load(unixSeconds: now - 100_000, postsFor: .seconds(1_000_000), seenFor: .seconds(1_000_000))
        #expect(later.posts.map(\.id) == [2])
        await store.close()
    }

    @Test func theSQLiteSchemaIsMadeOnceAndANewerOrNegativeOneIsRefused() async throws {
        let backing = try Backing("sqlite")
        defer { backing.remove() }
        guard case .sqlite(let path) = backing.database else { return }
        await (try backing.open()).close()
        await (try backing.open()).close()
        let raw = try await SQLiteConnection.open(storage: .file(path: path))
        let versions = try await raw.query("SELECT version FROM schema_migrations", [])
        #expect(versions.compactMap { $0.column("version")?.integer } == [1, 2, 3, 4])
        _ = try await raw.query("INSERT INTO schema_migrations (version, applied_at) VALUES (99, 0)", [])
        try await raw.close()
        await #expect(
            throws: DirectoryError("\(path) has schema version 99, newer than this tusa's 4: use a newer tusa")
        ) { _ = try await SQLiteDirectoryStore.open(path: path, logger: logger) }
        // A version below 0, which no tusa writes, is refused as such (it trapped).
        let edited = try await SQLiteConnection.open(storage: .file(path: path))
        _ = try await edited.query("DELETE FROM schema_migrations", [])
        _ = try await edited.query("INSERT INTO schema_migrations (version, applied_at) VALUES (-1, 0)", [])
        try await edited.close()
        await #expect(
            throws: DirectoryError(
                "\(path) has schema version -1 in schema_migrations, which no tusa writes: the table was changed by hand")
        ) { _ = try await SQLiteDirectoryStore.open(path: path, logger: logger) }
    }

    /// A file an earlier tusa made (schema 1: posts and keys seen, no contacts nor reaches) is
    /// brought up to date at open, its rows kept.
    @Test func anEarlierSQLiteSchemaIsMigratedWithItsRows() async throws {
        let path = NSTemporaryDirectory() + "tusa-directory-\(UUID().uuidString).sqlite"
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
        let raw = try await SQLiteConnection.open(storage: .file(path: path))
        _ = try await raw.query(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)", [])
        for statement in [
            """
            CREATE TABLE posts (id INTEGER PRIMARY KEY, recipient BLOB NOT NULL, sender BLOB NOT NULL,
                sealed BLOB NOT NULL, posted_at INTEGER NOT NULL)
            """,
            "CREATE INDEX posts_by_time ON posts (posted_at)", "CREATE TABLE seen (key BLOB PRIMARY KEY, at INTEGER NOT NULL)",
        ] { _ = try await raw.query(statement, []) }
        _ = try await raw.query("INSERT INTO schema_migrations (version, applied_at) VALUES (1, 0)", [])
        _ = try await raw.query(
            "INSERT INTO seen (key, at) VALUES (?, ?)", [.blob(.init(bytes: alice.bytes)), .integer(Int(now))])
        try await raw.close()
        let store = try await SQLiteDirectoryStore.open(path: path, logger: logger)
        let reach = RendezvousReach(from: bob, to: alice, unixSeconds: now)
        try await store.write([.contacts(owner: alice, add: [bob], remove: []), .reached(reach)])
        let snapshot = try await store.load(unixSeconds: now, postsFor: .seconds(86400), seenFor: .seconds(86400))
        #expect(snapshot.seen == [alice: now] && snapshot.contacts == [alice: [bob]] && snapshot.reaches == [reach])
        await store.close()
    }

    /// A party is a row (id, name, creator, relay, sizes, when) with a row per member
    /// and per invited key: written again whole when its relay lists it again, gone
    /// with its members' rows when it closes, read back as the relay listed it.
    @Test(arguments: kinds)
    func partiesAreRowsWithTheirMembersAndGoWhenClosed(_ kind: String) async throws {
        let backing = try Backing(kind)
        defer { backing.remove() }
        let carol = PrivateKey.generate().publicKey
        let relay = PrivateKey.generate().publicKey
        let other = PrivateKey.generate().publicKey
        func party(_ room: String, _ members: [PublicKey], invited: [PublicKey] = [], on relay: PublicKey, at: UInt64)
            -> RendezvousParty
        {
            RendezvousParty(
                listing: PartyListing(
                    room: room, name: "Hearthstone ✨", creator: alice, maxMembers: 8, members: members, invited: invited),
                relay: relay, unixSeconds: at)
        }
        let store = try await backing.open()
        try await store.write([
            .party(party("abcd-first", [alice, bob, carol], on: relay, at: now)),
            .party(party("abcd-second", [alice], invited: [bob, carol], on: relay, at: now)),
            .party(party("abcd-third", [alice], on: relay, at: now)),
        ])
        // Bob leaves the first (listed again, whole); the second closes; the third moved to another relay.
        try await store.write([
            .party(party("abcd-first", [carol, alice], on: relay, at: now + 4)),
            .partyClosed(room: "abcd-second", relay: relay),
            .party(party("abcd-third", [alice, bob], on: other, at: now + 5)),
        ])
        // Closed by the relay that no longer hosts it (it moved): it stays.
        try await store.write([.partyClosed(room: "abcd-third", relay: relay)])
        await store.close()
        let again = try await backing.open()
        let snapshot = try await again.load(unixSeconds: now + 10, postsFor: .seconds(86400), seenFor: .seconds(86400))
        #expect(
            snapshot.parties == [
                party("abcd-first", [carol, alice], on: relay, at: now + 4),
                party("abcd-third", [alice, bob], on: other, at: now + 5),
            ])
        // Moved to a relay and closed there in one batch: gone, whatever relay its row named.
        try await again.write([
            .party(party("abcd-third", [alice], on: relay, at: now + 6)), .partyClosed(room: "abcd-third", relay: relay),
        ])
        #expect(
            try await again.load(unixSeconds: now + 10, postsFor: .seconds(86400), seenFor: .seconds(86400)).parties.map(
                \.listing.room) == ["abcd-first"])
        // A party closed twice (two nodes saw its relay gone) is no error.
        try await again.write([
            .partyClosed(room: "abcd-first", relay: relay), .partyClosed(room: "abcd-first", relay: relay),
        ])
        let closed = try await again.load(unixSeconds: now + 10, postsFor: .seconds(86400), seenFor: .seconds(86400))
        #expect(closed.parties.isEmpty)
        await again.close()
    }

    /// Two directory nodes opening one new database together: both serve it, each
    /// numbered apart, its schema made once (one waits for the other's migration).
    /// A node that closes leaves no row behind. A newer schema than this build
    /// knows is refused.
    @Test(.enabled(if: postgresReady, "\(PostgresServer.absentMessage)"))
    func twoNodesOpenOneNewPostgresDatabaseTogetherAndANewerSchemaIsRefused() async throws {
        let backing = try Backing("postgres")
        defer { backing.remove() }
        guard case .postgres(let location) = backing.database else { return }
        async let first = backing.open()
        async let second = backing.open()
        let stores = try await [first, second]
        let nodes = [await stores[0].node, await stores[1].node]
        #expect(Set(nodes).count == 2 && !nodes.contains(0), "\(nodes)")
        #expect(try await Self.psql(backing, "SELECT count(*) FROM nodes") == "2")
        for store in stores { await store.close() }
        #expect(try await Self.psql(backing, "SELECT count(*) FROM nodes") == "0")
        let versions = try await Self.psql(backing, "SELECT version FROM schema_migrations ORDER BY version")
        #expect(versions == "1,2,3,4,5")
        _ = try await Self.psql(backing, "INSERT INTO schema_migrations (version, applied_at) VALUES (99, 0)")
        await #expect(
            throws: DirectoryError("\(location) has schema version 99, newer than this tusa's 5: use a newer tusa")
        ) { _ = try await PostgresDirectoryStore.open(location, logger: logger) }
        _ = try await Self.psql(backing, "DELETE FROM schema_migrations")
        _ = try await Self.psql(backing, "INSERT INTO schema_migrations (version, applied_at) VALUES (-1, 0)")
        await #expect(
            throws: DirectoryError(
                "\(location) has schema version -1 in schema_migrations, which no tusa writes: the table was changed by hand")
        ) { _ = try await PostgresDirectoryStore.open(location, logger: logger) }
    }

    /// What one node writes, another hears in order: who registered and left,
    /// posts and signals (those too long for a notification by their rows), and a
    /// node closing or falling silent. A node the others took for gone numbers
    /// itself again and says who is registered at it.
    @Test(.enabled(if: postgresReady, "\(PostgresServer.absentMessage)"))
    func nodesOnOnePostgresHearEachOther() async throws {
        let backing = try Backing("postgres")
        defer { backing.remove() }
        let a = try await backing.open()
        let b = try await backing.open()
        let (nodeA, nodeB) = (await a.node, await b.node)
        let heard = Heard()
        let following = Task { await b.follow { heard.add($0) } }
        defer { following.cancel() }
        // A beats too (a node that does not is gone within seconds).
        let followingA = Task { await a.follow { _ in } }
        defer { followingA.cancel() }
        #expect(await heard.wait { $0.resyncs > 0 })

        let carol = PrivateKey.generate().publicKey
        let long = [UInt8](repeating: 7, count: 9_000)  // past a notification's 8,000 bytes
        // The largest listing a relay sends: its notice still fits one notification.
        let most = (0..<PartyListing.shownMembers).map { _ in PrivateKey.generate().publicKey }
        let party = RendezvousParty(
            listing: PartyListing(
                room: String(repeating: "r", count: 64), name: String(repeating: "ü", count: 128), creator: alice,
                maxMembers: 10_000, members: most + most, invited: Array(most.prefix(PartyListing.shownInvited))),
            relay: bob, unixSeconds: now)
        let records: [RendezvousRecord] = [
            .online(carol, unixSeconds: now), .posted(post((UInt64(nodeA) << 40) | 1, at: now, 1)),
            .posted(RendezvousPost(id: (UInt64(nodeA) << 40) | 2, to: bob, from: alice, sealed: long, unixSeconds: now)),
            .signal(ClusterSignal(to: bob, node: nodeB, from: carol, sealed: [1, 2, 3])),
            .signal(ClusterSignal(to: bob, node: nodeB, from: carol, sealed: long)),
            .dropped([(UInt64(nodeA) << 40) | 1]), .offline(carol),
            .contacts(owner: bob, add: [alice, carol], remove: [bob]), .placed(relay: alice),
            .reached(RendezvousReach(from: alice, to: carol, unixSeconds: now)), .party(party),
            .partyClosed(room: "abcd-x", relay: bob),
        ]
        try await a.write(records)
        let expected: [RendezvousClusterEvent] = [
            .online(carol, ClusterPresence(node: nodeA, unixSeconds: now)),
            .posted(post((UInt64(nodeA) << 40) | 1, at: now, 1)),
            .posted(RendezvousPost(id: (UInt64(nodeA) << 40) | 2, to: bob, from: alice, sealed: long, unixSeconds: now)),
            .signal(ClusterSignal(to: bob, node: nodeB, from: carol, sealed: [1, 2, 3])),
            .signal(ClusterSignal(to: bob, node: nodeB, from: carol, sealed: long)),
            .dropped([(UInt64(nodeA) << 40) | 1]), .offline(carol, node: nodeA),
            .contacts(owner: bob, add: [alice, carol], remove: [bob]), .placed(relay: alice),
            .reached(RendezvousReach(from: alice, to: carol, unixSeconds: now)), .party(party),
            .partyClosed(room: "abcd-x", relay: bob),
        ]
        #expect(await heard.wait { $0.events.count >= expected.count }, "\(heard.events.count)")
        #expect(heard.events == expected)
        // A long signal's row is read once, then deleted.
        #expect(try await Self.psql(backing, "SELECT count(*) FROM signals") == "0")

        // A third node falls silent (its heartbeat 10 s old): B says it is gone and deletes its presence.
        let c = try await backing.open()
        let nodeC = await c.node
        try await c.write([.online(alice, unixSeconds: now)])
        #expect(try await Self.psql(backing, "SELECT count(*) FROM presence WHERE node = \(nodeC)") == "1")
        _ = try await Self.psql(backing, "UPDATE nodes SET heartbeat_at = heartbeat_at - 10000 WHERE id = \(nodeC)")
        #expect(await heard.wait(seconds: 8) { $0.events.contains(.nodeGone(nodeC)) }, "\(heard.events.suffix(3))")
        #expect(try await Self.psql(backing, "SELECT count(*) FROM presence WHERE node = \(nodeC)") == "0")
        // C comes back to life: at its next heartbeat it registers again, with Alice.
        let followingC = Task { await c.follow { _ in } }
        defer { followingC.cancel() }
        // (The second time B hears it: the first was C's write above.)
        let aliceAtC = RendezvousClusterEvent.online(alice, ClusterPresence(node: nodeC, unixSeconds: now))
        #expect(await heard.wait(seconds: 8) { $0.events.filter { $0 == aliceAtC }.count == 2 }, "\(heard.events.suffix(3))")
        #expect(try await Self.psql(backing, "SELECT count(*) FROM presence WHERE node = \(nodeC)") == "1")
        followingC.cancel()
        await followingC.value

        // A closes: B hears it gone.
        followingA.cancel()
        await followingA.value
        #expect(!heard.events.contains(.nodeGone(nodeA)))
        await a.close()
        #expect(await heard.wait { $0.events.contains(.nodeGone(nodeA)) })
        following.cancel()
        await following.value
        await b.close()
        await c.close()
    }

    /// A server that stops and comes back costs the writes in between, not the store:
    /// the next write connects again.
    @Test(.enabled(if: postgresReady, "\(PostgresServer.absentMessage)"))
    func aPostgresRestartIsSurvived() async throws {
        let backing = try Backing("postgres")
        defer { backing.remove() }
        let server = try #require(backing.postgres)
        let store = try await backing.open()
        try await store.write([.posted(post(1, at: now, 1))])
        server.stop()
        await #expect(throws: (any Error).self) { try await store.write([.posted(self.post(2, at: now, 2))]) }
        try server.start()
        try await store.write([.posted(post(3, at: now, 3))])
        let snapshot = try await store.load(unixSeconds: now, postsFor: .seconds(60), seenFor: .seconds(60))
        #expect(snapshot.posts.map(\.id) == [1, 3])
        await store.close()
    }

    /// Two nodes following each other through a PostgreSQL restart: once the server is
    /// back, each hears what the other writes again (their listening connections are
    /// made again, their nodes numbered as before).
    @Test(.enabled(if: postgresReady, "\(PostgresServer.absentMessage)"))
    func followersHearEachOtherAgainAfterAPostgresRestart() async throws {
        let backing = try Backing("postgres")
        defer { backing.remove() }
        let server = try #require(backing.postgres)
        let a = try await backing.open()
        let b = try await backing.open()
        let nodeA = await a.node
        let heard = Heard()
        let following = Task { await b.follow { heard.add($0) } }
        defer { following.cancel() }
        let followingA = Task { await a.follow { _ in } }
        defer { followingA.cancel() }
        #expect(await heard.wait { $0.resyncs > 0 })
        server.stop()
        try server.start()
        // Writes while the listening connections are being made again may be lost with
        // them (the resync that follows carries presence): write until one is heard.
        let carol = PrivateKey.generate().publicKey
        let online = RendezvousClusterEvent.online(carol, ClusterPresence(node: nodeA, unixSeconds: now))
        let deadline = ContinuousClock.now + .seconds(15)
        var resyncs = 0
        while ContinuousClock.now < deadline, !heard.events.contains(online) {
            try? await a.write([.online(carol, unixSeconds: now)])
            resyncs = heard.resyncs
            _ = await heard.wait(seconds: 1) { $0.events.contains(online) }
        }
        #expect(heard.events.contains(online), "B heard \(heard.events.suffix(5)); \(resyncs) resyncs")
        following.cancel()
        followingA.cancel()
        await following.value
        await followingA.value
        await a.close()
        await b.close()
    }

    @Test func anUnreachablePostgresIsAClearError() async throws {
        // Port 1 on loopback: nothing listens there.
        let location = try PostgresLocation(url: "postgres://tusa:secret@127.0.0.1:1/tusa")
        do {
            _ = try await PostgresDirectoryStore.open(location, logger: logger)
            Issue.record("a database nobody serves opened")
        } catch {
            #expect(error.description.hasPrefix("cannot reach the database postgres://tusa:***@127.0.0.1:1/tusa: "), "\(error)")
            #expect(!error.description.contains("secret"))
        }
    }

    @Test func aFileThatIsNotADatabaseIsAClearErrorAndLeftAlone() async throws {
        let path = NSTemporaryDirectory() + "tusa-directory-\(UUID().uuidString).sqlite"
        defer { try? FileManager.default.removeItem(atPath: path) }
        let garbage = Data((0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ 7) })
        try garbage.write(to: URL(fileURLWithPath: path))
        do {
            _ = try await SQLiteDirectoryStore.open(path: path, logger: logger)
            Issue.record("a file of garbage opened as a database")
        } catch {
            #expect(error.description.hasPrefix("\(path) is not a usable SQLite database: "), "\(error)")
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == garbage)
    }

    @Test(arguments: [
        ("sqlite:/var/lib/tusa/d.sqlite", DirectoryDatabase.sqlite(path: "/var/lib/tusa/d.sqlite")),
        ("dir.db", .sqlite(path: "dir.db")),
        (
            "postgres://tusa@127.0.0.1/tusa",
            .postgres(PostgresLocation(server: .tcp(host: "127.0.0.1", port: 5432), user: "tusa", database: "tusa"))
        ),
        (
            "postgresql://dir%40ops:p%2Fw@[::1]:6543/rooms?sslmode=require",
            .postgres(
                PostgresLocation(
                    server: .tcp(host: "::1", port: 6543), user: "dir@ops", password: "p/w", database: "rooms", tls: .require))
        ),
        (
            "postgres://tusa@localhost:5433/tusa?host=/run/postgresql",
            .postgres(
                PostgresLocation(server: .unixSocket(folder: "/run/postgresql", port: 5433), user: "tusa", database: "tusa"))
        ),
    ])
    func databasesAreNamed(_ text: String, _ database: DirectoryDatabase) throws {
        #expect(try DirectoryDatabase(text) == database)
    }

    @Test(arguments: [
        "sqlite:", "mysql://x", "directory", "postgres://127.0.0.1/tusa", "postgres://tusa@127.0.0.1/",
        "postgres://tusa@127.0.0.1:70000/tusa", "postgres://tusa@127.0.0.1/tusa?sslmode=maybe",
        "postgres://tusa@127.0.0.1/tusa?host=relative", "postgres://tusa@127.0.0.1/tusa?colour=blue",
    ])
    func otherDatabasesAreRefusedWithAReason(_ text: String) {
        #expect(throws: DirectoryError.self) { try DirectoryDatabase(text) }
    }

    /// However malformed the URL, its password is not in the error; a password
    /// with an escaped % is decoded once.
    @Test(arguments: [
        "postgres://tusa:s3cr/et@db/tusa", "postgres://tusa:1234/x@db/tusa", "postgresql://tusa:pa?ss#@db",
        "postgres://:s3cr/et@db/tusa",
    ])
    func aMalformedURLNeverPrintsItsPassword(_ text: String) {
        do {
            let database = try DirectoryDatabase(text)
            #expect(!database.description.contains("s3cr") && !database.description.contains("1234/x"), "\(database)")
        } catch {
            #expect(!error.description.contains("s3cr") && !error.description.contains("1234"), "\(error)")
            #expect(!error.description.contains("pa?ss"), "\(error)")
        }
    }

    @Test func aPercentInAPasswordIsDecodedOnce() throws {
        let database = try DirectoryDatabase("postgres://tusa:50%25off@db.example/tusa")
        guard case .postgres(let location) = database else {
            Issue.record("not a PostgreSQL database: \(database)")
            return
        }
        #expect(location.password == "50%off")
    }

    @Test func aPasswordIsNeverPrinted() throws {
        let database = try DirectoryDatabase("postgres://tusa:hunter2@db.example:5432/tusa")
        #expect(database.description == "postgres://tusa:***@db.example:5432/tusa")
        do {
            _ = try DirectoryDatabase("postgres://:hunter2@db.example/tusa")
            Issue.record("a URL with no user was taken")
        } catch {
            #expect(!error.description.contains("hunter2"), "\(error)")
        }
    }

    /// What `psql` prints for a query against the test's server (rows joined by commas).
    private static func psql(_ backing: Backing, _ sql: String) async throws -> String {
        let server = try #require(backing.postgres)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/psql")
        process.arguments = [server.url, "-tAq", "-c", sql]
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0, "psql \(sql)")
        return String(decoding: data, as: UTF8.self).split(separator: "\n").joined(separator: ",")
    }
}
