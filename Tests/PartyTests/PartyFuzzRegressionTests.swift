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
        var h = PartyHarness()
        for s in [alice, bob] { h.connect(s) }
        let room = try unwrap(h.room(alice, [bob]))
        let frame = try unwrap(h.speak(alice, [UInt8](repeating: 3, count: 40)))
        var channel = ControlChannel(id: 5)
        let messages: [PartyControl] = [
            .create(name: "Factorio", maxMembers: 8, invite: []), .join(room: room), .leave, .ping, .mute(true),
            .kick(member: MemberID(2)), .describe(room: room), .keyAck(member: MemberID(1), kid: 0x1_0000),
            .refused(code: .full, detail: "full"), .memberLeft(member: MemberID(2), reason: .kicked), .moving,
        ]
        var shapes = [frame] + messages.map { $0.encodedJSON() }
        shapes += messages.flatMap { channel.send($0, now: .seconds(1)) }
        shapes += channel.send(json: [UInt8](repeating: 0x20, count: 2_500), now: .seconds(1))  // in parts
        shapes.append(PartyInvitation(room: room, name: "Factorio", relay: "127.0.0.1:3481", relayKey: "k").encoded())
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
