import Crypto
import CryptoExtras
import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import TestSupport
import Testing

@testable import Relay

// The relay's TLS handshakes sign on a thread pool (OffloadedSigningKey): every
// signature it makes must verify under the certificate's public key, with each
// algorithm it offers, and real TLS 1.2 and 1.3 clients must complete handshakes
// with RSA and ECDSA certificates; a key it cannot take signs on the loop as before.
@Suite("TLS handshake signatures made off the event loop")
struct OffloadedSigningKeyTests {
    private static let rsa = ["rsa:2048"]
    private static let p256 = ["ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
    private static let p384 = ["ec", "-pkeyopt", "ec_paramgen_curve:P-384"]
    private static let ed25519 = ["ed25519"]

    /// The tests' own signing thread (signing lowers its priority: not one other tests share).
    private static let pool: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: 1)
        pool.start()
        return pool
    }()

    private func loaded(_ kind: [String]) throws -> (OffloadedSigningKey?, TestCertificate) {
        let certificate = try TestCertificate.make(key: kind)
        let key = try NIOSSLPrivateKey(file: certificate.privateKeyFile, format: .pem)
        return (OffloadedSigningKey.load(key, pool: Self.pool), certificate)
    }

    /// A real channel: `sign` uses its loop and allocator.
    private func channel() async throws -> any Channel {
        try await DatagramBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).get()
    }

    @Test func everyRSASignatureVerifiesUnderTheCertificatesKey() async throws {
        let (key, certificate) = try loaded(Self.rsa)
        let offloaded = try #require(key)
        let pem = try String(contentsOfFile: certificate.privateKeyFile, encoding: .utf8)
        let publicKey = try _RSA.Signing.PrivateKey(pemRepresentation: pem).publicKey
        let channel = try await channel()
        let message = ByteBuffer(bytes: Array("TLS 1.3, server CertificateVerify".utf8))
        #expect(offloaded.signatureAlgorithms.count == 7)
        for algorithm in offloaded.signatureAlgorithms {
            let signed = try await offloaded.sign(channel: channel, algorithm: algorithm, data: message).get()
            let signature = _RSA.Signing.RSASignature(rawRepresentation: Array(signed.readableBytesView))
            let bytes = Array(message.readableBytesView)
            let valid: Bool
            switch algorithm {
            case .rsaPssRsaeSha256: valid = publicKey.isValidSignature(signature, for: SHA256.hash(data: bytes), padding: .PSS)
            case .rsaPssRsaeSha384: valid = publicKey.isValidSignature(signature, for: SHA384.hash(data: bytes), padding: .PSS)
            case .rsaPssRsaeSha512: valid = publicKey.isValidSignature(signature, for: SHA512.hash(data: bytes), padding: .PSS)
            case .rsaPkcs1Sha256:
                valid = publicKey.isValidSignature(signature, for: SHA256.hash(data: bytes), padding: .insecurePKCS1v1_5)
            case .rsaPkcs1Sha384:
                valid = publicKey.isValidSignature(signature, for: SHA384.hash(data: bytes), padding: .insecurePKCS1v1_5)
            case .rsaPkcs1Sha512:
                valid = publicKey.isValidSignature(signature, for: SHA512.hash(data: bytes), padding: .insecurePKCS1v1_5)
            case .rsaPkcs1Sha1:
                valid = publicKey.isValidSignature(signature, for: Insecure.SHA1.hash(data: bytes), padding: .insecurePKCS1v1_5)
            default: valid = false
            }
            #expect(valid, "algorithm 0x\(String(algorithm.rawValue, radix: 16))")
        }
        // One it does not offer is a typed error, not a crash.
        await #expect(throws: OffloadedSigningKey.Unsupported.self) {
            try await offloaded.sign(channel: channel, algorithm: .ecdsaSecp256R1Sha256, data: message).get()
        }
        try await channel.close()
    }

    @Test func everyECDSASignatureVerifiesUnderTheCertificatesKey() async throws {
        let channel = try await channel()
        let message = Array("TLS 1.2, ServerKeyExchange".utf8)
        func digest(_ algorithm: SignatureAlgorithm) -> [UInt8]? {
            switch algorithm {
            case .ecdsaSecp256R1Sha256: Array(SHA256.hash(data: message))
            case .ecdsaSecp384R1Sha384: Array(SHA384.hash(data: message))
            case .ecdsaSecp521R1Sha512: Array(SHA512.hash(data: message))
            case .ecdsaSha1: Array(Insecure.SHA1.hash(data: message))
            default: nil
            }
        }
        for kind in [Self.p256, Self.p384] {
            let (key, certificate) = try loaded(kind)
            let offloaded = try #require(key)
            #expect(offloaded.signatureAlgorithms.count == 4)
            let pem = try String(contentsOfFile: certificate.privateKeyFile, encoding: .utf8)
            for algorithm in offloaded.signatureAlgorithms {
                let signed = try await offloaded.sign(channel: channel, algorithm: algorithm, data: ByteBuffer(bytes: message))
                    .get()
                let der = Array(signed.readableBytesView)
                let hashed = try #require(digest(algorithm))
                // Checked against the digest by its bytes: what a verifier does with the algorithm's hash.
                let valid =
                    kind == Self.p256
                    ? try P256.Signing.PrivateKey(pemRepresentation: pem).publicKey.isValidSignature(
                        P256.Signing.ECDSASignature(derRepresentation: der), for: Bytes(hashed))
                    : try P384.Signing.PrivateKey(pemRepresentation: pem).publicKey.isValidSignature(
                        P384.Signing.ECDSASignature(derRepresentation: der), for: Bytes(hashed))
                #expect(valid, "\(kind) algorithm 0x\(String(algorithm.rawValue, radix: 16))")
            }
        }
        try await channel.close()
    }

    /// A digest's bytes as a Digest, for ECDSA's digest-taking verification.
    private struct Bytes: Digest {
        static let byteCount = 0
        let bytes: [UInt8]
        init(_ bytes: [UInt8]) { self.bytes = bytes }
        func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
            try bytes.withUnsafeBytes(body)
        }
        func makeIterator() -> Array<UInt8>.Iterator { bytes.makeIterator() }
        var description: String { "\(bytes)" }
    }

    @Test func aKeyThatIsNotTheCertificatesIsRefusedAtStart() throws {
        let one = try TestCertificate.make()
        let other = try TestCertificate.make()
        #expect(throws: RelayServiceError.self) {
            try RelayService.tlsContext(TLSSettings(certificateFile: one.certificateFile, privateKeyFile: other.privateKeyFile))
        }
    }

    @Test func anEd25519KeyIsLeftToSignOnTheLoop() throws {
        let (key, _) = try loaded(Self.ed25519)
        #expect(key == nil)
    }

    /// Fulfils `done` when the client's handshake completes; fails it when the connection errs or ends first.
    private final class HandshakeDone: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let done: EventLoopPromise<Void>
        init(_ done: EventLoopPromise<Void>) { self.done = done }
        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if case .handshakeCompleted = event as? TLSUserEvent { done.succeed() }
        }
        func errorCaught(context: ChannelHandlerContext, error: any Error) { done.fail(error) }
        func channelInactive(context: ChannelHandlerContext) { done.fail(ChannelError.eof) }
    }

    /// A TLS handshake over loopback TCP between the relay's server context for
    /// `kind` and a client of `version` that accepts only `algorithms` (nil: any).
    private func handshake(
        _ kind: [String], version: TLSVersion, algorithms: [SignatureAlgorithm]? = nil
    ) async throws {
        let certificate = try TestCertificate.make(key: kind)
        let server = try RelayService.tlsContext(
            TLSSettings(certificateFile: certificate.certificateFile, privateKeyFile: certificate.privateKeyFile))
        let group = MultiThreadedEventLoopGroup.singleton
        let listener = try await ServerBootstrap(group: group)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: server))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.certificateVerification = .none
        configuration.minimumTLSVersion = version
        configuration.maximumTLSVersion = version
        configuration.verifySignatureAlgorithms = algorithms
        let client = try NIOSSLContext(configuration: configuration)
        let done = group.next().makePromise(of: Void.self)
        let connection = try await ClientBootstrap(group: group)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers([
                        NIOSSLClientHandler(context: client, serverHostname: nil), HandshakeDone(done),
                    ])
                }
            }
            .connect(to: try #require(listener.localAddress)).get()
        let timeout = group.next().scheduleTask(in: .seconds(10)) { done.fail(ChannelError.connectTimeout(.seconds(10))) }
        defer { timeout.cancel() }
        try await done.futureResult.get()
        try? await connection.close()
        try? await listener.close()
    }

    @Test(arguments: [TLSVersion.tlsv12, .tlsv13])
    func clientsCompleteHandshakesWithRSAAndECDSACertificates(version: TLSVersion) async throws {
        // (The relay's contexts sign off the loop unless told otherwise: not here.)
        #expect(!OffloadedSigningKey.signOnLoop)
        for kind in [Self.rsa, Self.p256, Self.p384] {
            try await handshake(kind, version: version)
        }
        // (BoringSSL's clients take Ed25519 only when told to.)
        try await handshake(Self.ed25519, version: version, algorithms: [.ed25519])
        // Each RSA padding the key offers, as a client that takes only it sees it.
        try await handshake(Self.rsa, version: version, algorithms: [.rsaPssRsaeSha384])
        if version == .tlsv12 {
            try await handshake(Self.rsa, version: version, algorithms: [.rsaPkcs1Sha256])
        }
    }
}
