import Foundation
import TestSupport
import Testing
import TusaBase

@testable import STUN

/// Every input the fuzzer ever crashed on stays fixed: each file in
/// FuzzCrashes/ runs through the same checks as the fuzz target.
struct FuzzRegressionTests {
    static let pinned = PinnedFuzzInputs(besideTestFile: #filePath)

    @Test(arguments: pinned.names)
    func pinnedCrashInputStaysFixed(name: String) throws {
        FuzzChecks.exercise(try Self.pinned.bytes(name))
    }

    /// Inputs shaped like the bugs fuzzers find in STUN parsers: lengths that
    /// overrun, attributes cut at every byte, integrity at the very end.
    @Test func truncationsOfAValidMessageNeverTrap() throws {
        let key = try IntegrityKey.shortTerm(password: "pw")
        let full = Message(
            type: .bindingRequest,
            attributes: [
                .username("u:v"), .priority(1), .xorMappedAddress(TransportAddress("[::1]:1")!), .changeRequest([.changeIP]),
                .padding([0, 0, 0]),
            ]
        ).encode(integrity: key, fingerprint: true)
        for n in 0...full.count {
            var cut = Array(full.prefix(n))
            FuzzChecks.exercise(cut)
            if n < full.count { #expect(throws: STUNError.self) { try Message(decoding: cut) } }
            // And with the length field claiming the full size.
            if cut.count >= 4 {
                cut.writeUInt16(UInt16(max(0, cut.count - 20)), at: 2)
                FuzzChecks.exercise(cut)
            }
        }
        // Every single-byte corruption.
        for i in full.indices {
            var bad = full
            bad[i] ^= 0xA5
            FuzzChecks.exercise(bad)
        }
    }
}
