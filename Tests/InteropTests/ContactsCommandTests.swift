import Foundation
import Party
import Secure
import TestSupport
import Testing
import Transport
import TusaBase

// `tusa contacts` and `tusa party create --contacts` against a real relay's
// rendezvous with its database, and `tusa contacts` against `tusa directory`:
// contacts kept across a restart, every contact told of a new party, and a
// stranger flood cut short with the reason.

@Suite("tusa contacts", .serialized)
struct ContactsCommandTests {
    /// `tusa relay` with its rendezvous (on this SQLite file) and party service, or
    /// `tusa directory` on it; returns it with the rendezvous' address.
    private static func start(_ kind: String, _ database: String) async throws -> (Harness.Background, String) {
        let tusa = try #require(Harness.tusa)
        let (arguments, prefix) =
            kind == "relay"
            ? (
                [
                    "relay", "--listen", "127.0.0.1:0", "--no-tcp", "--rendezvous-port", "0", "--party-port", "0",
                    "--rendezvous-database", "sqlite:\(database)",
                ], "rendezvous tcp "
            ) : (["directory", "--listen", "127.0.0.1:0", "--database", "sqlite:\(database)"], "directory tcp ")
        let process = try Harness.Background(tusa, arguments)
        guard let line = await process.waitForMatch(prefix + #"127\.0\.0\.1:[0-9]+"#) else {
            process.kill()
            _ = await process.waitForExit(timeout: 2)
            throw HarnessError("tusa \(kind) did not start: \(process.stderr.suffix(800))")
        }
        return (process, String(line.dropFirst(prefix.count)))
    }

    /// The keys `tusa contacts` printed, one a line.
    private static func keys(_ stdout: String) -> [String] {
        stdout.split(separator: "\n").map(String.init).filter { PublicKey(base64: $0) != nil }
    }

    @Test(
        "tusa contacts adds, lists and removes keys kept by the rendezvous (a relay's, or tusa directory) across its restart, tusa party create --contacts invites each, and a stranger flood stops at ten, across a restart too",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"),
        arguments: ["relay", "directory"])
    func contactsAreKeptAndInvitedToAParty(_ kind: String) async throws {
        let tusa = try #require(Harness.tusa)
        let folder = NSTemporaryDirectory() + "tusa-contacts-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let database = folder + "/rendezvous.sqlite"
        let alice = Identity.generate()
        let bob = Identity.generate()
        let carol = Identity.generate()
        let aliceFile = folder + "/alice.key"
        try alice.write(to: aliceFile)
        let (bobKey, carolKey) = (bob.publicKey.base64, carol.publicKey.base64)

        var (relay, server) = try await Self.start(kind, database)
        defer { relay.kill() }
        func contacts(_ arguments: [String]) async throws -> Harness.Result {
            try await Harness.run(tusa, ["contacts"] + arguments + ["--rendezvous", server, "--identity", aliceFile])
        }
        var run = try await contacts(["add", bobKey, carolKey])
        #expect(run.status == 0, "\(run.stderr)")
        #expect(Set(Self.keys(run.stdout)) == [bobKey, carolKey], "\(run.stdout)")
        run = try await contacts(["remove", carolKey])
        #expect(run.status == 0 && Self.keys(run.stdout) == [bobKey], "\(run.stdout) \(run.stderr)")
        // Not a key: a usage error naming it, nothing sent.
        run = try await contacts(["add", "not-a-key"])
        #expect(run.status == 64 && run.stderr.contains("'not-a-key' is not a 32-byte base64 public key"), "\(run.stderr)")

        // The relay restarts on its file: the contacts are still Alice's.
        relay.kill()
        _ = await relay.waitForExit(timeout: 5)
        (relay, server) = try await Self.start(kind, database)
        run = try await contacts(["list"])
        #expect(run.status == 0 && Self.keys(run.stdout) == [bobKey], "\(run.stdout) \(run.stderr)")

        guard let address = TransportAddress(server) else { throw HarnessError("bad address \(server)") }
        if kind == "relay" { try await Self.partyInvitesContacts(tusa, server, address, aliceFile, alice, bob, carolKey) }

        // Carol floods invitations to strangers: ten go, then each new one is refused
        // with the reason, and her connection still serves her.
        let c = try await RendezvousConnection.connect(to: address, identity: carol.privateKey, timeout: .seconds(30))
        defer { Task { await c.close() } }
        var refused: [String] = []
        for _ in 0..<12 {
            do { try await c.post([1], to: PrivateKey.generate().publicKey) } catch RendezvousConnectionError.refused(
                .rateLimited, let detail)
            {
                refused.append(detail)
            }
        }
        #expect(refused.count == 2 && refused.allSatisfy { $0.contains("has not made you a contact") }, "\(refused)")
        #expect(try await c.lookup(carol.publicKey), "her connection still serves her")

        // Killed and started again, the server has not refilled her budget: the
        // strangers she reached are rows.
        relay.kill()
        _ = await relay.waitForExit(timeout: 5)
        (relay, server) = try await Self.start(kind, database)
        guard let again = TransportAddress(server) else { throw HarnessError("bad address \(server)") }
        let back = try await RendezvousConnection.connect(to: again, identity: carol.privateKey, timeout: .seconds(30))
        defer { Task { await back.close() } }
        do {
            try await back.post([2], to: PrivateKey.generate().publicKey)
            Issue.record("a new stranger reached after the restart, with ten reached before it")
        } catch RendezvousConnectionError.refused(.rateLimited, let detail) {
            #expect(detail.contains("has not made you a contact"), "\(detail)")
        }
        #expect(await relay.stop() == 0)
    }

    /// Alice's party tells her contact Bob, online now, and lets him in; Carol, no
    /// longer a contact, is not told.
    private static func partyInvitesContacts(
        _ tusa: String, _ server: String, _ address: TransportAddress, _ aliceFile: String, _ alice: Identity,
        _ bob: Identity, _ carolKey: String
    ) async throws {
        let bobKey = bob.publicKey.base64
        let b = try await RendezvousConnection.connect(to: address, identity: bob.privateKey, timeout: .seconds(30))
        defer { Task { await b.close() } }
        let party = try await Harness.run(
            tusa,
            [
                "party", "create", "Hearthstone", "--contacts", "--rendezvous", server, "--identity", aliceFile, "--duration",
                "1", "--quiet",
            ], timeout: 30)
        #expect(party.status == 0, "\(party.stderr)")
        #expect(party.stdout.contains("invited \(bobKey)") && !party.stdout.contains(carolKey), "\(party.stdout)")
        let heard = await Harness.next(b.incoming, within: .seconds(10))
        #expect(heard?.from == alice.publicKey, "\(String(describing: heard))")
        #expect(heard.flatMap { PartyInvitation(decoding: $0.payload) }?.name == "Hearthstone")
        // More contacts than a room's invite list holds: a usage error before any room is made.
        let more = (0..<PartyControl.maximumInvited).map { _ in PrivateKey.generate().publicKey.base64 }
        let added = try await Harness.run(
            tusa, ["contacts", "add"] + more + ["--rendezvous", server, "--identity", aliceFile])
        #expect(added.status == 0, "\(added.stderr)")
        let tooMany = try await Harness.run(
            tusa, ["party", "create", "Raid", "--contacts", "--rendezvous", server, "--identity", aliceFile, "--duration", "1"],
            timeout: 30)
        #expect(
            tooMany.status == 64 && tooMany.stderr.contains("a room lets in at most \(PartyControl.maximumInvited)"),
            "\(tooMany.status) \(tooMany.stderr)")
    }
}
