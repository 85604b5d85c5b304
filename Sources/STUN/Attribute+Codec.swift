import TusaBase

/// The magic cookie of RFC 5389/8489.
public let magicCookie: UInt32 = 0x2112_A442

extension Attribute {
    /// Decodes the typed value of a raw attribute.
    ///
    /// - Parameter transactionID: needed to undo the XOR of XOR-*-ADDRESS values.
    /// - Throws: ``STUNError`` with code `.badAttribute` saying what was wrong.
    public init(_ raw: RawAttribute, transactionID: TransactionID) throws(STUNError) {
        let v = raw.value
        let t = raw.type
        switch t {
        case .mappedAddress: self = .mappedAddress(try Self.address(v, t, xor: nil))
        case .xorMappedAddress: self = .xorMappedAddress(try Self.address(v, t, xor: transactionID))
        case .xorPeerAddress: self = .xorPeerAddress(try Self.address(v, t, xor: transactionID))
        case .xorRelayedAddress: self = .xorRelayedAddress(try Self.address(v, t, xor: transactionID))
        case .alternateServer: self = .alternateServer(try Self.address(v, t, xor: nil))
        case .responseOrigin: self = .responseOrigin(try Self.address(v, t, xor: nil))
        case .otherAddress: self = .otherAddress(try Self.address(v, t, xor: nil))
        case .responseAddress, .sourceAddress, .changedAddress, .reflectedFrom:
            self = .legacyAddress(t, try Self.address(v, t, xor: nil))
        case .username: self = .username(try Self.text(v, t, limit: 509))
        case .realm: self = .realm(try Self.text(v, t, limit: 764))
        case .nonce: self = .nonce(try Self.text(v, t, limit: 764))
        case .software: self = .software(try Self.text(v, t, limit: 764))
        case .alternateDomain: self = .alternateDomain(try Self.text(v, t, limit: 255))
        case .userhash:
            try Self.length(v, t, is: 32)
            self = .userhash(v)
        case .messageIntegrity:
            try Self.length(v, t, is: 20)
            self = .messageIntegrity(v)
        case .messageIntegritySHA256:
            guard v.count >= 16, v.count <= 32, v.count % 4 == 0 else {
                throw .badAttribute(t, "length \(v.count), must be 16 to 32 in steps of 4")
            }
            self = .messageIntegritySHA256(v)
        case .passwordAlgorithm:
            let (algorithm, end) = try Self.passwordAlgorithm(v, at: 0, t)
            guard end == v.count || padded4(end) == v.count else {
                throw .badAttribute(t, "\(v.count - end) bytes after the algorithm")
            }
            self = .passwordAlgorithm(algorithm)
        case .passwordAlgorithms:
            var list: [PasswordAlgorithm] = []
            var i = 0
            while i < v.count {
                let (algorithm, end) = try Self.passwordAlgorithm(v, at: i, t)
                list.append(algorithm)
                i = padded4(end)
            }
            self = .passwordAlgorithms(list)
        case .fingerprint:
            try Self.length(v, t, is: 4)
            self = .fingerprint(v.readUInt32(at: 0))
        case .accessToken: self = .accessToken(v)
        case .password: self = .legacyPassword(v)
        case .errorCode:
            self = .errorCode(try Self.errorCode(v, t, offset: 0))
        case .addressErrorCode:
            guard v.count >= 4 else { throw .badAttribute(t, "length \(v.count), needs at least 4") }
            self = .addressErrorCode(family: v[0], try Self.errorCode(v, t, offset: 0))
        case .unknownAttributes:
            guard v.count % 2 == 0 else { throw .badAttribute(t, "odd length \(v.count)") }
            self = .unknownAttributes(stride(from: 0, to: v.count, by: 2).map { AttributeType(rawValue: v.readUInt16(at: $0)) })
        case .channelNumber:
            try Self.length(v, t, is: 4)
            self = .channelNumber(v.readUInt16(at: 0))
        case .lifetime:
            try Self.length(v, t, is: 4)
            self = .lifetime(v.readUInt32(at: 0))
        case .data: self = .data(v)
        case .requestedAddressFamily:
            try Self.length(v, t, is: 4)
            self = .requestedAddressFamily(v[0])
        case .additionalAddressFamily:
            try Self.length(v, t, is: 4)
            self = .additionalAddressFamily(v[0])
        case .evenPort:
            try Self.length(v, t, is: 1)
            self = .evenPort(reserveNext: v[0] & 0x80 != 0)
        case .requestedTransport:
            try Self.length(v, t, is: 4)
            self = .requestedTransport(v[0])
        case .dontFragment:
            try Self.length(v, t, is: 0)
            self = .dontFragment
        case .reservationToken:
            try Self.length(v, t, is: 8)
            self = .reservationToken(UInt64(v.readUInt32(at: 0)) << 32 | UInt64(v.readUInt32(at: 4)))
        case .icmp:
            try Self.length(v, t, is: 8)
            self = .icmp(ICMPValue(type: v[2], code: v[3], errorData: v.readUInt32(at: 4)))
        case .connectionID:
            try Self.length(v, t, is: 4)
            self = .connectionID(v.readUInt32(at: 0))
        case .priority:
            try Self.length(v, t, is: 4)
            self = .priority(v.readUInt32(at: 0))
        case .useCandidate:
            try Self.length(v, t, is: 0)
            self = .useCandidate
        case .iceControlled:
            try Self.length(v, t, is: 8)
            self = .iceControlled(UInt64(v.readUInt32(at: 0)) << 32 | UInt64(v.readUInt32(at: 4)))
        case .iceControlling:
            try Self.length(v, t, is: 8)
            self = .iceControlling(UInt64(v.readUInt32(at: 0)) << 32 | UInt64(v.readUInt32(at: 4)))
        case .changeRequest:
            try Self.length(v, t, is: 4)
            self = .changeRequest(ChangeRequest(rawValue: v.readUInt32(at: 0)))
        case .padding: self = .padding(v)
        case .responsePort:
            try Self.length(v, t, is: 4)
            self = .responsePort(v.readUInt16(at: 0))
        default: self = .unknown(raw)
        }
    }

