// Per-message cost of the STUN codec, side by side with the bare library
// calls it is built on (swift-crypto HMAC, zlib CRC-32): time and mallocs.
// Run with `make bench` (or `swift package --package-path Benchmarks benchmark`).
import BenchZlib
import Benchmark
import Crypto
import STUN
import TusaBase

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        warmupIterations: 100,
        scalingFactor: .kilo,
        maxDuration: .seconds(2),
        maxIterations: 10_000
    )

    // A typical ICE connectivity check, as browsers send it.
    let tid = TransactionID(high: 0xB7E7_A701, low: 0xBC34_D686_FA87_DFAE)
    let key = try! IntegrityKey.shortTerm(password: "VOkJxbRl1RmTxUk/WvJxBt")
    let request = Message(
        type: .bindingRequest, transactionID: tid,
        attributes: [
            .software("STUN test client"), .priority(0x6E00_01FF), .iceControlled(0x932F_F9B1_5126_3B36),
            .username("evtj:h6vY"),
        ])
    let wire = request.encode(integrity: key, fingerprint: true)
    let decoded = try! Message(decoding: wire)
    // The bytes an HMAC and a CRC cover for this message, for the baselines.
    let integrityCovered = Array(wire.prefix(wire.count - 8 - 24))
    let fingerprintCovered = Array(wire.prefix(wire.count - 8))
    let symmetric = SymmetricKey(data: key.bytes)

    Benchmark("decode: ICE Binding request (5 attributes + MI + FP)") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(try? Message(decoding: wire))
        }
    }

    Benchmark("decode + type every attribute") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(try? Message(decoding: wire).typedAttributes())
        }
    }

    Benchmark("encode: same request with MESSAGE-INTEGRITY and FINGERPRINT") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(request.encode(integrity: key, fingerprint: true))
        }
    }

    Benchmark("check MESSAGE-INTEGRITY (HMAC-SHA1) on a decoded message") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(decoded.checkMessageIntegrity(key: key))
        }
    }

    Benchmark("baseline: bare HMAC-SHA1 over the same bytes (swift-crypto)") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(HMAC<Insecure.SHA1>.authenticationCode(for: integrityCovered, using: symmetric))
        }
    }

    Benchmark("check FINGERPRINT on a decoded message") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(decoded.checkFingerprint())
        }
    }

    Benchmark("baseline: bare zlib crc32 over the same bytes") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(fingerprintCovered.withUnsafeBufferPointer { crc32(0, $0.baseAddress, uInt($0.count)) })
        }
    }

    // The relay's fast path: answer in place into a buffer the driver owns.
    let server = BindingServer()
    let client = TransportAddress(ip: .v4(0xC000_0207), port: 40000)
    let bareRequest = Message(type: .bindingRequest, transactionID: tid).encode()
    var output = [UInt8](repeating: 0, count: 2048)
    Benchmark("BindingServer.handle: bare request, answer written in place") { benchmark in
        for _ in benchmark.scaledIterations {
            let outcome = bareRequest.withUnsafeBytes { req in
                output.withUnsafeMutableBytes { server.handle(req, from: client, into: $0) }
            }
            blackHole(outcome)
        }
    }

    Benchmark("BindingServer.handle: browser request with MI + FINGERPRINT checked") { benchmark in
        for _ in benchmark.scaledIterations {
            let outcome = wire.withUnsafeBytes { req in
                output.withUnsafeMutableBytes { server.handle(req, from: client, into: $0) }
            }
            blackHole(outcome)
        }
    }
}
