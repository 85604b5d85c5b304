import Call
import Foundation
import Logging
import Relay
import Rendezvous
import STUN
import Secure
import ServiceLifecycle
import Synchronization
import Transport
import TusaBase
import Voice

// `call-bench`: real calls on loopback, in one process (one monotonic clock for
// both ends): a rendezvous, a callee, a caller playing a click train.
// - dial to first audio: the caller's dial until the first packet of the callee's
//   audio is played at the caller;
// - stack-added mouth-to-ear: a click "spoken" at the start of a frame (the frame
//   is handed over when complete, so one frame of packetisation counts) until the
//   callee's sink is handed the frame holding its onset, over the real call
//   (codec, sealing, UDP, jitter buffer, both audio clocks). Device buffers excluded.

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

func run(frameMs: Int, seconds: Int) async throws -> (dial: Double?, mouthToEar: [Double], report: CallReport) {
    var logger = Logger(label: "call-bench")
    logger.logLevel = .error
    let service = RendezvousService(address: TransportAddress(ip: .v4(0x7F00_0001), port: 0), logger: logger)
    let group = ServiceGroup(configuration: .init(services: [service], logger: logger))
    let running = Task { try await group.run() }
    defer { running.cancel() }
    let server = try await service.boundAddress()

    var options = CallAgent.Options()
    options.codec.frameDuration = FrameDuration(rawValue: frameMs) ?? .ms20
    let frames = seconds * 1000 / frameMs
    let calleeIdentity = Identity.generate()
    let callerIdentity = Identity.generate()
    let calleeConnection = try await RendezvousConnection.connect(to: server, identity: calleeIdentity.privateKey)
    let callerConnection = try await RendezvousConnection.connect(to: server, identity: callerIdentity.privateKey)
    let sink = TimedSink()
    let callee = CallAgent(rendezvous: calleeConnection, identity: calleeIdentity, options: options, logger: logger)
    let answering = Task { try await callee.answer(source: NullSource(sampleRate: 8000), sink: sink) }
    try await Task.sleep(for: .milliseconds(100))
    let source = ClickSource(frame: options.codec.samplesPerFrame, period: max(2, 400 / frameMs), frames: frames)
    let caller = CallAgent(rendezvous: callerConnection, identity: callerIdentity, options: options, logger: logger)
    let report = try await caller.call(calleeIdentity.publicKey, source: source, sink: nil)
    _ = try? await answering.value
    await calleeConnection.close()
    await callerConnection.close()
    await group.triggerGracefulShutdown()

    // Onsets at the callee: the first sample above a threshold after at least 100 ms of quiet.
    let frameNs = Double(frameMs) * 1e6
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
    // Each click was spoken one frame before its frame was read (the frame fills first).
    let reads = source.reads.withLock { $0 }
    let clicks = stride(from: source.period / 2, to: reads.count, by: source.period).map { Double(reads[$0]) - frameNs }
    var delays: [Double] = []
    for onset in onsets {
        // The latest click spoken before this onset.
        if let spoken = clicks.last(where: { $0 < onset }) { delays.append((onset - spoken) / 1e6) }
    }
    return (report.dialToFirstAudioMilliseconds, delays, report)
}

func median(_ x: [Double]) -> Double {
    let s = x.sorted()
    return s.isEmpty ? .nan : s[s.count / 2]
}
func percentile(_ x: [Double], _ p: Double) -> Double {
    let s = x.sorted()
    return s.isEmpty ? .nan : s[min(s.count - 1, Int(Double(s.count) * p))]
}

let seconds = Int(CommandLine.arguments.dropFirst().first ?? "") ?? 10
print("## Calls on loopback (call-bench, \(seconds) s per call, Opus 8 kHz 24 kb/s, direct path)")
print()
print("| frame | dial → first audio (ms) | mouth-to-ear median / p95 / max (ms) | clicks | target |")
print("|---|---|---|---|---|")
var failed = false
for (frameMs, target) in [(20, 45.0), (10, 25.0)] {
    do {
        let (dial, delays, _) = try await run(frameMs: frameMs, seconds: seconds)
        let med = median(delays)
        let ok = med <= target && (dial ?? .infinity) < 200
        if !ok { failed = true }
        print(
            String(
                format: "| %d ms | %.0f | %.1f / %.1f / %.1f | %d | ≤ %.0f ms, dial < 200 ms: %@ |",
                frameMs, dial ?? .nan, med, percentile(delays, 0.95), delays.max() ?? .nan, delays.count, target,
                ok ? "met" : "NOT met"))
    } catch {
        print("| \(frameMs) ms | call failed: \(error) | | | |")
        failed = true
    }
}
exit(failed ? 2 : 0)