    /// Encodes the typed value into its wire form.
    public func raw(transactionID: TransactionID) -> RawAttribute {
        var v: [UInt8] = []
        switch self {
        case .mappedAddress(let a), .alternateServer(let a), .responseOrigin(let a), .otherAddress(let a),
            .legacyAddress(_, let a):
            Self.appendAddress(a, xor: nil, to: &v)
        case .xorMappedAddress(let a), .xorPeerAddress(let a), .xorRelayedAddress(let a):
            Self.appendAddress(a, xor: transactionID, to: &v)
        case .username(let s), .realm(let s), .nonce(let s), .software(let s), .alternateDomain(let s):
            v = Array(s.utf8)
        case .userhash(let b), .messageIntegrity(let b), .messageIntegritySHA256(let b), .accessToken(let b),
            .legacyPassword(let b), .data(let b), .padding(let b):
            v = b
        case .passwordAlgorithm(let a):
            Self.appendPasswordAlgorithm(a, to: &v)
        case .passwordAlgorithms(let list):
            for a in list {
                Self.appendPasswordAlgorithm(a, to: &v)
                while v.count % 4 != 0 { v.append(0) }
            }
        case .fingerprint(let x), .lifetime(let x), .priority(let x), .connectionID(let x):
            v.appendUInt32(x)
        case .errorCode(let e):
            Self.appendErrorCode(e, familyByte: 0, to: &v)
        case .addressErrorCode(let family, let e):
            Self.appendErrorCode(e, familyByte: family, to: &v)
        case .unknownAttributes(let types):
            for t in types { v.appendUInt16(t.rawValue) }
        case .channelNumber(let n), .responsePort(let n):
            v.appendUInt16(n)
            v.appendUInt16(0)
        case .requestedAddressFamily(let f), .additionalAddressFamily(let f), .requestedTransport(let f):
            v = [f, 0, 0, 0]
        case .evenPort(let r):
            v = [r ? 0x80 : 0]
        case .dontFragment, .useCandidate:
            break
        case .reservationToken(let x), .iceControlled(let x), .iceControlling(let x):
            v.appendUInt64(x)
        case .icmp(let i):
            v = [0, 0, i.type, i.code]
            v.appendUInt32(i.errorData)
        case .changeRequest(let c):
            v.appendUInt32(c.rawValue)
        case .unknown(let raw):
            return raw
        }
        return RawAttribute(type: type, value: v)
    }

    // MARK: value helpers

