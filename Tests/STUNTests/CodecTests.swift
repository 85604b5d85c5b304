import Testing
import TusaBase

@testable import STUN

struct MessageTypeTests {
    @Test(
        arguments: [
            (MessageType.bindingRequest, UInt16(0x0001)),
            (.bindingSuccess, 0x0101),
            (.bindingError, 0x0111),
            (.bindingIndication, 0x0011),
            (MessageType(method: .allocate, class: .request), 0x0003),
            (MessageType(method: .allocate, class: .errorResponse), 0x0113),
            (MessageType(method: .data, class: .indication), 0x0017),
            (MessageType(method: .send, class: .indication), 0x0016),
            (MessageType(method: .channelBind, class: .successResponse), 0x0109),
            (MessageType(method: .connectionAttempt, class: .indication), 0x001C),
        ] as [(MessageType, UInt16)])
    func packsMethodAndClass(type: MessageType, raw: UInt16) {
        #expect(type.rawValue == raw)
        #expect(MessageType(rawValue: raw) == type)
    }

    @Test func everyMethodAndClassRoundTrips() {
        for m in stride(from: 0, through: 0xFFF, by: 7) {
            for c in MessageClass.allCases {
                let t = MessageType(method: Method(rawValue: UInt16(m)), class: c)
                #expect(MessageType(rawValue: t.rawValue) == t)
                #expect(t.rawValue & 0xC000 == 0)
            }
        }
    }
}

struct AttributeTests {
    static let tid = TransactionID(high: 0x0102_0304, low: 0x0506_0708_090A_0B0C)
    static let v4 = TransportAddress(ip: .v4(0xC000_0201), port: 32853)
    static let v6 = TransportAddress("[2001:db8::1]:443")!

    static let samples: [Attribute] = [
        .mappedAddress(v4), .mappedAddress(v6), .xorMappedAddress(v4), .xorMappedAddress(v6),
        .xorPeerAddress(v6), .xorRelayedAddress(v4), .alternateServer(v4), .responseOrigin(v6), .otherAddress(v4),
        .legacyAddress(.responseAddress, v4), .username("evtj:h6vY"), .realm("example.org"), .nonce("abc"),
        .userhash([UInt8](repeating: 7, count: 32)), .messageIntegrity([UInt8](repeating: 1, count: 20)),
        .messageIntegritySHA256([UInt8](repeating: 2, count: 32)), .passwordAlgorithm(.sha256),
        .passwordAlgorithms([.md5, .sha256]), .fingerprint(0xDEAD_BEEF), .accessToken([1, 2, 3, 4, 5]),
        .errorCode(ErrorCodeValue(code: 438, reason: "Stale Nonce")), .unknownAttributes([.changeRequest, .responseAddress]),
        .software("tusa"), .alternateDomain("example.org"), .channelNumber(0x4001), .lifetime(600), .data([9, 8, 7]),
        .requestedAddressFamily(2), .additionalAddressFamily(2), .evenPort(reserveNext: true), .evenPort(reserveNext: false),
        .requestedTransport(17), .dontFragment, .reservationToken(0x1122_3344_5566_7788),
        .addressErrorCode(family: 2, ErrorCodeValue(code: 440, reason: "Address Family not Supported")),
        .icmp(ICMPValue(type: 3, code: 4, errorData: 1400)), .connectionID(77), .priority(0x6E00_01FF), .useCandidate,
        .iceControlled(0x932F_F9B1_5126_3B36), .iceControlling(42), .changeRequest([.changeIP, .changePort]),
        .padding([0, 0, 0, 0, 0]), .responsePort(5000),
        .unknown(RawAttribute(type: AttributeType(rawValue: 0xC057), value: [0, 1, 0, 10])),
    ]

    @Test(arguments: samples)
    func typedValueRoundTrips(_ a: Attribute) throws {
        let raw = a.raw(transactionID: Self.tid)
        #expect(raw.type == a.type)
        #expect(try Attribute(raw, transactionID: Self.tid) == a)
        // And inside a whole message.
        let m = Message(type: .bindingRequest, transactionID: Self.tid, attributes: [a])
        let decoded = try Message(decoding: m.encode())
        #expect(try decoded.typedAttributes() == [a])
        #expect(decoded.roundTrips() == true)
    }

    @Test func xorAddressMatchesRFC5769() {
        // RFC 5769 §2.2: 192.0.2.1:32853 XOR-ed is a1 47 e1 12 a6 43.
        let raw = Attribute.xorMappedAddress(Self.v4).raw(transactionID: Self.tid)
        #expect(raw.value == [0x00, 0x01, 0xA1, 0x47, 0xE1, 0x12, 0xA6, 0x43])
    }

    @Test(arguments: [
        (AttributeType.lifetime, [UInt8]([1, 2, 3])),
        (.xorMappedAddress, [0, 3, 0, 0, 1, 2, 3, 4]),
        (.xorMappedAddress, [0, 1, 0, 0, 1, 2, 3]),
        (.mappedAddress, [0, 2, 0, 0, 1, 2, 3, 4]),
        (.messageIntegrity, [UInt8](repeating: 0, count: 19)),
        (.messageIntegritySHA256, [UInt8](repeating: 0, count: 12)),
        (.errorCode, [0, 0, 7, 0]),
        (.errorCode, [0, 0, 4, 100]),
        (.errorCode, [0, 0]),
        (.username, [0xFF, 0xFE]),
        (.username, [UInt8](repeating: 0x61, count: 600)),
        (.unknownAttributes, [0, 1, 0]),
        (.evenPort, []),
        (.dontFragment, [0]),
        (.passwordAlgorithm, [0, 1, 0, 9, 1]),
        (.channelNumber, [0x40, 0]),
    ])
    func malformedValuesAreTypedErrors(type: AttributeType, value: [UInt8]) {
        #expect(throws: STUNError.self) {
            _ = try Attribute(RawAttribute(type: type, value: value), transactionID: Self.tid)
        }
    }
}

