import Glibc
import TusaBase

/// Where mono 16-bit audio comes from: a microphone, a file or a generator.
public protocol AudioSource: AnyObject {
    var sampleRate: Int { get }
    /// Fills up to output.count samples; returns how many. Fewer than requested only at the end; 0 = ended.
    func read(into output: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int
}

/// Where mono 16-bit audio goes: a speaker or a file.
public protocol AudioSink: AnyObject {
    var sampleRate: Int { get }
    func write(_ samples: UnsafeBufferPointer<Int16>) throws(VoiceError)
    /// Idempotent; flushes files.
    func close()
    /// Whether a failed write ends the call: true for what the listener hears
    /// through (a speaker: nothing else to hear with); a recording that fails
    /// (a full disk) stops, and the conversation goes on.
    var failureEndsCall: Bool { get }
}

extension AudioSink {
    public var failureEndsCall: Bool { true }
}

/// Samples left for a source of `durationSeconds` (nil: endless).
private func sampleBudget(_ durationSeconds: Double?, _ sampleRate: Int) -> Int? {
    guard let seconds = durationSeconds else { return nil }
    guard seconds.isFinite, seconds > 0 else { return 0 }
    let samples = (seconds * Double(sampleRate)).rounded()
    return samples < Double(Int.max / 2) ? Int(samples) : Int.max / 2
}

/// How many of `requested` samples a source with `remaining` (nil: endless) may still produce.
private func take(_ requested: Int, _ remaining: inout Int?) -> Int {
    guard let left = remaining else { return requested }
    let count = min(requested, left)
    remaining = left - count
    return count
}

/// A sine tone. Amplitude is a fraction of full scale (clamped to 0...1).
public final class ToneSource: AudioSource {
    public let sampleRate: Int
    public let frequency: Double
    public let amplitude: Double
    private var phase = 0.0
    private let step: Double
    private var remaining: Int?

    public init(frequency: Double, amplitude: Double, sampleRate: Int, durationSeconds: Double? = nil) {
        self.sampleRate = max(1, sampleRate)
        self.frequency = frequency.isFinite ? frequency : 0
        self.amplitude = amplitude.isFinite ? min(max(amplitude, 0), 1) : 0
        step = 2 * Double.pi * self.frequency / Double(self.sampleRate)
        remaining = sampleBudget(durationSeconds, self.sampleRate)
    }

    public func read(into output: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        let count = take(output.count, &remaining)
        let scale = amplitude * 32767
        for i in 0..<count {
            output[i] = Int16((scale * sin(phase)).rounded())
            phase += step
            if phase >= 2 * Double.pi { phase = fmod(phase, 2 * Double.pi) }
        }
        return count
    }
}

/// Deterministic white noise (uniform, from a SplitMix64 generator seeded with `seed`).
/// `level` is the RMS as a fraction of full scale (clamped to 0...1; peaks clip above about 0.58).
public final class NoiseSource: AudioSource {
    public let sampleRate: Int
    public let level: Double
    private var random: SplitMix64
    private var remaining: Int?

    public init(level: Double, sampleRate: Int, seed: UInt64, durationSeconds: Double? = nil) {
        self.sampleRate = max(1, sampleRate)
        self.level = level.isFinite ? min(max(level, 0), 1) : 0
        random = SplitMix64(seed: seed)
        remaining = sampleBudget(durationSeconds, self.sampleRate)
    }

    public func read(into output: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        let count = take(output.count, &remaining)
        // Uniform on [-a, a] has RMS a/√3.
        let peak = level * 32767 * 1.7320508075688772
        for i in 0..<count {
            let unit = random.uniform() * 2 - 1
            output[i] = Int16(min(max((unit * peak).rounded(), -32768), 32767))
        }
        return count
    }
}

/// Silence.
public final class NullSource: AudioSource {
    public let sampleRate: Int
    private var remaining: Int?

    public init(sampleRate: Int, durationSeconds: Double? = nil) {
        self.sampleRate = max(1, sampleRate)
        remaining = sampleBudget(durationSeconds, self.sampleRate)
    }

    public func read(into output: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        let count = take(output.count, &remaining)
        if count > 0, let base = output.baseAddress { base.update(repeating: 0, count: count) }
        return count
    }
}

/// Discards everything; counts what it was given.
public final class NullSink: AudioSink {
    public let sampleRate: Int
    /// Samples written so far.
    public private(set) var samplesWritten = 0

    public init(sampleRate: Int) { self.sampleRate = max(1, sampleRate) }

    public func write(_ samples: UnsafeBufferPointer<Int16>) throws(VoiceError) { samplesWritten += samples.count }
    public func close() {}
}
