import CZlib
import Crypto
import TusaBase

/// The key for MESSAGE-INTEGRITY / MESSAGE-INTEGRITY-SHA256 (RFC 8489 §9).
public struct IntegrityKey: Hashable, Sendable {
    public let bytes: [UInt8]
    /// Prepared once, so that checking a message does not set up the key again.
    let symmetric: SymmetricKey

    public init(bytes: [UInt8]) {
        self.bytes = bytes
        self.symmetric = SymmetricKey(data: bytes)
    }

    public static func == (a: IntegrityKey, b: IntegrityKey) -> Bool { a.bytes == b.bytes }
    public func hash(into hasher: inout Hasher) { hasher.combine(bytes) }

    /// Short-term credentials (ICE): the OpaqueString-prepared password itself.
    public static func shortTerm(password: String) throws(STUNError) -> IntegrityKey {
        IntegrityKey(bytes: Array(try OpaqueString.prepare(password).utf8))
    }

    /// Long-term credentials: `H(username ":" OpaqueString(realm) ":" OpaqueString(password))`,
    /// with MD5 (the default, RFC 5389) or SHA-256 (PASSWORD-ALGORITHM SHA-256).
    public static func longTerm(
        username: String, realm: String, password: String, algorithm: PasswordAlgorithm = .md5
    ) throws(STUNError) -> IntegrityKey {
        let input = Array("\(username):\(try OpaqueString.prepare(realm)):\(try OpaqueString.prepare(password))".utf8)
        switch algorithm.number {
        case PasswordAlgorithm.md5.number: return IntegrityKey(bytes: Array(Insecure.MD5.hash(data: input)))
        case PasswordAlgorithm.sha256.number: return IntegrityKey(bytes: Array(SHA256.hash(data: input)))
        default: throw STUNError(.badCredentials, "unknown password algorithm \(algorithm.number)")
        }
    }

    /// The USERHASH value for a username and realm (RFC 8489 §14.4): both
    /// OpaqueString-prepared, then SHA-256 of `username ":" realm`.
    public static func userhash(username: String, realm: String) throws(STUNError) -> [UInt8] {
        let input = "\(try OpaqueString.prepare(username)):\(try OpaqueString.prepare(realm))"
        return Array(SHA256.hash(data: Array(input.utf8)))
    }
}

/// The result of checking an integrity or fingerprint attribute.
public enum IntegrityCheck: Hashable, Sendable, CustomStringConvertible {
    /// The attribute is present and correct.
    case valid
    /// The attribute is present and wrong.
    case invalid
    /// The message carries no such attribute.
    case absent
    /// The message was built or changed locally: there are no wire bytes to check.
    case notDecoded

    public var description: String {
        switch self {
        case .valid: "valid"
        case .invalid: "invalid"
        case .absent: "absent"
        case .notDecoded: "not decoded"
        }
    }
}

/// The XOR constant of FINGERPRINT (RFC 8489 §14.7).
let fingerprintXOR: UInt32 = 0x5354_554E

/// CRC-32 (ISO HDLC, as in zlib) of a byte range, continuing from `crc`.
func crc32(_ bytes: ArraySlice<UInt8>, after crc: UInt32 = 0) -> UInt32 {
    bytes.withUnsafeBufferPointer { p in
        UInt32(truncatingIfNeeded: CZlib.crc32(uLong(crc), p.baseAddress, uInt(p.count)))
    }
}

func hmacSHA1(key: IntegrityKey, _ data: ArraySlice<UInt8>) -> [UInt8] {
    Array(HMAC<Insecure.SHA1>.authenticationCode(for: data, using: key.symmetric))
}

func hmacSHA256(key: IntegrityKey, _ data: ArraySlice<UInt8>) -> [UInt8] {
    Array(HMAC<SHA256>.authenticationCode(for: data, using: key.symmetric))
}

/// Compares without leaking the position of the first difference.
package func constantTimeEqual(_ a: some Collection<UInt8>, _ b: some Collection<UInt8>) -> Bool {
    guard a.count == b.count else { return false }
    var diff: UInt8 = 0
    for (x, y) in zip(a, b) { diff |= x ^ y }
    return diff == 0
}

