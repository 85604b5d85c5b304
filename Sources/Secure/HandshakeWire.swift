import CSodium
import TusaBase

// The handshake's wire messages, WireGuard-shaped around a Noise IK exchange.
// Every handshake message starts with a type byte in 4...15, a range RFC 7983 /
// RFC 9443 leave unassigned, so one UDP port carries STUN (0-3), TURN
// ChannelData (64-79), RTP/RTCP (128-191) and these. Integers are big-endian.
//
//   initiation, 152 bytes        response, 96 bytes           cookie reply, 64 bytes
//   0   type 4, 3 zero bytes     0   type 5, 3 zero bytes     0   type 6, 3 zero bytes
//   4   sender index             4   sender index             4   receiver index
//   8   Noise IK message 1 (112) 8   receiver index           8   nonce (24)
//   120 mac1 (16)                12  Noise IK message 2 (52)  32  sealed cookie (32)
//   136 mac2 (16)                64  mac1 (16)
//                                80  mac2 (16)
//
// Message 1 carries e, the initiator's static key (sealed) and a sealed payload
// of a TAI64N timestamp (12) and the initiator's RTP SSRC (4); message 2 carries
// e and a sealed payload of the responder's SSRC (4). No answer is larger than
// the initiation it answers.

/// Handshake message types and sizes.
public enum HandshakeWire {
    public static let initiation: UInt8 = 4
    public static let response: UInt8 = 5
    public static let cookieReply: UInt8 = 6

    public static let initiationLength = 152
    public static let responseLength = 96
    public static let cookieReplyLength = 64

    static let initiationNoise = 8..<120
    static let initiationMAC1 = 120..<136
    static let initiationMAC2 = 136..<152
    static let responseNoise = 12..<64
    static let responseMAC1 = 64..<80
    static let responseMAC2 = 80..<96

    /// The first bytes this layer owns (RFC 7983's unassigned 4...15).
    public static func isHandshake(firstByte: UInt8) -> Bool { (4...15).contains(firstByte) }

    /// The Noise protocol and prologue every Tusa handshake uses.
    public static let prologue: [UInt8] = Array("tusa handshake v1".utf8)
}

/// A TAI64N timestamp (12 bytes: TAI seconds with the 2^62 label, nanoseconds).
/// Initiations carry one; a responder refuses any not newer than the last it
/// accepted from the same key, so a recorded initiation cannot be replayed.
public struct TAI64N: Comparable, Hashable, Sendable {
    public var seconds: UInt64
    public var nanoseconds: UInt32

    public init(unixNanoseconds ns: UInt64) {
        seconds = 0x4000_0000_0000_000A &+ ns / 1_000_000_000
        nanoseconds = UInt32(ns % 1_000_000_000)
    }

    init(seconds: UInt64, nanoseconds: UInt32) {
        self.seconds = seconds
        self.nanoseconds = nanoseconds
    }

    var bytes: [UInt8] {
        var b: [UInt8] = []
        b.reserveCapacity(12)
        b.appendUInt64(seconds)
        b.appendUInt32(nanoseconds)
        return b
    }

    init?(bytes b: ArraySlice<UInt8>) {
        guard b.count == 12 else { return nil }
        let a = Array(b)
        seconds = UInt64(a.readUInt32(at: 0)) << 32 | UInt64(a.readUInt32(at: 4))
        nanoseconds = a.readUInt32(at: 8)
    }

    public static func < (a: TAI64N, b: TAI64N) -> Bool {
        (a.seconds, a.nanoseconds) < (b.seconds, b.nanoseconds)
    }
}

/// Keyed BLAKE2b as the handshake's MACs use it.
enum MAC {
    /// BLAKE2b with an `outputLength`-byte digest, keyed when `key` is not empty.
    static func blake2b(_ parts: [ArraySlice<UInt8>], key: [UInt8], outputLength: Int) -> [UInt8] {
        let hasher = Blake2b.Hasher(key: key, outputLength: outputLength)
        for part in parts { hasher.update(part) }
        return hasher.finalize()
    }

    /// mac1's key for messages to `receiver`: BLAKE2b-256("mac1----" ‖ key).
    static func mac1Key(for receiver: PublicKey) -> [UInt8] {
        blake2b([ArraySlice("mac1----".utf8), receiver.bytes[...]], key: [], outputLength: 32)
    }

    /// The key sealing cookie replies from `responder`: BLAKE2b-256("cookie--" ‖ key).
    static func cookieKey(for responder: PublicKey) -> [UInt8] {
        blake2b([ArraySlice("cookie--".utf8), responder.bytes[...]], key: [], outputLength: 32)
    }

