import Foundation
import TestSupport
import Testing

@testable import STUN

/// The messages in ../shared/interop/messages must meet what its README says.
@Suite(.enabled(if: SharedCorpus.isPresent, SharedCorpus.absentMessage))
struct SharedVectorTests {
    static let messageFiles = SharedCorpus.isPresent ? SharedCorpus.files("messages").map(\.lastPathComponent) : []

    @Test("every message decodes, round-trips and its attributes type-check", arguments: messageFiles)
    func decodesAndRoundTrips(name: String) throws {
        let bytes = try SharedCorpus.bytes("messages", name)
        let m = try Message(decoding: bytes)
        #expect(m.roundTrips() == true)
        let typed = try m.typedAttributes()
        // Typed values re-encode to the same bytes, unknown ones pass through.
        for (t, raw) in zip(typed, m.effectiveAttributes) {
            #expect(t.raw(transactionID: m.transactionID) == raw, "\(raw.type)")
        }
        if m.attribute(.fingerprint) != nil {
            #expect(m.checkFingerprint() == .valid)
        }
    }

    @Test func browserRequestsCarryValidFingerprints() throws {
        let browsers = Self.messageFiles.filter { $0.hasPrefix("browser-") }
        #expect(browsers.count >= 10)
        var withFingerprint = 0
        for name in browsers {
            let m = try Message(decoding: try SharedCorpus.bytes("messages", name))
            #expect(m.type == .bindingRequest, "\(name)")
            // Some Chrome requests are a bare header or carry only ORIGIN (0x802F).
            if m.attribute(.fingerprint) == nil { continue }
            #expect(m.checkFingerprint() == .valid, "\(name)")
            withFingerprint += 1
        }
        #expect(withFingerprint >= 4)
    }

    @Test func rfc5769ShortTermRequest() throws {
        let m = try Message(decoding: try SharedCorpus.bytes("messages", "rfc5769-2.1-request-short-term.bin"))
        #expect(m.type == .bindingRequest)
        #expect(try m.value(.software) == .software("STUN test client"))
        #expect(try m.value(.username) == .username("evtj:h6vY"))
        #expect(try m.value(.priority) != nil)
        #expect(try m.value(.iceControlled) != nil)
        let key = try IntegrityKey.shortTerm(password: "VOkJxbRl1RmTxUk/WvJxBt")
        #expect(m.checkMessageIntegrity(key: key) == .valid)
        #expect(m.checkMessageIntegrity(key: try .shortTerm(password: "wrong")) == .invalid)
        #expect(m.checkFingerprint() == .valid)
    }

    @Test(arguments: [
        ("rfc5769-2.2-response-ipv4.bin", "192.0.2.1:32853"),
        ("rfc5769-2.3-response-ipv6.bin", "[2001:db8:1234:5678:11:2233:4455:6677]:32853"),
    ])
    func rfc5769Responses(name: String, mapped: String) throws {
        let m = try Message(decoding: try SharedCorpus.bytes("messages", name))
        #expect(m.type == .bindingSuccess)
        guard case .xorMappedAddress(let a) = try m.value(.xorMappedAddress) else {
            Issue.record("no XOR-MAPPED-ADDRESS")
            return
        }
        #expect(a.description == mapped)
        #expect(m.checkMessageIntegrity(key: try .shortTerm(password: "VOkJxbRl1RmTxUk/WvJxBt")) == .valid)
        #expect(m.checkFingerprint() == .valid)
    }

    @Test func rfc5769LongTermRequest() throws {
        let m = try Message(decoding: try SharedCorpus.bytes("messages", "rfc5769-2.4-request-long-term.bin"))
        let user = "\u{30DE}\u{30C8}\u{30EA}\u{30C3}\u{30AF}\u{30B9}"
        #expect(try m.value(.username) == .username(user))
        #expect(try m.value(.realm) == .realm("example.org"))
        #expect(try m.value(.nonce) == .nonce("f//499k954d6OL34oL9FSTvy64sA"))
        let key = try IntegrityKey.longTerm(username: user, realm: "example.org", password: "TheMatrIX")
        #expect(m.checkMessageIntegrity(key: key) == .valid)
        let wrong = try IntegrityKey.longTerm(username: user, realm: "example.org", password: "TheMatrix")
        #expect(m.checkMessageIntegrity(key: wrong) == .invalid)
    }

    @Test func rfc8489SHA256UserhashRequest() throws {
        let m = try Message(decoding: try SharedCorpus.bytes("messages", "rfc8489-b.1-request-sha256-userhash-corrected.bin"))
        let user = "\u{30DE}\u{30C8}\u{30EA}\u{30C3}\u{30AF}\u{30B9}"
        #expect(try m.value(.userhash) == .userhash(try IntegrityKey.userhash(username: user, realm: "example.org")))
        #expect(try m.value(.nonce) == .nonce("obMatJos2AAACf//499k954d6OL34oL9FSTvy64sA"))
        #expect(try m.value(.passwordAlgorithm) == .passwordAlgorithm(.sha256))
        let key = try IntegrityKey.longTerm(username: user, realm: "example.org", password: "TheMatrIX", algorithm: .sha256)
        #expect(m.checkMessageIntegritySHA256(key: key) == .valid)
        #expect(m.checkMessageIntegrity(key: key) == .absent)
    }

    static let seedFiles = SharedCorpus.isPresent ? SharedCorpus.files("fuzz-seeds").map(\.lastPathComponent) : []

    /// Every fuzz seed yields a message or a typed error from every decoder, never a crash.
    @Test(arguments: seedFiles)
    func fuzzSeedsNeverTrap(name: String) throws {
        let bytes = try SharedCorpus.bytes("fuzz-seeds", name)
        FuzzChecks.exercise(bytes)
    }
}
