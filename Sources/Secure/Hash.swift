import CSodium

/// The hash functions Noise may be instantiated with (all through libsodium;
/// BLAKE2s is not in libsodium and not offered).
public enum NoiseHash: Sendable, CaseIterable {
    case blake2b, sha256, sha512

    /// The name in a Noise protocol name.
    public var name: String {
        switch self {
        case .blake2b: "BLAKE2b"
        case .sha256: "SHA256"
        case .sha512: "SHA512"
        }
    }

    /// HASHLEN.
    public var hashLength: Int { self == .sha256 ? 32 : 64 }
    /// BLOCKLEN (for HMAC).
    public var blockLength: Int { self == .sha256 ? 64 : 128 }
}

/// One reusable hash state (64-byte aligned, as libsodium's BLAKE2b state
/// wants) plus HMAC and HKDF as the Noise specification defines them
/// (section 4.3, RFC 2104 HMAC with the hash's BLOCKLEN). Not thread-safe:
/// one per handshake.
final class HashEngine {
    let function: NoiseHash
    private let state: UnsafeMutableRawPointer
    private let stateSize: Int
    /// HMAC scratch: the padded key block (BLOCKLEN) then the inner hash (HASHLEN).
    private let scratch: SecureBytes

    init(_ function: NoiseHash) {
        Sodium.ensureInitialized()
        self.function = function
        stateSize = max(
            crypto_generichash_blake2b_statebytes(), crypto_hash_sha512_statebytes(),
            crypto_hash_sha256_statebytes())
        state = UnsafeMutableRawPointer.allocate(byteCount: stateSize, alignment: 64)
        scratch = SecureBytes(count: 128 + 64)
    }

    deinit {
        sodium_memzero(state, stateSize)
        state.deallocate()
    }

    var hashLength: Int { function.hashLength }

    /// HASH(parts[0] ‖ parts[1] ‖ …) into `out` (HASHLEN bytes).
    func hash(_ parts: [UnsafeRawBufferPointer], into out: UnsafeMutableRawPointer) {
        let o = out.assumingMemoryBound(to: UInt8.self)
        switch function {
        case .blake2b:
            let st = OpaquePointer(state)  // over-aligned C struct: imported opaque
            crypto_generichash_blake2b_init(st, nil, 0, 64)
            for p in parts where p.count > 0 { crypto_generichash_blake2b_update(st, p.basePointer, UInt64(p.count)) }
            crypto_generichash_blake2b_final(st, o, 64)
        case .sha256:
            let st = state.bindMemory(to: crypto_hash_sha256_state.self, capacity: 1)
            crypto_hash_sha256_init(st)
            for p in parts where p.count > 0 { crypto_hash_sha256_update(st, p.basePointer, UInt64(p.count)) }
            crypto_hash_sha256_final(st, o)
        case .sha512:
            let st = state.bindMemory(to: crypto_hash_sha512_state.self, capacity: 1)
            crypto_hash_sha512_init(st)
            for p in parts where p.count > 0 { crypto_hash_sha512_update(st, p.basePointer, UInt64(p.count)) }
            crypto_hash_sha512_final(st, o)
        }
        sodium_memzero(state, stateSize)
    }

    /// HMAC-HASH(key, parts…) into `out` (HASHLEN bytes). `out` may alias `key`.
    func hmac(key: UnsafeRawBufferPointer, _ parts: [UnsafeRawBufferPointer], into out: UnsafeMutableRawPointer) {
        let blockLength = function.blockLength
        let block = scratch.pointer
        let inner = scratch.pointer + 128
        sodium_memzero(block, blockLength)
        if key.count > blockLength {
            hash([key], into: block)
        } else if key.count > 0 {
            block.copyMemory(from: key.basePointer, byteCount: key.count)
        }
        let b = block.assumingMemoryBound(to: UInt8.self)
        for i in 0..<blockLength { b[i] ^= 0x36 }
        hash([UnsafeRawBufferPointer(start: block, count: blockLength)] + parts, into: inner)
        for i in 0..<blockLength { b[i] ^= 0x36 ^ 0x5C }
        hash(
            [
                UnsafeRawBufferPointer(start: block, count: blockLength),
                UnsafeRawBufferPointer(start: inner, count: hashLength),
            ], into: out)
        scratch.zero()
    }

