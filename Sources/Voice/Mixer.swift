import Foundation
import TusaBase

/// Mixes several streams' frames into one without clipping.
///
/// Frames are summed in 32 bits, then a limiter scales the sum: its gain drops at
/// once to whatever keeps the frame's peak inside 16 bits (the whole frame is the
/// look-ahead, so no sample ever clips) and recovers slowly (about 0.5 s), so the
/// level does not pump. A single stream, or any sum that fits, passes bit-exact
/// while the gain is at 1.
///
/// Per frame: `begin()`, `add(_:)` for each stream, `finish(into:)`: no allocation.
public final class Mixer {
    public let frameSize: Int
    private let sum: UnsafeMutablePointer<Int32>
    private var gain: Float = 1
    private var streams = 0
    /// Per-frame recovery toward unity gain.
    private let release: Float = 0.04

    public init(frameSize: Int) {
        self.frameSize = max(frameSize, 1)
        sum = .allocate(capacity: self.frameSize)
        sum.initialize(repeating: 0, count: self.frameSize)
    }

    deinit { sum.deallocate() }

    /// The limiter's current gain (1 = untouched).
    public var currentGain: Float { gain }

    public func begin() {
        sum.update(repeating: 0, count: frameSize)
        streams = 0
    }

    /// Adds one stream's frame; a shorter frame counts as silence at its end, a longer one is cut.
    public func add(_ frame: UnsafeBufferPointer<Int16>) {
        let n = min(frame.count, frameSize)
        for i in 0..<n { sum[i] &+= Int32(frame[i]) }
        streams += 1
    }

    /// Writes the limited mix (`frameSize` samples, or fewer if `output` is shorter).
    public func finish(into output: UnsafeMutableBufferPointer<Int16>) {
        let n = min(output.count, frameSize)
        var peak: Int32 = 0
        for i in 0..<n { peak = max(peak, sum[i] == Int32.min ? Int32.max : abs(sum[i])) }
        let needed: Float = peak > Int32(Int16.max) ? Float(Int16.max) / Float(peak) : 1
        if needed < gain { gain = needed }
        if gain >= 1 {
            for i in 0..<n { output[i] = Int16(clamping: sum[i]) }
        } else {
            for i in 0..<n { output[i] = Int16(clamping: Int32((Float(sum[i]) * gain).rounded(.towardZero))) }
        }
        // Recover toward unity, never above what the next frame of the same level needs.
        gain = min(1, gain + (1 - gain) * release)
    }

    /// Convenience for a fixed set of frames (the array itself is the caller's allocation).
    public func mix(_ frames: [UnsafeBufferPointer<Int16>], into output: UnsafeMutableBufferPointer<Int16>) {
        begin()
        for frame in frames { add(frame) }
        finish(into: output)
    }
}

/// A synthetic room echo path: a direct path after `delayMilliseconds`, then an
/// exponentially decaying noise tail (60 dB down after `reverbMilliseconds`),
/// scaled so that the echo's energy is `gainDB` relative to the far-end signal.
/// Deterministic for a seed. Streaming: `apply` keeps its own history.
public struct RoomEcho {
    public let sampleRate: Int
    private var taps: [Float]
    private var history: [Float]
    private var position = 0

    public init(
        sampleRate: Int = voiceSampleRate, delayMilliseconds: Double = 20, reverbMilliseconds: Double = 60, gainDB: Double = -6,
        seed: UInt64 = 1
    ) {
        self.sampleRate = sampleRate
        let delay = max(0, Int(delayMilliseconds * Double(sampleRate) / 1000))
        let tail = max(1, Int(reverbMilliseconds * Double(sampleRate) / 1000))
        var rng = SplitMix64(seed: seed)
        func next() -> Double { rng.uniform() * 2 - 1 }
        var h = [Double](repeating: 0, count: delay + tail)
        h[delay] = 1
        for i in 1..<tail {
            h[delay + i] = 0.5 * next() * exp(-6.9 * Double(i) / Double(tail))
        }
        let energy = h.reduce(0) { $0 + $1 * $1 }
        let scale = (pow(10, gainDB / 10) / energy).squareRoot()
        taps = h.map { Float($0 * scale) }
        history = [Float](repeating: 0, count: taps.count)
    }

    /// The impulse response's length in samples.
    public var length: Int { taps.count }

    /// Convolves `far` (continuing the stream) into `echo` (`min(far.count, echo.count)` samples).
    public mutating func apply(_ far: UnsafeBufferPointer<Int16>, into echo: UnsafeMutableBufferPointer<Int16>) {
        let n = min(far.count, echo.count)
        let length = taps.count
        taps.withUnsafeBufferPointer { h in
            history.withUnsafeMutableBufferPointer { x in
                for i in 0..<n {
                    position = position == 0 ? length - 1 : position - 1
                    x[position] = Float(far[i])
                    // y = Σ h[k] · x[t − k]; x[t − k] sits at (position + k) mod length.
                    var acc: Float = 0
                    let first = length - position
                    for k in 0..<first { acc += h[k] * x[position + k] }
                    for k in first..<length { acc += h[k] * x[k - first] }
                    echo[i] = Int16(clamping: Int(acc.rounded()))
                }
            }
        }
    }
}

/// Echo measurements.
public enum EchoMetrics {
    /// Echo return loss enhancement in dB: 10·log10(energy of the echo / energy of what is left).
    public static func erle(echo: ArraySlice<Int16>, residual: ArraySlice<Int16>) -> Double {
        let e = energy(echo)
        let r = energy(residual)
        return 10 * log10((e + 1) / (r + 1))
    }

    /// Sum of squares.
    public static func energy(_ x: ArraySlice<Int16>) -> Double {
        x.reduce(0) { $0 + Double($1) * Double($1) }
    }
}
