import Foundation
import Testing

@testable import Voice

/// The microphone of a room: the near talker plus the room's echo of what the
/// speaker played; the chain gets the played far end as its reference.
struct EchoScene {
    let far: [Int16]
    let near: [Int16]
    let echo: [Int16]
    let mic: [Int16]
    /// What the microphone would hear in a room without echo (the same near talker and noise).
    let micWithoutEcho: [Int16]

    init(seconds: Double, nearTalks: (Int) -> Bool, room: RoomEcho = RoomEcho()) throws {
        far = try SpeechCorpus.speech(seconds: seconds, offsetUtterance: 0)
        let nearSpeech = try SpeechCorpus.speech(seconds: seconds, offsetUtterance: 2)
        let near = nearSpeech.indices.map { nearTalks($0) ? nearSpeech[$0] : 0 }
        self.near = near
        var room = room
        var echo = [Int16](repeating: 0, count: far.count)
        far.withUnsafeBufferPointer { f in echo.withUnsafeMutableBufferPointer { room.apply(f, into: $0) } }
        self.echo = echo
        // A quiet noise floor, as a real microphone has.
        var seed: UInt32 = 1
        var mic = [Int16](repeating: 0, count: echo.count)
        var clean = mic
        for i in mic.indices {
            seed = seed &* 1_664_525 &+ 1_013_904_223
            let noise = Int(seed >> 28) - 8
            mic[i] = Int16(clamping: Int(near[i]) + Int(echo[i]) + noise)
            clean[i] = Int16(clamping: Int(near[i]) + noise)
        }
        self.mic = mic
        self.micWithoutEcho = clean
    }

    /// Runs the chain frame by frame; returns its output. `withoutEcho`: the echo-free
    /// room, with the far end's reference silent.
    func run(_ processor: CaptureProcessor, withoutEcho: Bool = false) throws -> [Int16] {
        let n = processor.frameSize
        let mic = withoutEcho ? micWithoutEcho : self.mic
        let far = withoutEcho ? [Int16](repeating: 0, count: self.far.count) : self.far
        var out = [Int16](repeating: 0, count: (mic.count / n) * n)
        for f in 0..<(mic.count / n) {
            let r = (f * n)..<((f + 1) * n)
            _ = try mic.withUnsafeBufferPointer { m in
                try far.withUnsafeBufferPointer { x in
                    try out.withUnsafeMutableBufferPointer { o in
                        try processor.process(
                            captured: UnsafeBufferPointer(rebasing: m[r]), reference: UnsafeBufferPointer(rebasing: x[r]),
                            into: UnsafeMutableBufferPointer(rebasing: o[r]))
                    }
                }
            }
        }
        return out
    }
}

@Suite(.enabled(if: SpeechCorpus.isAvailable, "needs Debian's pocketsphinx-testdata (make setup)"))
struct EchoTests {
    @Test func echoIsCancelledByAtLeast25dBAfterConvergence() throws {
        let scene = try EchoScene(seconds: 10, nearTalks: { _ in false })
        let full = try scene.run(CaptureProcessor(frameSize: 160))
        let aecOnly = try scene.run(
            CaptureProcessor(
                frameSize: 160,
                preprocessor: PreprocessorConfiguration(
                    noiseSuppression: false, voiceActivityDetection: false, echoSuppressDB: 0, echoSuppressActiveDB: 0)))
        let half = full.count / 2
        let erle = EchoMetrics.erle(echo: scene.echo[half..<full.count], residual: full[half...])
        let erleAEC = EchoMetrics.erle(echo: scene.echo[half..<full.count], residual: aecOnly[half...])
        #expect(erle >= 25, "ERLE after convergence: \(erle) dB (AEC alone \(erleAEC) dB)")
        // The adaptive filter itself does real work, not only the suppressor.
        #expect(erleAEC >= 8, "AEC alone: \(erleAEC) dB")
        // And without the reference there is nothing to cancel.
        let blind = try scene.run(
            CaptureProcessor(
                frameSize: 160, echoCancellation: false,
                preprocessor: PreprocessorConfiguration(noiseSuppression: false, voiceActivityDetection: false)))
        #expect(EchoMetrics.erle(echo: scene.echo[half..<full.count], residual: blind[half...]) < 3)
    }

