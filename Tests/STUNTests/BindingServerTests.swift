import TestSupport
import Testing
import TusaBase

@testable import STUN

struct BindingServerTests {
    static let client4 = TransportAddress("203.0.113.7:40000")!
    static let client6 = TransportAddress("[2001:db8::7]:40000")!
    static let primary = TransportAddress("127.0.0.1:3478")!
    static let alternate = TransportAddress("127.0.0.2:3479")!
    static let plain = BindingServer()
    static let rfc5780 = BindingServer(configuration: .init(primary: primary, alternate: alternate, software: "tusa test"))

    static func answer(
        _ server: BindingServer, _ request: Message, from: TransportAddress = client4,
        on: BindingServer.Origin = .primary
    ) throws -> (Message, TransportAddress, BindingServer.Origin)? {
        guard let r = server.handle(request.encode(), from: from, arrivedOn: on) else { return nil }
        let m = try Message(decoding: r.response)
        #expect(m.checkFingerprint() == .valid)
        #expect(m.transactionID == request.transactionID)
        return (m, r.destination, r.origin)
    }

    @Test(arguments: [client4, client6])
    func answersWithXorMappedAddress(client: TransportAddress) throws {
        let req = Message(type: .bindingRequest)
        let (m, dest, origin) = try #require(try Self.answer(Self.plain, req, from: client))
        #expect(m.type == .bindingSuccess)
        #expect(try m.value(.xorMappedAddress) == .xorMappedAddress(client))
        #expect(m.attribute(.responseOrigin) == nil)
        #expect(dest == client)
        #expect(origin == .primary)
    }

    @Test func requestsWithValidFingerprintAreAnsweredBadOnesDropped() throws {
        let req = Message(type: .bindingRequest, attributes: [.software("x")])
        var bytes = req.encode(fingerprint: true)
        #expect(Self.plain.handle(bytes, from: Self.client4) != nil)
        bytes[bytes.count - 1] ^= 1
        #expect(Self.plain.handle(bytes, from: Self.client4) == nil)
    }

    @Test func changeRequestWithoutAlternateIs420() throws {
        let req = Message(type: .bindingRequest, attributes: [.changeRequest([.changeIP])])
        let (m, _, _) = try #require(try Self.answer(Self.plain, req))
        #expect(m.type == .bindingError)
        #expect(try m.value(.errorCode) == .errorCode(ErrorCodeValue(code: 420, reason: "Unknown Attribute")))
        #expect(try m.value(.unknownAttributes) == .unknownAttributes([.changeRequest]))
    }

    @Test func responseAddressIsRefusedNotReflected() throws {
        let req = Message(
            type: .bindingRequest, attributes: [.legacyAddress(.responseAddress, TransportAddress("198.51.100.1:53")!)])
        let (m, dest, _) = try #require(try Self.answer(Self.rfc5780, req))
        #expect(m.type == .bindingError)
        #expect(try m.value(.unknownAttributes) == .unknownAttributes([.responseAddress]))
        #expect(dest == Self.client4)
    }

    @Test(arguments: [
        (ChangeRequest(), BindingServer.Origin.primary),
        (.changeIP, BindingServer.Origin(alternateIP: true, alternatePort: false)),
        (.changePort, BindingServer.Origin(alternateIP: false, alternatePort: true)),
        (ChangeRequest([.changeIP, .changePort]), BindingServer.Origin(alternateIP: true, alternatePort: true)),
    ])
    func behaviourDiscoveryAnswersFromTheRequestedOrigin(change: ChangeRequest, expected: BindingServer.Origin) throws {
        let req = Message(type: .bindingRequest, attributes: [.changeRequest(change)])
        let (m, _, origin) = try #require(try Self.answer(Self.rfc5780, req))
        #expect(m.type == .bindingSuccess)
        #expect(origin == expected)
        #expect(try m.value(.responseOrigin) == .responseOrigin(try #require(Self.rfc5780.address(of: expected))))
        #expect(try m.value(.otherAddress) == .otherAddress(Self.alternate))
        #expect(try m.value(.software) == .software("tusa test"))
    }

    @Test func otherAddressIsRelativeToWhereTheRequestArrived() throws {
        let on = BindingServer.Origin(alternateIP: true, alternatePort: false)
        let (m, _, origin) = try #require(try Self.answer(Self.rfc5780, Message(type: .bindingRequest), on: on))
        #expect(origin == on)
        #expect(try m.value(.otherAddress) == .otherAddress(TransportAddress("127.0.0.1:3479")!))
    }

    @Test func responsePortAndPadding() throws {
        let req = Message(type: .bindingRequest, attributes: [.responsePort(5555), .padding([UInt8](repeating: 0, count: 100))])
        let (m, dest, _) = try #require(try Self.answer(Self.rfc5780, req))
        #expect(dest == TransportAddress(ip: Self.client4.ip, port: 5555))
        #expect(m.attribute(.padding)?.value.count == 100)
    }