extension Message {
    /// Encodes the message and appends, in this order, MESSAGE-INTEGRITY,
    /// MESSAGE-INTEGRITY-SHA256 and FINGERPRINT, each computed over what precedes it.
    public func encode(
        integrity: IntegrityKey? = nil, integritySHA256: IntegrityKey? = nil, fingerprint: Bool = false
    ) -> [UInt8] {
        var out = encode()
        if let integrity {
            out.writeUInt16(UInt16(truncatingIfNeeded: out.count - Self.headerSize + 24), at: 2)
            let mac = hmacSHA1(key: integrity, out[...])
            Self.appendAttribute(RawAttribute(type: .messageIntegrity, value: mac), to: &out)
        }
        if let integritySHA256 {
            out.writeUInt16(UInt16(truncatingIfNeeded: out.count - Self.headerSize + 36), at: 2)
            let mac = hmacSHA256(key: integritySHA256, out[...])
            Self.appendAttribute(RawAttribute(type: .messageIntegritySHA256, value: mac), to: &out)
        }
        if fingerprint {
            Self.appendFingerprint(to: &out)
        }
        return out
    }

    /// Appends FINGERPRINT to an encoded message, fixing up its length field.
    public static func appendFingerprint(to out: inout [UInt8]) {
        out.writeUInt16(UInt16(truncatingIfNeeded: out.count - headerSize + 8), at: 2)
        let crc = crc32(out[...]) ^ fingerprintXOR
        out.appendUInt16(AttributeType.fingerprint.rawValue)
        out.appendUInt16(4)
        out.appendUInt32(crc)
    }

    /// Runs `body` on what the HMAC or CRC of the counted attribute of `type`
    /// covers, without copying the message: the first four header bytes with
    /// the length field rewritten to end just after that attribute, and the
    /// wire bytes from offset 4 up to the attribute; and the attribute's value.
    private func withCovered<R>(
        _ type: AttributeType, _ body: (UnsafeRawBufferPointer, ArraySlice<UInt8>, [UInt8]) -> R
    ) -> R? {
        guard let wire,
            let index = effectiveAttributes.firstIndex(where: { $0.type == type }),
            let offset = wireOffset(of: index)
        else { return nil }
        let value = attributes[index].value
        let length = UInt16(truncatingIfNeeded: offset + 4 + padded4(value.count) - Self.headerSize)
        var prefix = (wire[0], wire[1], UInt8(length >> 8), UInt8(truncatingIfNeeded: length))
        return withUnsafeBytes(of: &prefix) { body($0, wire[4..<offset], value) }
    }

    /// Checks FINGERPRINT against the wire bytes.
    public func checkFingerprint() -> IntegrityCheck {
        guard wire != nil else { return .notDecoded }
        return withCovered(.fingerprint) { (prefix, rest, value) -> IntegrityCheck in
            guard value.count == 4 else { return .invalid }
            let head = UInt32(truncatingIfNeeded: CZlib.crc32(0, prefix.baseAddress?.assumingMemoryBound(to: UInt8.self), 4))
            return crc32(rest, after: head) ^ fingerprintXOR == value.readUInt32(at: 0) ? .valid : .invalid
        } ?? .absent
    }

    /// Checks MESSAGE-INTEGRITY (HMAC-SHA1) with a key.
    public func checkMessageIntegrity(key: IntegrityKey) -> IntegrityCheck {
        guard wire != nil else { return .notDecoded }
        return withCovered(.messageIntegrity) { (prefix, rest, value) -> IntegrityCheck in
            guard value.count == 20 else { return .invalid }
            var mac = HMAC<Insecure.SHA1>(key: key.symmetric)
            mac.update(data: prefix)
            mac.update(data: rest)
            // swift-crypto compares a MAC with bytes in constant time.
            return mac.finalize() == value ? .valid : .invalid
        } ?? .absent
    }

    /// Checks MESSAGE-INTEGRITY-SHA256 (HMAC-SHA256, possibly truncated) with a key.
    public func checkMessageIntegritySHA256(key: IntegrityKey) -> IntegrityCheck {
        guard wire != nil else { return .notDecoded }
        return withCovered(.messageIntegritySHA256) { (prefix, rest, value) -> IntegrityCheck in
            guard value.count >= 16, value.count <= 32, value.count % 4 == 0 else { return .invalid }
            var mac = HMAC<SHA256>(key: key.symmetric)
            mac.update(data: prefix)
            mac.update(data: rest)
            return constantTimeEqual(Array(mac.finalize()).prefix(value.count), value) ? .valid : .invalid
        } ?? .absent
    }
}