    /// HKDF(chainingKey, ikm, n) per Noise 4.3: writes n (2 or 3) outputs of
    /// HASHLEN bytes. `tempKey` is HASHLEN bytes of scratch the caller zeroes.
    /// Outputs may alias `chainingKey` (it is read only for the first HMAC).
    func hkdf(
        chainingKey: UnsafeRawBufferPointer, ikm: UnsafeRawBufferPointer, tempKey: UnsafeMutableRawPointer,
        outputs: [UnsafeMutableRawPointer]
    ) {
        let n = hashLength
        hmac(key: chainingKey, [ikm], into: tempKey)
        let k = UnsafeRawBufferPointer(start: tempKey, count: n)
        var counter: UInt8 = 1
        var previous: UnsafeRawBufferPointer? = nil
        for out in outputs {
            withUnsafeBytes(of: counter) { c in
                if let previous { hmac(key: k, [previous, c], into: out) } else { hmac(key: k, [c], into: out) }
            }
            previous = UnsafeRawBufferPointer(start: out, count: n)
            counter += 1
        }
        sodium_memzero(tempKey, n)
    }
}

/// BLAKE2b (libsodium `crypto_generichash`), keyed or not.
public enum Blake2b {
    public static let minOutputLength = 16
    public static let maxOutputLength = 64
    public static let maxKeyLength = 64

    /// BLAKE2b-`outputLength`(key, data). `outputLength` must be 16…64 and
    /// the key at most 64 bytes (programmer errors, checked by precondition).
    public static func hash(
        _ data: some Collection<UInt8>, key: some Collection<UInt8> = [UInt8](),
        outputLength: Int = 32
    ) -> [UInt8] {
        let hasher = Hasher(key: key, outputLength: outputLength)
        hasher.update(data)
        return hasher.finalize()
    }

    /// BLAKE2b over the concatenation of `parts`, without building it.
    public static func hash(
        parts: [[UInt8]], key: some Collection<UInt8> = [UInt8](),
        outputLength: Int = 32
    ) -> [UInt8] {
        let hasher = Hasher(key: key, outputLength: outputLength)
        for p in parts { hasher.update(p) }
        return hasher.finalize()
    }

    /// Into caller memory (`out.count` is the output length), no allocation
    /// beyond the state: for MACs over packets.
    public static func hash(
        _ data: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer,
        into out: UnsafeMutableRawBufferPointer
    ) {
        Sodium.ensureInitialized()
        precondition((minOutputLength...maxOutputLength).contains(out.count) && key.count <= maxKeyLength)
        crypto_generichash(
            out.basePointer, out.count, data.basePointer, UInt64(data.count),
            key.count == 0 ? nil : key.basePointer, key.count)
    }

    /// Incremental BLAKE2b over several parts. One owner; not thread-safe.
    public final class Hasher {
        private let state: UnsafeMutableRawPointer
        private let size: Int
        private let outputLength: Int
        private var finished = false

        public init(key: some Collection<UInt8> = [UInt8](), outputLength: Int = 32) {
            Sodium.ensureInitialized()
            precondition(
                (Blake2b.minOutputLength...Blake2b.maxOutputLength).contains(outputLength),
                "BLAKE2b output length must be 16...64")
            precondition(key.count <= Blake2b.maxKeyLength, "BLAKE2b key must be at most 64 bytes")
            self.outputLength = outputLength
            size = crypto_generichash_statebytes()
            state = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 64)
            let st = OpaquePointer(state)
            var keyBytes = Array(key)
            keyBytes.withUnsafeBufferPointer { k in
                _ = crypto_generichash_init(st, k.count == 0 ? nil : k.baseAddress, k.count, outputLength)
            }
            if !keyBytes.isEmpty { keyBytes.withUnsafeMutableBytes { Sodium.zero($0) } }
        }

        deinit {
            sodium_memzero(state, size)
            state.deallocate()
        }

        public func update(_ data: UnsafeRawBufferPointer) {
            precondition(!finished, "Blake2b.Hasher used after finalize()")
            guard data.count > 0 else { return }
            crypto_generichash_update(
                OpaquePointer(state),
                data.basePointer, UInt64(data.count))
        }

        public func update(_ data: some Collection<UInt8>) {
            let done: Void? = data.withContiguousStorageIfAvailable { update(UnsafeRawBufferPointer($0)) }
            if done == nil { Array(data).withUnsafeBytes { update($0) } }
        }

        public func finalize(into out: UnsafeMutableRawBufferPointer) {
            precondition(!finished && out.count == outputLength)
            finished = true
            crypto_generichash_final(
                OpaquePointer(state),
                out.basePointer, outputLength)
        }

        public func finalize() -> [UInt8] {
            var out = [UInt8](repeating: 0, count: outputLength)
            out.withUnsafeMutableBytes { finalize(into: $0) }
            return out
        }
    }
}
