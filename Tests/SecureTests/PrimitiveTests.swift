import Testing

@testable import Secure

struct PrimitiveTests {
    /// RFC 7748 section 6.1.
    @Test func x25519MatchesRFC7748() throws {
        let alice = try PrivateKey(bytes: hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"))
        let bob = try PrivateKey(bytes: hex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"))
        #expect(alice.publicKey.hex == "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
        #expect(bob.publicKey.hex == "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
        let shared = try alice.sharedSecret(with: bob.publicKey)
        #expect(
            shared.withUnsafeBytes { Hex.encode($0) }
                == "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")
        #expect(try shared == bob.sharedSecret(with: alice.publicKey))
    }

    @Test func lowOrderPublicKeysAreRejected() throws {
        let me = PrivateKey.generate()
        // The all-zero point and the point of order 8 from the curve25519 blacklist.
        for bad in [
            "0000000000000000000000000000000000000000000000000000000000000000",
            "0100000000000000000000000000000000000000000000000000000000000000",
            "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
        ] {
            #expect(throws: SecureError.weakPublicKey) { try me.sharedSecret(with: PublicKey(bytes: hex(bad))) }
        }
    }

    @Test func keyLengthsAreChecked() {
        #expect(throws: SecureError.invalidKeyLength(expected: 32, got: 31)) {
            try SecretKey(bytes: [UInt8](repeating: 1, count: 31))
        }
        #expect(throws: SecureError.invalidKeyLength(expected: 32, got: 33)) {
            try PublicKey(bytes: [UInt8](repeating: 1, count: 33))
        }
        #expect(PublicKey(base64: "AAAA") == nil)
        #expect(PublicKey(hex: "zz") == nil)
    }

    @Test func publicKeyTextFormsRoundTrip() throws {
        let key = PrivateKey.generate().publicKey
        #expect(PublicKey(base64: key.base64) == key)
        #expect(PublicKey(hex: key.hex) == key)
        #expect(PublicKey(hex: key.hex.uppercased()) == key)
        #expect(key.base64.count == 44 && key.description == key.base64)
        #expect(PublicKey(base64: key.base64 + "A") == nil)
    }

    @Test func secretKeyEqualityAndRandomness() throws {
        let a = SecretKey.random()
        let b = SecretKey.random()
        #expect(a != b)
        let copy = try a.withUnsafeBytes { try SecretKey(copying: $0) }
        #expect(a == copy)
    }

    /// RFC 8439 section 2.8.2.
    @Test func chaChaPolyMatchesRFC8439() throws {
        let key = try SecretKey(bytes: hex("808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f"))
        let nonce = hex("070000004041424344454647")
        let ad = hex("50515253c0c1c2c3c4c5c6c7")
        let plaintext = Array(
            "Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it."
                .utf8)
        let sealed = try AEAD.seal(key: key, nonce: nonce, ad: ad, plaintext: plaintext)
        #expect(Hex.encode(sealed.suffix(16)) == "1ae10b594f09e26a7e902ecbd0600691")
        #expect(Hex.encode(sealed.prefix(16)) == "d31a8d34648e60db7b86afbc53ef7ec2")
        #expect(try AEAD.open(key: key, nonce: nonce, ad: ad, ciphertext: sealed) == plaintext)
        var bad = sealed
        bad[5] ^= 1
        #expect(throws: SecureError.authenticationFailed) { try AEAD.open(key: key, nonce: nonce, ad: ad, ciphertext: bad) }
        #expect(throws: SecureError.authenticationFailed) { try AEAD.open(key: key, nonce: nonce, ad: [], ciphertext: sealed) }
        #expect(throws: SecureError.truncated) { try AEAD.open(key: key, nonce: nonce, ad: ad, ciphertext: [1, 2]) }
        #expect(throws: SecureError.self) { try AEAD.seal(key: key, nonce: [0], plaintext: []) }
    }

    @Test func xChaChaRoundTripsAndRejectsTampering() throws {
        let key = SecretKey.random()
        let nonce = [UInt8](repeating: 7, count: 24)
        let sealed = try XAEAD.seal(key: key, nonce: nonce, ad: [1, 2, 3], plaintext: [9, 8, 7])
        #expect(sealed.count == 3 + 16)
        #expect(try XAEAD.open(key: key, nonce: nonce, ad: [1, 2, 3], ciphertext: sealed) == [9, 8, 7])
        var otherNonce = nonce
        otherNonce[23] = 0
        #expect(throws: SecureError.authenticationFailed) {
            try XAEAD.open(key: key, nonce: otherNonce, ad: [1, 2, 3], ciphertext: sealed)
        }
        #expect(throws: SecureError.self) { try XAEAD.seal(key: key, nonce: Array(nonce.prefix(12)), plaintext: []) }
    }

    @Test func blake2bKnownAnswers() {
        // BLAKE2b-512("abc"), RFC 7693 Appendix A.
        #expect(
            Hex.encode(Blake2b.hash(Array("abc".utf8), outputLength: 64))
                == "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d17d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923"
        )
        // Incremental equals one-shot, keyed, for 16/32/64.
        let key = [UInt8](repeating: 0x42, count: 32)
        for n in [16, 32, 64] {
            let whole = Blake2b.hash(Array("hello world".utf8), key: key, outputLength: n)
            #expect(whole.count == n)
            #expect(Blake2b.hash(parts: [Array("hello".utf8), Array(" world".utf8)], key: key, outputLength: n) == whole)
            #expect(Blake2b.hash(Array("hello world".utf8), outputLength: n) != whole)
            var out = [UInt8](repeating: 0, count: n)
            Array("hello world".utf8).withUnsafeBytes { d in
                key.withUnsafeBytes { k in out.withUnsafeMutableBytes { Blake2b.hash(d, key: k, into: $0) } }
            }
            #expect(out == whole)
        }
    }

    /// HMAC through the Noise hash engine against RFC 4231 test case 2.
    @Test func hmacMatchesRFC4231() {
        let engine256 = HashEngine(.sha256)
        let engine512 = HashEngine(.sha512)
        let key = Array("Jefe".utf8)
        let data = Array("what do ya want for nothing?".utf8)
        var out = [UInt8](repeating: 0, count: 64)
        key.withUnsafeBytes { k in
            data.withUnsafeBytes { d in out.withUnsafeMutableBytes { engine256.hmac(key: k, [d], into: $0.baseAddress!) } }
        }
        #expect(Hex.encode(out.prefix(32)) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        key.withUnsafeBytes { k in
            data.withUnsafeBytes { d in out.withUnsafeMutableBytes { engine512.hmac(key: k, [d], into: $0.baseAddress!) } }
        }
        #expect(
            Hex.encode(out)
                == "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"
        )
    }
}
