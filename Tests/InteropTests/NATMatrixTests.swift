import Foundation
import Testing

/// `tusa call` through real kernel NAT: network namespaces, veth links and
/// nftables routers (scripts/nat-matrix.sh), `tusa relay` on the "internet"
/// between the peers: endpoint-independent and symmetric NATs, a network that
/// blocks UDP, a NAT rebinding, a relay restart and a move to a new address mid-call. Each case asserts the
/// path ICE chose and that voice flowed both ways. Where namespaces or nftables are not usable (not root, no
/// `ip netns`, no `nft`), the suite is skipped and says why.
@Suite(.serialized) struct NATMatrixTests {
    static let script = Harness.packageRoot.appendingPathComponent("scripts/nat-matrix.sh").path

    /// nil when the matrix can run here, else why not.
    static let unavailable: String? = {
        guard Harness.tusa != nil else { return "needs .build/debug/tusa" }
        guard let probe = try? Harness.runBlocking("/bin/bash", [script, "--probe"], timeout: 20) else {
            return "cannot run \(script)"
        }
        return probe.status == 0 ? nil : probe.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }()

    struct Outcome {
        var caller: [String: Any]
        var callee: [String: Any]
        var line: String
        /// The callee's standard error (at info level in the move case).
        var calleeLog: String
    }

