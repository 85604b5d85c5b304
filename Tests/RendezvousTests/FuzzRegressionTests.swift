import Foundation
import Rendezvous
import Secure
import TestSupport
import Testing

/// Every input RendezvousFuzz ever crashed on stays fixed, and the checks hold
/// for inputs shaped like what a fuzzer starts from: real messages and notices,
/// cut short and with a byte changed.
struct RendezvousFuzzRegressionTests {
    static let pinned = PinnedFuzzInputs(besideTestFile: #filePath)

    @Test(arguments: pinned.names)
    func pinnedCrashInputStaysFixed(name: String) throws {
        RendezvousFuzzChecks.exercise(try Self.pinned.bytes(name))
    }

    /// The corpus `scripts/fuzz.sh` starts from holds what the server and the database
    /// really deliver: each seed is a message or a notice.
    @Test func theFuzzSeedsAreMessagesAndNotices() throws {
        let seeds = PinnedFuzzInputs(besideTestFile: #filePath, folder: "FuzzSeeds")
        let names = seeds.names.filter { $0.hasSuffix(".json") }
        #expect(names.count >= 8)
        for name in names {
            let bytes = try seeds.bytes(name)
            let message = try? RendezvousMessage(decoding: bytes)
            let notice = try? ClusterNotice(decoding: String(decoding: bytes, as: UTF8.self))
            #expect(message != nil || notice != nil, "\(name)")
            RendezvousFuzzChecks.exercise(bytes)
        }
    }

    @Test func seedShapedInputsPassTheChecks() throws {
        let k = PrivateKey.generate().publicKey
        let messages: [RendezvousMessage] = [
            .hello(challenge: [1, 2, 3], serverKey: k), .register(key: k, proof: [9]),
            .registered(turn: TURNGrant(username: "1:ab", password: "p", expiry: 1, uris: ["turn:x"])),
            .post(id: 8, to: k, sealed: [7]), .lookup(id: 1, key: k), .send(id: 3, to: k, sealed: [0]),
            .error(code: .offline, detail: "d", id: 7), .ping,
            .load(RelayLoad(party: PartyGrant(address: "127.0.0.9:3481", key: k.base64), capacityBitsPerSecond: 1), proof: [1]),
            .changeContacts(id: 4, add: [k], remove: [k]), .contacts(id: 4, keys: [k]),
        ]
        let notices: [ClusterNotice] = [
            ClusterNotice(origin: 5, .event(.online(k, ClusterPresence(node: 3, unixSeconds: 1_800_000_000)))),
            ClusterNotice(origin: 5, .event(.dropped([1, 2, 1 << 41]))), ClusterNotice(origin: 2, .signalRow(12, node: 2)),
            ClusterNotice(origin: 2, .postRow(1 << 40 | 7)),
            ClusterNotice(origin: 2, .event(.contacts(owner: k, add: [k], remove: []))),
        ]
        var inputs: [[UInt8]] = [[], [0], [0xFF, 0xFF], [UInt8](repeating: 0x7B, count: 300)]
        var shapes = messages.map { $0.encode() } + messages.map { RendezvousFrame.frame($0) }
        shapes += notices.map { Array($0.encode().utf8) }
        for shape in shapes {
            inputs.append(shape)
            for n in stride(from: 0, to: shape.count, by: max(1, shape.count / 16)) { inputs.append(Array(shape.prefix(n))) }
            for i in stride(from: 0, to: shape.count, by: max(1, shape.count / 8)) {
                var changed = shape
                changed[i] ^= 0x20
                inputs.append(changed)
            }
        }
        for input in inputs { RendezvousFuzzChecks.exercise(input) }
        #expect(inputs.count > 100)
    }
}
