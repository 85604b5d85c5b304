import Secure
import TusaBase

/// Which key sealed a frame: the member that owns it, the epoch (a fresh random
/// key each time one is made: on a leave, a kick, every 15 minutes) and the
/// ratchet step within the epoch (one step forward on every join).
///
/// Packed into SFrame's KID as `member << 32 | epoch << 16 | step`, so a
/// receiver (and the relay) reads the owner from the header.
public struct SenderKeyID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public var member: MemberID
    public var epoch: UInt16
    public var step: UInt16

    public init(member: MemberID, epoch: UInt16, step: UInt16) {
        self.member = member
        self.epoch = epoch
        self.step = step
    }

    public init?(kid: UInt64) {
        guard kid >> 48 == 0 else { return nil }
        self.init(
            member: MemberID(UInt16(truncatingIfNeeded: kid >> 32)), epoch: UInt16(truncatingIfNeeded: kid >> 16),
            step: UInt16(truncatingIfNeeded: kid))
    }

    public var kid: UInt64 { UInt64(member.value) << 32 | UInt64(epoch) << 16 | UInt64(step) }

    public static func < (a: SenderKeyID, b: SenderKeyID) -> Bool { a.kid < b.kid }

    public var description: String { "\(member)/e\(epoch)/s\(step)" }
}

/// One member's sender key at one (epoch, step): the base secret, and the AEAD
/// key and salt derived from it for SFrame (RFC 9605 §4.4, with BLAKE2b in
/// place of HKDF and ChaCha20-Poly1305 as the AEAD).
///
/// `ratcheted()` is one-way: whoever holds step n derives n+1, n+2, …, never
/// n−1. A newcomer handed step n+1 cannot open what was sealed under step n.
public struct SenderKey: Sendable {
    public let id: SenderKeyID
    let base: SecretKey
    let key: SecretKey
    let salt: [UInt8]

    private static let keyLabel = Array("tusa party sframe key".utf8)
    private static let saltLabel = Array("tusa party sframe salt".utf8)
    private static let ratchetLabel = Array("tusa party ratchet".utf8)

    public init(id: SenderKeyID, base: SecretKey) {
        self.id = id
        self.base = base
        var kid: [UInt8] = []
        kid.appendUInt64(id.kid)
        let b = base.withUnsafeBytes { Array($0) }
        // Cannot fail: 32 bytes in, 32 bytes out.
        key = (try? SecretKey(bytes: Blake2b.hash(Self.keyLabel + kid, key: b, outputLength: 32))) ?? SecretKey.random()
        salt = Array(Blake2b.hash(Self.saltLabel + kid, key: b, outputLength: 16).prefix(AEAD.nonceLength))
    }

    /// A fresh random key (a new epoch).
    public static func fresh(member: MemberID, epoch: UInt16, random: inout any SecureRandom) -> SenderKey {
        let base = (try? SecretKey(bytes: random.bytes(SecretKey.length))) ?? SecretKey.random()
        return SenderKey(id: SenderKeyID(member: member, epoch: epoch, step: 0), base: base)
    }

    /// The next step of the same epoch.
    public func ratcheted() -> SenderKey {
        let b = base.withUnsafeBytes { Array($0) }
        let next = (try? SecretKey(bytes: Blake2b.hash(Self.ratchetLabel, key: b, outputLength: 32))) ?? SecretKey.random()
        return SenderKey(id: SenderKeyID(member: id.member, epoch: id.epoch, step: id.step &+ 1), base: next)
    }

    /// The base secret's bytes, to hand (sealed) to another member.
    public var baseBytes: [UInt8] { base.withUnsafeBytes { Array($0) } }

    func nonce(_ counter: UInt64) -> [UInt8] {
        var n = salt
        for i in 0..<8 { n[AEAD.nonceLength - 1 - i] ^= UInt8(truncatingIfNeeded: counter >> (8 * UInt64(i))) }
        return n
    }
}