    @Test func theNearTalkerSurvivesDoubleTalk() throws {
        // The far end talks throughout, the near end joins halfway (double talk).
        // The near talker is compared with what the same chain makes of the near
        // talker in a room without echo: the chain's own filtering (the canceller's
        // DC notch, the preprocessor's one-frame delay) is then the same on both
        // sides, and what differs is what double talk costs.
        let seconds = 10.0
        let start = Int(seconds / 2 * 8000)
        let scene = try EchoScene(seconds: seconds, nearTalks: { $0 >= start })
        let out = try scene.run(CaptureProcessor(frameSize: 160))
        let alone = try scene.run(CaptureProcessor(frameSize: 160), withoutEcho: true)
        let range = (start + 4000)..<out.count
        let attenuation = 10 * log10(EchoMetrics.energy(alone[range]) / max(EchoMetrics.energy(out[range]), 1))
        let match = Signal.bestCorrelation(Array(alone[range]), Array(out[range]), lags: -2...2)
        #expect(attenuation < 6, "near talker attenuated by \(attenuation) dB during double talk")
        #expect(match.correlation > 0.8, "near talker correlation \(match.correlation) at lag \(match.lag)")
        // Without the canceller, the echo would stay in: the same comparison is clearly worse.
        let blind = try scene.run(CaptureProcessor(frameSize: 160, echoCancellation: false))
        let blindMatch = Signal.bestCorrelation(Array(alone[range]), Array(blind[range]), lags: -2...2)
        #expect(
            match.correlation > blindMatch.correlation, "with canceller \(match.correlation), without \(blindMatch.correlation)")
    }
}

@Suite struct DSPTests {
    @Test func frameSizesAndRangesAreChecked() {
        #expect(throws: VoiceError.self) { _ = try EchoCanceller(frameSize: 100) }
        #expect(throws: VoiceError.self) { _ = try EchoCanceller(sampleRate: 11_025, frameSize: 110) }
        #expect(throws: VoiceError.self) { _ = try EchoCanceller(frameSize: 160, tailMilliseconds: 5) }
        #expect(throws: VoiceError.self) {
            _ = try Preprocessor(frameSize: 160, configuration: PreprocessorConfiguration(agcLevel: 0))
        }
        #expect(throws: VoiceError.self) {
            _ = try Preprocessor(frameSize: 80, echoCanceller: try EchoCanceller(frameSize: 160))
        }
        #expect(throws: VoiceError.self) { _ = try Resampler(from: 0, to: 8000) }
        #expect(throws: VoiceError.self) { _ = try Resampler(from: 48_000, to: 8000, quality: 11) }
        #expect((try? CaptureProcessor(frameSize: 80)) != nil)
    }

    @Test func wrongFrameLengthsThrowInsteadOfOverrunning() throws {
        let p = try CaptureProcessor(frameSize: 160)
        let short = [Int16](repeating: 0, count: 100)
        var out = [Int16](repeating: 0, count: 160)
        #expect(throws: VoiceError.self) {
            _ = try short.withUnsafeBufferPointer { s in
                try out.withUnsafeMutableBufferPointer { try p.process(captured: s, reference: s, into: $0) }
            }
        }
    }

    @Test func vadTellsSpeechFromSilence() throws {
        guard SpeechCorpus.isAvailable else { return }
        let speech = try SpeechCorpus.speech(seconds: 3)
        let pre = try Preprocessor(frameSize: 160)
        var voiced = 0
        var silentVoiced = 0
        var frame = [Int16](repeating: 0, count: 160)
        for f in 0..<(speech.count / 160) {
            for i in 0..<160 { frame[i] = speech[f * 160 + i] }
            if try frame.withUnsafeMutableBufferPointer({ try pre.process($0) }) { voiced += 1 }
        }
        for _ in 0..<100 {
            for i in 0..<160 { frame[i] = Int16(i % 3) - 1 }
            if try frame.withUnsafeMutableBufferPointer({ try pre.process($0) }) { silentVoiced += 1 }
        }
        #expect(voiced > speech.count / 160 / 3, "speech frames marked voiced: \(voiced)")
        #expect(silentVoiced < 20, "near-silent frames marked voiced: \(silentVoiced)")
    }
}
