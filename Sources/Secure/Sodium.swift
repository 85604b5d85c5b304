import CSodium

/// libsodium's one-time initialisation. Every entry point of this module that
/// needs libsodium calls `ensureInitialized()` (directly or through a key type).
public enum Sodium {
    /// A Swift global's initializer runs exactly once, under the runtime's own
    /// once-lock, so concurrent first callers all wait for one `sodium_init`.
    private static let initialized: Bool = {
        // 0: initialised now, 1: already initialised, -1: failure (no usable
        // randomness source); the last cannot be recovered from.
        sodium_init() >= 0
    }()

    /// Runs `sodium_init` once; thread-safe and cheap after the first call.
    public static func ensureInitialized() {
        precondition(initialized, "sodium_init failed: libsodium has no randomness source")
    }

    /// Constant-time comparison of two buffers of equal length.
    public static func constantTimeEqual(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
        guard a.count == b.count else { return false }
        guard let pa = a.baseAddress, let pb = b.baseAddress else { return a.count == 0 }
        return sodium_memcmp(pa, pb, a.count) == 0
    }

    /// Fills `buffer` with cryptographically secure random bytes.
    public static func randomBytes(_ buffer: UnsafeMutableRawBufferPointer) {
        ensureInitialized()
        guard let base = buffer.baseAddress else { return }
        randombytes_buf(base, buffer.count)
    }

    /// Zeroes `buffer` in a way the compiler may not elide.
    public static func zero(_ buffer: UnsafeMutableRawBufferPointer) {
        guard let base = buffer.baseAddress else { return }
        sodium_memzero(base, buffer.count)
    }
}

/// Everything that can go wrong in this module. Nothing arriving from the
/// network traps; it ends in one of these (or a `PacketDropReason`).
public enum SecureError: Error, Equatable, Sendable {
    case invalidKeyLength(expected: Int, got: Int)
    /// An X25519 result was all zero: the peer's public key is of low order.
    case weakPublicKey
    case authenticationFailed
    case bufferTooSmall(needed: Int, have: Int)
    case truncated
    case malformed(String)
    case handshakeState(String)
    /// A `MediaCipher` was retired (its key zeroed) and used afterwards.
    case keyRetired
    /// A counter (Noise nonce, control index) would repeat.
    case nonceExhausted
    /// A versioned encoding carried a version this build does not know.
    case unsupportedVersion(UInt8)
}

/// Bytes in memory this module allocated itself and zeroes before freeing:
/// never copied by value, never handed out beyond a closure's lifetime.
///
/// Plain heap memory zeroed with `sodium_memzero`, not `sodium_malloc`: the
/// latter maps guard pages per allocation (several syscalls), too slow for the
/// handful of keys a handshake makes and retires.
final class SecureBytes {
    let pointer: UnsafeMutableRawPointer
    let count: Int

    init(count: Int) {
        self.count = count
        pointer = UnsafeMutableRawPointer.allocate(byteCount: max(count, 1), alignment: 16)
        pointer.initializeMemory(as: UInt8.self, repeating: 0, count: max(count, 1))
    }

    convenience init(copying bytes: UnsafeRawBufferPointer) {
        self.init(count: bytes.count)
        if let base = bytes.baseAddress { pointer.copyMemory(from: base, byteCount: bytes.count) }
    }

    var buffer: UnsafeMutableRawBufferPointer { UnsafeMutableRawBufferPointer(start: pointer, count: count) }

    func zero() { sodium_memzero(pointer, count) }

    deinit {
        sodium_memzero(pointer, count)
        pointer.deallocate()
    }
}

/// A 32-byte secret (a symmetric key or an X25519 private scalar) in memory
/// this module controls, zeroed when the last reference goes away.
///
/// `@unchecked Sendable`: the bytes are written once in `init` and only read
/// afterwards (`withUnsafeBytes`); the storage is freed in `deinit`, when no
/// other thread can hold a reference. No mutation is reachable after init.
public final class SecretKey: @unchecked Sendable, Equatable {
    public static let length = 32
    let storage: SecureBytes

    private init(storage: SecureBytes) { self.storage = storage }

    /// Copies exactly 32 bytes into controlled memory.
    public convenience init(bytes: some Collection<UInt8>) throws {
        guard bytes.count == Self.length else {
            throw SecureError.invalidKeyLength(expected: Self.length, got: bytes.count)
        }
        let s = SecureBytes(count: Self.length)
        for (i, b) in bytes.enumerated() { s.pointer.storeBytes(of: b, toByteOffset: i, as: UInt8.self) }
        self.init(storage: s)
    }

