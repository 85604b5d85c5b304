import BenchSodium
// Per-packet cost of media protection (MediaCipher, MediaReceiver) side by
// side with the bare libsodium ChaCha20-Poly1305-IETF calls it is built on,
// for a 160-byte voice payload behind a 12-byte RTP header; and the Noise IK
// handshake. Run with `swift package --package-path Benchmarks benchmark --target SecureMedia`.
import Benchmark
import Secure

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        warmupIterations: 100,
        scalingFactor: .kilo,
        maxDuration: .seconds(2),
        maxIterations: 10_000
    )

    /// One voice packet: a 12-byte header for `ext` and the sealed payload.
    func seal(
        _ cipher: MediaCipher, _ ext: UInt64, _ payload: UnsafeRawBufferPointer,
        _ out: UnsafeMutableRawBufferPointer
    ) -> Int? {
        let header = RTPHeader(
            payloadType: 111, sequenceNumber: UInt16(truncatingIfNeeded: ext),
            timestamp: UInt32(truncatingIfNeeded: ext * 960), ssrc: 0x1234_5678)
        return try? cipher.sealMedia(header: header, payload: payload, extendedSequence: ext, into: out)
    }

    let key = SecretKey.random()
    let keyBytes = key.withUnsafeBytes { Array($0) }
    let payload = [UInt8](repeating: 0x5A, count: 160)
    var packet = [UInt8](repeating: 0, count: 12 + 160 + 16)
    var plain = [UInt8](repeating: 0, count: 160)

    Benchmark("MediaCipher: sealMedia + openMedia, 160-byte payload") { benchmark in
        let cipher = MediaCipher(key: key)
        payload.withUnsafeBytes { p in
            packet.withUnsafeMutableBytes { out in
                for i in benchmark.scaledIterations {
                    let ext = UInt64(i)
                    blackHole(seal(cipher, ext, p, out))
                    blackHole(try? cipher.openMedia(packet: out, headerLength: 12, extendedSequence: ext))
                }
            }
        }
    }

    Benchmark("baseline: bare crypto_aead_chacha20poly1305_ietf_encrypt + _decrypt") { benchmark in
        var nonce = [UInt8](repeating: 0, count: 12)
        payload.withUnsafeBufferPointer { p in
            packet.withUnsafeMutableBufferPointer { out in
                plain.withUnsafeMutableBufferPointer { m in
                    keyBytes.withUnsafeBufferPointer { k in
                        nonce.withUnsafeMutableBufferPointer { n in
                            let base = out.baseAddress!
                            for i in benchmark.scaledIterations {
                                UnsafeMutableRawPointer(n.baseAddress! + 4).storeBytes(of: UInt64(i).bigEndian, as: UInt64.self)
                                var clen: UInt64 = 0
                                var mlen: UInt64 = 0
                                crypto_aead_chacha20poly1305_ietf_encrypt(
                                    base + 12, &clen, p.baseAddress!, 160, base, 12, nil, n.baseAddress!, k.baseAddress!)
                                blackHole(
                                    crypto_aead_chacha20poly1305_ietf_decrypt(
                                        m.baseAddress!, &mlen, nil, base + 12, clen, base, 12, n.baseAddress!, k.baseAddress!))
                            }
                        }
                    }
                }
            }
        }
    }

    Benchmark("sealMedia + MediaReceiver.receive (parse, ROC, replay check, open, accept)") { benchmark in
        let cipher = MediaCipher(key: key)
        var receiver = MediaReceiver()
        payload.withUnsafeBytes { p in
            packet.withUnsafeMutableBytes { out in
                for i in benchmark.scaledIterations {
                    let ext = UInt64(i)
                    blackHole(seal(cipher, ext, p, out))
                    blackHole(receiver.receive(out, with: cipher))
                }
            }
        }
    }

    let initiatorStatic = PrivateKey.generate()
    let responderStatic = PrivateKey.generate()
    Benchmark(
        "Noise_IK_25519_ChaChaPoly_BLAKE2b handshake (write1, read1, write2, read2, split)",
        configuration: .init(scalingFactor: .one, maxIterations: 2_000)
    ) { benchmark in
        for _ in benchmark.scaledIterations {
            do {
                let i = try NoiseHandshake(
                    pattern: .IK, initiator: true, prologue: [], localStatic: initiatorStatic,
                    remoteStatic: responderStatic.publicKey)
                let r = try NoiseHandshake(
                    pattern: .IK, initiator: false, prologue: [], localStatic: responderStatic,
                    remoteStatic: nil)
                _ = try r.readMessage(try i.writeMessage(payload: []))
                _ = try i.readMessage(try r.writeMessage(payload: []))
                blackHole(try i.split())
                blackHole(try r.split())
            } catch {
                fatalError("handshake failed: \(error)")
            }
        }
    }
}