struct MessageDecodingTests {
    static func header(type: UInt16 = 0x0001, length: UInt16, cookie: UInt32 = magicCookie) -> [UInt8] {
        var b: [UInt8] = []
        b.appendUInt16(type)
        b.appendUInt16(length)
        b.appendUInt32(cookie)
        b += [UInt8](repeating: 0xAB, count: 12)
        return b
    }

    @Test func malformedMessagesAreTypedErrors() {
        func code(_ bytes: [UInt8]) -> STUNError.Code? {
            do {
                _ = try Message(decoding: bytes)
                return nil
            } catch {
                return error.code
            }
        }
        #expect(code([]) == .truncated)
        #expect(code(Array(Self.header(length: 0).prefix(19))) == .truncated)
        #expect(code([0x80] + Self.header(length: 0).dropFirst()) == .notSTUN)
        #expect(code(Self.header(length: 2) + [0, 0]) == .badLength)
        #expect(code(Self.header(length: 8)) == .badLength)
        #expect(code(Self.header(length: 0, cookie: 0x1234_5678)) == .classicSTUN)
        // An attribute whose value overruns the message.
        #expect(code(Self.header(length: 8) + [0x80, 0x22, 0x00, 0x10, 1, 2, 3, 4]) == .badAttribute)
        // A valid empty request decodes.
        #expect(code(Self.header(length: 0)) == nil)
    }

    @Test func attributesAfterIntegrityAreIgnored() throws {
        var m = Message(type: .bindingRequest, attributes: [.username("u")])
        let key = try IntegrityKey.shortTerm(password: "pw")
        var bytes = m.encode(integrity: key, fingerprint: true)
        // Splice an attribute after FINGERPRINT: it must not count.
        bytes += [0x80, 0x22, 0x00, 0x04, 0x61, 0x62, 0x63, 0x64]
        bytes.writeUInt16(UInt16(bytes.count - 20), at: 2)
        let decoded = try Message(decoding: bytes)
        #expect(decoded.attributes.count == 4)
        #expect(decoded.effectiveAttributeCount == 3)
        #expect(decoded.attribute(.software) == nil)
        #expect(decoded.roundTrips() == true)
        // Attributes between MESSAGE-INTEGRITY and FINGERPRINT are ignored too.
        m.append(.messageIntegrity([UInt8](repeating: 0, count: 20)))
        m.append(.software("after"))
        m.append(.fingerprint(0))
        let d2 = try Message(decoding: m.encode())
        #expect(d2.attribute(.software) == nil)
        #expect(d2.effectiveAttributeCount == 2)
    }

    @Test func integrityAndFingerprintAreComputedAndChecked() throws {
        let key = try IntegrityKey.longTerm(username: "alice", realm: "example.org", password: "wonderland")
        let key256 = try IntegrityKey.longTerm(
            username: "alice", realm: "example.org", password: "wonderland", algorithm: .sha256)
        let m = Message(
            type: MessageType(method: .allocate, class: .request),
            attributes: [
                .username("alice"), .realm("example.org"), .nonce("n"), .requestedTransport(17),
            ])
        let bytes = m.encode(integrity: key, integritySHA256: key256, fingerprint: true)
        let d = try Message(decoding: bytes)
        #expect(d.checkMessageIntegrity(key: key) == .valid)
        #expect(d.checkMessageIntegritySHA256(key: key256) == .valid)
        #expect(d.checkFingerprint() == .valid)
        // Flip one bit anywhere before the fingerprint: FINGERPRINT notices.
        for i in 20..<(bytes.count - 8) {
            var bad = bytes
            bad[i] ^= 0x01
            guard let b = try? Message(decoding: bad) else { continue }
            // Either the CRC fails, or the flip hid the fingerprint from the counted attributes.
            #expect(b.checkFingerprint() != .valid, "byte \(i)")
        }
        var changed = d
        changed.append(.software("x"))
        #expect(changed.checkFingerprint() == .notDecoded)
    }

    @Test func opaqueStringPreparesAndRefuses() throws {
        #expect(try OpaqueString.prepare("a\u{00A0}b") == "a b")
        #expect(try OpaqueString.prepare("e\u{301}") == "\u{E9}")
        #expect(throws: STUNError.self) { try OpaqueString.prepare("") }
        #expect(throws: STUNError.self) { try OpaqueString.prepare("a\u{7}b") }
    }

    @Test func transportAddressParsing() {
        #expect(TransportAddress("127.0.0.1:3478")?.description == "127.0.0.1:3478")
        #expect(TransportAddress("[::1]:3478")?.description == "[::1]:3478")
        #expect(TransportAddress("::1", defaultPort: 3478)?.description == "[::1]:3478")
        #expect(TransportAddress("example", defaultPort: 1) == nil)
        #expect(TransportAddress("1.2.3.4:99999") == nil)
        #expect(TransportAddress("1.2.3.4") == nil)
    }
}
