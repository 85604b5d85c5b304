import Foundation
import Party
import TestSupport
import Testing

/// Every input PartyFuzz ever crashed on stays fixed, and the checks hold for
/// inputs shaped like what reaches a relay and a member: real frames, control
/// packets and their parts, acknowledgements, messages' JSON, cut short and with
/// a byte changed.
struct PartyFuzzRegressionTests {
    static let pinned = PinnedFuzzInputs(besideTestFile: #filePath)

    @Test(arguments: pinned.names)
    func pinnedCrashInputStaysFixed(name: String) throws {
        PartyFuzzChecks.exercise(try Self.pinned.bytes(name))
    }

    @Test func shapedInputsPassTheChecks() throws {
        // The fuzzer's seeds (the fuzz room's real frame and control packet, messages,
        // their channel packets, one in parts, an invitation, a format), and a frame
        // from a room of the test's own.
        var h = PartyHarness()
        for s in [alice, bob] { h.connect(s) }
        _ = try unwrap(h.room(alice, [bob]))
        let shapes = PartyFuzzChecks.seeds() + [try unwrap(h.speak(alice, [UInt8](repeating: 3, count: 40)))]
        #expect(shapes.count > 20)
        var inputs: [[UInt8]] = [[], [0], [0x01], [0xFF, 0xFF], [UInt8](repeating: 0x7B, count: 300)]
        for shape in shapes {
            inputs.append(shape)
            for n in stride(from: 0, to: shape.count, by: max(1, shape.count / 12)) { inputs.append(Array(shape.prefix(n))) }
            // Each byte of the headers (type, sender, sequence, timestamp, level and the
            // SFrame header, 24 bytes at most; a control packet's channel and sequence),
            // then a few further on.
            for i in Array(0..<min(24, shape.count)) + Array(stride(from: 24, to: shape.count, by: max(1, shape.count / 6))) {
                var changed = shape
                changed[i] ^= 0x20
                inputs.append(changed)
            }
        }
        for input in inputs { PartyFuzzChecks.exercise(input) }
        #expect(inputs.count > 200)
    }
}
