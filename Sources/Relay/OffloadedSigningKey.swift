import Crypto
import CryptoExtras
import NIOCore
import NIOPosix
import NIOSSL

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
    private static let signerNice = min(19, getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0) + 10)

    /// Whether the environment asks for signatures on the event loop, as before
    /// (`TUSA_TLS_SIGN_ON_LOOP=1`: Benchmarks/tls-flood-relay.sh compares the two).
    static var signOnLoop: Bool { getenv("TUSA_TLS_SIGN_ON_LOOP").map { String(cString: $0) == "1" } ?? false }

    /// The ciphers that go with it: NIOSSL's defaults less RSA key exchange.
    static let cipherSuites = "ECDH+AESGCM:ECDH+CHACHA20:ECDH+AES256:ECDH+AES128:!aNULL:!eNULL:!MD5"

    static func == (a: Self, b: Self) -> Bool { a.derBytes == b.derBytes }
    func hash(into hasher: inout Hasher) { hasher.combine(derBytes) }

    var signatureAlgorithms: [SignatureAlgorithm] {
        switch key {
        case .rsa:
            [.rsaPssRsaeSha256, .rsaPssRsaeSha384, .rsaPssRsaeSha512, .rsaPkcs1Sha256, .rsaPkcs1Sha384, .rsaPkcs1Sha512]
        case .p256: [.ecdsaSecp256R1Sha256]
        case .p384: [.ecdsaSecp384R1Sha384]
        }
    }

    func sign(channel: any Channel, algorithm: SignatureAlgorithm, data: ByteBuffer) -> EventLoopFuture<ByteBuffer> {
        let message = Array(data.readableBytesView)
        let key = self.key
        let allocator = channel.allocator
        let nice = Self.signerNice
        return pool.runIfActive(eventLoop: channel.eventLoop) {
            // (On Linux a nice value belongs to a thread, and 0 names the calling one.
            // Set each time: a system call against a millisecond's signature.)
            _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, nice)
            return try Self.signature(of: message, by: key, algorithm: algorithm)
        }.map { allocator.buffer(bytes: $0) }
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
        switch (key, algorithm) {
        case (.rsa(let rsa), .rsaPssRsaeSha256):
            Array(try rsa.signature(for: SHA256.hash(data: message), padding: .PSS).rawRepresentation)
        case (.rsa(let rsa), .rsaPssRsaeSha384):
            Array(try rsa.signature(for: SHA384.hash(data: message), padding: .PSS).rawRepresentation)
        case (.rsa(let rsa), .rsaPssRsaeSha512):
            Array(try rsa.signature(for: SHA512.hash(data: message), padding: .PSS).rawRepresentation)
        case (.rsa(let rsa), .rsaPkcs1Sha256):
            Array(try rsa.signature(for: SHA256.hash(data: message), padding: .insecurePKCS1v1_5).rawRepresentation)
        case (.rsa(let rsa), .rsaPkcs1Sha384):
            Array(try rsa.signature(for: SHA384.hash(data: message), padding: .insecurePKCS1v1_5).rawRepresentation)
        case (.rsa(let rsa), .rsaPkcs1Sha512):
            Array(try rsa.signature(for: SHA512.hash(data: message), padding: .insecurePKCS1v1_5).rawRepresentation)
        case (.p256(let ec), .ecdsaSecp256R1Sha256): Array(try ec.signature(for: message).derRepresentation)
        case (.p384(let ec), .ecdsaSecp384R1Sha384): Array(try ec.signature(for: message).derRepresentation)
        default: throw Unsupported(what: "signature algorithm 0x\(String(algorithm.rawValue, radix: 16))")
        }
    }
}
