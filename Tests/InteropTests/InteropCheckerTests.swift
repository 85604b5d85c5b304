import Foundation
import STUN
import Testing

@testable import TusaInterop

/// The checker against ../shared/interop: every capture must decode,
/// round-trip and verify with the README's credentials.
@Suite(.enabled(if: InteropCorpus.isPresent, InteropCorpus.absentMessage))
struct InteropCheckerTests {
    static let readmeCredentials: InteropCredentials = {
        var c = InteropCredentials()
        c.users = ["alice": "wonderland", "\u{30DE}\u{30C8}\u{30EA}\u{30C3}\u{30AF}\u{30B9}": "TheMatrIX"]
        c.secrets = ["northwind"]
        c.ice = [
            "alic": "alicepassword0123456789abc", "bobb": "bobpassword0123456789abcdef",
            "evtj": "VOkJxbRl1RmTxUk/WvJxBt",
        ]
        return c
    }()

    static let captures = InteropCorpus.isPresent ? InteropCorpus.files("captures") : []
    static let messages = InteropCorpus.isPresent ? InteropCorpus.files("messages") : []

    @Test(arguments: captures)
    func everyCaptureVerifies(path: String) {
        let r = InteropChecker(credentials: Self.readmeCredentials).check(path: path)
        #expect(r.failures.isEmpty, "\(r.failures)")
        #expect(r.notes.isEmpty, "\(r.notes)")
        #expect(r.packets > 0)
        #expect(r.decoded == r.packets)
        #expect(r.roundTrip == r.packets)
        #expect(r.verified > 0)
    }

    @Test(arguments: messages)
    func everyMessageFileDecodesAndRoundTrips(path: String) {
        let r = InteropChecker(credentials: Self.readmeCredentials).check(path: path)
        #expect(r.passed, "\(r.failures)")
        #expect(r.packets == 1 && r.decoded == 1 && r.roundTrip == 1)
    }

    @Test func rfcVectorsVerifyWithTheirCredentials() {
        for name in [
            "rfc5769-2.1-request-short-term.bin", "rfc5769-2.2-response-ipv4.bin", "rfc5769-2.3-response-ipv6.bin",
            "rfc5769-2.4-request-long-term.bin", "rfc8489-b.1-request-sha256-userhash-corrected.bin",
        ] {
            let r = InteropChecker(credentials: Self.readmeCredentials).check(path: InteropCorpus.path("messages", name))
            #expect(r.verified == 1, "\(name): \(r.failures) \(r.notes)")
        }
    }

    @Test func wrongCredentialsFailWithPacketNumbers() throws {
        var wrong = Self.readmeCredentials
        wrong.users["alice"] = "not-the-password"
        let r = InteropChecker(credentials: wrong).check(path: InteropCorpus.path("captures", "coturn-udp-channels.pcapng"))
        #expect(!r.passed)
        #expect(r.failed > 0)
        let first = try #require(r.failures.first)
        #expect(first.packet > 0)
        #expect(first.reason.contains("MESSAGE-INTEGRITY invalid"))
    }

    /// --realm replaces the realm of long-term keys; it must not stop ICE
    /// short-term checks from being verified.
    @Test func realmOptionKeepsICEChecksVerified() {
        var c = Self.readmeCredentials
        c.realm = "example.org"
        let r = InteropChecker(credentials: c).check(path: InteropCorpus.path("captures", "aioice-ice-host.pcapng"))
        #expect(r.passed && r.notes.isEmpty, "\(r.failures) \(r.notes)")
        #expect(r.verified == r.packets)
    }

    @Test func missingCredentialsAreNotesNotFailures() {
        let r = InteropChecker().check(path: InteropCorpus.path("captures", "coturn-udp-channels.pcapng"))
        #expect(r.failures.isEmpty)
        #expect(!r.notes.isEmpty)
    }

    @Test func aCorruptedMessageInACaptureIsReported() throws {
        // Flip one byte inside a STUN attribute of a real capture: the
        // fingerprint or integrity check of that packet must fail.
        let original = try Data(contentsOf: URL(fileURLWithPath: InteropCorpus.path("captures", "coturn-binding.pcapng")))
        var bytes = [UInt8](original)
        let cookie: [UInt8] = [0x21, 0x12, 0xA4, 0x42]
        let at = try #require((0..<(bytes.count - 4)).last { Array(bytes[$0..<($0 + 4)]) == cookie })
        bytes[at + 20] ^= 0xFF  // first attribute type byte of the last STUN message
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("tusa-corrupt-\(UUID()).pcapng")
        try Data(bytes).write(to: url)
        defer { try? FileManager.default.removeItem(at: url) }
        let r = InteropChecker(credentials: Self.readmeCredentials).check(path: url.path)
        #expect(!r.passed, "\(r.summary)")
    }

    @Test func fuzzSeedsGiveTypedFailuresNeverCrashes() {
        for path in InteropCorpus.files("fuzz-seeds") {
            let r = InteropChecker().check(path: path)
            #expect(r.packets <= 1)
            #expect(r.failures.allSatisfy { !$0.reason.isEmpty })
        }
    }

    @Test func missingFileIsAFailure() {
        let r = InteropChecker().check(path: "/nonexistent/tusa.pcapng")
        #expect(!r.passed)
        #expect(r.failures.first?.reason == "no such file")
    }
}

/// ../shared/interop beside the project.
enum InteropCorpus {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("shared/interop").path
    static var isPresent: Bool { FileManager.default.fileExists(atPath: root) }
    static let absentMessage: Comment = "../shared/interop is absent: shared corpus interop tests skipped"
    static func path(_ folder: String, _ name: String) -> String { "\(root)/\(folder)/\(name)" }
    static func files(_ folder: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: "\(root)/\(folder)")) ?? []).sorted().map { path(folder, $0) }
    }
}