    /// Copies exactly 32 bytes from raw memory.
    public convenience init(copying bytes: UnsafeRawBufferPointer) throws {
        guard bytes.count == Self.length else {
            throw SecureError.invalidKeyLength(expected: Self.length, got: bytes.count)
        }
        self.init(storage: SecureBytes(copying: bytes))
    }

    /// Builds a key by letting `fill` write its 32 bytes straight into the
    /// controlled memory (no intermediate copy). Module-internal.
    static func filling(_ fill: (UnsafeMutableRawBufferPointer) throws -> Void) rethrows -> SecretKey {
        let s = SecureBytes(count: length)
        try fill(s.buffer)
        return SecretKey(storage: s)
    }

    /// 32 fresh random bytes.
    public static func random() -> SecretKey {
        filling { Sodium.randomBytes($0) }
    }

    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try body(UnsafeRawBufferPointer(storage.buffer))
    }

    /// Constant-time comparison (`sodium_memcmp`).
    public static func == (a: SecretKey, b: SecretKey) -> Bool {
        a.withUnsafeBytes { pa in b.withUnsafeBytes { pb in Sodium.constantTimeEqual(pa, pb) } }
    }
}

/// A 32-byte X25519 public key.
public struct PublicKey: Hashable, Sendable, CustomStringConvertible {
    public static let length = 32
    public let bytes: [UInt8]

    public init(bytes: some Collection<UInt8>) throws {
        guard bytes.count == Self.length else {
            throw SecureError.invalidKeyLength(expected: Self.length, got: bytes.count)
        }
        self.bytes = Array(bytes)
    }

    /// Standard base64 (with padding), the form keys take in config files.
    public init?(base64: String) {
        guard let decoded = Base64.decode(base64), let key = try? PublicKey(bytes: decoded) else { return nil }
        self = key
    }

    public var base64: String { Base64.encode(bytes) }

    public init?(hex: String) {
        guard let decoded = Hex.decode(hex), let key = try? PublicKey(bytes: decoded) else { return nil }
        self = key
    }

    public var hex: String { Hex.encode(bytes) }

    public var description: String { base64 }
}

/// An X25519 private key; the scalar lives in a `SecretKey`.
public struct PrivateKey: Sendable {
    public let secret: SecretKey
    public let publicKey: PublicKey

    public init(secret: SecretKey) {
        Sodium.ensureInitialized()
        self.secret = secret
        var pub = [UInt8](repeating: 0, count: PublicKey.length)
        secret.withUnsafeBytes { s in
            pub.withUnsafeMutableBytes { p in
                // Cannot fail for a scalar times the base point.
                _ = crypto_scalarmult_base(p.baseAddress!, s.baseAddress!)
            }
        }
        publicKey = PublicKey(unchecked: pub)
    }

    public init(bytes: some Collection<UInt8>) throws {
        self.init(secret: try SecretKey(bytes: bytes))
    }

    public static func generate() -> PrivateKey {
        PrivateKey(secret: .random())
    }

    /// X25519(self, peer). An all-zero result (the peer sent a low-order
    /// point) is rejected with `.weakPublicKey`.
    public func sharedSecret(with peer: PublicKey) throws -> SecretKey {
        try SecretKey.filling { out in try diffieHellman(with: peer, into: out) }
    }

    /// X25519 into caller memory (32 bytes), for the Noise state's scratch.
    func diffieHellman(with peer: PublicKey, into out: UnsafeMutableRawBufferPointer) throws {
        precondition(out.count >= 32)
        let rc = secret.withUnsafeBytes { s in
            peer.bytes.withUnsafeBytes { p in
                crypto_scalarmult(out.baseAddress!, s.baseAddress!, p.baseAddress!)
            }
        }
        // libsodium returns -1 when the result is all zero (low-order point).
        if rc != 0 || sodium_is_zero(out.baseAddress!, 32) == 1 {
            sodium_memzero(out.baseAddress!, 32)
            throw SecureError.weakPublicKey
        }
    }
}

extension PublicKey {
    /// For callers that have already checked the length.
    init(unchecked bytes: [UInt8]) { self.bytes = bytes }
}