    /// A 16-byte MAC over `message`.
    static func mac(_ message: ArraySlice<UInt8>, key: [UInt8]) -> [UInt8] {
        blake2b([message], key: key, outputLength: 16)
    }

    /// Constant-time comparison.
    static func equal(_ a: ArraySlice<UInt8>, _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        return Array(a).withUnsafeBufferPointer { x in
            b.withUnsafeBufferPointer { y in sodium_memcmp(x.baseAddress, y.baseAddress, x.count) == 0 }
        }
    }
}

/// The responder's side of the flood defence (WireGuard's cookie scheme): while
/// it is under load, an initiation must carry mac2, a MAC keyed with a cookie
/// bound to its source address; one without gets a 64-byte cookie reply and no
/// Diffie-Hellman work. The secret behind cookies changes every two minutes.
struct CookieChecker {
    private var secret: [UInt8]
    private var secretBorn: Timestamp
    private let cookieKey: [UInt8]
    static let secretLifetime: Duration = .seconds(120)

    /// Secrets and reply nonces are drawn from the caller's `random`.
    init(responder: PublicKey, now: Timestamp, random: inout any SecureRandom) {
        secret = random.bytes(32)
        secretBorn = now
        cookieKey = MAC.cookieKey(for: responder)
    }

    init(responder: PublicKey, now: Timestamp) {
        var system: any SecureRandom = SystemRandom()
        self.init(responder: responder, now: now, random: &system)
    }

    private mutating func rotate(now: Timestamp, random: inout any SecureRandom) {
        if now - secretBorn >= CookieChecker.secretLifetime {
            secret = random.bytes(32)
            secretBorn = now
        }
    }

    /// The cookie for `source`: BLAKE2b-128 keyed by the secret over its IP and port.
    mutating func cookie(for source: TransportAddress, now: Timestamp, random: inout any SecureRandom) -> [UInt8] {
        rotate(now: now, random: &random)
        var addr = source.ip.bytes
        addr.appendUInt16(source.port)
        return MAC.blake2b([addr[...]], key: secret, outputLength: 16)
    }

    /// Whether `message`'s mac2 (the 16 bytes at `mac2`) is right for `source`.
    mutating func mac2Valid(
        _ message: [UInt8], mac2: Range<Int>, from source: TransportAddress, now: Timestamp, random: inout any SecureRandom
    ) -> Bool {
        let key = cookie(for: source, now: now, random: &random)
        return MAC.equal(message[mac2], MAC.mac(message[..<mac2.lowerBound], key: key))
    }

    /// A cookie reply to an initiation whose sender index is `receiverIndex`
    /// and whose mac1 is `mac1` (the reply's associated data).
    mutating func reply(
        receiverIndex: UInt32, mac1: ArraySlice<UInt8>, to source: TransportAddress, now: Timestamp,
        random: inout any SecureRandom
    ) -> [UInt8] {
        let cookie = cookie(for: source, now: now, random: &random)
        let nonce = random.bytes(24)
        var out = [UInt8](repeating: 0, count: HandshakeWire.cookieReplyLength)
        out[0] = HandshakeWire.cookieReply
        out.writeUInt32(receiverIndex, at: 4)
        out.replaceSubrange(8..<32, with: nonce)
        let ad = Array(mac1)
        var sealed = [UInt8](repeating: 0, count: 32)
        var sealedLength: UInt64 = 0
        _ = crypto_aead_xchacha20poly1305_ietf_encrypt(
            &sealed, &sealedLength, cookie, UInt64(cookie.count), ad, UInt64(ad.count), nil, nonce, cookieKey)
        out.replaceSubrange(32..<64, with: sealed)
        return out
    }

    /// Opens a cookie reply on the initiator's side: the cookie, or nil if it
    /// does not authenticate under `responder`'s cookie key and our last mac1.
    static func openReply(_ message: [UInt8], responder: PublicKey, lastMAC1: [UInt8]) -> [UInt8]? {
        guard message.count == HandshakeWire.cookieReplyLength else { return nil }
        let key = MAC.cookieKey(for: responder)
        let nonce = Array(message[8..<32])
        let sealed = Array(message[32..<64])
        var cookie = [UInt8](repeating: 0, count: 16)
        var length: UInt64 = 0
        let rc = crypto_aead_xchacha20poly1305_ietf_decrypt(
            &cookie, &length, nil, sealed, UInt64(sealed.count), lastMAC1, UInt64(lastMAC1.count), nonce, key)
        return rc == 0 && length == 16 ? cookie : nil
    }
}