    private static func length(_ v: [UInt8], _ t: AttributeType, is n: Int) throws(STUNError) {
        guard v.count == n else { throw .badAttribute(t, "length \(v.count), must be \(n)") }
    }

    /// UTF-8 text of fewer than `limit` bytes (REALM, NONCE, SOFTWARE and reason
    /// phrases may be up to 763 bytes: 128 characters; USERNAME fewer than 509).
    private static func text(_ v: [UInt8], _ t: AttributeType, limit: Int) throws(STUNError) -> String {
        guard v.count < limit else { throw .badAttribute(t, "\(v.count) bytes, must be fewer than \(limit)") }
        guard let s = String(validating: v, as: UTF8.self) else { throw .badAttribute(t, "not valid UTF-8") }
        return s
    }

    private static func address(_ v: [UInt8], _ t: AttributeType, xor: TransactionID?) throws(STUNError) -> TransportAddress {
        guard v.count >= 4 else { throw .badAttribute(t, "length \(v.count), an address needs 8 or 20") }
        let family = v[1]
        let expected: Int
        switch family {
        case 0x01: expected = 8
        case 0x02: expected = 20
        default: throw .badAttribute(t, "unknown address family 0x\(String(family, radix: 16))")
        }
        guard v.count == expected else {
            throw .badAttribute(t, "length \(v.count), family \(family == 1 ? "IPv4" : "IPv6") needs \(expected)")
        }
        var port = v.readUInt16(at: 2)
        var ipBytes = Array(v[4...])
        if let xor {
            port ^= UInt16(magicCookie >> 16)
            var mask: [UInt8] = []
            mask.appendUInt32(magicCookie)
            mask += xor.bytes
            for i in ipBytes.indices { ipBytes[i] ^= mask[i] }
        }
        guard let ip = IPAddress(bytes: ipBytes) else { throw .badAttribute(t, "bad address bytes") }
        return TransportAddress(ip: ip, port: port)
    }

    private static func appendAddress(_ a: TransportAddress, xor: TransactionID?, to v: inout [UInt8]) {
        v.append(0)
        v.append(a.ip.family)
        var ip = a.ip.bytes
        if let xor {
            v.appendUInt16(a.port ^ UInt16(magicCookie >> 16))
            var mask: [UInt8] = []
            mask.appendUInt32(magicCookie)
            mask += xor.bytes
            for i in ip.indices { ip[i] ^= mask[i] }
        } else {
            v.appendUInt16(a.port)
        }
        v += ip
    }

    private static func errorCode(_ v: [UInt8], _ t: AttributeType, offset: Int) throws(STUNError) -> ErrorCodeValue {
        guard v.count >= 4 else { throw .badAttribute(t, "length \(v.count), needs at least 4") }
        let cls = Int(v[2] & 0x07)
        let number = Int(v[3])
        guard (3...6).contains(cls), number < 100 else {
            throw .badAttribute(t, "class \(cls) number \(number) is not a code in 300–699")
        }
        let reason = try text(Array(v[4...]), t, limit: 764)
        return ErrorCodeValue(code: cls * 100 + number, reason: reason)
    }

    private static func appendErrorCode(_ e: ErrorCodeValue, familyByte: UInt8, to v: inout [UInt8]) {
        let code = min(max(e.code, 300), 699)
        v += [familyByte, 0, UInt8(code / 100), UInt8(code % 100)]
        v += Array(e.reason.utf8)
    }

    private static func passwordAlgorithm(_ v: [UInt8], at i: Int, _ t: AttributeType) throws(STUNError) -> (
        PasswordAlgorithm, Int
    ) {
        guard i + 4 <= v.count else { throw .badAttribute(t, "truncated algorithm entry at offset \(i)") }
        let number = v.readUInt16(at: i)
        let length = Int(v.readUInt16(at: i + 2))
        guard i + 4 + length <= v.count else {
            throw .badAttribute(t, "algorithm parameters of \(length) bytes overrun the attribute")
        }
        return (PasswordAlgorithm(number: number, parameters: Array(v[(i + 4)..<(i + 4 + length)])), i + 4 + length)
    }

    private static func appendPasswordAlgorithm(_ a: PasswordAlgorithm, to v: inout [UInt8]) {
        v.appendUInt16(a.number)
        v.appendUInt16(UInt16(truncatingIfNeeded: a.parameters.count))
        v += a.parameters
    }
}
