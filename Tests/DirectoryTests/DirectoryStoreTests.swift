import Directory
import Foundation
import Logging
import Rendezvous
import SQLiteNIO
import Secure
import Testing

@Suite("The directory's SQLite store")
struct SQLiteDirectoryStoreTests {
    private let logger = Logger(label: "test")
    private let alice = PrivateKey.generate().publicKey, bob = PrivateKey.generate().publicKey
    private let now: UInt64 = 1_800_000_000

    private func temporaryPath() -> String {
        NSTemporaryDirectory() + "tusa-directory-\(UUID().uuidString).sqlite"
    }

    private func remove(_ path: String) {
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
    }

    private func post(_ id: UInt64, at: UInt64, _ byte: UInt8) -> RendezvousPost {
        RendezvousPost(id: id, to: bob, from: alice, sealed: [byte, byte], unixSeconds: at)
    }

    @Test func whatIsWrittenIsReadBackAfterReopeningInOrder() async throws {
        let path = temporaryPath()
        defer { remove(path) }
        let store = try await SQLiteDirectoryStore.open(path: path, logger: logger)
        try await store.write([.posted(post(1, at: now, 1)), .posted(post(2, at: now, 2)), .seen(alice, unixSeconds: now)])
        try await store.write([.posted(post(3, at: now + 5, 3)), .dropped([1]), .seen(alice, unixSeconds: now + 7)])
        await store.close()

        let again = try await SQLiteDirectoryStore.open(path: path, logger: logger)
        let snapshot = try await again.load(unixSeconds: now + 10, postsFor: .seconds(86400), seenFor: .seconds(86400))
        #expect(snapshot.posts == [post(2, at: now, 2), post(3, at: now + 5, 3)])
        #expect(snapshot.seen == [alice: now + 7])
        await again.close()
    }

    @Test func rowsOlderThanTheyAreKeptAreDeletedAtLoad() async throws {
        let path = temporaryPath()
        defer { remove(path) }
        let store = try await SQLiteDirectoryStore.open(path: path, logger: logger)
        try await store.write([
            .posted(post(1, at: now - 90_000, 1)), .posted(post(2, at: now - 3600, 2)), .seen(alice, unixSeconds: now - 90_000),
            .seen(bob, unixSeconds: now - 60),
        ])
        let snapshot = try await store.load(unixSeconds: now, postsFor: .seconds(86400), seenFor: .seconds(86400))
        #expect(snapshot.posts.map(\.id) == [2])
        #expect(snapshot.seen == [bob: now - 60])
        // Gone from the file, not only from the answer.
        let later = try await store.load(unixSeconds: now - 100_000, postsFor: .seconds(1_000_000), seenFor: .seconds(1_000_000))
        #expect(later.posts.map(\.id) == [2])
        await store.close()
    }

    @Test func theSchemaIsMadeOnceAndANewerOneIsRefused() async throws {
        let path = temporaryPath()
        defer { remove(path) }
        await (try SQLiteDirectoryStore.open(path: path, logger: logger)).close()
        await (try SQLiteDirectoryStore.open(path: path, logger: logger)).close()
        let raw = try await SQLiteConnection.open(storage: .file(path: path))
        let versions = try await raw.query("SELECT version FROM schema_migrations", [])
        #expect(versions.compactMap { $0.column("version")?.integer } == [1])
        _ = try await raw.query("INSERT INTO schema_migrations (version, applied_at) VALUES (99, 0)", [])
        try await raw.close()
        await #expect(
            throws: DirectoryError("\(path) has schema version 99, newer than this tusa's 1: use a newer tusa")
        ) { _ = try await SQLiteDirectoryStore.open(path: path, logger: logger) }
    }

    @Test func aFileThatIsNotADatabaseIsAClearErrorAndLeftAlone() async throws {
        let path = temporaryPath()
        defer { remove(path) }
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
    ])
    func databasesAreNamed(_ text: String, _ database: DirectoryDatabase) throws {
        #expect(try DirectoryDatabase(text) == database)
    }

    @Test(arguments: ["sqlite:", "mysql://x", "directory", "postgres://tusa@127.0.0.1/tusa"])
    func otherDatabasesAreRefusedWithAReason(_ text: String) {
        #expect(throws: DirectoryError.self) { try DirectoryDatabase(text) }
    }
}
