/// The result of replaying a trace.
public struct TraceReplayResult: Sendable {
    public var output: [Int16]
    public var statistics: PlayoutStatistics
    /// End-to-end delay above the trace's minimum transit (playout − send − minimum transit), over played packets.
    public var meanDelayMilliseconds: Double, p95DelayMilliseconds: Double
    /// Packets that arrived but were never played / unique packets that arrived.
    public var lateLossRate: Double
    /// Packets that never arrived / packets sent.
    public var networkLossRate: Double
}

/// Replays encoded packets through a trace on a virtual clock into a PlayoutBuffer, pulling
/// `pullSamples` every pull period, and measures end-to-end delay per played packet plus late loss.
/// Delay needs the player to be `PlayoutTimingReporting`; otherwise delays are 0.
public struct TraceReplay {
    /// packets[i] is the payload of sequence i (timestamps are i * samplesPerFrame); returns the played PCM.
    public static func run(
        trace: NetworkTrace, packets: [[UInt8]], playout: any PlayoutBuffer, samplesPerFrame: Int,
        sampleRate: Int, pullSamples: Int? = nil
    ) -> TraceReplayResult {
        let pull = max(1, pullSamples ?? samplesPerFrame)
        // The trace's packets that there is audio for.
        let entries = trace.entries.filter { $0.sequence >= 0 && $0.sequence < packets.count }
        // A trace whose times start later than 0 is replayed from its first send (its
        // delays are the same; the output has no silence in front for the offset).
        let origin = max(0, entries.lazy.map(\.sendMilliseconds).min() ?? 0)
        let arrivals = entries.compactMap { e -> (Double, Int)? in
            e.arrivalMilliseconds.map { ($0 - origin, e.sequence) }
        }.sorted { $0.0 < $1.0 }
        var sendMs = [Double](repeating: 0, count: packets.count)
        var arrived = [Bool](repeating: false, count: packets.count)
        var sent = Set<Int>()
        for e in entries {
            sendMs[e.sequence] = e.sendMilliseconds - origin
            sent.insert(e.sequence)
            if e.arrivalMilliseconds != nil { arrived[e.sequence] = true }
        }
        let minTransit = trace.minimumTransitMilliseconds
        var played = [Bool](repeating: false, count: packets.count)
        var delays: [Double] = []
        delays.reserveCapacity(packets.count)
        let reporter = playout as? PlayoutTimingReporting
        let previous = reporter?.onPacketPlayed
        final class Sink: @unchecked Sendable { var events: [(UInt32, Int64)] = [] }
        let sink = Sink()
        reporter?.onPacketPlayed = { ts, ns in sink.events.append((ts, ns)) }
        let lastArrival = arrivals.last?.0 ?? 0
        // The replay ends at most 10 minutes after the audio does (from the first send):
        // a trace's times are its file's to say, and a packet a day late would have the
        // output hold a day of audio (gigabytes). What arrives later is not played.
        let audioMs = Double(packets.count) * Double(trace.frameMilliseconds)
        let endMs = min(max(lastArrival, audioMs), audioMs + 600_000) + 1000
        let periodMs = Double(pull) * 1000 / Double(sampleRate)
        var output = [Int16](repeating: 0, count: Int(endMs / periodMs + 1) * pull)
        var next = 0
        var t = 0.0
        var index = 0
        while t < endMs && (index + 1) * pull <= output.count {
            while next < arrivals.count && arrivals[next].0 <= t {
                let seq = arrivals[next].1
                packets[seq].withUnsafeBytes { raw in
                    playout.insert(
                        sequence: UInt16(truncatingIfNeeded: seq), timestamp: UInt32(truncatingIfNeeded: seq * samplesPerFrame),
                        payload: raw, arrivalNanoseconds: Int64(arrivals[next].0 * 1e6))
                }
                next += 1
            }
            output.withUnsafeMutableBufferPointer { out in
                playout.pull(
                    nowNanoseconds: Int64(t * 1e6),
                    into: UnsafeMutableBufferPointer(rebasing: out[(index * pull)..<((index + 1) * pull)]))
            }
            index += 1
            t = Double(index) * periodMs
        }
        output.removeLast(output.count - index * pull)
        reporter?.onPacketPlayed = previous
        for (ts, ns) in sink.events {
            let seq = Int(ts) / samplesPerFrame
            guard seq >= 0, seq < packets.count, !played[seq] else { continue }
            played[seq] = true
            delays.append(Double(ns) / 1e6 - sendMs[seq] - minTransit)
        }
        delays.sort()
        let uniqueArrived = arrived.filter { $0 }.count
        let playedCount = played.filter { $0 }.count
        let mean = delays.isEmpty ? 0 : delays.reduce(0, +) / Double(delays.count)
        let p95 = delays.isEmpty ? 0 : delays[min(delays.count - 1, Int((0.95 * Double(delays.count)).rounded(.up)) - 1)]
        return TraceReplayResult(
            output: output, statistics: playout.statistics, meanDelayMilliseconds: mean, p95DelayMilliseconds: p95,
            lateLossRate: uniqueArrived > 0 ? Double(max(0, uniqueArrived - playedCount)) / Double(uniqueArrived) : 0,
            networkLossRate: sent.isEmpty ? 0 : Double(sent.count - uniqueArrived) / Double(sent.count))
    }
}
