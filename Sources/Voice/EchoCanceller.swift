import CSpeexDSP

func checkFrameSize(_ frameSize: Int, sampleRate: Int) throws(VoiceError) {
    guard [8000, 16_000, 32_000, 48_000].contains(sampleRate) else {
        throw .invalidConfiguration("sampleRate must be 8000, 16000, 32000 or 48000 Hz, not \(sampleRate)")
    }
    let allowed = [sampleRate / 100, sampleRate / 50]
    guard allowed.contains(frameSize) else {
        throw .invalidConfiguration(
            "frameSize must be 10 or 20 ms at \(sampleRate) Hz (\(allowed[0]) or \(allowed[1]) samples), not \(frameSize)")
    }
}

/// speexdsp's acoustic echo canceller (MDF), its sampling rate set explicitly.
///
/// The far-end reference must be what was actually played: `process` when the
/// caller pairs each captured frame with the frame played at the same time,
/// `playback`/`capture` when render and capture callbacks run apart (speexdsp then
/// buffers the played frames and pairs them itself).
public final class EchoCanceller {
    public let sampleRate: Int
    public let frameSize: Int
    public let tailMilliseconds: Int
    let state: OpaquePointer

    public init(sampleRate: Int = voiceSampleRate, frameSize: Int, tailMilliseconds: Int = 128) throws(VoiceError) {
        try checkFrameSize(frameSize, sampleRate: sampleRate)
        guard (20...1000).contains(tailMilliseconds) else {
            throw .invalidConfiguration("echo tail must be 20...1000 ms, not \(tailMilliseconds)")
        }
        guard let state = speex_echo_state_init(Int32(frameSize), Int32(sampleRate * tailMilliseconds / 1000)) else {
            throw .library("speex_echo_state_init", code: -1)
        }
        var rate = Int32(sampleRate)
        _ = speex_echo_ctl(state, SPEEX_ECHO_SET_SAMPLING_RATE, &rate)
        self.state = state
        self.sampleRate = sampleRate
        self.frameSize = frameSize
        self.tailMilliseconds = tailMilliseconds
    }

    deinit { speex_echo_state_destroy(state) }

    private func check(_ count: Int) throws(VoiceError) {
        guard count == frameSize else { throw .bufferTooSmall(needed: frameSize, available: count) }
    }

    /// `capture` with the echo of `reference` (the far-end frame played when it was recorded) removed.
    public func process(
        capture: UnsafeBufferPointer<Int16>, reference: UnsafeBufferPointer<Int16>, into output: UnsafeMutableBufferPointer<Int16>
    ) throws(VoiceError) {
        try check(capture.count)
        try check(reference.count)
        try check(output.count)
        guard let c = capture.baseAddress, let r = reference.baseAddress, let o = output.baseAddress else { return }
        speex_echo_cancellation(state, c, r, o)
    }

    /// A frame was just handed to the speaker (device-driven use).
    public func playback(_ played: UnsafeBufferPointer<Int16>) throws(VoiceError) {
        try check(played.count)
        guard let p = played.baseAddress else { return }
        speex_echo_playback(state, p)
    }

    /// A frame was just captured (device-driven use): cancels against the buffered playback.
    public func capture(_ captured: UnsafeBufferPointer<Int16>, into output: UnsafeMutableBufferPointer<Int16>) throws(VoiceError)
    {
        try check(captured.count)
        try check(output.count)
        guard let c = captured.baseAddress, let o = output.baseAddress else { return }
        speex_echo_capture(state, c, o)
    }

    public func reset() { speex_echo_state_reset(state) }
}

public struct PreprocessorConfiguration: Sendable, Hashable {
    public var noiseSuppression: Bool
    /// Maximum noise attenuation in dB (negative).
    public var noiseSuppressDB: Int
    public var automaticGain: Bool
    /// AGC target level (speexdsp's units, 1...32768).
    public var agcLevel: Int
    public var voiceActivityDetection: Bool
    /// Maximum residual echo attenuation in dB (negative), and while the near end talks.
    public var echoSuppressDB: Int
    public var echoSuppressActiveDB: Int

    public init(
        noiseSuppression: Bool = true, noiseSuppressDB: Int = -15,
        automaticGain: Bool = false, agcLevel: Int = 8000,
        voiceActivityDetection: Bool = true,
        echoSuppressDB: Int = -40, echoSuppressActiveDB: Int = -15
    ) {
        self.noiseSuppression = noiseSuppression
        self.noiseSuppressDB = noiseSuppressDB
        self.automaticGain = automaticGain
        self.agcLevel = agcLevel
        self.voiceActivityDetection = voiceActivityDetection
        self.echoSuppressDB = echoSuppressDB
        self.echoSuppressActiveDB = echoSuppressActiveDB
    }
}

/// speexdsp's preprocessor: noise suppression, AGC, VAD, and residual echo
/// suppression tied to an `EchoCanceller`'s state.
public final class Preprocessor {
    public let frameSize: Int
    public let configuration: PreprocessorConfiguration
    private let state: OpaquePointer
    /// Kept alive: the preprocessor reads the echo canceller's state every frame.
    private let echoCanceller: EchoCanceller?

