import Testing
import TusaBase

@testable import Secure

/// Live sessions under the SecureFuzz target's scripts (`SecureSessionFuzzChecks`):
/// its seeds reach what they are for without a broken check, and so do random scripts.
struct SecureSessionFuzzScriptTests {
    @Test func seedsReachTheirPathsWithoutABrokenCheck() {
        let seeds = SecureSessionFuzzChecks.seeds()
        #expect(seeds.allSatisfy { $0.first == SecureSessionFuzzChecks.marker })
        let runs = seeds.map { SecureSessionFuzzChecks.run(Array($0.dropFirst())) }
        for run in runs { #expect(run.violations == []) }
        // Talk both ways, and a report from each side read from the input.
        #expect(runs[0].opened == 3)
        #expect(runs[0].reports >= 2)
        // Reordered and duplicated (no replay opens), lost, corrupted (no forgery opens).
        #expect(runs[1].opened == 3 + 1 + 2)
        #expect(runs[2].moves >= 1)
        #expect(runs[2].opened >= 7)
        // Minutes of talk: the keys were made again, and nobody was given up.
        #expect(runs[3].establishments >= 4)
        #expect(runs[3].gone == 0)
        // Silence past the peer timeout: given up (what is said then is not sent but starts
        // a handshake), then the session comes back.
        #expect(runs[4].gone >= 1)
        #expect(runs[4].establishments >= 4)
        #expect(runs[4].opened == 3 + 0 + 3)
    }

    @Test func randomScriptsBreakNoCheck() {
        var random = SplitMix64(seed: 0x5EC)
        var opened = 0
        var establishments = 0
        for _ in 0..<400 {
            let script = (0..<Int(random.next() % 120)).map { _ in UInt8(truncatingIfNeeded: random.next()) }
            let summary = SecureSessionFuzzChecks.run(script)
            #expect(summary.violations == [], "script \(script)")
            if !summary.violations.isEmpty { return }
            opened += summary.opened
            establishments += summary.establishments
        }
        #expect(opened > 200)
        #expect(establishments > 800)
    }
}
