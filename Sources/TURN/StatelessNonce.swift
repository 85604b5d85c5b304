import Crypto
import STUN
import TusaBase

/// Stateless TURN nonces: the nonce carries the time it was issued and a MAC
/// over that time and the client's transport address, so the server can check
/// it without remembering anything. A stranger's packet creates no state.
///
/// Layout (all printable, no quote or backslash, as NONCE requires):
/// `obMatJos2` + four base64 characters of the RFC 8489 §9.2 security-feature
/// bits (password algorithms offered) + eight hex digits of the issue time in
/// seconds + 16 base64url characters of HMAC-SHA256 truncated to 12 bytes.
public struct StatelessNonce: Sendable {
    /// The RFC 8489 §9.2 "nonce cookie" that announces security features.
    public static let cookie = "obMatJos2"
    /// Feature bits, numbered from the most significant (IETF order): bit 0
    /// = password algorithms. 0x800000 in base64.
    static let passwordAlgorithmsFeatures = "gAAA"
    static let length = 9 + 4 + 8 + 16

    private let key: SymmetricKey
    /// How long a nonce stays fresh.
    public let lifetime: Duration

    public init(secret: [UInt8], lifetime: Duration = .seconds(600)) {
        self.key = SymmetricKey(data: secret)
        self.lifetime = lifetime
    }

    /// A fresh random secret (per server start).
    public static func randomSecret() -> [UInt8] {
        var g = SystemRandomNumberGenerator()
        return (0..<32).map { _ in UInt8.random(in: 0...255, using: &g) }
    }

    /// Mints a nonce for a client at `now`.
    public func mint(for client: TransportAddress, now: Timestamp) -> String {
        let seconds = UInt32(truncatingIfNeeded: now.nanoseconds / 1_000_000_000)
        return Self.cookie + Self.passwordAlgorithmsFeatures + Self.hex(seconds) + mac(client, seconds)
    }

    public enum Verdict: Hashable, Sendable {
        /// Minted by this server for this client and still fresh.
        case fresh
        /// Minted by this server for this client, but too old.
        case stale
        /// Not one of ours (or for another client).
        case invalid
    }

    /// Checks a nonce a client sent back.
    public func check(_ nonce: String, for client: TransportAddress, now: Timestamp) -> Verdict {
        let u = Array(nonce.utf8)
        guard u.count == Self.length, nonce.hasPrefix(Self.cookie + Self.passwordAlgorithmsFeatures) else { return .invalid }
        var seconds: UInt32 = 0
        for c in u[13..<21] {
            guard let d = Self.hexValue(c) else { return .invalid }
            seconds = seconds << 4 | UInt32(d)
        }
        let expected = Array(mac(client, seconds).utf8)
        guard constantTimeEqual(u[21...], expected) else { return .invalid }
        let nowSeconds = UInt32(truncatingIfNeeded: now.nanoseconds / 1_000_000_000)
        let age = nowSeconds &- seconds  // wraps correctly for ages below 2^31 s
        let limit = UInt32(clamping: lifetime.components.seconds)
        return age <= limit && age < 1 << 31 ? .fresh : .stale
    }

    private func mac(_ client: TransportAddress, _ seconds: UInt32) -> String {
        var input = client.ip.bytes
        input.appendUInt16(client.port)
        input.appendUInt32(seconds)
        let code = HMAC<SHA256>.authenticationCode(for: input, using: key)
        return Self.base64url(Array(code.prefix(12)))
    }

    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    static func base64url(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        var i = 0
        while i + 3 <= bytes.count {
            let v = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
            for shift in [18, 12, 6, 0] { out.append(alphabet[Int((v >> UInt32(shift)) & 63)]) }
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func hex(_ v: UInt32) -> String {
        let s = String(v, radix: 16)
        return String(repeating: "0", count: 8 - s.count) + s
    }

    static func hexValue(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        default: nil
        }
    }
}
