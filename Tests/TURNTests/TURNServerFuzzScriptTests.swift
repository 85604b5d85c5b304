import STUN
import TURN
import Testing
import TusaBase

/// The authenticating TURN server under the STUNFuzz target's scripts
/// (`TURNServerFuzzChecks`): its seeds reach the paths they are for without a
/// broken check, and so do a few thousand random scripts.
struct TURNServerFuzzScriptTests {
    @Test func seedsRelayBothWaysAndLeaveNothingBehind() {
        let seeds = TURNServerFuzzChecks.seeds().map { Array($0.dropFirst()) }
        #expect(TURNServerFuzzChecks.seeds().allSatisfy { $0.first == TURNServerFuzzChecks.marker })
        let session = TURNServerFuzzChecks.run(seeds[0])
        #expect(session.violations == [])
        // Four clients (static and REST users; UDP, TCP, TLS over IPv6) each
        // allocate, permit, bind and relay both ways.
        #expect(session.allocations == 4)
        #expect(session.permissions == 4)
        #expect(session.channels == 4)
        #expect(session.toPeer >= 6)
        #expect(session.toClient >= 6)
        #expect(session.signedAnswers >= 10)

        for seed in seeds.dropFirst() {
            let summary = TURNServerFuzzChecks.run(seed)
            #expect(summary.violations == [], "seed \(seed)")
            #expect(summary.emptied >= 1, "every other seed ends with a check that nothing is left")
        }
        // A port held and redeemed by the same user at its quota, and another user.
        #expect(TURNServerFuzzChecks.run(seeds[2]).allocations >= 3)
        // A signed Allocate read from the input, its retransmission signed with
        // SHA-256, and the same sent as it is (refused: no credentials).
        let read = TURNServerFuzzChecks.run(seeds[4])
        #expect(read.allocations == 1)
        #expect(read.signedAnswers == 2)
    }

    /// Carol's REST username lapses 700 s in: after that her requests are refused.
    @Test func aLapsedRESTUsernameIsRefused() {
        let allocate: UInt8 = 0x00 | 3 << 3
        let fresh = TURNServerFuzzChecks.run([allocate, 0x00])
        #expect(fresh.allocations == 1)
        let lapsed = TURNServerFuzzChecks.run([0x05 | 6 << 5, 0x05 | 5 << 5, allocate, 0x00])
        #expect(lapsed.violations == [])
        #expect(lapsed.allocations == 0)
        #expect(lapsed.signedAnswers == 0)
    }

    @Test func randomScriptsBreakNoCheck() {
        var random = SplitMix64(seed: 0x7475_7361)
        var reached = TURNServerFuzzChecks.run([])
        for _ in 0..<2000 {
            // Steps of two bytes (an operation and its argument), mostly requests
            // and relaying by two clients, so that scripts get past allocating.
            let kinds: [UInt8] = [0, 0, 0, 0, 0, 0, 2, 2, 3, 3, 3, 5, 1, 4, 6, 7]
            let script = (0..<Int(random.next() % 80)).flatMap { _ -> [UInt8] in
                let kind = kinds[Int(random.next() % UInt64(kinds.count))]
                let tuple = UInt8(random.next() % (random.next() % 4 == 0 ? 4 : 2))
                let variant = UInt8(random.next() % (kind == 0 ? 5 : 8))
                var argument = UInt8(truncatingIfNeeded: random.next())
                // Allocate with UDP (reservations, tokens and families included); permit mostly IPv4 peers.
                if kind == 0 && variant == 0 { argument &= 0x7E }
                if kind == 0 && variant == 2 && argument & 0x40 == 0 { argument &= 0x33 }
                return kind == 3
                    ? [kind | variant << 5, argument % 4, argument] : [kind | tuple << 3 | variant << 5, argument & 0x3F]
            }
            let summary = TURNServerFuzzChecks.run(script)
            #expect(summary.violations == [], "script \(script)")
            if !summary.violations.isEmpty { return }
            reached.allocations += summary.allocations
            reached.permissions += summary.permissions
            reached.channels += summary.channels
            reached.toPeer += summary.toPeer
            reached.toClient += summary.toClient
            reached.emptied += summary.emptied
        }
        // (The script is the same each run: these are what it reaches, halved.)
        #expect(reached.allocations > 1000)
        #expect(reached.permissions > 50)
        #expect(reached.channels > 50)
        #expect(reached.toPeer > 8)
        #expect(reached.toClient > 15)
        #expect(reached.emptied > 1000)
    }
}
