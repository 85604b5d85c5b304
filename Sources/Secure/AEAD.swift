import CSodium

/// A pointer libsodium may be handed for an empty buffer (Swift gives `nil`
/// for the base address of an empty buffer; some C paths dislike NULL).
/// `nonisolated(unsafe)`: allocated once, never written, never freed.
nonisolated(unsafe) private let emptyBytes = UnsafeMutableRawPointer.allocate(byteCount: 16, alignment: 16)

extension UnsafeRawBufferPointer {
    var basePointer: UnsafePointer<UInt8> {
        (baseAddress ?? UnsafeRawPointer(emptyBytes)).assumingMemoryBound(to: UInt8.self)
    }
}

extension UnsafeMutableRawBufferPointer {
    var basePointer: UnsafeMutablePointer<UInt8> {
        (baseAddress ?? emptyBytes).assumingMemoryBound(to: UInt8.self)
    }
}

/// The two libsodium detached AEAD constructions this module uses; they
/// share one C signature and differ in the nonce length.
enum AEADConstruction: Sendable {
    case chaCha20Poly1305IETF, xChaCha20Poly1305

    var nonceLength: Int { self == .chaCha20Poly1305IETF ? 12 : 24 }

    /// Encrypts `plaintext` to `ciphertext` (same length; may be the same
    /// memory, in place) and writes the 16-byte tag to `tag`. No checks: the
    /// callers have sized everything.
    @inline(__always)
    func sealDetached(
        key: UnsafeRawPointer, nonce: UnsafeRawPointer, ad: UnsafeRawBufferPointer,
        plaintext: UnsafeRawBufferPointer, ciphertext: UnsafeMutableRawPointer,
        tag: UnsafeMutableRawPointer
    ) {
        let c = ciphertext.assumingMemoryBound(to: UInt8.self)
        let t = tag.assumingMemoryBound(to: UInt8.self)
        let n = nonce.assumingMemoryBound(to: UInt8.self)
        let k = key.assumingMemoryBound(to: UInt8.self)
        switch self {
        case .chaCha20Poly1305IETF:
            _ = crypto_aead_chacha20poly1305_ietf_encrypt_detached(
                c, t, nil, plaintext.basePointer, UInt64(plaintext.count), ad.basePointer, UInt64(ad.count), nil, n, k)
        case .xChaCha20Poly1305:
            _ = crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
                c, t, nil, plaintext.basePointer, UInt64(plaintext.count), ad.basePointer, UInt64(ad.count), nil, n, k)
        }
    }

    /// Verifies the tag, then decrypts (in place allowed). On failure
    /// libsodium zeroes the output (so an in-place open destroys the
    /// ciphertext); `plaintext == nil` only verifies and writes nothing.
    @inline(__always)
    func openDetached(
        key: UnsafeRawPointer, nonce: UnsafeRawPointer, ad: UnsafeRawBufferPointer,
        ciphertext: UnsafeRawBufferPointer, tag: UnsafeRawPointer,
        plaintext: UnsafeMutableRawPointer?
    ) -> Bool {
        let m = plaintext?.assumingMemoryBound(to: UInt8.self)
        let t = tag.assumingMemoryBound(to: UInt8.self)
        let n = nonce.assumingMemoryBound(to: UInt8.self)
        let k = key.assumingMemoryBound(to: UInt8.self)
        switch self {
        case .chaCha20Poly1305IETF:
            return crypto_aead_chacha20poly1305_ietf_decrypt_detached(
                m, nil, ciphertext.basePointer, UInt64(ciphertext.count), t, ad.basePointer, UInt64(ad.count), n, k) == 0
        case .xChaCha20Poly1305:
            return crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
                m, nil, ciphertext.basePointer, UInt64(ciphertext.count), t, ad.basePointer, UInt64(ad.count), n, k) == 0
        }
    }

    func seal(
        key: SecretKey, nonce: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        plaintext: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        Sodium.ensureInitialized()
        guard nonce.count == nonceLength else { throw SecureError.malformed("nonce must be \(nonceLength) bytes") }
        let needed = plaintext.count + AEAD.tagLength
        guard out.count >= needed else { throw SecureError.bufferTooSmall(needed: needed, have: out.count) }
        key.withUnsafeBytes { k in
            sealDetached(
                key: k.basePointer, nonce: nonce.basePointer, ad: ad, plaintext: plaintext,
                ciphertext: out.basePointer, tag: out.basePointer + plaintext.count)
        }
        return needed
    }

    func open(
        key: SecretKey, nonce: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        ciphertext: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        Sodium.ensureInitialized()
        guard nonce.count == nonceLength else { throw SecureError.malformed("nonce must be \(nonceLength) bytes") }
        guard ciphertext.count >= AEAD.tagLength else { throw SecureError.truncated }
        let length = ciphertext.count - AEAD.tagLength
        guard out.count >= length else { throw SecureError.bufferTooSmall(needed: length, have: out.count) }
        let body = UnsafeRawBufferPointer(rebasing: ciphertext[..<length])
        let ok = key.withUnsafeBytes { k in
            openDetached(
                key: k.basePointer, nonce: nonce.basePointer, ad: ad, ciphertext: body,
                tag: ciphertext.basePointer + length, plaintext: out.basePointer)
        }
        guard ok else { throw SecureError.authenticationFailed }
        return length
    }

    func seal(key: SecretKey, nonce: [UInt8], ad: [UInt8], plaintext: [UInt8]) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: plaintext.count + AEAD.tagLength)
        _ = try nonce.withUnsafeBytes { n in
            try ad.withUnsafeBytes { a in
                try plaintext.withUnsafeBytes { p in
                    try out.withUnsafeMutableBytes { try seal(key: key, nonce: n, ad: a, plaintext: p, into: $0) }
                }
            }
        }
        return out
    }

    func open(key: SecretKey, nonce: [UInt8], ad: [UInt8], ciphertext: [UInt8]) throws -> [UInt8] {
        guard ciphertext.count >= AEAD.tagLength else { throw SecureError.truncated }
        var out = [UInt8](repeating: 0, count: ciphertext.count - AEAD.tagLength)
        _ = try nonce.withUnsafeBytes { n in
            try ad.withUnsafeBytes { a in
                try ciphertext.withUnsafeBytes { c in
                    try out.withUnsafeMutableBytes { try open(key: key, nonce: n, ad: a, ciphertext: c, into: $0) }
                }
            }
        }
        return out
    }
}

