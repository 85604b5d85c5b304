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
        // The fuzzer's seeds (every kind of message, and scripts), each message cut
        // short and with bytes changed.
        let seeds = CallFuzzChecks.seeds()
        var inputs: [[UInt8]] = [[], [0x0F], [0x1F], Array("{}".utf8)] + seeds
        for m in seeds where m.first == UInt8(ascii: "{") {
            for n in stride(from: 0, to: m.count, by: max(1, m.count / 10)) { inputs.append(Array(m.prefix(n))) }
            for i in stride(from: 0, to: m.count, by: max(1, m.count / 10)) {
                var changed = m
                changed[i] ^= 0x20
                inputs.append(changed)
            }
        }
        for input in inputs { CallFuzzChecks.exercise(input) }
        #expect(seeds.count >= 12 && inputs.count > 60)
    }
}
