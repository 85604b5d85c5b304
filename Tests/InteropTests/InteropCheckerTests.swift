import Foundation
import STUN
import Testing
import TusaBase

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

    /// Credentials for someone else than the capture's users: its requests and their
    /// responses are notes (not verified), not failures. A response was checked against
    /// whatever credentials were given, and failed.
    @Test func credentialsForOthersAreNotesNotFailures() {
        var alice = InteropCredentials()
        alice.users = ["alice": "wonderland"]
        var bob = InteropCredentials()
        bob.users = ["bob": "other"]
        var ice = InteropCredentials()
        ice.ice = ["alic": "alicepassword0123456789abc"]
        for (capture, credentials) in [
            ("coturn-rest-credentials.pcapng", alice), ("coturn-udp-channels.pcapng", bob), ("aioice-ice-host.pcapng", ice),
        ] {
            let r = InteropChecker(credentials: credentials).check(path: InteropCorpus.path("captures", capture))
            #expect(r.failures.isEmpty, "\(capture): \(r.failures)")
            #expect(!r.notes.isEmpty, "\(capture)")
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

/// The checker's accounting on hand-written captures: every datagram of a
/// STUN/TURN flow is checked or failed with its reason, never left out; ICE
/// flows' application data and flows without STUN are counted as other.
@Suite("InteropChecker: no datagram of a STUN/TURN flow left out")
struct InteropCheckerFlowTests: CaptureFixtures {
    let client: [UInt8] = [10, 0, 0, 1]
    let server: [UInt8] = [10, 0, 0, 2]

    func datagram(_ payload: [UInt8], up: Bool = true, clientPort: UInt16 = 40000, serverPort: UInt16 = 3478)
        -> CaptureTestRecord
    {
        let (src, dst) = up ? (client, server) : (server, client)
        let (sport, dport) = up ? (clientPort, serverPort) : (serverPort, clientPort)
        return CaptureTestRecord(ipv4(src: src, dst: dst, proto: 17, payload: udp(sport, dport, payload)))
    }

    func check(_ records: [CaptureTestRecord]) throws -> InteropReport {
        let path = try temporaryFile(pcap(linkType: 101, records: records))
        defer { try? FileManager.default.removeItem(atPath: path) }
        return InteropChecker().check(path: path)
    }

    /// An RFC 3489 Binding request: no magic cookie, a 16-byte transaction id.
    var classicSTUN: [UInt8] { [0x00, 0x01, 0x00, 0x00] + [UInt8](repeating: 0x5A, count: 16) }
    var dtls: [UInt8] { [22, 0xFE, 0xFD] + [UInt8](repeating: 0, count: 10) }
    var rtp: [UInt8] { [0x80, 0x00, 0x00, 0x01] + [UInt8](repeating: 0, count: 8) + [1, 2, 3] }

    @Test("on a STUN server's flow, every datagram that is not STUN fails, named where its protocol is known")
    func foreignDatagramsOnAStunFlowFail() throws {
        let request = Message(type: .bindingRequest)
        let response = Message(
            type: .bindingSuccess, transactionID: request.transactionID,
            attributes: [.xorMappedAddress(TransportAddress(ip: .v4(0x0A00_0001), port: 40000))])
        let report = try check([
            datagram(request.encode()),  // 1
            datagram(response.encode(), up: false),  // 2
            datagram(classicSTUN),  // 3
            datagram(dtls),  // 4
            datagram(rtp, up: false),  // 5
            datagram(Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8)),  // 6
            datagram([]),  // 7
            datagram([0xFF, 1, 2]),  // 8
            datagram([0x40, 0x00, 0x00, 0x01, 9]),  // 9: ChannelData, but no TURN on this flow
            datagram([0x00, 0x01, 0x00]),  // 10: a STUN-like byte, too short
        ])
        #expect(report.packets == 10, "\(report.summary)")
        #expect(report.decoded == 2 && report.failed == 8, "\(report.summary)")
        #expect(!report.passed)
        let reasons = Dictionary(uniqueKeysWithValues: report.failures.map { ($0.packet, $0.reason) })
        #expect(reasons.keys.sorted() == Array(3...10))
        #expect(reasons[3]?.contains("classic STUN (RFC 3489: no magic cookie), type 0x0001") == true, "\(reasons)")
        #expect(reasons[4]?.contains("DTLS record (DTLS 1.2)") == true, "\(reasons)")
        #expect(reasons[5]?.contains("RTP (RFC 3550)") == true, "\(reasons)")
        #expect(reasons[6]?.contains("HTTP (GET / HTTP/1.1)") == true, "\(reasons)")
        #expect(reasons[7]?.contains("an empty datagram") == true, "\(reasons)")
        #expect(reasons[8]?.contains("first byte 0xFF") == true, "\(reasons)")
        #expect(reasons[9]?.contains("ChannelData on a flow where no TURN request was seen") == true, "\(reasons)")
        #expect(reasons[10]?.contains("shorter than a STUN header") == true, "\(reasons)")
        for reason in reasons.values { #expect(reason.contains("10.0.0.") && reason.contains("STUN/TURN flow")) }
    }

    @Test("beside ICE checks, application data (DTLS, RTP) is counted as other; so is a flow that carries no STUN")
    func iceApplicationDataAndOtherFlowsAreOther() throws {
        let check1 = Message(type: .bindingRequest, attributes: [.priority(0x6E00_1EFF), .iceControlling(42), .useCandidate])
        let report = try check([
            datagram(check1.encode()),
            datagram(dtls),
            datagram(rtp, up: false),
            datagram([0x17, 0xFE, 0xFD, 0, 1], clientPort: 50000, serverPort: 50001),  // a flow without STUN
            datagram(classicSTUN, clientPort: 50000, serverPort: 50001),
        ])
        #expect(report.passed, "\(report.failures)")
        #expect(report.packets == 1 && report.decoded == 1)
        #expect(report.other == 4)
        #expect(report.summary.hasSuffix("0 failed; 4 other datagrams not checked"), "\(report.summary)")
    }

    @Test("a TCP connection that opens with STUN one way and not the other fails, named")
    func tcpConnectionWithForeignDirection() throws {
        let request = Message(type: .bindingRequest).encode()
        func segment(_ up: Bool, _ seq: UInt32, _ flags: UInt8, _ payload: [UInt8] = []) -> CaptureTestRecord {
            let (src, dst) = up ? (client, server) : (server, client)
            let (sport, dport): (UInt16, UInt16) = up ? (40000, 3478) : (3478, 40000)
            return CaptureTestRecord(
                ipv4(src: src, dst: dst, proto: 6, payload: tcp(sport, dport, seq: seq, flags: flags, payload)))
        }
        let reply = Array("HTTP/1.1 400 Bad Request\r\n\r\n".utf8)
        let report = try check([
            segment(true, 1000, 0x02), segment(false, 5000, 0x12), segment(true, 1001, 0x18, request),
            segment(false, 5001, 0x18, reply),
        ])
        #expect(report.packets == 2 && report.decoded == 1 && report.failed == 1, "\(report.summary) \(report.failures)")
        #expect(report.failures.first?.packet == 4)
        #expect(report.failures.first?.reason.contains("does not open with STUN") == true, "\(report.failures)")
        #expect(report.failures.first?.reason.contains("HTTP (HTTP/1.1 400 Bad Request)") == true, "\(report.failures)")
    }
}
