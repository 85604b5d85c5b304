import TusaBase

/// Where the secure core draws its random bytes: ephemeral keys, sender
/// indices, SSRCs and initial sequence numbers, cookie secrets and nonces.
///
/// Real sessions use ``SystemRandom`` (libsodium), the default everywhere; a
/// test passes ``SeededRandom`` so that two runs on a virtual clock put the
/// same bytes on the wire.
public protocol SecureRandom {
    /// Fills `buffer` with random bytes.
    mutating func fill(_ buffer: UnsafeMutableRawBufferPointer)
}

extension SecureRandom {
    /// `count` random bytes.
    public mutating func bytes(_ count: Int) -> [UInt8] {
        var b = [UInt8](repeating: 0, count: count)
        b.withUnsafeMutableBytes { fill($0) }
        return b
    }

    /// A random 32-bit value.
    public mutating func uint32() -> UInt32 {
        var v: UInt32 = 0
        withUnsafeMutableBytes(of: &v) { fill($0) }
        return v
    }

    /// A random 32-bit value other than zero (sender indices, SSRCs).
    mutating func nonZeroUInt32() -> UInt32 {
        while true {
            let v = uint32()
            if v != 0 { return v }
        }
    }

    /// A fresh X25519 key pair (a handshake's ephemeral key).
    mutating func privateKey() -> PrivateKey {
        PrivateKey(secret: SecretKey.filling { fill($0) })
    }
}

/// The operating system's randomness through libsodium's `randombytes_buf`:
/// the default source of every `SecureEndpoint`.
public struct SystemRandom: SecureRandom, Sendable {
    public init() { Sodium.ensureInitialized() }

    public mutating func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        Sodium.randomBytes(buffer)
    }
}

/// A deterministic stream from a seed (SplitMix64): the same seed gives the
/// same bytes. For tests and benchmarks only: anyone who knows the seed knows
/// every key drawn from it.
public struct SeededRandom: SecureRandom, Sendable {
    private var generator: SplitMix64

    public init(seed: UInt64) { generator = SplitMix64(seed: seed) }

    public mutating func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        var i = 0
        while i < buffer.count {
            let word = generator.next()
            for shift in stride(from: 0, to: 64, by: 8) where i < buffer.count {
                buffer[i] = UInt8(truncatingIfNeeded: word >> UInt64(shift))
                i += 1
            }
        }
    }
}
