import ArgumentParser
import COpus
import CSpeexDSP
import Foundation
import Glibc
import Voice

/// `voice-bench cpu`: CPU per call-second of the whole pipeline against the sum of
/// the bare library calls it makes, side by side on the same speech, and how many
/// calls one core carries.
///
/// One "call" is one endpoint's audio work per frame: capture chain (echo
/// canceller + preprocessor) and encoder on the way out, packet ring + jitter
/// buffer + decoder on the way in. The bare run makes the same library calls
/// (speex_echo_cancellation, speex_preprocess_run, opus_encode, opus_decode) on the
/// same frames with nothing around them.
struct CPUBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cpu",
        abstract: "CPU per call-second: the voice pipeline against the bare library calls.")

    @Option(help: "Seconds of speech per run.")
    var seconds: Double = 20

    @Option(help: "Alternating runs of each side (the median is reported).")
    var rounds: Int = 5

    @Option(help: "Frame duration in ms (10 or 20).")
    var frame: Int = 20

    @Option(help: "Opus complexity.")
    var complexity: Int = 5

    func run() throws {
        guard let duration = FrameDuration(rawValue: frame) else {
            throw ValidationError("--frame must be 10 or 20")
        }
        let codec = CodecConfiguration(frameDuration: duration, complexity: complexity)
        let spf = codec.samplesPerFrame
        let far = try SpeechCorpus.speech(seconds: seconds, offsetUtterance: 0)
        let near = try SpeechCorpus.speech(seconds: seconds, offsetUtterance: 1)
        let frames = min(far.count, near.count) / spf
        // The microphone hears the near talker plus the room's echo of the far end.
        var room = RoomEcho()
        var echo = [Int16](repeating: 0, count: frames * spf)
        far.withUnsafeBufferPointer { f in
            echo.withUnsafeMutableBufferPointer { e in
                room.apply(UnsafeBufferPointer(rebasing: f[0..<(frames * spf)]), into: e)
            }
        }
        var mic = [Int16](repeating: 0, count: frames * spf)
        for i in 0..<mic.count {
            mic[i] = Int16(clamping: Int(near[i]) / 2 + Int(echo[i]))
        }
        // The packets the far end would send: the far speech, encoded once up front.
        let packets = try encodeAll(far, frames: frames, codec: codec)

        var ours: [Double] = []
        var bare: [Double] = []
        for _ in 0..<max(rounds, 1) {
            ours.append(try measure { try runPipeline(mic: mic, far: far, packets: packets, frames: frames, codec: codec) })
            bare.append(try measure { try runBare(mic: mic, far: far, packets: packets, frames: frames, codec: codec) })
        }
        let callSeconds = Double(frames * duration.milliseconds) / 1000
        let oursPerCallSecond = median(ours) / callSeconds
        let barePerCallSecond = median(bare) / callSeconds
        print(
            "CPU per call-second, Opus \(codec.sampleRate) Hz \(duration.milliseconds) ms \(codec.bitrate) b/s CBR FEC complexity \(complexity), echo canceller (\(128) ms tail) + preprocessor, real speech with room echo; median of \(rounds) alternating runs of \(String(format: "%.0f", callSeconds)) s"
        )
        print("")
        print("| | CPU ms per call-second | µs per frame | calls per core |")
        print("|---|---|---|---|")
        for (name, v) in [("bare library calls", barePerCallSecond), ("tusa pipeline", oursPerCallSecond)] {
            let perFrame = v * 1e6 / (1000 / Double(duration.milliseconds))
            print(
                "| \(name) | \(String(format: "%.2f", v * 1000)) | \(String(format: "%.0f", perFrame)) | \(String(format: "%.0f", 1 / v)) |"
            )
        }
        let ratio = oursPerCallSecond / barePerCallSecond
        print("")
        print("- pipeline / bare: \(String(format: "%.3f", ratio))× (target ≤ 1.2×) — \(ratio <= 1.2 ? "met" : "NOT met")")
        print(
            "- calls per core: \(String(format: "%.0f", 1 / oursPerCallSecond)) (target ≥ 60) — \(1 / oursPerCallSecond >= 60 ? "met" : "NOT met")"
        )
    }

    private func median(_ v: [Double]) -> Double {
        let s = v.sorted()
        return s[s.count / 2]
    }

    /// CPU seconds (this thread) spent in `body`.
    private func measure(_ body: () throws -> Void) throws -> Double {
        var a = timespec()
        var b = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a)
        try body()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b)
        return Double(b.tv_sec - a.tv_sec) + Double(b.tv_nsec - a.tv_nsec) / 1e9
    }

    private func encodeAll(_ pcm: [Int16], frames: Int, codec: CodecConfiguration) throws -> [[UInt8]] {
        let encoder = try makeEncoder(codec)
        var out: [[UInt8]] = []
        var buffer = [UInt8](repeating: 0, count: encoder.maximumPacketSize)
        let spf = codec.samplesPerFrame
        for f in 0..<frames {
            let n = try pcm.withUnsafeBufferPointer { p in
                try buffer.withUnsafeMutableBytes { b in
                    try encoder.encode(UnsafeBufferPointer(rebasing: p[(f * spf)..<((f + 1) * spf)]), into: b)
                }
            }
            out.append(Array(buffer[0..<n]))
        }
        return out
    }

    /// The product path: VoiceSender (capture chain + encoder) and VoiceReceiver (ring + playout + decoder).
    private func runPipeline(mic: [Int16], far: [Int16], packets: [[UInt8]], frames: Int, codec: CodecConfiguration) throws {
        let sender = try VoiceSender(codec: codec, capture: CaptureConfiguration())
        let receiver = try VoiceReceiver(codec: codec)
        let spf = codec.samplesPerFrame
        let frameNanoseconds = Int64(codec.frameDuration.milliseconds) * 1_000_000
        var payload = [UInt8](repeating: 0, count: sender.maximumPayloadSize)
        var played = [Int16](repeating: 0, count: spf)
        try mic.withUnsafeBufferPointer { m in
            try far.withUnsafeBufferPointer { f in
                try payload.withUnsafeMutableBytes { out in
                    try played.withUnsafeMutableBufferPointer { play in
                        for i in 0..<frames {
                            let range = (i * spf)..<((i + 1) * spf)
                            let now = Int64(i) * frameNanoseconds
                            packets[i].withUnsafeBytes { p in
                                _ = receiver.receive(
                                    sequence: UInt16(truncatingIfNeeded: i), timestamp: UInt32(truncatingIfNeeded: i * spf),
                                    payload: p, arrivalNanoseconds: now)
                            }
                            receiver.render(nowNanoseconds: now, into: play)
                            _ = try sender.encode(
                                captured: UnsafeBufferPointer(rebasing: m[range]),
                                reference: UnsafeBufferPointer(rebasing: f[range]), into: out)
                        }
                    }
                }
            }
        }
    }

    /// The same library calls with nothing around them.
    private func runBare(mic: [Int16], far: [Int16], packets: [[UInt8]], frames: Int, codec: CodecConfiguration) throws {
        let spf = Int32(codec.samplesPerFrame)
        var error: Int32 = 0
        guard let enc = opus_encoder_create(Int32(codec.sampleRate), 1, OPUS_APPLICATION_VOIP, &error),
            let dec = opus_decoder_create(Int32(codec.sampleRate), 1, &error),
            let echo = speex_echo_state_init(spf, Int32(codec.sampleRate * 128 / 1000)),
            let pre = speex_preprocess_state_init(spf, Int32(codec.sampleRate))
        else { throw ValidationError("library init failed") }
        defer {
            opus_encoder_destroy(enc)
            opus_decoder_destroy(dec)
            speex_echo_state_destroy(echo)
            speex_preprocess_state_destroy(pre)
        }
        BareSetup.configure(encoder: enc, codec: codec)
        var rate = Int32(codec.sampleRate)
        _ = speex_echo_ctl(echo, SPEEX_ECHO_SET_SAMPLING_RATE, &rate)
        _ = speex_preprocess_ctl(pre, SPEEX_PREPROCESS_SET_ECHO_STATE, UnsafeMutableRawPointer(echo))
        var probability: Int32 = 0
        var cleaned = [Int16](repeating: 0, count: Int(spf))
        var decoded = [Int16](repeating: 0, count: Int(spf))
        var out = [UInt8](repeating: 0, count: 1500)
        mic.withUnsafeBufferPointer { m in
            far.withUnsafeBufferPointer { f in
                cleaned.withUnsafeMutableBufferPointer { c in
                    decoded.withUnsafeMutableBufferPointer { d in
                        out.withUnsafeMutableBufferPointer { o in
                            guard let mb = m.baseAddress, let fb = f.baseAddress, let cb = c.baseAddress,
                                let db = d.baseAddress, let ob = o.baseAddress
                            else { return }
                            for i in 0..<frames {
                                let start = i * Int(spf)
                                packets[i].withUnsafeBufferPointer { p in
                                    _ = opus_decode(dec, p.baseAddress, Int32(p.count), db, spf, 0)
                                }
                                speex_echo_cancellation(echo, mb + start, fb + start, cb)
                                _ = speex_preprocess_run(pre, cb)
                                _ = speex_preprocess_ctl(pre, SPEEX_PREPROCESS_GET_PROB, &probability)
                                _ = opus_encode(enc, cb, spf, ob, Int32(o.count))
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The encoder settings the pipeline uses, applied with the bare ctl calls.
enum BareSetup {
    static func configure(encoder: OpaquePointer, codec: CodecConfiguration) {
        let settings: [(Int32, Int32)] = [
            (OPUS_SET_SIGNAL_REQUEST, OPUS_SIGNAL_VOICE),
            (OPUS_SET_MAX_BANDWIDTH_REQUEST, codec.sampleRate == 16_000 ? OPUS_BANDWIDTH_WIDEBAND : OPUS_BANDWIDTH_NARROWBAND),
            (OPUS_SET_BITRATE_REQUEST, Int32(codec.bitrate)),
            (OPUS_SET_COMPLEXITY_REQUEST, Int32(codec.complexity)),
            (OPUS_SET_VBR_REQUEST, codec.constantBitrate ? 0 : 1),
            (OPUS_SET_DTX_REQUEST, codec.discontinuousTransmission ? 1 : 0),
            (OPUS_SET_INBAND_FEC_REQUEST, codec.inbandFEC ? 1 : 0),
            (OPUS_SET_PACKET_LOSS_PERC_REQUEST, Int32(codec.packetLossPercent)),
        ]
        for (request, value) in settings { _ = copus_encoder_set(encoder, request, value) }
    }
}
