import Foundation
import Party
import Rendezvous
import Secure
import TestSupport
import Testing
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#endif

// `tusa directory` as a process, its database a file: what was posted survives the
// directory's SIGKILL, and what the protocol does against it is what it does against
// `tusa relay --rendezvous-port`.

@Suite("tusa directory", .serialized)
struct DirectoryCommandTests {
    /// Starts `tusa directory` (or `tusa relay` with its rendezvous) on a free loopback
    /// port with this database (`sqlite:PATH` or a PostgreSQL URL); returns it with
    /// the rendezvous's address.
    private static func start(_ command: String, _ database: String, _ extra: [String] = []) async throws -> (
        Harness.Background, TransportAddress
    ) {
        let tusa = try #require(Harness.tusa)
        let (arguments, prefix) =
            command == "relay"
            ? (
                [
                    "relay", "--listen", "127.0.0.1:0", "--no-tcp", "--rendezvous-port", "0", "--rendezvous-database",
                    database,
                ], "rendezvous tcp "
            ) : (["directory", "--listen", "127.0.0.1:0", "--database", database], "directory tcp ")
        let process = try Harness.Background(tusa, arguments + extra)
        guard let line = await process.waitForMatch(prefix + #"127\.0\.0\.1:[0-9]+"#),
            let address = TransportAddress(String(line.dropFirst(prefix.count)))
        else {
            process.kill()
            _ = await process.waitForExit(timeout: 2)
            throw HarnessError("tusa \(command) did not start: \(process.stderr.suffix(800))")
        }
        return (process, address)
    }

    /// An invitation posted for an offline peer is written before it is acknowledged:
    /// the directory SIGKILLed right after and started again on the same file delivers
    /// it at the peer's login, and still knows the poster (offline, not unknown).
    @Test(
        "an invitation acknowledged by tusa directory (on SQLite or PostgreSQL, or a relay's rendezvous with a database) survives its SIGKILL and is delivered at the next login",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"),
        arguments: ["directory", "relay"] + (PostgresServer.isInstalled ? ["directory on postgres"] : []))
    func invitationsSurviveAKill(_ command: String) async throws {
        let file = NSTemporaryDirectory() + "tusa-directory-\(UUID().uuidString).sqlite"
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: file + suffix) } }
        let postgres = command.hasSuffix("postgres") ? try PostgresServer() : nil
        defer { postgres?.remove() }
        let database = postgres?.url ?? "sqlite:\(file)"
        let alice = PrivateKey.generate()
        let bob = PrivateKey.generate()

        let (first, server) = try await Self.start(command, database)
        if command != "relay" {
            #expect(first.stdout.contains("database \(database) (schema "), "\(first.stdout)")
        }
        let a = try await RendezvousConnection.connect(to: server, identity: alice, timeout: .seconds(30))
        let invitation = Array("Hearthstone: tusa party join ROOM".utf8)
        try await a.post(invitation, to: bob.publicKey)
        first.kill()
        #expect(await first.waitForExit(timeout: 10))
        await a.close()

        let (second, again) = try await Self.start(command, database)
        defer { second.kill() }
        let b = try await RendezvousConnection.connect(to: again, identity: bob, timeout: .seconds(30))
        let delivered = await Harness.next(b.incoming, within: .seconds(10))
        #expect(delivered?.from == alice.publicKey && delivered?.payload == invitation)
        await #expect(throws: RendezvousConnectionError.refused(.offline, "\(alice.publicKey) is offline")) {
            try await b.send([1], to: alice.publicKey)
        }
        #expect(second.stderr.contains("restored from the database"), "\(second.stderr.suffix(800))")
        await b.close()
        #expect(await second.stop() == 0)
    }

    /// Three relays report to a directory: new rooms are spread over them (each
    /// `place` answered with one relay's party address; most/least within 1.5), and a
    /// relay SIGKILLed is sent nobody from then on.
    @Test(
        "tusa directory spreads new rooms over the relays that report to it and drops a killed one",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func peersAreSpreadOverReportingRelays() async throws {
        let tusa = try #require(Harness.tusa)
        let database = NSTemporaryDirectory() + "tusa-directory-\(UUID().uuidString).sqlite"
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: database + suffix) } }
        let directory = try Harness.Background(
            tusa,
            ["directory", "--listen", "127.0.0.1:0", "--database", "sqlite:\(database)", "--relay-secret", "s3cret"])
        defer { directory.kill() }
        let line = try #require(await directory.waitForMatch(#"directory tcp 127\.0\.0\.1:[0-9]+"#), "\(directory.stderr)")
        let server = try #require(TransportAddress(String(line.dropFirst("directory tcp ".count))))
        var relays: [(Harness.Background, String)] = []
        defer { for (relay, _) in relays { relay.kill() } }
        for _ in 0..<3 {
            let relay = try Harness.Background(
                tusa,
                [
                    "relay", "--listen", "127.0.0.1:0", "--no-tcp", "--party-port", "0", "--directory", "\(server)",
                    "--directory-secret", "s3cret",
                ])
            let party = try #require(
                await relay.waitForMatch(#"party udp 127\.0\.0\.1:[0-9]+"#), "\(relay.stdout) \(relay.stderr)")
            relays.append((relay, String(party.dropFirst("party udp ".count))))
        }
        for (relay, _) in relays {
            #expect(
                await relay.waitFor(timeout: 10) { _, err in err.contains("reporting load to the directory") }, "\(relay.stderr)")
        }
        func placements(_ count: Int) async throws -> [String: Int] {
            var counts: [String: Int] = [:]
            for _ in 0..<count {
                let peer = try await RendezvousConnection.connect(to: server, identity: .generate(), timeout: .seconds(30))
                // A new room's placement, as `tusa party create` asks it (reserved: a burst spreads).
                counts[(try? await peer.placeRoom())?.address ?? "none", default: 0] += 1
                await peer.close()
            }
            return counts
        }
        // Until every relay's first report is in (each says it reports once connected).
        var seen = Set<String>()
        let deadline = ContinuousClock.now + .seconds(15)
        while seen.count < 3 && ContinuousClock.now < deadline {
            seen.formUnion(try await placements(3).keys)
            try await Task.sleep(for: .milliseconds(100))
        }
        let spread = try await placements(30)
        let addresses = relays.map(\.1)
        #expect(Set(spread.keys) == Set(addresses), "\(spread) over \(addresses)")
        let most = spread.values.max() ?? 0
        let least = spread.values.min() ?? 0
        #expect(least > 0 && Double(most) / Double(least) <= 1.5, "\(spread)")

        relays[0].0.kill()
        #expect(await relays[0].0.waitForExit(timeout: 10))
        // Its connection closes with it: down at once (at the latest 6 s after its last report).
        try await Task.sleep(for: .milliseconds(500))
        let after = try await placements(12)
        #expect(after[addresses[0]] == nil && after.values.reduce(0, +) == 12, "\(after)")
        #expect(Set(after.keys) == Set(addresses[1...]), "\(after)")
    }

    /// `directory-load`, the project's load tool for a directory, against `tusa
    /// directory` on its SQLite default and two relays: its users register, make
    /// rooms where they are placed, invite friends (two of them offline until the
    /// invitations wait for them), join through `locate`, speak and signal; its
    /// report says all of it arrived. A bad option is a usage error.
    @Test(
        "directory-load plays many users against tusa directory on SQLite and reports what they got",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func theLoadToolPlaysItsUsersAgainstADirectory() async throws {
        let tusa = try #require(Harness.tusa)
        let load = URL(fileURLWithPath: tusa).deletingLastPathComponent().appendingPathComponent("directory-load").path
        try #require(FileManager.default.isExecutableFile(atPath: load), "\(load) not built (swift build builds it)")
        let bad = try await Harness.run(load, ["--directory", "127.0.0.1:9", "--rooms", "0"], timeout: 20)
        #expect(bad.status == 64 && bad.stderr.contains("--rooms must be 1-10000"), "\(bad.status) \(bad.stderr)")

        let database = NSTemporaryDirectory() + "tusa-directory-\(UUID().uuidString).sqlite"
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: database + suffix) } }
        let (directory, server) = try await Self.start("directory", "sqlite:\(database)", ["--relay-secret", "s3cret"])
        defer { directory.kill() }
        var relays: [Harness.Background] = []
        defer { for relay in relays { relay.kill() } }
        for _ in 0..<2 {
            let relay = try Harness.Background(
                tusa,
                [
                    "relay", "--listen", "127.0.0.1:0", "--no-tcp", "--party-port", "0", "--directory", "\(server)",
                    "--directory-secret", "s3cret",
                ])
            relays.append(relay)
            #expect(
                await relay.waitFor(timeout: 10) { _, err in err.contains("reporting load to the directory") }, "\(relay.stderr)")
        }
        // Until the directory places peers on a party relay.
        #expect(
            await eventually(within: .seconds(15), poll: .milliseconds(100)) {
                let probe = try? await RendezvousConnection.connect(to: server, identity: .generate(), timeout: .seconds(5))
                defer { Task { await probe?.close() } }
                return probe?.party != nil
            })
        let r = try await Harness.run(
            load,
            ["--directory", "\(server)", "--rooms", "4", "--friends", "2", "--offline", "2", "--seconds", "2", "--json"],
            timeout: 90)
        #expect(r.status == 0, "\(r.stderr)")
        let report = try #require(
            try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any], "\(r.stdout) \(r.stderr)")
        #expect(report["users"] as? Int == 12, "\(report)")
        #expect(report["invitationsPosted"] as? Int == 6 && report["invitationsDelivered"] as? Int == 6, "\(report)")
        #expect(report["offlineInvited"] as? Int == 2 && report["offlineDelivered"] as? Int == 2, "\(report)")
        #expect(report["hearing"] as? Int == 12, "\(report)")
        #expect(report["signalsSent"] as? Int == 8 && report["signalsDelivered"] as? Int == 8, "\(report)")
        #expect((report["roomsPerRelay"] as? [Int])?.reduce(0, +) == 4, "\(report)")
        print("directory-load: \(r.stdout)")
    }

    /// A room lives on the relay the directory placed its creator on, and a joiner
    /// asking the directory (`tusa party join ID --rendezvous`) finds it there,
    /// whichever relay it was placed on itself. That relay SIGKILLed, every member
    /// follows the room to the relay the directory places it on next, rejoining with
    /// its ticket and keys; a newcomer asking the directory then lands in the moved
    /// room and hears its creator, and so does an invited watcher, whose invitation
    /// names the dead relay (`tusa party list` shows the room's members from there too).
    @Test(
        "a party room is found through tusa directory, and its members follow it to another relay when its relay is SIGKILLed",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func aRoomMovesOffAKilledRelayWithItsMembers() async throws {
        let cluster = try await PartyCluster(relays: 2)
        defer { cluster.stop() }
        let (room, members) = try await cluster.room(invitingAlso: ["c", "w"])
        let host = try #require(cluster.host(of: room), "no relay says it hosts \(room)")
        cluster.relays[host].kill()
        let killed = ContinuousClock.now
        // Every member is back in the room, on the other relay (the number is the issue's target).
        for m in members {
            #expect(await m.waitFor(timeout: 20) { _, err in err.contains("(the room moved)") }, "\(m.stderr)")
        }
        let back = killed.duration(to: .now)
        #expect(back < .seconds(5), "the members were back in the room \(back) after the kill")
        let other = cluster.relays[1 - host]
        #expect(other.stderr.contains("party restored from a member's ticket"), "\(other.stderr)")
        // A newcomer asking the directory is sent to where the room is now, and hears its creator there.
        let newcomer = try await cluster.member("c", ["join", room, "--in", "silence", "--duration", "4", "--json"])
        #expect(await newcomer.waitForExit(timeout: 30), "\(newcomer.stderr)")
        let fromCreator = try PartyCluster.heardFromCreator(newcomer)
        #expect(fromCreator > 100, "the newcomer heard \(fromCreator) packets from the creator: \(newcomer.stdout)")
        // The invited watcher: its invitation names the dead relay; list and join find the room where it is.
        let list = try await Harness.run(
            cluster.tusa, ["party", "list", "--rendezvous", cluster.server, "--identity", cluster.keyFile("w")])
        #expect(list.status == 0 && list.stdout.contains(" in it:") && list.stdout.contains(" creator"), "\(list.stdout)")
        let watching = try await cluster.member(
            "w", ["watch", "--join", "--timeout", "20", "--in", "silence", "--duration", "4", "--json"])
        #expect(await watching.waitForExit(timeout: 40), "\(watching.stderr)")
        let watcherHeard = try PartyCluster.heardFromCreator(watching)
        #expect(watcherHeard > 100, "the watcher heard \(watcherHeard) packets from the creator: \(watching.stdout)")
    }

    /// A directory's relay lists its rooms to it, and `tusa party list` shows each
    /// user the parties it may see, with who is in them: the creator's friend (a
    /// contact of the creator's) its open room, within a report or two of each
    /// join; a stranger nothing; and no one a room whose members all left.
    @Test(
        "tusa directory lists a friend's open party with its members, and not to a stranger, until the room closes",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func aDirectoryListsAFriendsPartyWithItsMembers() async throws {
        let cluster = try await PartyCluster(relays: 1)
        defer { cluster.stop() }
        let creatorKey = try await cluster.keygen("a")
        let friendKey = try await cluster.keygen("f")
        let joinerKey = try await cluster.keygen("b")
        try await cluster.keygen("s")
        let added = try await Harness.run(
            cluster.tusa, ["contacts", "add", friendKey, "--rendezvous", cluster.server, "--identity", cluster.keyFile("a")])
        #expect(added.status == 0, "\(added.stderr)")
        func list(_ name: String) async throws -> String {
            let r = try await Harness.run(
                cluster.tusa, ["party", "list", "--rendezvous", cluster.server, "--identity", cluster.keyFile(name)])
            #expect(r.status == 0, "\(r.stderr)")
            return r.stdout
        }
        /// `name`'s list, once `condition` holds of it (or after 15 s).
        func list(_ name: String, until condition: (String) -> Bool) async throws -> String {
            let deadline = ContinuousClock.now + .seconds(15)
            var last = try await list(name)
            while !condition(last), ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(500))
                last = try await list(name)
            }
            return last
        }
        let creator = try await cluster.member("a", ["create", "Hearthstone", "--in", "tone", "--duration", "14"])
        let created = try #require(
            await creator.waitForMatch(#"party [a-z0-9]{4}-[a-z0-9]{12}"#, timeout: 20), "\(creator.stderr)")
        let room = String(created.dropFirst("party ".count))
        let first = try await list("f") { $0.contains("party Hearthstone \(room)") }
        #expect(
            first.contains("party Hearthstone \(room) by \(creatorKey)")
                && first.contains("1 of at most 50 in it: tusa party join \(room) --relay 127.0.0.1:")
                && first.contains("\(creatorKey) ") && first.contains(" creator"), "\(first)")
        let joiner = try await cluster.member("b", ["join", room, "--in", "silence", "--duration", "12"])
        let second = try await list("f") { $0.contains("2 of at most 50") }
        #expect(second.contains("2 of at most 50") && second.contains(joinerKey), "\(second)")
        #expect(try await list("b").contains("party Hearthstone \(room)"), "a member sees the room it is in")
        let stranger = try await list("s")
        #expect(!stranger.contains(room), "a stranger was shown the room: \(stranger)")
        #expect(await creator.waitForExit(timeout: 30), "\(creator.stderr)")
        #expect(await joiner.waitForExit(timeout: 30), "\(joiner.stderr)")
        let after = try await list("f") { !$0.contains(room) }
        #expect(!after.contains(room), "the room was still listed after its members left: \(after)")
    }

    /// A relay that reports to a directory drains on SIGTERM: it says so to the
    /// directory, tells its members to move, and exits once they have gone; they
    /// follow the room to another relay at once, without waiting to find it silent.
    @Test(
        "a relay of tusa directory drains on SIGTERM: its members move with their room to another relay, then it exits",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func aDrainingRelaySendsItsMembersOn() async throws {
        let cluster = try await PartyCluster(relays: 2)
        defer { cluster.stop() }
        let (room, members) = try await cluster.room()
        let host = try #require(cluster.host(of: room), "no relay says it hosts \(room)")
        let draining = cluster.relays[host]
        #expect(Glibc.kill(try #require(draining.pid), SIGTERM) == 0)
        let asked = ContinuousClock.now
        for m in members {
            #expect(
                await m.waitFor(timeout: 20) { _, err in
                    err.contains("the relay is shutting down") && err.contains("(the room moved)")
                }, "\(m.stderr)")
        }
        let moved = asked.duration(to: .now)
        #expect(moved < .seconds(5), "the members were in the room on the other relay \(moved) after the SIGTERM")
        #expect(await draining.waitForExit(timeout: 20), "\(draining.stderr)")
        #expect(draining.status == 0, "\(draining.stderr)")
        #expect(draining.stderr.contains("draining: members told to move") && draining.stderr.contains("drained"))
        #expect(cluster.relays[1 - host].stderr.contains("party restored from a member's ticket"))
    }

    /// Two `tusa directory` nodes on one PostgreSQL serve as one: a peer at one
    /// finds and reaches a peer at the other, a post made at one is delivered at a
    /// login at the other, and a node SIGKILLed is soon taken for gone (its peers
    /// offline at the other) while its peers register at the other node.
    @Test(
        "two tusa directory nodes on one PostgreSQL serve as one, and one killed is taken for gone",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"),
        .enabled(if: PostgresServer.isInstalled, "\(PostgresServer.absentMessage)"))
    func twoNodesOnOnePostgresServeAsOne() async throws {
        let postgres = try PostgresServer()
        defer { postgres.remove() }
        let (first, one) = try await Self.start("directory", postgres.url, ["--relay-secret", "s3cret"])
        defer { first.kill() }
        let (second, two) = try await Self.start("directory", postgres.url, ["--relay-secret", "s3cret"])
        defer { second.kill() }
        // A relay reporting to the nodes (to node one, the first that answers).
        let tusa = try #require(Harness.tusa)
        let relay = try Harness.Background(
            tusa,
            [
                "relay", "--listen", "127.0.0.1:0", "--no-tcp", "--party-port", "0", "--directory", "\(one),\(two)",
                "--directory-secret", "s3cret",
            ])
        defer { relay.kill() }
        let partyLine = try #require(await relay.waitForMatch(#"party udp 127\.0\.0\.1:[0-9]+"#), "\(relay.stderr)")
        let partyAddress = String(partyLine.dropFirst("party udp ".count))
        #expect(
            await relay.waitFor(timeout: 10) { _, err in err.contains("reporting load to the directory") && err.contains("\(one)")
            },
            "\(relay.stderr)")
        for node in [first, second] { #expect(node.stdout.contains("(schema 5, node "), "\(node.stdout)") }
        let alice = PrivateKey.generate()
        let bob = PrivateKey.generate()
        let carol = PrivateKey.generate()
        let a = try await RendezvousConnection.connect(to: one, identity: alice, timeout: .seconds(30))
        let b = try await RendezvousConnection.connect(to: two, identity: bob, timeout: .seconds(30))
        #expect(await eventually(within: .seconds(5)) { (try? await b.lookup(alice.publicKey)) == true })
        #expect(await eventually(within: .seconds(5)) { (try? await a.lookup(bob.publicKey)) == true })

        // A sealed send crosses the nodes, both ways.
        let offer = Array("offer from node one".utf8)
        let sentAt = ContinuousClock.now
        try await a.send(offer, to: bob.publicKey)
        let heard = await Harness.next(b.incoming, within: .seconds(5))
        #expect(heard?.from == alice.publicKey && heard?.payload == offer)
        print("directory nodes: a send from node one heard at node two after \(ContinuousClock.now - sentAt)")
        try await b.send(Array("answer".utf8), to: alice.publicKey)
        #expect(await Harness.next(a.incoming, within: .seconds(5))?.payload == Array("answer".utf8))

        // A post for Carol, never here, made at node one: she logs in at node two.
        let invitation = Array("Valheim: tusa party join ROOM".utf8)
        try await a.post(invitation, to: carol.publicKey)
        let c = try await RendezvousConnection.connect(to: two, identity: carol, timeout: .seconds(30))
        let delivered = await Harness.next(c.incoming, within: .seconds(5))
        #expect(delivered?.from == alice.publicKey && delivered?.payload == invitation)

        // Node two sends its peers to the relay that reports to node one.
        #expect(
            await eventually(within: .seconds(5)) {
                let peer = try? await RendezvousConnection.connect(to: two, identity: .generate(), timeout: .seconds(5))
                await peer?.close()
                return peer?.party?.address == partyAddress
            })

        // `tusa party watch` given both nodes registers at the first.
        let identityFile = try Self.keyFile()
        defer { try? FileManager.default.removeItem(atPath: identityFile) }
        let watcher = try Harness.Background(
            tusa, ["party", "watch", "--rendezvous", "\(one),\(two)", "--identity", identityFile, "--timeout", "60"])
        defer { watcher.kill() }
        let watching = try #require(await watcher.waitForMatch(#"watching as [A-Za-z0-9+/=]+"#), "\(watcher.stderr)")
        let dave = try #require(PublicKey(base64: String(watching.dropFirst("watching as ".count))))
        let valheim = PartyInvitation(room: "R1", name: "Valheim", relay: "127.0.0.1:3481", relayKey: bob.publicKey.base64)
        try await b.post(valheim.encoded(), to: dave)
        #expect(await watcher.waitForMatch("created party Valheim") != nil, "\(watcher.stdout) \(watcher.stderr)")

        // Node one is killed: Alice is offline at node two once node two sees its
        // session end, and reached there once she registers there; the watcher
        // moves to node two and hears what is posted there, and nothing twice.
        first.kill()
        let killedAt = ContinuousClock.now
        #expect(
            await eventually(within: .seconds(12), poll: .milliseconds(100)) {
                (try? await b.lookup(alice.publicKey)) == false
            })
        print("directory nodes: a killed node's peers offline at the other after \(ContinuousClock.now - killedAt)")
        let moved = try await RendezvousConnection.connect(to: two, identity: alice, timeout: .seconds(30))
        try await b.send([7], to: alice.publicKey)
        #expect(await Harness.next(moved.incoming, within: .seconds(5))?.payload == [7])
        #expect(await watcher.waitFor(timeout: 10) { _, err in err.contains("watching at \(two)") }, "\(watcher.stderr)")
        // The relay reports to node two now, which places on it.
        #expect(
            await relay.waitFor(timeout: 10) { _, err in err.contains("directory=\(two)") }, "\(relay.stderr.suffix(600))")
        let placed = try await RendezvousConnection.connect(to: two, identity: .generate(), timeout: .seconds(5))
        #expect(placed.party?.address == partyAddress)
        await placed.close()
        let rust = PartyInvitation(room: "R2", name: "Rust", relay: "127.0.0.1:3481", relayKey: bob.publicKey.base64)
        try await b.post(rust.encoded(), to: dave)
        #expect(await watcher.waitForMatch("created party Rust") != nil, "\(watcher.stdout) \(watcher.stderr)")
        #expect(watcher.stdout.components(separatedBy: "created party Valheim").count == 2, "\(watcher.stdout)")
        for connection in [b, c, moved] { await connection.close() }
        await a.close()
        #expect(await second.stop() == 0)
    }

    /// `tusa answer` given two nodes registers at the first; that node SIGKILLed, it
    /// registers at the other within 3 s (not only once a call is under way), and a call
    /// placed through the other node reaches it.
    @Test(
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"),
        .enabled(if: PostgresServer.isInstalled, "\(PostgresServer.absentMessage)"))
    func anAnswererWhoseNodeDiesIsCalledThroughTheOther() async throws {
        let postgres = try PostgresServer()
        defer { postgres.remove() }
        let (first, one) = try await Self.start("directory", postgres.url)
        defer { first.kill() }
        let (second, two) = try await Self.start("directory", postgres.url)
        defer { second.kill() }
        let tusa = try #require(Harness.tusa)
        // (Its log at info level names the registration.)
        let answerer = try Harness.Background(
            "/usr/bin/env",
            [
                "TUSA_LOG=info", tusa, "answer", "--rendezvous", "\(one),\(two)", "--timeout", "60", "--in", "tone", "--json",
                "--quiet",
            ])
        defer { answerer.kill() }
        let line = try #require(await answerer.waitForMatch(#"answering as [A-Za-z0-9+/=]{44}"#), "\(answerer.stderr)")
        let key = String(line.dropFirst("answering as ".count))
        let callee = try #require(PublicKey(base64: key))
        let probe = try await RendezvousConnection.connect(to: two, identity: .generate(), timeout: .seconds(30))
        #expect(await eventually(within: .seconds(5)) { (try? await probe.lookup(callee)) == true }, "not registered")
        await probe.close()

        first.kill()
        let killed = ContinuousClock.now
        #expect(
            await answerer.waitFor(timeout: 10) { _, err in err.contains("registered again at the rendezvous") },
            "the answerer did not register at the other node: \(answerer.stderr)")
        let after = ContinuousClock.now - killed
        print("directory nodes: an answerer's node SIGKILLed, registered at the other after \(after)")
        #expect(after < .seconds(3), "registered again after \(after)")
        #expect(answerer.stderr.contains("server=\(two)"), "\(answerer.stderr)")
        let caller = try await Harness.run(
            tusa, ["call", key, "--rendezvous", "\(two)", "--in", "tone", "--duration", "2", "--json", "--quiet"],
            timeout: 40)
        #expect(caller.status == 0, "\(caller.stdout) \(caller.stderr)")
        _ = await answerer.waitForExit(timeout: 10)
        #expect(answerer.status == 0, "\(answerer.stdout) \(answerer.stderr)")
    }

    /// Two `tusa answer` with one identity: the later takes the registration, and the
    /// earlier, its connection closed as replaced, ends saying so (it does not register
    /// again and take it back).
    @Test(.enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func anAnswererWhoseIdentityRegistersElsewhereStops() async throws {
        let folder = NSTemporaryDirectory() + "tusa-twice-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let (directory, address) = try await Self.start("directory", "sqlite:\(folder)/d.sqlite")
        defer { directory.kill() }
        let tusa = try #require(Harness.tusa)
        let identity = try Self.keyFile()
        defer { try? FileManager.default.removeItem(atPath: identity) }
        let arguments = ["answer", "--rendezvous", "\(address)", "--identity", identity, "--timeout", "30", "--quiet"]
        let first = try Harness.Background(tusa, arguments)
        defer { first.kill() }
        #expect(await first.waitForMatch("answering as ") != nil, "\(first.stderr)")
        let second = try Harness.Background(tusa, arguments)
        defer { second.kill() }
        #expect(await second.waitForMatch("answering as ") != nil, "\(second.stderr)")
        #expect(await first.waitForExit(timeout: 10), "the first answerer went on: \(first.stderr)")
        #expect(first.status == 2 && first.stderr.contains("this identity registered again elsewhere"), "\(first.stderr)")
        try await Task.sleep(for: .seconds(1))
        #expect(second.pid != nil, "the second answerer stopped: \(second.stderr)")
    }

    /// A relay reporting under the wrong secret: the directory refuses its load and
    /// places nothing on it, and the relay says why on standard error (once, not a
    /// "connecting again" every 2 s) and goes on serving.
    @Test(.enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func aRelayWithTheWrongSecretIsRefusedAndSaysWhy() async throws {
        let folder = NSTemporaryDirectory() + "tusa-secret-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let (directory, address) = try await Self.start(
            "directory", "sqlite:\(folder)/d.sqlite", ["--relay-secret", "s3cret"])
        defer { directory.kill() }
        let tusa = try #require(Harness.tusa)
        let relay = try Harness.Background(
            tusa,
            [
                "relay", "--listen", "127.0.0.1:0", "--no-tcp", "--party-port", "0", "--directory", "\(address)",
                "--directory-secret", "wrong",
            ])
        defer { relay.kill() }
        #expect(
            await relay.waitFor(timeout: 15) { _, err in
                err.contains("the directory \(address) refused this relay: not a relay of this directory")
                    && err.contains("--directory-secret must be the same")
            }, "\(relay.stderr)")
        // Nothing placed on it: a peer registering is told of no party relay.
        let peer = try await RendezvousConnection.connect(to: address, identity: .generate(), timeout: .seconds(10))
        #expect(peer.party == nil, "placed on \(String(describing: peer.party))")
        await peer.close()
        try await Task.sleep(for: .seconds(3))
        #expect(relay.pid != nil, "the relay exited: \(relay.stderr)")
        #expect(!relay.stderr.contains("connecting again"), "\(relay.stderr)")
        #expect(relay.stderr.components(separatedBy: "refused this relay").count == 2, "\(relay.stderr)")
    }

    /// A fresh identity file (what `tusa keygen` writes) in the temporary folder.
    private static func keyFile() throws -> String {
        let path = NSTemporaryDirectory() + "tusa-watch-\(UUID().uuidString).key"
        try Identity.generate().write(to: path)
        return path
    }

    @Test(
        "tusa directory refuses a database it cannot use with one line and status 1",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"),
        arguments: [
            (
                ["--database", "postgres://tusa:hunter2@127.0.0.1:1/tusa"],
                "cannot reach the database postgres://tusa:***@127.0.0.1:1/tusa: "
            ),
            (["--database", "postgres://127.0.0.1/tusa"], "names no user"),
            (["--database", "sqlite:/nonexistent-dir/x.sqlite"], "cannot open the database /nonexistent-dir/x.sqlite"),
            (["--listen", "nowhere"], "--listen must be IP:PORT"),
            (["--turn-uri", "turn:127.0.0.1:3478"], "--turn-uri needs --static-auth-secret"),
            (
                ["--static-auth-secret", "", "--turn-uri", "turn:127.0.0.1:3478"],
                "--static-auth-secret must not be empty: anyone could make TURN credentials with it"
            ),
            (["--max-connections", "0"], "--max-connections must be 1-1000000"),
            (["--max-connections-per-ip", "0"], "--max-connections-per-ip must be 1-1000000"),
        ])
    func badDatabasesAndFlags(_ flags: [String], _ message: String) async throws {
        let tusa = try #require(Harness.tusa)
        let result = try await Harness.run(tusa, ["directory", "--listen", "127.0.0.1:0"] + flags, timeout: 20)
        #expect(result.status == 1)
        #expect(result.stderr.hasPrefix("tusa directory: error: ") && result.stderr.contains(message), "\(result.stderr)")
        #expect(result.stderr.split(separator: "\n").count == 1, "\(result.stderr)")
        #expect(!result.stderr.contains("hunter2"))
    }
}

