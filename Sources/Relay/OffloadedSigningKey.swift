import Crypto
import CryptoExtras
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A TLS certificate's private key whose handshake signatures are made on a thread
/// pool instead of the event loop the connection lives on. The signature is the
/// costly part of a server's handshake (about 5 ms of CPU with RSA 4096, 1.2 ms with
/// RSA 2048): made on the loop, a flood of handshakes holds up every other connection
/// and every datagram that loop serves; made on the pool, the loop waits for none of
/// them. The signing threads (``signers``) run at a nice value 10 above the
/// process's, so that the kernel gives a loop that wakes up the CPU first: under a
/// flood, handshakes get what the traffic leaves.
///
/// RSA (2048 bits or more, PSS and PKCS #1 v1.5 with SHA-256/384/512) and ECDSA on
/// P-256 and P-384; ``load(_:pool:)`` gives nil for other keys, which then sign on
/// the loop as before. Only ECDHE key exchange is offered with it (the signature is
/// the key's one use): RSA key exchange, without forward secrecy, would need the raw
/// key's decryption on the loop.
struct OffloadedSigningKey: NIOSSLCustomPrivateKey, Hashable {
    private enum Key: Sendable {
        case rsa(_RSA.Signing.PrivateKey)
        case p256(P256.Signing.PrivateKey)
        case p384(P384.Signing.PrivateKey)
    }

    private let key: Key
    private let pool: NIOThreadPool
    /// The key's DER bytes: its identity (NIOSSL compares contexts' keys).
    let derBytes: [UInt8]

    /// `key` (as NIOSSL loaded it), signing on `pool`; nil when it is none of the
    /// kinds above (or an RSA key under 2048 bits).
    static func load(_ key: NIOSSLPrivateKey, pool: NIOThreadPool) -> OffloadedSigningKey? {
        guard let der = try? key.derBytes else { return nil }
        let loaded: Key
        if let rsa = try? _RSA.Signing.PrivateKey(derRepresentation: der) {
            loaded = .rsa(rsa)
        } else if let p256 = try? P256.Signing.PrivateKey(derRepresentation: der) {
            loaded = .p256(p256)
        } else if let p384 = try? P384.Signing.PrivateKey(derRepresentation: der) {
            loaded = .p384(p384)
        } else {
            return nil
        }
        return OffloadedSigningKey(key: loaded, pool: pool, derBytes: der)
    }

