import CSodium

/// Noise SymmetricState (section 5.2): chaining key, handshake hash and the
/// handshake's CipherState. ck, h and every HKDF intermediate live in one
/// region of controlled memory, zeroed as soon as they are spent.
final class NoiseSymmetricState {
    let engine: HashEngine
    let cipher = NoiseCipherState()
    /// ck[64] ‖ h[64] ‖ tempKey[64] ‖ out2[64] ‖ out3[64] ‖ dh[32]
    private let region = SecureBytes(count: 64 * 5 + 32)

    private var ck: UnsafeMutableRawPointer { region.pointer }
    private var h: UnsafeMutableRawPointer { region.pointer + 64 }
    private var tempKey: UnsafeMutableRawPointer { region.pointer + 128 }
    private var out2: UnsafeMutableRawPointer { region.pointer + 192 }
    private var out3: UnsafeMutableRawPointer { region.pointer + 256 }
    /// 32 bytes for a DH result, consumed by `mixKey` right away.
    var dhScratch: UnsafeMutableRawBufferPointer { UnsafeMutableRawBufferPointer(start: region.pointer + 320, count: 32) }

    private var hashLength: Int { engine.hashLength }

    /// InitializeSymmetric(protocolName).
    init(protocolName: String, hash: NoiseHash) {
        engine = HashEngine(hash)
        let name = Array(protocolName.utf8)
        if name.count <= hash.hashLength {
            h.copyMemory(from: name, byteCount: name.count)
        } else {
            name.withUnsafeBytes { engine.hash([$0], into: h) }
        }
        ck.copyMemory(from: h, byteCount: hash.hashLength)
    }

    var handshakeHash: [UInt8] { Array(UnsafeRawBufferPointer(start: h, count: hashLength)) }

    func mixHash(_ data: UnsafeRawBufferPointer) {
        engine.hash([UnsafeRawBufferPointer(start: h, count: hashLength), data], into: h)
    }

    func mixHash(_ data: [UInt8]) { data.withUnsafeBytes { mixHash($0) } }

    /// MixKey(ikm): ck, temp_k = HKDF(ck, ikm, 2); InitializeKey(temp_k[0..<32]).
    func mixKey(_ ikm: UnsafeRawBufferPointer) {
        engine.hkdf(
            chainingKey: UnsafeRawBufferPointer(start: ck, count: hashLength), ikm: ikm, tempKey: tempKey,
            outputs: [ck, out2])
        cipher.initializeKey(UnsafeRawBufferPointer(start: out2, count: 32))
        sodium_memzero(out2, 64)
    }

    /// MixKey with the DH result in `dhScratch`, which is zeroed afterwards.
    func mixKeyWithDH() {
        mixKey(UnsafeRawBufferPointer(dhScratch))
        Sodium.zero(dhScratch)
    }

    /// MixKeyAndHash(ikm) for psk tokens: ck, temp_h, temp_k = HKDF(ck, ikm, 3).
    func mixKeyAndHash(_ ikm: UnsafeRawBufferPointer) {
        engine.hkdf(
            chainingKey: UnsafeRawBufferPointer(start: ck, count: hashLength), ikm: ikm, tempKey: tempKey,
            outputs: [ck, out2, out3])
        mixHash(UnsafeRawBufferPointer(start: out2, count: hashLength))
        cipher.initializeKey(UnsafeRawBufferPointer(start: out3, count: 32))
        sodium_memzero(out2, 64)
        sodium_memzero(out3, 64)
    }

    /// EncryptAndHash, appending the ciphertext to `message`.
    func encryptAndHash(_ plaintext: [UInt8], appendingTo message: inout [UInt8]) throws {
        let start = message.count
        message.append(contentsOf: try encryptWithH(plaintext))
        message.withUnsafeBytes { mixHash(UnsafeRawBufferPointer(rebasing: $0[start...])) }
    }

    private func encryptWithH(_ plaintext: [UInt8]) throws -> [UInt8] {
        try cipher.encrypt(ad: handshakeHash, plaintext: plaintext)
    }

    /// DecryptAndHash.
    func decryptAndHash(_ ciphertext: ArraySlice<UInt8>) throws -> [UInt8] {
        let c = Array(ciphertext)
        let plaintext = try cipher.decrypt(ad: handshakeHash, ciphertext: c)
        mixHash(c)
        return plaintext
    }

    /// Split(): the two transport keys (first 32 bytes of each HKDF output).
    /// Zeroes ck afterwards; h stays for `handshakeHash`.
    func split() -> (SecretKey, SecretKey) {
        engine.hkdf(
            chainingKey: UnsafeRawBufferPointer(start: ck, count: hashLength),
            ikm: UnsafeRawBufferPointer(start: nil, count: 0), tempKey: tempKey, outputs: [out2, out3])
        let k1 = SecretKey.filling { $0.copyMemory(from: UnsafeRawBufferPointer(start: out2, count: 32)) }
        let k2 = SecretKey.filling { $0.copyMemory(from: UnsafeRawBufferPointer(start: out3, count: 32)) }
        clearSecrets()
        return (k1, k2)
    }

    /// Zeroes everything secret (ck, scratch, the cipher key); keeps h.
    func clearSecrets() {
        sodium_memzero(ck, 64)
        sodium_memzero(tempKey, 64 * 3 + 32)
        cipher.clear()
    }
}