    public init(
        sampleRate: Int = voiceSampleRate, frameSize: Int, configuration: PreprocessorConfiguration = .init(),
        echoCanceller: EchoCanceller? = nil
    ) throws(VoiceError) {
        try checkFrameSize(frameSize, sampleRate: sampleRate)
        let c = configuration
        guard (-90...0).contains(c.noiseSuppressDB), (-90...0).contains(c.echoSuppressDB),
            (-90...0).contains(c.echoSuppressActiveDB)
        else {
            throw .invalidConfiguration("suppression levels must be -90...0 dB")
        }
        guard (1...32768).contains(c.agcLevel) else {
            throw .invalidConfiguration("agcLevel must be 1...32768, not \(c.agcLevel)")
        }
        if let echoCanceller, echoCanceller.frameSize != frameSize || echoCanceller.sampleRate != sampleRate {
            throw .invalidConfiguration(
                "the echo canceller runs \(echoCanceller.frameSize) samples at \(echoCanceller.sampleRate) Hz, the preprocessor \(frameSize) at \(sampleRate)"
            )
        }
        guard let state = speex_preprocess_state_init(Int32(frameSize), Int32(sampleRate)) else {
            throw .library("speex_preprocess_state_init", code: -1)
        }
        self.state = state
        self.frameSize = frameSize
        self.configuration = c
        self.echoCanceller = echoCanceller
        set(SPEEX_PREPROCESS_SET_DENOISE, c.noiseSuppression ? 1 : 0)
        set(SPEEX_PREPROCESS_SET_NOISE_SUPPRESS, Int32(c.noiseSuppressDB))
        set(SPEEX_PREPROCESS_SET_AGC, c.automaticGain ? 1 : 0)
        var level = Float(c.agcLevel)
        _ = speex_preprocess_ctl(state, SPEEX_PREPROCESS_SET_AGC_LEVEL, &level)
        // speexdsp's own VAD switch (off by default) prints a warning ("replaced by a hack")
        // whenever it is set; `process` decides from the same speech probability instead.
        set(SPEEX_PREPROCESS_SET_DEREVERB, 0)
        if let echoCanceller {
            _ = speex_preprocess_ctl(state, SPEEX_PREPROCESS_SET_ECHO_STATE, UnsafeMutableRawPointer(echoCanceller.state))
            set(SPEEX_PREPROCESS_SET_ECHO_SUPPRESS, Int32(c.echoSuppressDB))
            set(SPEEX_PREPROCESS_SET_ECHO_SUPPRESS_ACTIVE, Int32(c.echoSuppressActiveDB))
        }
    }

    deinit { speex_preprocess_state_destroy(state) }

    private func set(_ request: Int32, _ value: Int32) {
        var v = value
        _ = speex_preprocess_ctl(state, request, &v)
    }

    /// Processes one frame in place; returns the VAD decision (always true with VAD off):
    /// the preprocessor's speech probability with speexdsp's own hysteresis (speech from
    /// 35 %, holding down to 20 %).
    public func process(_ frame: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Bool {
        guard frame.count == frameSize, let base = frame.baseAddress else {
            throw .bufferTooSmall(needed: frameSize, available: frame.count)
        }
        _ = speex_preprocess_run(state, base)
        guard configuration.voiceActivityDetection else { return true }
        var probability: Int32 = 0
        _ = speex_preprocess_ctl(state, SPEEX_PREPROCESS_GET_PROB, &probability)
        voiced = probability >= (voiced ? 20 : 35)
        return voiced
    }

    private var voiced = false
}

/// The near-end chain at the voice rate: echo canceller (optional), then the
/// preprocessor with residual echo suppression tied to it. Allocation-free per frame.
public final class CaptureProcessor {
    public let frameSize: Int
    public let echoCanceller: EchoCanceller?
    public let preprocessor: Preprocessor

    public init(
        frameSize: Int, sampleRate: Int = voiceSampleRate, echoCancellation: Bool = true, tailMilliseconds: Int = 128,
        preprocessor: PreprocessorConfiguration = .init()
    ) throws(VoiceError) {
        let echo =
            echoCancellation
            ? try EchoCanceller(sampleRate: sampleRate, frameSize: frameSize, tailMilliseconds: tailMilliseconds)
            : nil
        self.echoCanceller = echo
        self.preprocessor = try Preprocessor(
            sampleRate: sampleRate, frameSize: frameSize, configuration: preprocessor, echoCanceller: echo)
        self.frameSize = frameSize
    }

    /// `captured` and the far-end `reference` played when it was recorded → the cleaned frame; returns VAD.
    public func process(
        captured: UnsafeBufferPointer<Int16>, reference: UnsafeBufferPointer<Int16>,
        into output: UnsafeMutableBufferPointer<Int16>
    ) throws(VoiceError) -> Bool {
        if let echoCanceller {
            try echoCanceller.process(capture: captured, reference: reference, into: output)
        } else {
            guard captured.count == frameSize, output.count == frameSize else {
                throw .bufferTooSmall(needed: frameSize, available: min(captured.count, output.count))
            }
            _ = output.initialize(from: captured)
        }
        return try preprocessor.process(output)
    }
}
