import Foundation
import Party
import Secure
import TestSupport
import Testing
import Voice

/// `tusa party` as users run it: `tusa relay --party-port`, four member processes,
/// each playing a different utterance in turn, each recording the room's mix;
/// every member's recording of every other speaker is scored with PESQ.
@Suite(.serialized) struct PartyCommandTests {
    static let speech = [
        "sense_and_sensibility_01_austen_64kb-0880.wav", "sense_and_sensibility_01_austen_64kb-0930.wav",
        "sense_and_sensibility_01_austen_64kb-0890.wav", "sense_and_sensibility_01_austen_64kb-0920.wav",
    ].map { "/usr/share/pocketsphinx/test/data/librivox/" + $0 }
    static let scorer = Harness.packageRoot.appendingPathComponent("Tests/InteropTests/peers/party_pesq.py").path
    static let ready =
        Harness.tusa != nil && Harness.python != nil && speech.allSatisfy { FileManager.default.fileExists(atPath: $0) }
    static let needs = "needs .build/debug/tusa, .venv with pesq and Debian's pocketsphinx-testdata (make test installs them)"

    /// `tusa relay --party-port 0`: the process, the party address and the relay's key.
    static func relay(_ extra: [String] = [], partyPort: UInt16 = 0) async throws -> (Harness.Background, String, String) {
        let (relay, _) = try #require(
            try await Harness.startRelay(["--listen", "127.0.0.1:0", "--party-port", "\(partyPort)"] + extra))
        let line = try #require(
            await relay.waitForMatch(#"party udp 127\.0\.0\.1:[0-9]+ key [A-Za-z0-9+/=]{44}"#), "\(relay.stdout) \(relay.stderr)")
        let words = line.split(separator: " ")
        return (relay, String(words[2]), String(words[4]))
    }

    static func json(_ text: String) -> [String: Any]? {
        guard let start = text.firstIndex(of: "{") else { return nil }
        return try? JSONSerialization.jsonObject(with: Data(text[start...].utf8)) as? [String: Any]
    }

