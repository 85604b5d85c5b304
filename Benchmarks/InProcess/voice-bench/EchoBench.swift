import ArgumentParser
import CSpeexDSP
import Foundation
import Voice

/// `voice-bench echo`: echo return loss enhancement on real speech through a
/// synthetic room, the near talker during double talk, and the capture chain's
/// cost against the bare speexdsp calls on the same frames.
struct EchoBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "echo",
        abstract: "Echo canceller: ERLE on real speech, double talk, µs per frame against bare speexdsp.")

    @Option(help: "Seconds of far-end speech (the near end joins for the last third).")
    var seconds: Double = 15

    @Option(help: "Echo path gain in dB (loudness of the echo relative to the far end).")
    var echoGain: Double = -6

    @Option(help: "Echo canceller tail in ms.")
    var tail: Int = 128

    func run() throws {
        let frame = 160
        let far = try SpeechCorpus.speech(seconds: seconds, offsetUtterance: 0)
        let nearSpeech = try SpeechCorpus.speech(seconds: seconds, offsetUtterance: 2)
        let doubleTalkStart = far.count * 2 / 3
        let near = nearSpeech.indices.map { $0 >= doubleTalkStart ? nearSpeech[$0] : 0 }
        var room = RoomEcho(gainDB: echoGain)
        var echo = [Int16](repeating: 0, count: far.count)
        far.withUnsafeBufferPointer { f in echo.withUnsafeMutableBufferPointer { room.apply(f, into: $0) } }
        let mic = (0..<far.count).map { Int16(clamping: Int(near[$0]) + Int(echo[$0])) }
        let silent = [Int16](repeating: 0, count: far.count)
        let frames = far.count / frame

        func run(_ p: CaptureProcessor, mic: [Int16], far: [Int16]) throws -> [Int16] {
            var out = [Int16](repeating: 0, count: frames * frame)
            for f in 0..<frames {
                let r = (f * frame)..<((f + 1) * frame)
                _ = try mic.withUnsafeBufferPointer { m in
                    try far.withUnsafeBufferPointer { x in
                        try out.withUnsafeMutableBufferPointer { o in
                            try p.process(
                                captured: UnsafeBufferPointer(rebasing: m[r]), reference: UnsafeBufferPointer(rebasing: x[r]),
                                into: UnsafeMutableBufferPointer(rebasing: o[r]))
                        }
                    }
                }
            }
            return out
        }
        let aecOnlyConfig = PreprocessorConfiguration(
            noiseSuppression: false, voiceActivityDetection: false, echoSuppressDB: 0, echoSuppressActiveDB: 0)
        let full = try run(CaptureProcessor(frameSize: frame, tailMilliseconds: tail), mic: mic, far: far)
        let aecOnly = try run(
            CaptureProcessor(frameSize: frame, tailMilliseconds: tail, preprocessor: aecOnlyConfig), mic: mic, far: far)
        let alone = try run(CaptureProcessor(frameSize: frame, tailMilliseconds: tail), mic: near, far: silent)

        print(
            "Echo: real speech (pocketsphinx-testdata) through RoomEcho (20 ms delay, 60 ms reverb, \(echoGain) dB), 8 kHz, 20 ms frames, \(tail) ms tail; far end only until \(String(format: "%.1f", Double(doubleTalkStart) / 8000)) s, then double talk"
        )
        print("")
        print("| second | ERLE AEC only (dB) | ERLE AEC + preprocessor (dB) |")
        print("|---|---|---|")
        let second = 8000
        var window = 0
        while (window + 1) * second <= doubleTalkStart {
            let r = (window * second)..<((window + 1) * second)
            print(
                "| \(window + 1) | \(String(format: "%.1f", EchoMetrics.erle(echo: echo[r], residual: aecOnly[r]))) | \(String(format: "%.1f", EchoMetrics.erle(echo: echo[r], residual: full[r]))) |"
            )
            window += 1
        }
        let converged = (doubleTalkStart / 2)..<doubleTalkStart
        let erle = EchoMetrics.erle(echo: echo[converged], residual: full[converged])
        let erleAEC = EchoMetrics.erle(echo: echo[converged], residual: aecOnly[converged])
        let dt = (doubleTalkStart + 4000)..<full.count
        let attenuation = 10 * log10(EchoMetrics.energy(alone[dt]) / max(EchoMetrics.energy(full[dt]), 1))
        let correlation = Self.correlation(Array(alone[dt]), Array(full[dt]))
        print("")
        print(
            "- after convergence (second half of the far-end-only part): ERLE \(String(format: "%.1f", erle)) dB with the preprocessor, \(String(format: "%.1f", erleAEC)) dB AEC alone (target ≥ 25 dB) — \(erle >= 25 ? "met" : "NOT met")"
        )
        print(
            "- double talk: near talker \(String(format: "%.1f", attenuation)) dB below what the same chain passes without echo, correlation \(String(format: "%.3f", correlation)) with it"
        )

        // Cost: CaptureProcessor against the bare speex_echo_cancellation + speex_preprocess_run.
        let rounds = 5
        var ours: [Double] = []
        var bare: [Double] = []
        for _ in 0..<rounds {
            ours.append(
                try Self.cpu { _ = try run(CaptureProcessor(frameSize: frame, tailMilliseconds: tail), mic: mic, far: far) })
            bare.append(try Self.cpu { try Self.bareChain(mic: mic, far: far, frames: frames, frame: frame, tail: tail) })
        }
        let o = ours.sorted()[rounds / 2] / Double(frames) * 1e6
        let b = bare.sorted()[rounds / 2] / Double(frames) * 1e6
        print(
            "- µs per 20 ms frame: CaptureProcessor \(String(format: "%.1f", o)), bare speexdsp calls \(String(format: "%.1f", b)) (\(String(format: "%.3f", o / b))×), median of \(rounds)"
        )
    }

    static func correlation(_ a: [Int16], _ b: [Int16]) -> Double {
        var ab = 0.0
        var aa = 0.0
        var bb = 0.0
        for i in 0..<min(a.count, b.count) {
            let x = Double(a[i])
            let y = Double(b[i])
            ab += x * y
            aa += x * x
            bb += y * y
        }
        return aa > 0 && bb > 0 ? ab / (aa * bb).squareRoot() : 0
    }

    static func cpu(_ body: () throws -> Void) throws -> Double {
        var a = timespec()
        var b = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a)
        try body()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b)
        return Double(b.tv_sec - a.tv_sec) + Double(b.tv_nsec - a.tv_nsec) / 1e9
    }

    static func bareChain(mic: [Int16], far: [Int16], frames: Int, frame: Int, tail: Int) throws {
        guard let echo = speex_echo_state_init(Int32(frame), Int32(8 * tail)),
            let pre = speex_preprocess_state_init(Int32(frame), 8000)
        else { throw ValidationError("speexdsp init failed") }
        defer {
            speex_echo_state_destroy(echo)
            speex_preprocess_state_destroy(pre)
        }
        var rate: Int32 = 8000
        _ = speex_echo_ctl(echo, SPEEX_ECHO_SET_SAMPLING_RATE, &rate)
        _ = speex_preprocess_ctl(pre, SPEEX_PREPROCESS_SET_ECHO_STATE, UnsafeMutableRawPointer(echo))
        var probability: Int32 = 0
        var out = [Int16](repeating: 0, count: frames * frame)
        mic.withUnsafeBufferPointer { m in
            far.withUnsafeBufferPointer { x in
                out.withUnsafeMutableBufferPointer { o in
                    guard let mb = m.baseAddress, let xb = x.baseAddress, let ob = o.baseAddress else { return }
                    for f in 0..<frames {
                        speex_echo_cancellation(echo, mb + f * frame, xb + f * frame, ob + f * frame)
                        _ = speex_preprocess_run(pre, ob + f * frame)
                        _ = speex_preprocess_ctl(pre, SPEEX_PREPROCESS_GET_PROB, &probability)
                    }
                }
            }
        }
    }
}