/// A `tusa directory` (SQLite, a relay secret) with relays reporting to it, each
/// hosting parties, and party members as processes, in one temporary folder.
final class PartyCluster {
    let tusa: String
    let folder: String
    let directory: Harness.Background
    /// The directory's address, for `--rendezvous` and `--directory`.
    let server: String
    private(set) var relays: [Harness.Background] = []
    private(set) var members: [Harness.Background] = []

    init(relays count: Int) async throws {
        tusa = try #require(Harness.tusa)
        folder = NSTemporaryDirectory() + "tusa-cluster-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        directory = try Harness.Background(
            tusa,
            ["directory", "--listen", "127.0.0.1:0", "--database", "sqlite:\(folder)/d.sqlite", "--relay-secret", "s3cret"])
        guard let line = await directory.waitForMatch(#"directory tcp 127\.0\.0\.1:[0-9]+"#) else {
            directory.kill()
            throw HarnessError("tusa directory did not start: \(directory.stderr.suffix(800))")
        }
        server = String(line.dropFirst("directory tcp ".count))
        for _ in 0..<count {
            let relay = try Harness.Background(
                tusa,
                [
                    "relay", "--listen", "127.0.0.1:0", "--no-tcp", "--party-port", "0", "--directory", server,
                    "--directory-secret", "s3cret",
                ])
            relays.append(relay)
            #expect(
                await relay.waitFor(timeout: 15) { _, err in err.contains("reporting load to the directory") }, "\(relay.stderr)")
        }
    }

    func keyFile(_ name: String) -> String { "\(folder)/\(name).key" }

    /// Makes `name`'s identity file; returns its public key.
    @discardableResult
    func keygen(_ name: String) async throws -> String {
        let made = try await Harness.run(tusa, ["keygen", "--out", keyFile(name)])
        #expect(made.status == 0, "\(made.stderr)")
        return try #require(
            made.stdout.split(whereSeparator: \.isWhitespace).map(String.init).first { $0.count == 44 && $0.hasSuffix("=") },
            "\(made.stdout)")
    }

    /// `tusa party ARGUMENTS` as `name` (its identity made if need be), through the directory.
    func member(_ name: String, _ arguments: [String]) async throws -> Harness.Background {
        if !FileManager.default.fileExists(atPath: keyFile(name)) { try await keygen(name) }
        let process = try Harness.Background(tusa, ["party"] + arguments + ["--rendezvous", server, "--identity", keyFile(name)])
        members.append(process)
        return process
    }

    /// A room "Valheim" created by `a` and joined by `b` (both sending a tone for 40 s),
    /// invite-only: `b` and `others` are invited by key.
    func room(invitingAlso others: [String] = []) async throws -> (String, [Harness.Background]) {
        var invited: [String] = []
        for name in ["b"] + others { invited.append(try await keygen(name)) }
        let creator = try await member(
            "a", ["create", "Valheim"] + invited.flatMap { ["--invite", $0] } + ["--in", "tone", "--duration", "40"])
        let created = try #require(
            await creator.waitForMatch(#"party [a-z0-9]{4}-[a-z0-9]{12}"#, timeout: 20), "\(creator.stderr)")
        let room = String(created.dropFirst("party ".count))
        let joiner = try await member("b", ["join", room, "--in", "tone", "--duration", "40"])
        #expect(await creator.waitFor(timeout: 15) { _, err in err.contains("joined: #2") }, "\(creator.stderr)")
        return (room, [creator, joiner])
    }

    /// Which relay logged the room's creation.
    func host(of room: String) -> Int? { relays.firstIndex { $0.stderr.contains("room=\(room)") } }

    /// Packets a member's `--json` report counts from member #1 (the creator).
    static func heardFromCreator(_ process: Harness.Background) throws -> Int {
        let report = try #require(
            try JSONSerialization.jsonObject(with: Data(process.stdout.drop { $0 != "{" }.utf8)) as? [String: Any],
            "\(process.stdout) \(process.stderr)")
        let speakers = report["speakers"] as? [[String: Any]] ?? []
        return speakers.first { $0["member"] as? Int == 1 }?["packets"] as? Int ?? 0
    }

    func stop() {
        for process in members + relays + [directory] { process.kill() }
        try? FileManager.default.removeItem(atPath: folder)
    }
}