    /// The id of the room `creator` (a `tusa party create NAME`) made, once it says so.
    /// A relay with its rendezvous and parties on loopback, and the rendezvous' address.
    static func relayWithRendezvous() async throws -> (Harness.Background, String) {
        let (relay, _) = try #require(
            try await Harness.startRelay(["--listen", "127.0.0.1:0", "--rendezvous-port", "0", "--party-port", "0"]))
        guard let line = await relay.waitForMatch(#"rendezvous tcp 127\.0\.0\.1:[0-9]+"#) else {
            relay.kill()
            throw HarnessError("no rendezvous: \(relay.stdout) \(relay.stderr)")
        }
        return (relay, String(line.split(separator: " ")[2]))
    }

    /// `tusa keygen --out FILE`; the public key it prints.
    static func keygen(_ file: String) async throws -> String {
        let made = try await Harness.run(try #require(Harness.tusa), ["keygen", "--out", file])
        #expect(made.status == 0, "\(made.stderr)")
        return try #require(
            made.stdout.split(whereSeparator: \.isWhitespace).map(String.init).first { $0.count == 44 && $0.hasSuffix("=") },
            "\(made.stdout)")
    }

    static func room(createdBy creator: Harness.Background, named name: String) async throws -> String {
        let line = try #require(
            await creator.waitForMatch(#"party [a-z0-9]{12} ""# + name + #"" as #1"#), "\(creator.stdout) \(creator.stderr)")
        return String(line.split(separator: " ")[1])
    }

    /// The jitter buffers' floor in the four-member party (`--min-delay`). The path is
    /// clean, loopback, but the machine is not: five debug-build processes on a CI
    /// machine's two shared cores, where a member's or the relay's thread now and then
    /// waits 15-70 ms for a core (last CI: a speaker's packets 70 ms late at p95 in every
    /// listener's report). By default a listener plays as early as the path allows and
    /// waits for such a packet, mid-word, which PESQ punishes (worst pairs 2.8-4.1
    /// beside two CPU hogs); held 60 ms over the fastest packets, what a player on a busy machine sets,
    /// the test sees the room itself (forwarding, end-to-end sealing, mixing, the codec).
    /// What the default does on a busy machine is measured side by side with the floor
    /// in `Benchmarks/party-starvation.sh` (BENCHMARKS.md, "A party on a busy machine").
    static let heldMilliseconds = 60

    @Test(.enabled(if: ready, "\(needs)"))
    func fourMembersSpeakInTurnAndEveryoneHearsEveryoneClearly() async throws {
        let (scores, playout) = try await Self.speakInTurn(Array(repeating: [], count: 4))
        // Issue 15 asks 4.0 of every pair on a clean path. A shortfall names what each
        // listener's jitter buffer did (delay, concealment, stretching).
        for (pair, score) in scores.sorted(by: { $0.key < $1.key }) {
            #expect(score >= 4.0, "listener,speaker \(pair): PESQ \(score) (all: \(scores))\n\(playout)")
        }
    }

    /// Members choose their codec and frame each: a room of Opus at 20 and 10 ms,
    /// Speex and L16 at 10 ms. Each listener decodes each speaker as it encodes (the
    /// format rides with its sender key), so every pair is heard: scored against
    /// the codec's own quality (Speex narrowband is the floor, PESQ about 3.5 on a
    /// clean path), not against silence or noise, which a listener decoding a
    /// speaker with its own codec plays (PESQ near 1).
    @Test(.enabled(if: ready, "\(needs)"))
    func membersWithDifferentCodecsAndFramesHearEachOther() async throws {
        let codecs = [
            ["--codec", "opus"], ["--codec", "speex"], ["--codec", "opus", "--frame", "10"],
            ["--codec", "l16", "--frame", "10"],
        ]
        let (scores, playout) = try await Self.speakInTurn(
            codecs,
            reportedCodecs: [
                "opus 8000 Hz 20 ms", "speex 8000 Hz 20 ms", "opus 8000 Hz 10 ms", "l16 8000 Hz 10 ms",
            ])
        for (pair, score) in scores.sorted(by: { $0.key < $1.key }) {
            #expect(score >= 3.0, "listener,speaker \(pair): PESQ \(score) (all: \(scores))\n\(playout)")
        }
    }

    /// Members (one per entry of `extra`, their own options) speak the test's
    /// utterances in turn and record the room; every pair scored with PESQ, and
    /// each member's report of its speakers. With `reportedCodecs`, each listener's
    /// report must name speaker k's codec as `reportedCodecs[k]`.
    static func speakInTurn(_ extra: [[String]], reportedCodecs: [String]? = nil) async throws -> (
        scores: [String: Double], playout: String
    ) {
        let n = extra.count
        let tusa = try #require(Harness.tusa)
        let python = try #require(Harness.python)
        let dir = NSTemporaryDirectory() + "tusa-party-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let prepared = try await Harness.run(python, [Self.scorer, "prepare", dir, tusa] + Self.speech.prefix(n), timeout: 60)
        #expect(prepared.status == 0, "\(prepared.stderr)")
        let plan = try #require(Self.json(prepared.stdout), "\(prepared.stdout)")
        let total = try #require(plan["total"] as? Double)

        let (relay, address, key) = try await Self.relay()
        defer { relay.kill() }
        let common = { (k: Int) -> [String] in
            [
                "--relay", address, "--relay-key", key, "--in", "\(dir)/in-\(k).wav", "--out", "\(dir)/out-\(k).wav",
                "--duration", String(format: "%.1f", total + 1.5), "--json", "--quiet", "--min-delay", "\(Self.heldMilliseconds)",
            ] + extra[k]
        }
        let creator = try Harness.Background(tusa, ["party", "create", "Hearthstone"] + common(0))
        defer { creator.kill() }
        let room = try await Self.room(createdBy: creator, named: "Hearthstone")
        var members = [creator]
        for k in 1..<n {
            let m = try Harness.Background(tusa, ["party", "join", room] + common(k))
            members.append(m)
        }
        defer { for m in members { m.kill() } }
        var heard: [String] = []  // each member's report of its speakers, for a failure's message
        var reports: [[String: Any]] = []
        for (k, m) in members.enumerated() {
            #expect(await m.waitForExit(timeout: total + 30), "member \(k) did not leave")
            #expect(m.status == 0, "member \(k): \(m.stdout) \(m.stderr)")
            let report = try #require(Self.json(m.stdout), "member \(k): \(m.stdout)")
            reports.append(report)
            let speakers = try #require(report["speakers"] as? [[String: Any]])
            #expect(speakers.count == n - 1, "member \(k) heard \(speakers.count) speakers: \(report)")
            #expect((report["undecodable"] as? [Any])?.isEmpty == true, "member \(k): \(report)")
            heard.append("member \(k): \(speakers)")
            for s in speakers { #expect((s["lostPercent"] as? Double ?? 100) < 1, "member \(k): \(s)") }
        }
        if let reportedCodecs {
            // Joiners are numbered in the order their joins reached the relay: each report says its own number.
            let process = Dictionary(
                uniqueKeysWithValues: reports.enumerated().compactMap { k, r in (r["me"] as? Int).map { ($0, k) } })
            #expect(process.count == n, "\(reports)")
            for (k, report) in reports.enumerated() {
                for s in report["speakers"] as? [[String: Any]] ?? [] {
                    let speaker = (s["member"] as? Int).flatMap { process[$0] }
                    #expect(speaker.map { s["codec"] as? String == reportedCodecs[$0] } == true, "member \(k): \(s)")
                }
            }
        }
        // Every member heard every other one's utterance; PESQ of each against what was said.
        let scored = try await Harness.run(python, [Self.scorer, "score", dir, "\(n)"], timeout: 120)
        #expect(scored.status == 0, "\(scored.stderr)")
        let scores = try #require(
            (try? JSONSerialization.jsonObject(with: Data(scored.stdout.utf8))) as? [String: Double], "\(scored.stdout)")
        #expect(scores.count == n * (n - 1))
        return (scores, heard.joined(separator: "\n"))
    }

    /// A member whose standard input stays open (a terminal, or a pipe nobody closes)
    /// leaves when its stay ends, and at a `leave` typed there: reading the commands
    /// held up a thread that async code needs, and the member hung after its report
    /// until the input ended.
    @Test(.enabled(if: Harness.tusa != nil, "needs .build/debug/tusa"))
    func aMemberWithItsInputLeftOpenLeavesOnTime() async throws {
        let tusa = try #require(Harness.tusa)
        let (relay, address, key) = try await Self.relay()
        defer { relay.kill() }
        let common = ["--relay", address, "--relay-key", key, "--json", "--quiet", "--in", "tone"]
        let timed = try Harness.Background(tusa, ["party", "create", "Open"] + common + ["--duration", "2"], withInput: true)
        defer { timed.kill() }
        timed.send("mute\n")
        // (The relay by name: a name is resolved, not refused as "not HOST:PORT".)
        let byName = ["--relay", address.replacingOccurrences(of: "127.0.0.1", with: "localhost")]
        let told = try Harness.Background(tusa, ["party", "create", "Told"] + common + byName, withInput: true)
        defer { told.kill() }
        _ = try await Self.room(createdBy: told, named: "Told")
        told.send("leave\n")
        for (name, m) in [("timed", timed), ("told", told)] {
            #expect(await m.waitForExit(timeout: 20), "\(name) did not leave: \(m.stderr)")
            #expect(m.status == 0, "\(name): \(m.stdout) \(m.stderr)")
            #expect(Self.json(m.stdout)?["framesSent"] != nil, "\(name): \(m.stdout)")
        }
        // Joining needs the relay when no rendezvous places the room: the hint says so.
        #expect(timed.stdout.contains(" --relay \(address) --relay-key \(key)"), "\(timed.stdout)")
    }

    /// A member's `--impair` loses what it sends as a bad network would (the
    /// listener counts the loss), and `--loop` plays a one-second file for the
    /// whole stay; `--loop` without a file is a usage error.
    @Test(.enabled(if: Harness.tusa != nil, "needs .build/debug/tusa"))
    func impairedAndLoopingMembers() async throws {
        let tusa = try #require(Harness.tusa)
        let dir = NSTemporaryDirectory() + "tusa-party-impair-\(getpid())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let second = (0..<8000).map { Int16(8000 * sin(Double($0) * 2 * .pi * 440 / 8000)) }
        try WAVFile.write(path: "\(dir)/second.wav", samples: second, sampleRate: 8000)
        let someKey = String(repeating: "A", count: 43) + "="
        let usage = try await Harness.run(
            tusa, ["party", "create", "X", "--relay", "127.0.0.1:9", "--relay-key", someKey, "--in", "tone", "--loop"])
        #expect(usage.status == 64 && usage.stderr.contains("--loop"), "\(usage.status) \(usage.stderr)")
        let badSpec = try await Harness.run(
            tusa, ["party", "create", "X", "--relay", "127.0.0.1:9", "--relay-key", someKey, "--impair", "loss=x"])
        #expect(badSpec.status == 64 && badSpec.stderr.contains("--impair"), "\(badSpec.status) \(badSpec.stderr)")
        // More invited keys than a room's invite list holds.
        let invites = (0...PartyControl.maximumInvited).flatMap { _ in ["--invite", PrivateKey.generate().publicKey.base64] }
        let tooMany = try await Harness.run(
            tusa, ["party", "create", "X", "--relay", "127.0.0.1:9", "--relay-key", someKey] + invites)
        #expect(
            tooMany.status == 64 && tooMany.stderr.contains("at most \(PartyControl.maximumInvited) by key"),
            "\(tooMany.status) \(tooMany.stderr)")

        let (relay, address, key) = try await Self.relay()
        defer { relay.kill() }
        // Another key than the relay's: its handshake is dropped unanswered, and the
        // error says the key may be why (it said only "timed out").
        let wrongKey = try await Harness.run(
            tusa, ["party", "create", "X", "--relay", address, "--relay-key", someKey, "--in", "tone"], timeout: 30)
        #expect(wrongKey.status == 2 && wrongKey.stderr.contains("is the relay key its own?"), "\(wrongKey.stderr)")
        let common = ["--relay", address, "--relay-key", key, "--json", "--quiet"]
        let creator = try Harness.Background(
            tusa,
            ["party", "create", "Impaired"] + common + [
                "--in", "\(dir)/second.wav", "--loop", "--impair", "loss=30%,burst=3,seed=5", "--duration", "5",
            ])
        defer { creator.kill() }
        let room = try await Self.room(createdBy: creator, named: "Impaired")
        let listener = try Harness.Background(tusa, ["party", "join", room] + common + ["--duration", "6"])
        defer { listener.kill() }
        for (name, m) in [("creator", creator), ("listener", listener)] {
            #expect(await m.waitForExit(timeout: 30), "\(name) did not leave")
            #expect(m.status == 0, "\(name): \(m.stdout) \(m.stderr)")
        }
        let sent = try #require(Self.json(creator.stdout)?["framesSent"] as? Int, "\(creator.stdout)")
        #expect(sent > 200, "the one-second file played for the whole stay: \(sent) frames")
        let heard = try #require(
            (Self.json(listener.stdout)?["speakers"] as? [[String: Any]])?.first, "\(listener.stdout)")
        let packets = heard["packets"] as? Int ?? 0
        let lost = heard["lostPercent"] as? Double ?? 0
        #expect(packets > 100 && packets < sent * 85 / 100, "\(packets) of \(sent) arrived")
        #expect(lost > 15, "30 % imposed, \(lost) % counted: \(heard)")
    }

    /// `tusa relay --party-tls-port` with a self-signed certificate, and a member
    /// whose network passes only TLS: `--transport tls` to that port, in the same
    /// room as a member on UDP, each hearing the other; its report says tls. The
    /// port without a certificate, and `--transport tls` without `--relay` (a
    /// rendezvous names UDP addresses), are usage errors naming what is missing.
    @Test(.enabled(if: Harness.tusa != nil, "needs .build/debug/tusa"))
    func aMemberJoinsOverTLSOnTheRelaysOwnPort() async throws {
        let tusa = try #require(Harness.tusa)
        let bare = try await Harness.run(
            tusa, ["relay", "--listen", "127.0.0.1:0", "--party-port", "0", "--party-tls-port", "0"], timeout: 20)
        #expect(
            bare.status != 0 && bare.stderr.contains("--party-tls-port needs --party-cert and --party-pkey"), "\(bare.stderr)")

        let noRelay = try await Harness.run(
            tusa, ["party", "create", "X", "--rendezvous", "127.0.0.1:9", "--transport", "tls"], timeout: 20)
        #expect(noRelay.status == 64 && noRelay.stderr.contains("--transport tls needs --relay"), "\(noRelay.stderr)")

        let certificate = try TestCertificate.make()
        let (relay, address, key) = try await Self.relay([
            "--party-tls-port", "0", "--party-cert", certificate.certificateFile, "--party-pkey", certificate.privateKeyFile,
        ])
        defer { relay.kill() }
        let tlsLine = try #require(
            await relay.waitForMatch(#"party tls 127\.0\.0\.1:[0-9]+"#), "\(relay.stdout) \(relay.stderr)")
        let tlsAddress = String(tlsLine.split(separator: " ")[2])
        let common = ["--relay-key", key, "--in", "tone", "--json", "--quiet"]
        let creator = try Harness.Background(
            tusa, ["party", "create", "Overwatch", "--relay", address, "--duration", "5"] + common)
        defer { creator.kill() }
        let room = try await Self.room(createdBy: creator, named: "Overwatch")
        let member = try Harness.Background(
            tusa, ["party", "join", room, "--relay", tlsAddress, "--transport", "tls", "--duration", "3"] + common)
        defer { member.kill() }
        for (name, m) in [("creator", creator), ("member", member)] {
            #expect(await m.waitForExit(timeout: 30), "\(name) did not leave")
            #expect(m.status == 0, "\(name): \(m.stdout) \(m.stderr)")
        }
        let report = try #require(Self.json(member.stdout), "\(member.stdout)")
        #expect(report["transport"] as? String == "tls", "\(report)")
        for (name, m) in [("creator", creator), ("member", member)] {
            let heard = (Self.json(m.stdout)?["speakers"] as? [[String: Any]])?.first?["packets"] as? Int ?? 0
            #expect(heard > 50, "\(name) heard \(heard) packets: \(m.stdout)")
        }
    }

    /// A listener's playout plays as early as the path allows by default (as
    /// `--min-delay 0`) and `--min-delay 60` holds 60 ms over each speaker's fastest
    /// packets; out of range it is a usage error.
    @Test(.enabled(if: Harness.tusa != nil, "needs .build/debug/tusa"))
    func aListenersMinimumDelayHoldsItsPlayout() async throws {
        let tusa = try #require(Harness.tusa)
        let someKey = String(repeating: "A", count: 43) + "="
        let usage = try await Harness.run(
            tusa, ["party", "create", "X", "--relay", "127.0.0.1:9", "--relay-key", someKey, "--min-delay", "301"])
        #expect(usage.status == 64 && usage.stderr.contains("--min-delay"), "\(usage.status) \(usage.stderr)")

        let (relay, address, key) = try await Self.relay()
        defer { relay.kill() }
        let common = ["--relay", address, "--relay-key", key, "--json", "--quiet"]
        let creator = try Harness.Background(
            tusa, ["party", "create", "Held"] + common + ["--in", "tone", "--duration", "5"])
        defer { creator.kill() }
        let room = try await Self.room(createdBy: creator, named: "Held")
        var listeners: [(String, Harness.Background)] = []
        for (name, extra) in [("default", []), ("zero", ["--min-delay", "0"]), ("held", ["--min-delay", "60"])] {
            let m = try Harness.Background(tusa, ["party", "join", room] + common + extra + ["--duration", "4"])
            listeners.append((name, m))
        }
        defer { for (_, m) in listeners { m.kill() } }
        #expect(await creator.waitForExit(timeout: 30), "the creator did not leave")
        var delays: [String: Double] = [:]
        var targets: [String: Double] = [:]
        for (name, m) in listeners {
            #expect(await m.waitForExit(timeout: 30), "\(name) did not leave")
            #expect(m.status == 0, "\(name): \(m.stdout) \(m.stderr)")
            let heard = try #require(
                (Self.json(m.stdout)?["speakers"] as? [[String: Any]])?.first { $0["member"] as? Int == 1 }, "\(m.stdout)")
            #expect((heard["packets"] as? Int ?? 0) > 100, "\(name): \(heard)")
            #expect((heard["lostPercent"] as? Double ?? 100) < 1, "\(name): \(heard)")
            delays[name] = heard["delayMeanMilliseconds"] as? Double
            targets[name] = heard["targetDelayMilliseconds"] as? Double
        }
        let all = "waited \(delays), aimed at \(targets)"
        let byDefault = try #require(delays["default"])
        let zero = try #require(delays["zero"])
        let held = try #require(delays["held"])
        // The floor holds the playout point over the speaker's fastest packets: what the
        // buffer aims at is never below it.
        #expect(try #require(targets["held"]) >= 60, "\(all)")
        // Without a floor the delay is the path's: about 7 ms, more after packets came
        // late (the pulls that waited for them stay until a pause), so no bound but this.
        #expect(byDefault < 40, "by default: \(all)")
        #expect(zero < 40, "--min-delay 0: \(all)")
        // A packet waits the floor less its own lateness over the fastest (a few ms on a
        // busy machine, a sender's timer and four processes on two cores).
        #expect(held >= 45 && held < 90 && held - byDefault >= 20, "--min-delay 60: \(all)")
    }

    /// The relay is killed (SIGKILL) in the middle of a party and started again
    /// from the same identity file on the same port: both members notice, rejoin
    /// on their own and hear each other again until the end; neither is dropped.
    @Test(.enabled(if: Harness.tusa != nil, "needs .build/debug/tusa"))
    func membersRejoinARelayKilledAndRestartedMidParty() async throws {
        let tusa = try #require(Harness.tusa)
        let dir = NSTemporaryDirectory() + "tusa-party-restart-\(getpid())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let identity = "\(dir)/relay.key"
        let keygen = try await Harness.run(tusa, ["keygen", "--out", identity])
        #expect(keygen.status == 0, "\(keygen.stderr)")
        let port = Harness.freePort()
        var (relay, address, key) = try await Self.relay(["--identity", identity], partyPort: port)
        defer { relay.kill() }
        let common = ["--relay", address, "--relay-key", key, "--in", "tone", "--duration", "14", "--json"]
        let creator = try Harness.Background(tusa, ["party", "create", "Valheim"] + common)
        defer { creator.kill() }
        let room = try await Self.room(createdBy: creator, named: "Valheim")
        let joiner = try Harness.Background(tusa, ["party", "join", room] + common)
        defer { joiner.kill() }
        _ = try #require(await joiner.waitForMatch(##"as #2"##), "\(joiner.stdout) \(joiner.stderr)")
        try await Task.sleep(for: .seconds(2))

        relay.kill()
        #expect(await relay.waitForExit(timeout: 5))
        (relay, _, _) = try await Self.relay(["--identity", identity], partyPort: port)
        let restarted = ContinuousClock.now
        for (name, m) in [("creator", creator), ("joiner", joiner)] {
            #expect(await m.waitFor(timeout: 10) { _, err in err.contains("rejoined") }, "\(name): \(m.stderr)")
            #expect(m.stderr.contains("lost the relay"), "\(name): \(m.stderr)")
            #expect(!m.stderr.contains("rejoined as"), "\(name) lost its seat: \(m.stderr)")
        }
        print("tusa party: both members rejoined \(ContinuousClock.now - restarted) after the relay restarted")
        for (name, m) in [("creator", creator), ("joiner", joiner)] {
            #expect(await m.waitForExit(timeout: 30), "\(name) did not leave")
            #expect(m.status == 0, "\(name): \(m.stdout) \(m.stderr)")
            let report = try #require(Self.json(m.stdout), "\(name): \(m.stdout)")
            let speakers = try #require(report["speakers"] as? [[String: Any]], "\(report)")
            #expect(speakers.count == 1, "\(name): \(report)")
            // About 2 s heard before the kill; most of the rest after the rejoin.
            let packets = speakers.first?["packets"] as? Int ?? 0
            #expect(packets > 350, "\(name) heard \(packets) packets: \(report)")
        }
    }

    /// A relay's own rendezvous lists the relay's rooms as a directory does: Alice's
    /// friend (a contact of hers) sees her open room and who is in it, a stranger does not.
    @Test(.enabled(if: Harness.tusa != nil, "needs .build/debug/tusa"))
    func aRelaysOwnRendezvousListsAFriendsParty() async throws {
        let tusa = try #require(Harness.tusa)
        let (relay, rendezvous) = try await Self.relayWithRendezvous()
        defer { relay.kill() }
        let dir = NSTemporaryDirectory() + "tusa-friends-\(getpid())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var keys: [String: String] = [:]
        for name in ["alice", "friend", "stranger"] { keys[name] = try await Self.keygen("\(dir)/\(name).key") }
        let me = { (name: String) in ["--rendezvous", rendezvous, "--identity", "\(dir)/\(name).key"] }
        let added = try await Harness.run(tusa, ["contacts", "add", keys["friend"] ?? ""] + me("alice"))
        #expect(added.status == 0, "\(added.stderr)")
        let alice = try Harness.Background(
            tusa, ["party", "create", "Factorio", "--in", "silence", "--duration", "20", "--quiet"] + me("alice"))
        defer { alice.kill() }
        let room = try await Self.room(createdBy: alice, named: "Factorio")
        func list(_ name: String) async throws -> String {
            let deadline = ContinuousClock.now + .seconds(10)
            while true {
                let r = try await Harness.run(tusa, ["party", "list"] + me(name), timeout: 30)
                #expect(r.status == 0, "\(r.stderr)")
                if r.stdout.contains(room) || ContinuousClock.now > deadline { return r.stdout }
                try await Task.sleep(for: .milliseconds(500))
            }
        }
        let friend = try await list("friend")
        #expect(
            friend.contains("party Factorio \(room) by \(keys["alice"] ?? "?")") && friend.contains("1 of at most 50 in it"),
            "\(friend)")
        #expect(!(try await list("stranger")).contains(room))
    }

    /// Invitations as users meet them: Alice creates a party inviting Bob while Bob
    /// is away; `tusa party list` shows it when he comes; `tusa party watch --join`
    /// joins the next one the moment it arrives (skipping the closed one).
    @Test(.enabled(if: Harness.tusa != nil, "needs .build/debug/tusa"))
    func invitationsReachTheInvitedNowOrLater() async throws {
        let tusa = try #require(Harness.tusa)
        let (relay, rendezvous) = try await Self.relayWithRendezvous()
        defer { relay.kill() }
        let dir = NSTemporaryDirectory() + "tusa-invite-\(getpid())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let bobFile = "\(dir)/bob.key"
        let bob = try await Self.keygen(bobFile)

        // Bob is away: the invitation waits at the rendezvous.
        let first = try await Harness.run(
            tusa, ["party", "create", "Hearthstone", "--rendezvous", rendezvous, "--invite", bob, "--duration", "1", "--quiet"],
            timeout: 30)
        #expect(first.status == 0, "\(first.stdout) \(first.stderr)")
        #expect(first.stdout.contains("invited \(bob)"), "\(first.stdout)")
        let room = try #require(first.stdout.split(separator: " ").dropFirst().first.map(String.init))
        let list = try await Harness.run(tusa, ["party", "list", "--rendezvous", rendezvous, "--identity", bobFile], timeout: 30)
        #expect(list.status == 0, "\(list.stderr)")
        #expect(list.stdout.contains("created party Hearthstone: tusa party join \(room)"), "\(list.stdout)")
        #expect(list.stdout.contains("\n  closed"), "the room ended with its creator's stay: \(list.stdout)")

        // A room that is open: the list shows who is in it, asked of its relay.
        let alice = try Harness.Background(
            tusa,
            [
                "party", "create", "Factorio", "--rendezvous", rendezvous, "--invite", bob, "--in", "silence",
                "--duration", "20", "--quiet",
            ])
        defer { alice.kill() }
        let openRoom = try await Self.room(createdBy: alice, named: "Factorio")
        let aliceKey = try #require(
            alice.stdout.split(separator: "\n").first { $0.contains("creator") }?.split(separator: " ").dropFirst().first,
            "\(alice.stdout)")
        #expect(await alice.waitFor(timeout: 10) { out, _ in out.contains("invited \(bob)") })
        let listed = try await Harness.run(
            tusa, ["party", "list", "--rendezvous", rendezvous, "--identity", bobFile], timeout: 30)
        #expect(listed.status == 0, "\(listed.stderr)")
        let factorio = try #require(
            listed.stdout.components(separatedBy: "tusa party join \(openRoom)").last, "\(listed.stdout)")
        #expect(factorio.contains("1 of at most 50 in it:"), "\(listed.stdout)")
        #expect(factorio.contains("#1 \(aliceKey)") && factorio.contains("creator"), "\(listed.stdout)")
        // Ctrl-C: Alice leaves (her room closes at once) and still reports.
        #expect(await alice.stop(signal: SIGINT) == 0, "\(alice.stdout) \(alice.stderr)")
        #expect(alice.stdout.contains("frames sent as #1"), "the report: \(alice.stdout)")

        // Bob watches; Alice creates another party; Bob joins it (the first has closed).
        let watcher = try Harness.Background(
            tusa,
            [
                "party", "watch", "--rendezvous", rendezvous, "--identity", bobFile, "--join", "--timeout", "20",
                "--duration", "3", "--json", "--quiet",
            ])
        defer { watcher.kill() }
        _ = try #require(await watcher.waitForMatch("watching as"), "\(watcher.stdout) \(watcher.stderr)")
        let second = try await Harness.run(
            tusa,
            [
                "party", "create", "Dota 2", "--rendezvous", rendezvous, "--invite", bob, "--in", "tone", "--duration", "5",
                "--json", "--quiet",
            ], timeout: 30)
        #expect(second.status == 0, "\(second.stdout) \(second.stderr)")
        #expect(await watcher.waitForExit(timeout: 20))
        #expect(watcher.status == 0, "\(watcher.stdout) \(watcher.stderr)")
        #expect(watcher.stdout.contains("created party Dota 2"), "\(watcher.stdout)")
        #expect(watcher.stderr.contains("no-such-room"), "the closed room: \(watcher.stderr)")
        let report = try #require(Self.json(watcher.stdout), "\(watcher.stdout)")
        let heard = try #require(report["speakers"] as? [[String: Any]], "\(report)")
        #expect(heard.count == 1 && (heard.first?["packets"] as? Int ?? 0) > 50, "\(report)")
    }

    /// Invitations the rendezvous refuses (a sender reaches ten strangers at once) are
    /// said one by one, and the exit status tells a script that not everyone invited
    /// was told, though the stay itself went as asked.
    @Test(.enabled(if: Harness.tusa != nil, "needs .build/debug/tusa"))
    func invitationsTheRendezvousRefusesEndInExitStatus3() async throws {
        let tusa = try #require(Harness.tusa)
        let (relay, rendezvous) = try await Self.relayWithRendezvous()
        defer { relay.kill() }
        let strangers = (0..<12).map { _ in PrivateKey.generate().publicKey.base64 }
        let run = try await Harness.run(
            tusa,
            ["party", "create", "Civilization", "--rendezvous", rendezvous, "--duration", "1", "--quiet"]
                + strangers.flatMap { ["--invite", $0] },
            timeout: 30)
        let told = strangers.filter { run.stdout.contains("invited \($0)") }
        let refused = strangers.filter { run.stderr.contains("cannot invite \($0)") }
        #expect(told.count == 10 && refused.count == 2, "\(run.stdout) \(run.stderr)")
        #expect(run.stderr.contains("2 of 12 invited keys were let in but not told"), "\(run.stderr)")
        #expect(run.status == 3, "\(run.stdout) \(run.stderr)")
    }
}
