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
        // Real Opus frames (a tone), each a packet a frame apart (20 ms, 160 samples), as the format writes them.
        let codec = CodecConfiguration(kind: .opus)
        let encoder = try makeEncoder(codec)
        var frames: [[UInt8]] = []
        var pcm = [Int16](repeating: 0, count: codec.samplesPerFrame)
        for f in 0..<8 {
            for i in pcm.indices { pcm[i] = Int16(6000 * sin(Double(f * pcm.count + i) * 0.05)) }
            var out = [UInt8](repeating: 0, count: 400)
            let n = try pcm.withUnsafeBufferPointer { p in try out.withUnsafeMutableBytes { try encoder.encode(p, into: $0) } }
            frames.append(Array(out[0..<n]))
        }
        var speech: [UInt8] = []
        for frame in frames where frame.count < 256 { speech += [0x60, UInt8(frame.count)] + frame }
        var inputs: [[UInt8]] = [[], [0x00], [0x02, 1, 0], speech]
        // Half a frame apart, a tick apart, back and forth.
        inputs.append((0..<40).flatMap { i -> [UInt8] in [0x02, i % 2 == 0 ? 160 : 1, 1, 0x42] })
        inputs.append((0..<40).flatMap { i -> [UInt8] in [i % 3 == 0 ? 0x04 : 0x02, 200, 3, 1, 2, 3] })
        // Redundant audio: two blocks back then the primary, and headers cut short.
        inputs.append([0x01, 12, 0x80 | 111, 0x00, 0x50, 0x02, 111, 1, 2, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF])
        inputs.append([0x01, 3, 0x80, 0x00, 0x50])
        for i in stride(from: 0, to: speech.count, by: max(1, speech.count / 16)) {
            var changed = speech
            changed[i] ^= 0x5A
            inputs.append(changed)
            inputs.append(Array(speech.prefix(i)))
        }
        for input in inputs { VoiceFuzzChecks.exercise(input) }
        #expect(inputs.count > 30)
    }
}
