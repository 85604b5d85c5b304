import Secure

/// End-to-end sealing of call offers and answers between two static X25519 keys,
/// so the rendezvous server forwarding them learns only who talks to whom.
///
/// Like Noise's one-way X pattern: the sender picks an ephemeral key `e`; the key is
/// BLAKE2b-256 over a label, DH(e, R), DH(S, R) and the three public keys; the
/// payload is sealed with XChaCha20-Poly1305 under a random nonce. Only the holder
/// of R's private key opens it, and only the holder of S's (or R's) could have made
/// it, so a server that lies about `from` gets a payload that does not open.
/// Wire: e (32) ‖ nonce (24) ‖ ciphertext (plaintext + 16).
public enum Sealing {
    public static let overhead = 32 + XAEAD.nonceLength + XAEAD.tagLength
    private static let label = Array("tusa-rendezvous-seal-v1".utf8)

    public static func seal(_ plaintext: [UInt8], from sender: PrivateKey, to recipient: PublicKey) throws -> [UInt8] {
        let e = PrivateKey.generate()
        let key = try derive(
            ephemeral: e.publicKey, sender: sender.publicKey, recipient: recipient,
            dh1: e.sharedSecret(with: recipient), dh2: sender.sharedSecret(with: recipient))
        var nonce = [UInt8](repeating: 0, count: XAEAD.nonceLength)
        nonce.withUnsafeMutableBytes { Sodium.randomBytes($0) }
        let ad = e.publicKey.bytes + sender.publicKey.bytes + recipient.bytes
        return e.publicKey.bytes + nonce + (try XAEAD.seal(key: key, nonce: nonce, ad: ad, plaintext: plaintext))
    }

    /// Opens what `sender` sealed to `recipient`; `.unsealable` when it was tampered
    /// with, sealed by someone else, or for another key.
    public static func open(_ sealed: [UInt8], from sender: PublicKey, to recipient: PrivateKey) throws(RendezvousError)
        -> [UInt8]
    {
        guard sealed.count >= overhead, let e = try? PublicKey(bytes: sealed[0..<32]) else { throw .unsealable }
        let nonce = Array(sealed[32..<(32 + XAEAD.nonceLength)])
        let ciphertext = Array(sealed[(32 + XAEAD.nonceLength)...])
        do {
            let key = try derive(
                ephemeral: e, sender: sender, recipient: recipient.publicKey,
                dh1: recipient.sharedSecret(with: e), dh2: recipient.sharedSecret(with: sender))
            return try XAEAD.open(
                key: key, nonce: nonce, ad: e.bytes + sender.bytes + recipient.publicKey.bytes, ciphertext: ciphertext)
        } catch {
            throw .unsealable
        }
    }

    private static func derive(
        ephemeral: PublicKey, sender: PublicKey, recipient: PublicKey,
        dh1: SecretKey, dh2: SecretKey
    ) throws -> SecretKey {
        let a = dh1.withUnsafeBytes { Array($0) }
        let b = dh2.withUnsafeBytes { Array($0) }
        return try SecretKey(bytes: Blake2b.hash(parts: [label, a, b, ephemeral.bytes, sender.bytes, recipient.bytes]))
    }
}

/// Proof that a registering client holds the private half of its key: a keyed
/// BLAKE2b-256 over the server's challenge and the key, keyed with DH(client, server's
/// per-connection key). The server computes the same DH from its side.
public enum RegistrationProof {
    private static let label = Array("tusa-rendezvous-register-v1".utf8)

    public static func make(identity: PrivateKey, serverKey: PublicKey, challenge: [UInt8]) throws -> [UInt8] {
        let dh = try identity.sharedSecret(with: serverKey)
        return dh.withUnsafeBytes { Blake2b.hash(parts: [label, challenge, identity.publicKey.bytes], key: Array($0)) }
    }

    public static func verify(_ proof: [UInt8], key: PublicKey, server: PrivateKey, challenge: [UInt8]) -> Bool {
        guard proof.count == 32, let dh = try? server.sharedSecret(with: key) else { return false }
        let expected = dh.withUnsafeBytes { Blake2b.hash(parts: [label, challenge, key.bytes], key: Array($0)) }
        return expected.withUnsafeBytes { e in proof.withUnsafeBytes { p in Sodium.constantTimeEqual(e, p) } }
    }
}
