import Foundation
import Testing

@testable import Voice

@Suite struct VoicePipelineTests {
    @Test func senderNumbersFramesAndFollowsLossReports() throws {
        let codec = CodecConfiguration()
        let sender = try VoiceSender(codec: codec, capture: nil, initialSequence: 65535, initialTimestamp: UInt32.max - 100)
        let frame = [Int16](repeating: 0, count: codec.samplesPerFrame)
        var payload = [UInt8](repeating: 0, count: sender.maximumPayloadSize)
        var frames: [EncodedFrame] = []
        for _ in 0..<3 {
            frames.append(
                try frame.withUnsafeBufferPointer { f in
                    try payload.withUnsafeMutableBytes { try sender.encode(captured: f, reference: nil, into: $0) }
                })
        }
        #expect(frames.map(\.sequence) == [65535, 0, 1])
        #expect(frames.map(\.timestamp) == [UInt32.max - 100, UInt32.max - 100 &+ 160, UInt32.max - 100 &+ 320])
        #expect(frames.allSatisfy { $0.byteCount > 0 })
        try sender.adapt(lossPercent: 250)
        try sender.adapt(lossPercent: -3)
        // A frame of the wrong length is refused, and nothing is counted for it.
        let short = [Int16](repeating: 0, count: 10)
        #expect(throws: VoiceError.self) {
            try short.withUnsafeBufferPointer { f in
                try payload.withUnsafeMutableBytes { try sender.encode(captured: f, reference: nil, into: $0) }
            }
        }
        let next = try frame.withUnsafeBufferPointer { f in
            try payload.withUnsafeMutableBytes { try sender.encode(captured: f, reference: nil, into: $0) }
        }
        #expect(next.sequence == 2)
    }

    @Test(.enabled(if: SpeechCorpus.isAvailable, "needs Debian's pocketsphinx-testdata"))
    func speechCrossesSenderAndReceiverInOrder() throws {
        let codec = CodecConfiguration(packetLossPercent: 0)
        let speech = try SpeechCorpus.speech(seconds: 4)
        let sender = try VoiceSender(codec: codec, capture: nil)
        let receiver = try VoiceReceiver(codec: codec)
        let spf = codec.samplesPerFrame
        var payload = [UInt8](repeating: 0, count: sender.maximumPayloadSize)
        var out = [Int16](repeating: 0, count: spf)
        var played: [Int16] = []
        let frames = speech.count / spf
        for i in 0..<frames {
            let now = Int64(i) * 20_000_000
            let frame = try speech.withUnsafeBufferPointer { s in
                try payload.withUnsafeMutableBytes { p in
                    try sender.encode(
                        captured: UnsafeBufferPointer(rebasing: s[(i * spf)..<((i + 1) * spf)]), reference: nil, into: p)
                }
            }
            payload.withUnsafeBytes { p in
                _ = receiver.receive(
                    sequence: frame.sequence, timestamp: frame.timestamp,
                    payload: UnsafeRawBufferPointer(rebasing: p[0..<frame.byteCount]), arrivalNanoseconds: now + 5_000_000)
            }
            out.withUnsafeMutableBufferPointer { receiver.render(nowNanoseconds: now + 5_000_000, into: $0) }
            played += out
        }
        let stats = receiver.statistics
        #expect(stats.framesDecoded >= frames - 5)
        #expect(stats.framesConcealed <= 3)
        #expect(receiver.droppedPackets == 0)
        // The played speech is the sent speech, a few frames later (playout delay + codec lookahead).
        let match = Signal.bestCorrelation(speech, played, lags: 0...(spf * 8))
        #expect(match.correlation > 0.8, "correlation \(match.correlation) at lag \(match.lag)")
    }

    @Test(.enabled(if: SpeechCorpus.isAvailable, "needs Debian's pocketsphinx-testdata"))
    func underLossTusaPlayoutBeatsTheSpeexBaseline() async throws {
        let r = try await offPool { () throws -> (ours: Double, baseline: Double, fec: Int, detail: String) in
            let speech = try SpeechCorpus.speech(seconds: 8)
            var model = NetworkModel()
            model.lossRate = 0.2
            let codec = CodecConfiguration(packetLossPercent: 20)
            let frames = VoiceSimulation.frameCount(samples: speech.count, codec: codec)
            let trace = NetworkTrace.generate(model, packets: frames, frameMilliseconds: 20, seed: 7)
            let ideal = try VoiceSimulation.run(
                input: speech, inputRate: voiceSampleRate, trace: nil,
                options: VoiceSimulationOptions(codec: codec, playout: .ideal))
            let ours = try VoiceSimulation.run(
                input: speech, inputRate: voiceSampleRate, trace: trace,
                options: VoiceSimulationOptions(codec: codec, playout: .tusa))
            var baselineCodec = codec
            baselineCodec.inbandFEC = false
            let baseline = try VoiceSimulation.run(
                input: speech, inputRate: voiceSampleRate, trace: trace,
                options: VoiceSimulationOptions(codec: baselineCodec, playout: .speex))
            // Align each output with the clean decode, then compare segmental SNR.
            func score(_ out: [Int16]) -> Double {
                Signal.trackedSegmentalSNR(reference: ideal.output, test: out, initialLags: 0...2400)
            }
            let detail = "\(ours.replay.map { "\($0.statistics)" } ?? "-")\n\(baseline.replay.map { "\($0.statistics)" } ?? "-")"
            return (score(ours.output), score(baseline.output), ours.replay?.statistics.framesRecoveredByFEC ?? 0, detail)
        }
        #expect(r.fec > 0)
        #expect(r.ours > r.baseline + 1, "segmental SNR: tusa \(r.ours) dB, baseline \(r.baseline) dB\n\(r.detail)")
    }

    @Test func simulationRefusesATraceThatDoesNotFit() throws {
        let input = [Int16](repeating: 0, count: 8000)
        let short = NetworkTrace.generate(NetworkModel(), packets: 10, frameMilliseconds: 20, seed: 1)
        #expect(throws: VoiceError.self) {
            _ = try VoiceSimulation.run(input: input, inputRate: 8000, trace: short, options: VoiceSimulationOptions())
        }
        let tenMs = NetworkTrace.generate(NetworkModel(), packets: 100, frameMilliseconds: 10, seed: 1)
        #expect(throws: VoiceError.self) {
            _ = try VoiceSimulation.run(input: input, inputRate: 8000, trace: tenMs, options: VoiceSimulationOptions())
        }
        #expect(throws: VoiceError.self) {
            _ = try VoiceSimulation.run(input: input, inputRate: 8000, trace: nil, options: VoiceSimulationOptions())
        }
    }

    @Test func wholeSignalResamplingKeepsTimeAligned() throws {
        // A 440 Hz tone at 48 kHz, down to 8 kHz and back: the same length and in phase.
        let n = 48_000
        let tone = (0..<n).map { Int16(8000 * sin(2 * Double.pi * 440 * Double($0) / 48_000)) }
        let down = try Resampler.resampleAll(tone, from: 48_000, to: 8_000)
        #expect(down.count == 8_000)
        let up = try Resampler.resampleAll(down, from: 8_000, to: 48_000)
        #expect(up.count == n)
        let match = Signal.bestCorrelation(Array(tone[4800..<43200]), Array(up[4800..<43200]), lags: -20...20)
        #expect(abs(match.lag) <= 2)
        #expect(match.correlation > 0.98)
    }
}