    /// Half the cores' worth of threads (at least one) for the relay's signatures, and the
    /// nice value they take: 10 above the process's (up to 19).
    static let signers: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: max(1, System.coreCount / 2))
        pool.start()
        return pool
    }()
    /// Read where the key is made (RelayService.tlsContext, at start), not on a signing thread.
    private let nice = Self.processNice() + 10

    /// Signatures queued or being made, at most ``maximumWaiting``: past it a handshake
    /// fails at once (a flood's backlog would only make every client wait past its timeout).
    private static let waiting = Atomic<Int>(0)
    static let maximumWaiting = 512

    /// Whether the environment asks for signatures on the event loop, as before
    /// (`TUSA_TLS_SIGN_ON_LOOP=1`: Benchmarks/tls-flood-relay.sh compares the two).
    static var signOnLoop: Bool { getenv("TUSA_TLS_SIGN_ON_LOOP").map { String(cString: $0) == "1" } ?? false }

    /// The ciphers that go with it: NIOSSL's defaults less RSA key exchange.
    static let cipherSuites = "ECDH+AESGCM:ECDH+CHACHA20:ECDH+AES256:ECDH+AES128:!aNULL:!eNULL:!MD5"

    static func == (a: Self, b: Self) -> Bool { a.derBytes == b.derBytes }
    func hash(into hasher: inout Hasher) { hasher.combine(derBytes) }

    var signatureAlgorithms: [SignatureAlgorithm] {
        switch key {
        // BoringSSL's own server preferences for these keys, SHA-1 last (TLS 1.2 clients
        // that name no algorithms; TLS 1.3 leaves it out, and the curve-bound ECDSA pairs).
        case .rsa:
            [
                .rsaPssRsaeSha256, .rsaPkcs1Sha256, .rsaPssRsaeSha384, .rsaPkcs1Sha384, .rsaPssRsaeSha512,
                .rsaPkcs1Sha512, .rsaPkcs1Sha1,
            ]
        case .p256, .p384: [.ecdsaSecp256R1Sha256, .ecdsaSecp384R1Sha384, .ecdsaSecp521R1Sha512, .ecdsaSha1]
        }
    }

    func sign(channel: any Channel, algorithm: SignatureAlgorithm, data: ByteBuffer) -> EventLoopFuture<ByteBuffer> {
        let message = Array(data.readableBytesView)
        let key = self.key
        let allocator = channel.allocator
        let nice = self.nice
        guard Self.waiting.wrappingAdd(1, ordering: .relaxed).newValue <= Self.maximumWaiting else {
            Self.waiting.wrappingSubtract(1, ordering: .relaxed)
            return channel.eventLoop.makeFailedFuture(Busy())
        }
        return pool.runIfActive(eventLoop: channel.eventLoop) {
            defer { Self.waiting.wrappingSubtract(1, ordering: .relaxed) }
            // Not for a connection gone while it waited (a flood's, mostly).
            guard channel.isActive else { throw ChannelError.ioOnClosedChannel }
            Self.lowerPriority(to: nice)
            return try Self.signature(of: message, by: key, algorithm: algorithm)
        }.map { allocator.buffer(bytes: $0) }
    }

    /// Too many signatures wait already.
    struct Busy: Error, CustomStringConvertible {
        var description: String { "\(OffloadedSigningKey.maximumWaiting) TLS signatures wait already" }
    }

    /// The calling thread's nice value. (On Linux a nice value belongs to a thread, and
    /// 0 names the calling one.)
    private static func processNice() -> Int32 {
        #if canImport(Glibc)
            getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
        #else
            getpriority(PRIO_PROCESS, 0)
        #endif
    }

    /// The calling thread at nice `nice` (at most 19); set before each signature: a system
    /// call against a millisecond's work.
    private static func lowerPriority(to nice: Int32) {
        #if canImport(Glibc)
            _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, min(19, nice))
        #else
            _ = setpriority(PRIO_PROCESS, 0, min(19, nice))
        #endif
    }

    /// Never asked: the cipher suites above leave out RSA key exchange.
    func decrypt(channel: any Channel, data: ByteBuffer) -> EventLoopFuture<ByteBuffer> {
        channel.eventLoop.makeFailedFuture(Unsupported(what: "RSA key exchange"))
    }

    struct Unsupported: Error, CustomStringConvertible {
        var what: String
        var description: String { "\(what) is not offered" }
    }

    private static func signature(of message: [UInt8], by key: Key, algorithm: SignatureAlgorithm) throws -> [UInt8] {
        let unsupported = Unsupported(what: "signature algorithm 0x\(String(algorithm.rawValue, radix: 16))")
        // The algorithm names the hash; the key, RSA or which ECDSA curve.
        func rsa<D: Digest>(_ digest: D, _ padding: _RSA.Signing.Padding) throws -> [UInt8] {
            guard case .rsa(let rsa) = key else { throw unsupported }
            return Array(try rsa.signature(for: digest, padding: padding).rawRepresentation)
        }
        func ecdsa<D: Digest>(_ digest: D) throws -> [UInt8] {
            switch key {
            case .p256(let ec): Array(try ec.signature(for: digest).derRepresentation)
            case .p384(let ec): Array(try ec.signature(for: digest).derRepresentation)
            case .rsa: throw unsupported
            }
        }
        switch algorithm {
        case .rsaPssRsaeSha256: return try rsa(SHA256.hash(data: message), .PSS)
        case .rsaPssRsaeSha384: return try rsa(SHA384.hash(data: message), .PSS)
        case .rsaPssRsaeSha512: return try rsa(SHA512.hash(data: message), .PSS)
        case .rsaPkcs1Sha256: return try rsa(SHA256.hash(data: message), .insecurePKCS1v1_5)
        case .rsaPkcs1Sha384: return try rsa(SHA384.hash(data: message), .insecurePKCS1v1_5)
        case .rsaPkcs1Sha512: return try rsa(SHA512.hash(data: message), .insecurePKCS1v1_5)
        case .rsaPkcs1Sha1: return try rsa(Insecure.SHA1.hash(data: message), .insecurePKCS1v1_5)
        case .ecdsaSecp256R1Sha256: return try ecdsa(SHA256.hash(data: message))
        case .ecdsaSecp384R1Sha384: return try ecdsa(SHA384.hash(data: message))
        case .ecdsaSecp521R1Sha512: return try ecdsa(SHA512.hash(data: message))
        case .ecdsaSha1: return try ecdsa(Insecure.SHA1.hash(data: message))
        default: throw unsupported
        }
    }
}
