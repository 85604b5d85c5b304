// Allocations and time per 20 ms voice frame through the product path after
// warm-up: VoiceSender.encode (echo canceller + preprocessor + Opus encode) and
// VoiceReceiver.receive + render (packet ring + jitter buffer + Opus decode).
// The rule is that a frame allocates nothing: mallocCountTotal must be 0.
// Run with `swift package --package-path Benchmarks benchmark --target VoiceFrame`.
import Benchmark
import Foundation
import Voice

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .mallocCountTotal],
        warmupIterations: 200,
        scalingFactor: .one,
        maxDuration: .seconds(2),
        maxIterations: 5_000
    )

    // A speech-like test signal (harmonics with a syllable envelope) as microphone
    // and far end; the real-speech figures are voice-bench's.
    let spf = 160
    let frames = 250
    func signal(_ f0: Double, _ seed: Double) -> [Int16] {
        (0..<(frames * spf)).map { n in
            let t = Double(n) / 8000
            let env = max(0, sin(2 * Double.pi * 3 * t + seed))
            var v = 0.0
            for h in 1...6 { v += sin(2 * Double.pi * f0 * Double(h) * t) / Double(h) }
            return Int16(v * env * 5000)
        }
    }
    let mic = signal(140, 0)
    let far = signal(210, 1)

    Benchmark("VoiceSender.encode + VoiceReceiver.receive/render, one 20 ms frame (Opus, AEC, preprocessor, jitter buffer)") {
        benchmark in
        let codec = CodecConfiguration()
        guard let sender = try? VoiceSender(codec: codec), let receiver = try? VoiceReceiver(codec: codec) else { return }
        var payload = [UInt8](repeating: 0, count: sender.maximumPayloadSize)
        var played = [Int16](repeating: 0, count: spf)
        var i = 0
        mic.withUnsafeBufferPointer { m in
            far.withUnsafeBufferPointer { f in
                payload.withUnsafeMutableBytes { out in
                    played.withUnsafeMutableBufferPointer { play in
                        func frame() {
                            let k = i % frames
                            let range = (k * spf)..<((k + 1) * spf)
                            let now = Int64(i) * 20_000_000
                            if let encoded = try? sender.encode(
                                captured: UnsafeBufferPointer(rebasing: m[range]),
                                reference: UnsafeBufferPointer(rebasing: f[range]), into: out)
                            {
                                receiver.receive(
                                    sequence: encoded.sequence, timestamp: encoded.timestamp,
                                    payload: UnsafeRawBufferPointer(rebasing: out[0..<encoded.byteCount]),
                                    arrivalNanoseconds: now + 5_000_000)
                            }
                            receiver.render(nowNanoseconds: now + 5_000_000, into: play)
                            i += 1
                        }
                        // Warm-up outside the measured part: buffers, codec state, the jitter buffer's start.
                        for _ in 0..<100 { frame() }
                        benchmark.startMeasurement()
                        for _ in benchmark.scaledIterations { frame() }
                        benchmark.stopMeasurement()
                    }
                }
            }
        }
        blackHole(played)
    }
}