    @Test func otherMethodsGet400AndIndicationsAndResponsesNothing() throws {
        let allocate = Message(type: MessageType(method: .allocate, class: .request))
        let (m, _, _) = try #require(try Self.answer(Self.plain, allocate))
        #expect(m.type == MessageType(method: .allocate, class: .errorResponse))
        guard case .errorCode(let e) = try m.value(.errorCode) else {
            Issue.record("no ERROR-CODE")
            return
        }
        #expect(e.code == 400)
        #expect(Self.plain.handle(Message(type: .bindingIndication).encode(), from: Self.client4) == nil)
        #expect(Self.plain.handle(Message(type: .bindingSuccess).encode(), from: Self.client4) == nil)
    }

    @Test func dropReasons() {
        func reason(_ bytes: [UInt8]) -> BindingServer.DropReason? {
            var out = [UInt8](repeating: 0, count: 2048)
            let o = bytes.withUnsafeBytes { b in out.withUnsafeMutableBytes { Self.plain.handle(b, from: Self.client4, into: $0) }
            }
            if case .drop(let r) = o { return r }
            return nil
        }
        #expect(reason([1, 2, 3]) == .notSTUN)
        #expect(reason(MessageDecodingTests.header(length: 4)) == .malformed)
        #expect(reason(MessageDecodingTests.header(length: 0, cookie: 7)) == .classicSTUN)
        #expect(reason(Message(type: .bindingSuccess).encode()) == .notRequest)
        // Too small an output buffer is a drop, not an overrun.
        var tiny = [UInt8](repeating: 0, count: 10)
        let req = Message(type: .bindingRequest).encode()
        let o = req.withUnsafeBytes { b in tiny.withUnsafeMutableBytes { Self.plain.handle(b, from: Self.client4, into: $0) } }
        #expect(o == .drop(.noRoom))
    }

    @Test(.enabled(if: SharedCorpus.isPresent, SharedCorpus.absentMessage))
    func decodedRequestsFromTheCorpusAreAnswered() throws {
        // Real browser requests carry ICE attributes and MESSAGE-INTEGRITY: still answered.
        for url in SharedCorpus.files("messages") where url.lastPathComponent.hasPrefix("browser-") {
            let bytes = try SharedCorpus.bytes("messages", url.lastPathComponent)
            let reply = try #require(Self.plain.handle(bytes, from: Self.client4), "\(url.lastPathComponent)")
            let m = try Message(decoding: reply.response)
            #expect(m.type == .bindingSuccess)
        }
    }

    /// Like Message: a FINGERPRINT after an attribute that follows
    /// MESSAGE-INTEGRITY is ignored, not checked.
    @Test func fingerprintAfterIgnoredAttributesIsNotChecked() throws {
        var m = Message(type: .bindingRequest)
        m.append(.messageIntegrity([UInt8](repeating: 0, count: 20)))
        m.append(.software("ignored"))
        m.append(.fingerprint(0xBAD))  // wrong on purpose
        let bytes = m.encode()
        #expect(try Message(decoding: bytes).checkFingerprint() == .absent)
        #expect(Self.plain.handle(bytes, from: Self.client4) != nil)
        // Directly after MESSAGE-INTEGRITY it counts, and a wrong one drops the request.
        var n = Message(type: .bindingRequest)
        n.append(.messageIntegrity([UInt8](repeating: 0, count: 20)))
        n.append(.fingerprint(0xBAD))
        #expect(Self.plain.handle(n.encode(), from: Self.client4) == nil)
    }

    @Test func softwareIsCutBetweenCharacters() throws {
        let server = BindingServer(configuration: .init(software: String(repeating: "é", count: 500)))
        let reply = try #require(server.handle(Message(type: .bindingRequest).encode(), from: Self.client4))
        guard case .software(let text)? = try Message(decoding: reply.response).value(.software) else {
            Issue.record("no SOFTWARE")
            return
        }
        #expect(text.utf8.count <= 763 && text.allSatisfy { $0 == "é" })
    }

    @Test func responseCapacityIsAlwaysEnough() throws {
        let longSoftware = String(repeating: "x", count: 700)
        let servers = [
            Self.plain, Self.rfc5780,
            BindingServer(configuration: .init(primary: Self.primary, alternate: Self.alternate, software: longSoftware)),
        ]
        let requests: [Message] = [
            Message(type: .bindingRequest),
            Message(type: .bindingRequest, attributes: [.padding([UInt8](repeating: 0, count: 1500)), .responsePort(9)]),
            Message(type: .bindingRequest, attributes: [.changeRequest([.changeIP, .changePort]), .padding([0])]),
            Message(type: .bindingRequest, attributes: [.legacyAddress(.responseAddress, Self.client4), .changeRequest([])]),
            Message(type: MessageType(method: .allocate, class: .request)),
        ]
        for server in servers {
            for request in requests {
                for client in [Self.client4, Self.client6] {
                    let bytes = request.encode(fingerprint: true)
                    var out = [UInt8](repeating: 0, count: server.responseCapacity(requestLength: bytes.count))
                    let outcome = bytes.withUnsafeBytes { b in
                        out.withUnsafeMutableBytes { server.handle(b, from: client, into: $0) }
                    }
                    guard case .reply = outcome else {
                        Issue.record("\(request): \(outcome)")
                        continue
                    }
                }
            }
        }
    }
}