/// ChaCha20-Poly1305 (IETF, RFC 8439): 32-byte key, 12-byte nonce, 16-byte tag.
/// The output is ciphertext ‖ tag.
public enum AEAD {
    public static let keyLength = 32
    public static let nonceLength = 12
    public static let tagLength = 16

    /// Writes ciphertext ‖ tag to `out`; returns `plaintext.count + 16`.
    /// `out` may start at `plaintext` (in place) but must not otherwise overlap it.
    public static func seal(
        key: SecretKey, nonce: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        plaintext: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        try AEADConstruction.chaCha20Poly1305IETF.seal(key: key, nonce: nonce, ad: ad, plaintext: plaintext, into: out)
    }

    /// Checks the tag of ciphertext ‖ tag and writes the plaintext to `out`;
    /// returns its length. On `.authenticationFailed` `out` is zeroed.
    public static func open(
        key: SecretKey, nonce: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        ciphertext: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        try AEADConstruction.chaCha20Poly1305IETF.open(key: key, nonce: nonce, ad: ad, ciphertext: ciphertext, into: out)
    }

    public static func seal(key: SecretKey, nonce: [UInt8], ad: [UInt8] = [], plaintext: [UInt8]) throws -> [UInt8] {
        try AEADConstruction.chaCha20Poly1305IETF.seal(key: key, nonce: nonce, ad: ad, plaintext: plaintext)
    }

    public static func open(key: SecretKey, nonce: [UInt8], ad: [UInt8] = [], ciphertext: [UInt8]) throws -> [UInt8] {
        try AEADConstruction.chaCha20Poly1305IETF.open(key: key, nonce: nonce, ad: ad, ciphertext: ciphertext)
    }
}

/// XChaCha20-Poly1305: as `AEAD` with a 24-byte nonce, safe to pick at random
/// (WireGuard-style cookie replies).
public enum XAEAD {
    public static let keyLength = 32
    public static let nonceLength = 24
    public static let tagLength = 16

    public static func seal(
        key: SecretKey, nonce: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        plaintext: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        try AEADConstruction.xChaCha20Poly1305.seal(key: key, nonce: nonce, ad: ad, plaintext: plaintext, into: out)
    }

    public static func open(
        key: SecretKey, nonce: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        ciphertext: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        try AEADConstruction.xChaCha20Poly1305.open(key: key, nonce: nonce, ad: ad, ciphertext: ciphertext, into: out)
    }

    public static func seal(key: SecretKey, nonce: [UInt8], ad: [UInt8] = [], plaintext: [UInt8]) throws -> [UInt8] {
        try AEADConstruction.xChaCha20Poly1305.seal(key: key, nonce: nonce, ad: ad, plaintext: plaintext)
    }

    public static func open(key: SecretKey, nonce: [UInt8], ad: [UInt8] = [], ciphertext: [UInt8]) throws -> [UInt8] {
        try AEADConstruction.xChaCha20Poly1305.open(key: key, nonce: nonce, ad: ad, ciphertext: ciphertext)
    }
}
