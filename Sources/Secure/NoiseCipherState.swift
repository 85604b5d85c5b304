import CSodium

/// Noise CipherState (section 5.1) over ChaChaPoly: a 32-byte key and a 64-bit
/// counter; nonce = 4 zero bytes ‖ little-endian counter. Used inside the
/// handshake and, built from `NoiseTransportKeys`, for Noise transport
/// messages. One owner; not thread-safe.
public final class NoiseCipherState {
    private let key = SecureBytes(count: 32)
    private(set) var hasKey = false
    /// The counter the next encrypt/decrypt uses.
    public private(set) var nonce: UInt64 = 0

    init() {}

    /// A transport CipherState (counter 0) with `key`.
    public init(key: SecretKey) {
        key.withUnsafeBytes { initializeKey($0) }
    }

    deinit {}  // `key` zeroes itself.

    func initializeKey(_ bytes: UnsafeRawBufferPointer) {
        precondition(bytes.count >= 32)
        key.pointer.copyMemory(from: bytes.basePointer, byteCount: 32)
        hasKey = true
        nonce = 0
    }

    func clear() {
        key.zero()
        hasKey = false
    }

    /// The counter for this message, refusing 2^64 − 1 (reserved by the spec).
    private func nextNonce() throws -> UInt64 {
        guard nonce < UInt64.max else { throw SecureError.nonceExhausted }
        return nonce
    }

    private func withNonceBytes<R>(_ n: UInt64, _ body: (UnsafeRawPointer) -> R) -> R {
        withUnsafeTemporaryAllocation(byteCount: 12, alignment: 4) { buffer in
            buffer.storeBytes(of: 0, toByteOffset: 0, as: UInt32.self)
            buffer.storeBytes(of: n.littleEndian, toByteOffset: 4, as: UInt64.self)
            return body(UnsafeRawPointer(buffer.baseAddress!))
        }
    }

    /// EncryptWithAd: ciphertext ‖ tag into `out` (plaintext + 16 bytes), or
    /// the plaintext itself while there is no key. Returns the length written.
    public func encrypt(
        ad: UnsafeRawBufferPointer, plaintext: UnsafeRawBufferPointer,
        into out: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        guard hasKey else {
            guard out.count >= plaintext.count else {
                throw SecureError.bufferTooSmall(needed: plaintext.count, have: out.count)
            }
            if plaintext.count > 0 { out.basePointer.update(from: plaintext.basePointer, count: plaintext.count) }
            return plaintext.count
        }
        let needed = plaintext.count + AEAD.tagLength
        guard out.count >= needed else { throw SecureError.bufferTooSmall(needed: needed, have: out.count) }
        let n = try nextNonce()
        withNonceBytes(n) { nonce in
            AEADConstruction.chaCha20Poly1305IETF.sealDetached(
                key: key.pointer, nonce: nonce, ad: ad, plaintext: plaintext,
                ciphertext: out.basePointer, tag: out.basePointer + plaintext.count)
        }
        nonce = n + 1
        return needed
    }

    /// DecryptWithAd: plaintext into `out`; the counter advances only when
    /// the tag checks (section 5.1).
    public func decrypt(
        ad: UnsafeRawBufferPointer, ciphertext: UnsafeRawBufferPointer,
        into out: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        guard hasKey else {
            guard out.count >= ciphertext.count else {
                throw SecureError.bufferTooSmall(needed: ciphertext.count, have: out.count)
            }
            if ciphertext.count > 0 { out.basePointer.update(from: ciphertext.basePointer, count: ciphertext.count) }
            return ciphertext.count
        }
        guard ciphertext.count >= AEAD.tagLength else { throw SecureError.truncated }
        let length = ciphertext.count - AEAD.tagLength
        guard out.count >= length else { throw SecureError.bufferTooSmall(needed: length, have: out.count) }
        let n = try nextNonce()
        let body = UnsafeRawBufferPointer(rebasing: ciphertext[..<length])
        let ok = withNonceBytes(n) { nonce in
            AEADConstruction.chaCha20Poly1305IETF.openDetached(
                key: key.pointer, nonce: nonce, ad: ad, ciphertext: body,
                tag: ciphertext.basePointer + length, plaintext: out.basePointer)
        }
        guard ok else { throw SecureError.authenticationFailed }
        nonce = n + 1
        return length
    }

    public func encrypt(ad: [UInt8] = [], plaintext: [UInt8]) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: plaintext.count + (hasKey ? AEAD.tagLength : 0))
        _ = try ad.withUnsafeBytes { a in
            try plaintext.withUnsafeBytes { p in try out.withUnsafeMutableBytes { try encrypt(ad: a, plaintext: p, into: $0) } }
        }
        return out
    }

    public func decrypt(ad: [UInt8] = [], ciphertext: [UInt8]) throws -> [UInt8] {
        let tag = hasKey ? AEAD.tagLength : 0
        guard ciphertext.count >= tag else { throw SecureError.truncated }
        var out = [UInt8](repeating: 0, count: ciphertext.count - tag)
        _ = try ad.withUnsafeBytes { a in
            try ciphertext.withUnsafeBytes { c in try out.withUnsafeMutableBytes { try decrypt(ad: a, ciphertext: c, into: $0) } }
        }
        return out
    }
}
