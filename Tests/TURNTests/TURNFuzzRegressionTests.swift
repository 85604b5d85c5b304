import Foundation
import STUN
import TURN
import TestSupport
import Testing
import TusaBase

/// The TURN half of the STUNFuzz target: every shared fuzz seed and every input
/// the fuzzer ever crashed on (pinned in `Tests/STUNTests/FuzzCrashes/`) goes
/// through the TURN server and client cores' checks.
struct TURNFuzzRegressionTests {
    static let crashes = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("STUNTests/FuzzCrashes")
    static let pinned: [String] = ((try? FileManager.default.contentsOfDirectory(atPath: crashes.path)) ?? [])
        .filter { $0 != "README.md" }.sorted()
    static let seeds = SharedCorpus.isPresent ? SharedCorpus.files("fuzz-seeds").map(\.lastPathComponent) : []

    @Test(arguments: pinned)
    func pinnedCrashInputStaysFixed(name: String) throws {
        TURNFuzzChecks.exercise(Array(try Data(contentsOf: Self.crashes.appendingPathComponent(name))))
    }

    @Test(.enabled(if: SharedCorpus.isPresent, SharedCorpus.absentMessage), arguments: seeds)
    func fuzzSeedsNeverTrap(name: String) throws {
        TURNFuzzChecks.exercise(try SharedCorpus.bytes("fuzz-seeds", name))
    }

    /// Requests cut at every byte and corrupted at every byte reach the TURN cores' checks.
    @Test func truncationsOfAnAllocateNeverTrap() throws {
        let key = try IntegrityKey.longTerm(username: "alice", realm: "example.org", password: "wonderland")
        let full = Message(
            type: MessageType(method: .allocate, class: .request),
            attributes: [
                .requestedTransport(17), .username("alice"), .realm("example.org"), .nonce("n"), .lifetime(600),
            ]
        ).encode(integrity: key, fingerprint: true)
        for n in 0...full.count { TURNFuzzChecks.exercise(Array(full.prefix(n))) }
        for i in full.indices {
            var bad = full
            bad[i] ^= 0xA5
            TURNFuzzChecks.exercise(bad)
        }
    }
}
