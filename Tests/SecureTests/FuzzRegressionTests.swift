import Foundation
import Secure
import TestSupport
import Testing

/// Every input SecureFuzz ever crashed on stays fixed, and the checks hold
/// for inputs shaped like what a fuzzer starts from.
struct SecureFuzzRegressionTests {
    static let pinned = PinnedFuzzInputs(besideTestFile: #filePath)

    @Test(arguments: pinned.names)
    func pinnedCrashInputStaysFixed(name: String) throws {
        SecureFuzzChecks.exercise(try Self.pinned.bytes(name))
    }

    @Test func seedShapedInputsPassTheChecks() throws {
        let cipher = MediaCipher(key: .random())
        let media = try cipher.sealMedia(
            header: RTPHeader(payloadType: 0, sequenceNumber: 1, timestamp: 2, ssrc: 3),
            payload: [1, 2, 3], extendedSequence: 1)
        let control = try cipher.sealControl(ControlReport(), ssrc: 1, index: 1)
        var inputs: [[UInt8]] = [[], [0], [0x80], [UInt8](repeating: 0, count: 200), [UInt8](repeating: 0xFF, count: 300)]
        for n in 0...media.count { inputs.append(Array(media.prefix(n))) }
        for n in 0...control.count { inputs.append(Array(control.prefix(n))) }
        for i in 0..<96 {
            var one = [UInt8](repeating: 0, count: 96)
            one[i] = 0x80
            inputs.append(one)
        }
        for input in inputs { SecureFuzzChecks.exercise(input) }
    }
}