    static func run(_ name: String) async throws -> Outcome {
        let out = NSTemporaryDirectory() + "tusa-nat-\(getpid())-\(name)"
        defer { try? FileManager.default.removeItem(atPath: out) }
        let r = try await Harness.run("/bin/bash", [script, "-o", out, name], timeout: 60)
        #expect(r.status == 0 && !r.timedOut, "\(r.stdout) \(r.stderr.suffix(3000))")
        func report(_ side: String) throws -> [String: Any] {
            let data = try Data(contentsOf: URL(fileURLWithPath: "\(out)/\(name)-\(side).json"))
            return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any], "\(r.stdout)")
        }
        let line = r.stdout.split(separator: "\n").first { $0.hasPrefix("\(name): ") }.map(String.init) ?? r.stdout
        let log = (try? String(contentsOfFile: "\(out)/\(name)-callee.log", encoding: .utf8)) ?? ""
        return Outcome(caller: try report("caller"), callee: try report("callee"), line: line, calleeLog: log)
    }

    /// Voice went both ways: each side received nearly all the other sent.
    /// Both sides report this path ("direct" or "relayed").
    static func expectPath(_ path: String, _ o: Outcome) {
        #expect(o.caller["path"] as? String == path && o.callee["path"] as? String == path, "\(o.line)")
    }

    static func expectVoiceBothWays(_ o: Outcome) throws {
        let sentByCaller = try #require(o.caller["packetsSent"] as? Int)
        let sentByCallee = try #require(o.callee["packetsSent"] as? Int)
        #expect(sentByCaller > 150 && sentByCallee > 150, "\(o.line)")
        #expect(try #require(o.callee["packetsReceived"] as? Int) >= sentByCaller - 10, "\(o.line)")
        #expect(try #require(o.caller["packetsReceived"] as? Int) >= sentByCallee - 60, "\(o.line)")
        #expect(o.caller["ended"] as? String == "time-limit" && o.callee["ended"] as? String == "remote-hangup", "\(o.line)")
    }

    @Test(.enabled(if: unavailable == nil, "\(unavailable ?? "")"))
    func endpointIndependentNATsOnBothSidesConnectDirectly() async throws {
        let o = try await Self.run("eim")
        Self.expectPath("direct", o)
        #expect(try #require(o.caller["connectMilliseconds"] as? Double) < 2000, "\(o.line)")
        try Self.expectVoiceBothWays(o)
    }

    @Test(.enabled(if: unavailable == nil, "\(unavailable ?? "")"))
    func aSymmetricNATOnOneSideStillConnects() async throws {
        let o = try await Self.run("sym1")
        // Direct only through a peer-reflexive pair (when the other NAT's filtering lets
        // it), else through the relay; both sides agree either way.
        let path = try #require(o.caller["path"] as? String)
        #expect(path == "relayed" || (o.caller["candidatePair"] as? String)?.contains("prflx") == true, "\(o.line)")
        #expect(o.callee["path"] as? String == path, "\(o.line)")
        try Self.expectVoiceBothWays(o)
    }

    /// A's network lets no UDP out: A allocates over TURN/TCP, the relay talks UDP
    /// to B, and the call is relayed.
    @Test(.enabled(if: unavailable == nil, "\(unavailable ?? "")"))
    func aNetworkThatBlocksUDPIsReachedThroughTURNOverTCP() async throws {
        let o = try await Self.run("udp-blocked")
        Self.expectPath("relayed", o)
        #expect((o.callee["candidatePair"] as? String)?.hasPrefix("relay") == true, "\(o.line)")
        try Self.expectVoiceBothWays(o)
    }

    /// Mid-call (3 s in), A's NAT forgets its UDP mappings and maps from another
    /// port range; B's NAT then drops what A sends from the new port, and A's NAT
    /// what B sends to the old one. After 100 ms of silence each side asks the
    /// relay for its own address and tells the other through the rendezvous; B
    /// probes A's new mapping, which opens B's NAT to it, and A's media, now let
    /// through, moves B's session there (the roaming rule). The target: at most
    /// 200 ms of audio lost each way (10 frames of 20 ms), without an ICE restart.
    @Test(.enabled(if: unavailable == nil, "\(unavailable ?? "")"))
    func aNATRebindingMidCallCostsAtMost200Milliseconds() async throws {
        let o = try await Self.run("roam")
        #expect(o.caller["ended"] as? String == "time-limit", "\(o.line)")
        let sentByCaller = try #require(o.caller["packetsSent"] as? Int)
        let sentByCallee = try #require(o.callee["packetsSent"] as? Int)
        #expect(sentByCaller > 400 && sentByCallee > 400, "\(o.line)")
        #expect(try #require(o.callee["packetsReceived"] as? Int) >= sentByCaller - 10, "\(o.line)")
        #expect(try #require(o.caller["packetsReceived"] as? Int) >= sentByCallee - 10, "\(o.line)")
        #expect(o.caller["addressChanges"] as? Int == 1, "B's session moved to A's new mapping: \(o.line)")
        let restarts = (o.caller["iceRestarts"] as? Int ?? 0) + (o.callee["iceRestarts"] as? Int ?? 0)
        #expect(restarts == 0, "the probe, not a restart, brought the path back: \(o.line)")
    }

    /// Mid-call the relay process is killed and started again: the relayed path and
    /// both rendezvous registrations are gone. The peers register again, allocate
    /// anew, restart ICE and talk on through the new allocations.
    @Test(.enabled(if: unavailable == nil, "\(unavailable ?? "")"))
    func aRelayRestartMidCallIsSurvivedByReallocating() async throws {
        let o = try await Self.run("relay-restart")
        #expect(o.caller["path"] as? String == "relayed", "\(o.line)")
        try Self.expectRecovered(o)
    }

    /// Mid-call A's host gets a new address and loses its old one (a move to
    /// another network). A sees its addresses change and restarts ICE at once,
    /// over a new rendezvous connection (the old one left with the old address),
    /// without waiting for the peer to fall silent: the call loses well under the
    /// 2 s that a silence-triggered restart costs.
    @Test(.enabled(if: unavailable == nil, "\(unavailable ?? "")"))
    func aMoveToANewAddressRestartsICEAtOnce() async throws {
        let o = try await Self.run("move")
        try Self.expectRecovered(o)
        #expect(o.calleeLog.contains("our addresses changed: ICE restart"), "\(o.calleeLog.suffix(2000))")
        #expect(o.calleeLog.contains("registered again at the rendezvous"), "\(o.calleeLog.suffix(2000))")
        // A silence-triggered restart loses ~110 frames each way; a second's worth (50) is the bound here.
        let sentByCaller = try #require(o.caller["packetsSent"] as? Int)
        let sentByCallee = try #require(o.callee["packetsSent"] as? Int)
        #expect(try #require(o.callee["packetsReceived"] as? Int) >= sentByCaller - 50, "\(o.line)")
        #expect(try #require(o.caller["packetsReceived"] as? Int) >= sentByCallee - 50, "\(o.line)")
    }

    static func expectRecovered(_ o: Outcome) throws {
        let restarts = (o.caller["iceRestarts"] as? Int ?? 0) + (o.callee["iceRestarts"] as? Int ?? 0)
        #expect(restarts >= 1, "\(o.line)")
        #expect(o.caller["ended"] as? String == "time-limit", "\(o.line)")
        // 3 s before the event are ~150 packets; the rest of the 10 s call came after it.
        #expect(try #require(o.caller["packetsReceived"] as? Int) > 300, "\(o.line)")
        #expect(try #require(o.callee["packetsReceived"] as? Int) > 300, "\(o.line)")
    }

    @Test(.enabled(if: unavailable == nil, "\(unavailable ?? "")"))
    func symmetricNATsOnBothSidesGoThroughTheRelay() async throws {
        let o = try await Self.run("sym2")
        Self.expectPath("relayed", o)
        // The target: under 2 s from dialing to audio through symmetric NATs.
        #expect(try #require(o.caller["dialToFirstAudioMilliseconds"] as? Double) < 2000, "\(o.line)")
        try Self.expectVoiceBothWays(o)
    }

    /// A party through real NAT: A behind a symmetric NAT on UDP, B on a network
    /// that blocks UDP and drops 5 % of TCP segments, over TCP (happy eyeballs
    /// found UDP silent); each hears the other, and B's playout delay stays within
    /// the 400 ms mouth-to-ear budget (the namespaces add no latency: what is
    /// measured is what TCP's stalls and the jitter buffer add).
    @Test(.enabled(if: unavailable == nil, "\(unavailable ?? "")"))
    func aPartyReachesAMemberBehindSymmetricNATAndOneWhoseUDPIsBlocked() async throws {
        let o = try await Self.run("party")
        #expect(o.caller["transport"] as? String == "udp", "\(o.line)")
        #expect(o.callee["transport"] as? String == "tcp", "\(o.line)")
        for (who, report) in [("A", o.caller), ("B", o.callee)] {
            let speakers = try #require(report["speakers"] as? [[String: Any]], "\(who): \(o.line)")
            #expect(speakers.count == 1, "\(who) heard \(speakers.count) speakers: \(o.line)")
            let heard = speakers.first ?? [:]
            #expect(heard["packets"] as? Int ?? 0 > 150, "\(who): \(o.line)")
            #expect(heard["lostPercent"] as? Double ?? 100 < 3, "\(who): \(o.line)")
            // Issue 15: below 400 ms mouth-to-ear at p95. What the stack adds besides the
            // playout (a frame, the codec, the relay) is 35 ms at most on loopback
            // (BENCHMARKS.md, "Mouth-to-ear through the relay": 35.1 ms median with the
            // playout in it), so the playout may take the rest. A fixed 300 failed once in
            // CI at 310.5 ms (each segment TCP sends again waits at least its 200 ms RTO).
            #expect(heard["delayP95Milliseconds"] as? Double ?? 1000 < 400 - 35, "\(who): \(o.line)")
        }
    }

    /// The same party, B's network passing no TCP at all for 1.5 s (a link that hangs):
    /// TCP then hands over the whole backlog at once. Each side's playout drops what is
    /// above its 400 ms cap, no packet waits longer than the cap, and 6 s later the
    /// delay is back down (what is left over the target comes off in pauses, up to 60 ms,
    /// and B's tone has none: hence A's bound).
    @Test(.enabled(if: unavailable == nil, "\(unavailable ?? "")"))
    func aPartyMemberWhoseTCPStallsCatchesUpAfterwards() async throws {
        let o = try await Self.run("party-stall")
        #expect(o.caller["transport"] as? String == "udp", "\(o.line)")
        #expect(o.callee["transport"] as? String == "tcp", "\(o.line)")
        var dropped = 0.0
        for (who, report) in [("A", o.caller), ("B", o.callee)] {
            let speakers = try #require(report["speakers"] as? [[String: Any]], "\(who): \(o.line)")
            #expect(speakers.count == 1, "\(who) heard \(speakers.count) speakers: \(o.line)")
            let heard = speakers.first ?? [:]
            #expect(heard["packets"] as? Int ?? 0 > 400, "\(who): \(o.line)")
            #expect(heard["delayMaxMilliseconds"] as? Double ?? 1000 <= 400 + 20, "\(who): \(o.line)")
            #expect(heard["delayAtEndMilliseconds"] as? Double ?? 1000 < 150, "\(who): \(o.line)")
            dropped += heard["catchUpDroppedMilliseconds"] as? Double ?? 0
        }
        // The stall was real: its backlog came, and went over the cap.
        #expect(dropped >= 500, "\(o.line)")
    }
}
