import Call
import Foundation
import Synchronization
import TusaBase
import Voice

/// Clicks: one frame in every `period` starts with a 2 ms 1 kHz burst; the time
/// each frame is read (handed to the stack) is recorded.
final class ClickSource: AudioSource, @unchecked Sendable {
    let sampleRate = 8000
    let frame: Int, period: Int, total: Int
    private var index = 0
    let reads = Mutex<[Int64]>([])
    init(frame: Int, period: Int, frames: Int) {
        self.frame = frame
        self.period = period
        total = frames
    }
    func read(into output: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        guard index < total else { return 0 }
        let now = monotonicNanoseconds()
        reads.withLock { $0.append(now) }
        for i in 0..<output.count { output[i] = 0 }
        if index % period == period / 2 {
            for i in 0..<min(16, output.count) { output[i] = Int16(20_000 * sin(2 * Double.pi * 1000 * Double(i) / 8000)) }
        }
        index += 1
        return output.count
    }
}

/// Records every frame handed to it with the time.
final class TimedSink: AudioSink, @unchecked Sendable {
    let sampleRate = 8000
    let writes = Mutex<[(Int64, [Int16])]>([])
    func write(_ samples: UnsafeBufferPointer<Int16>) throws(VoiceError) {
        let now = monotonicNanoseconds()
        writes.withLock { $0.append((now, Array(samples))) }
    }
    func close() {}
}

/// Mouth-to-ear of each click heard: from the moment it was "spoken" (one frame
/// before its frame was read: a frame is complete only then) until the sink was
/// handed the sample of its onset (the first above a threshold after 100 ms of quiet).
func mouthToEar(_ source: ClickSource, _ sink: TimedSink, frameMs: Int) -> [Double] {
    var onsets: [Double] = []
    var quiet = 0
    for (t, samples) in sink.writes.withLock({ $0 }) {
        for (i, v) in samples.enumerated() {
            if abs(Int(v)) > 3000 {
                if quiet >= 800 { onsets.append(Double(t) + Double(i) * 1e9 / 8000) }
                quiet = 0
            } else {
                quiet += 1
            }
        }
    }
    let frameNs = Double(frameMs) * 1e6
    let reads = source.reads.withLock { $0 }
    let clicks = stride(from: source.period / 2, to: reads.count, by: source.period).map { Double(reads[$0]) - frameNs }
    var delays: [Double] = []
    for onset in onsets {
        // The latest click spoken before this onset.
        if let spoken = clicks.last(where: { $0 < onset }) { delays.append((onset - spoken) / 1e6) }
    }
    return delays
}

func median(_ x: [Double]) -> Double {
    let s = x.sorted()
    return s.isEmpty ? .nan : s[s.count / 2]
}

func percentile(_ x: [Double], _ p: Double) -> Double {
    let s = x.sorted()
    return s.isEmpty ? .nan : s[min(s.count - 1, Int(Double(s.count) * p))]
}
