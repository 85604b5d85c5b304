import Directory
import Foundation
import Logging
import Relay
import Rendezvous
import SQLiteNIO
import Secure
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
        await store.close()

        let again = try await backing.open()
        let snapshot = try await again.load(unixSeconds: now + 10, postsFor: .seconds(86400), seenFor: .seconds(86400))
        #expect(snapshot.posts == [post(2, at: now, 2), post(3, at: now + 5, 3)])
        #expect(snapshot.seen == [alice: now + 7])
        await again.close()
    }

    @Test(arguments: kinds)
    func rowsOlderThanTheyAreKeptAreDeletedAtLoad(_ kind: String) async throws {
        let backing = try Backing(kind)
        defer { backing.remove() }
        let store = try await backing.open()
        try await store.write([
            .posted(post(1, at: now - 90_000, 1)), .posted(post(2, at: now - 3600, 2)), .seen(alice, unixSeconds: now - 90_000),
            .seen(bob, unixSeconds: now - 60),
        ])
        let snapshot = try await store.load(unixSeconds: now, postsFor: .seconds(86400), seenFor: .seconds(86400))
        #expect(snapshot.posts.map(\.id) == [2])
        #expect(snapshot.seen == [bob: now - 60])
        // Gone from the database, not only from the answer.
        let later = try await store.load(unixSeconds: now - 100_000, postsFor: .seconds(1_000_000), seenFor: .seconds(1_000_000))
        #expect(later.posts.map(\.id) == [2])
        await store.close()
    }

    @Test func theSQLiteSchemaIsMadeOnceAndANewerOneIsRefused() async throws {
        let backing = try Backing("sqlite")
        defer { backing.remove() }
        guard case .sqlite(let path) = backing.database else { return }
        await (try backing.open()).close()
        await (try backing.open()).close()
        let raw = try await SQLiteConnection.open(storage: .file(path: path))
        let versions = try await raw.query("SELECT version FROM schema_migrations", [])
        #expect(versions.compactMap { $0.column("version")?.integer } == [1])
        _ = try await raw.query("INSERT INTO schema_migrations (version, applied_at) VALUES (99, 0)", [])
        try await raw.close()
        await #expect(
            throws: DirectoryError("\(path) has schema version 99, newer than this tusa's 1: use a newer tusa")
        ) { _ = try await SQLiteDirectoryStore.open(path: path, logger: logger) }
    }

    /// Two directories opening one new database together: one serves it (its schema
    /// made once), the other is refused with one line, and a directory can open it
    /// once the first has closed. A newer schema than this build knows is refused.
    @Test(.enabled(if: postgresReady, "\(PostgresServer.absentMessage)"))
    func onePostgresDatabaseServesOneDirectoryAndANewerSchemaIsRefused() async throws {
        let backing = try Backing("postgres")
        defer { backing.remove() }
        guard case .postgres(let location) = backing.database else { return }
        let attempt: @Sendable () async -> Result<any RendezvousStore, any Error> = {
            do { return .success(try await backing.open()) } catch { return .failure(error) }
        }
        async let first = attempt()
        async let second = attempt()
        let results = await [first, second]
        let opened = results.compactMap { try? $0.get() }
        #expect(opened.count == 1)
        for result in results {
            if case .failure(let error) = result {
                #expect(
                    "\(error)"
                        == "another tusa directory serves \(location): one directory per database (several nodes on one database are not built yet)"
                )
            }
        }
        for store in opened { await store.close() }
        await (try backing.open()).close()
        let versions = try await Self.psql(backing, "SELECT version FROM schema_migrations ORDER BY version")
        #expect(versions == "1")
        _ = try await Self.psql(backing, "INSERT INTO schema_migrations (version, applied_at) VALUES (99, 0)")
        await #expect(
            throws: DirectoryError("\(location) has schema version 99, newer than this tusa's 1: use a newer tusa")
        ) { _ = try await PostgresDirectoryStore.open(location, logger: logger) }
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
