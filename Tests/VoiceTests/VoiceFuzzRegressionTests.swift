import Foundation
import TestSupport
import Testing

@testable import Voice

/// Every input VoiceFuzz ever crashed on stays fixed, and the checks hold for
/// streams a peer could send: packets half a frame apart, a timestamp a tick on,
/// timestamps going back, redundant audio, real encoded speech cut and changed.
struct VoiceFuzzRegressionTests {
    static let pinned = PinnedFuzzInputs(besideTestFile: #filePath)

    @Test(arguments: pinned.names)
    func pinnedCrashInputStaysFixed(name: String) throws {
        VoiceFuzzChecks.exercise(try Self.pinned.bytes(name))
    }

    /// The input format reads as documented: the fields of each control bit.
    @Test func theInputReadsAsPackets() {
        // A frame on; then +3 with the sequence +5 and 16 samples rendered, in a burst;
        // then back 2, redundant, 60 ms on; then an absolute timestamp, 10 ms back.
        let input: [UInt8] =
            [0x60, 2, 0xAA, 0xBB] + [0x3A, 3, 5, 2, 1, 0xCC] + [0xE5, 2, 0] + [0x06, 0x12, 0x34, 0x56, 0x78, 0]
        let packets = VoiceFuzzChecks.packets(input)
        #expect(packets.map(\.timestamp) == [1_160, 1_163, 1_161, 0x1234_5678])
        #expect(packets.map { ($0.arrivalNanoseconds - 1_000_000_000) / 1_000_000 } == [20, 20, 80, 70])
        #expect(packets.map(\.sequence) == [2, 7, 8, 9])
        #expect(packets.map(\.payload) == [[0xAA, 0xBB], [0xCC], [], []])
        #expect(packets.map(\.redundant) == [false, false, true, false])
        #expect(packets.map(\.render) == [0, 16, 0, 0])
    }

    @Test func streamsAPeerCouldSendPassTheChecks() throws {
        // The fuzzer's seeds (real Opus, Speex and L16 streams, packets half a frame and
        // a tick apart, back and forth, redundant audio whole and cut short), and the
        // Opus stream cut short and with bytes changed.
        let seeds = VoiceFuzzChecks.seeds()
        let speech = try #require(seeds.first)
        var inputs: [[UInt8]] = [[], [0x00], [0x02, 1, 0]] + seeds
        for i in stride(from: 0, to: speech.count, by: max(1, speech.count / 16)) {
            var changed = speech
            changed[i] ^= 0x5A
            inputs.append(changed)
            inputs.append(Array(speech.prefix(i)))
        }
        for input in inputs { VoiceFuzzChecks.exercise(input) }
        #expect(seeds.count == 7 && speech.count > 8 * 20 && seeds[2].count == 8 * 162, "\(seeds.map(\.count))")
    }
}
