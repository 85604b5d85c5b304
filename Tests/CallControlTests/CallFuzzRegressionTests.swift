import Foundation
import TestSupport
import Testing
import TusaBase

@testable import CallControl

/// Every input CallFuzz ever crashed on stays fixed, the script reads as
/// documented, and the checks hold for inputs shaped like a call's signalling:
/// real messages of every kind, cut short and with a byte changed, and scripts of
/// restarts, floods, rendezvous drops and hang-ups.
struct CallFuzzRegressionTests {
    static let pinned = PinnedFuzzInputs(besideTestFile: #filePath)

    @Test(arguments: pinned.names)
    func pinnedCrashInputStaysFixed(name: String) throws {
        CallFuzzChecks.exercise(try Self.pinned.bytes(name))
    }

    @Test func theScriptReadsAsDocumented() throws {
        let hangup = CallMessage(kind: .hangup, call: CallFuzzChecks.call).encoded()
        let input: [UInt8] =
            [0x00, UInt8(hangup.count)] + hangup + [0x10, UInt8(hangup.count)] + hangup + [0x41, 7] + [0x02, 0x06, 9]
            + [0x1A] + [0x0A, 3] + [0x0F, 50] + [0x1F] + [0x1E, 0x0E]
        let steps = CallFuzzChecks.script(input)
        let peerHangup = try #require(try? CallMessage(decoding: hangup))
        let restart = try #require(steps.dropFirst(2).first)
        guard case .signal(let made, true) = restart else {
            Issue.record("step 3 is \(restart)")
            return
        }
        #expect(made.kind == .restart && made.call == CallFuzzChecks.call && made.path?.ufrag == "u7")
        #expect(
            steps.prefix(2) == [.signal(peerHangup, fromPeer: true), .signal(peerHangup, fromPeer: false)]
                && Array(steps.dropFirst(3))
                    == [
                        .input(.mediaArrived(at: .zero)), .input(.localAddresses([.v4(0x0A00_0009)])),
                        .input(.reflexiveAddress(nil)),
                        .input(.reflexiveAddress(TransportAddress(ip: .v4(0xC633_6403), port: 6003))),
                        .wait(.milliseconds(500)), .wait(nil), .input(.audioFailed), .input(.hangUp),
                    ],
            "\(steps)")
    }

    @Test func shapedInputsPassTheChecks() {
        let path = CallMessage.Path(
            ufrag: "ab12", password: "0123456789abcdefghijkl", candidates: ["candidate:1 1 udp 2130706431 10.0.0.1 4000 typ host"]
        )
        let codec = CallMessage.Codec(name: "opus", sampleRate: 8000, frameMilliseconds: 20, bitrate: 24_000)
        let messages = [
            CallMessage(kind: .offer, call: "c", path: path, codec: codec),
            CallMessage(kind: .answer, call: "c", path: path, codec: codec),
            CallMessage(kind: .reject, call: "c", reason: "busy"), CallMessage(kind: .hangup, call: "c"),
            CallMessage(kind: .restart, call: "c", path: path), CallMessage(kind: .restartAnswer, call: "c", path: path),
            CallMessage(kind: .reachable, call: "c", address: "[2001:db8::1]:4000"),
        ].map { $0.encoded() }
        var inputs: [[UInt8]] = [[], [0x0F], [0x1F], Array("{}".utf8)]
        for m in messages {
            inputs.append(m)
            for n in stride(from: 0, to: m.count, by: max(1, m.count / 10)) { inputs.append(Array(m.prefix(n))) }
            for i in stride(from: 0, to: m.count, by: max(1, m.count / 10)) {
                var changed = m
                changed[i] ^= 0x20
                inputs.append(changed)
            }
        }
        // Scripts: silence until restarts, a flood of the peer's restarts while ours
        // gathers, the rendezvous dropping and failing to come back, a hang-up each way.
        inputs.append([0x0F, 250, 0x0F, 250, 0x1F, 0x1F, 0x1F])
        inputs.append([0x04, 0x1F] + (0..<200).flatMap { i -> [UInt8] in [0x41, UInt8(i & 0x7F)] } + [0x0B, 1, 0x0B, 2])
        inputs.append([0x07, 0x1F, 0x09, 0x1F, 0x51, 3, 0x0D, 0x08, 0x1F, 0x0C, 0x1F])
        inputs.append([0x02, 0x61, 0, 0x1F, 0x31, 0x80, 0x0E])
        inputs.append((0..<255).map { UInt8($0) })
        for input in inputs { CallFuzzChecks.exercise(input) }
        #expect(inputs.count > 60)
    }
}
