import Foundation
import TusaBase

/// How a generated trace's packets are delayed, lost and duplicated.
///
/// Per-packet delay = base + jitter·E where E is exponential with mean 1 (a shifted exponential:
/// `jitterMilliseconds` is the mean excess delay; packets can reorder). Loss is Gilbert–Elliott:
/// good→bad with probability p, bad→good with 1/meanBurstLength, every packet in the bad state
/// lost, p chosen so the stationary loss is `lossRate`. A spike every `spikeIntervalSeconds`
/// (random phase) holds packets sent during its `spikeMilliseconds` until it ends, so they arrive
/// bunched. Duplicates arrive 0–10 ms after the original. Clock drift scales the sender's clock.
public struct NetworkModel: Sendable, Hashable {
    public var baseDelayMilliseconds: Double
    public var jitterMilliseconds: Double
    public var lossRate: Double
    public var meanBurstLength: Double
    public var spikeIntervalSeconds: Double
    public var spikeMilliseconds: Double
    public var duplicateRate: Double
    public var clockDriftPPM: Double

    public init(
        baseDelayMilliseconds: Double = 20, jitterMilliseconds: Double = 0, lossRate: Double = 0,
        meanBurstLength: Double = 1, spikeIntervalSeconds: Double = 0, spikeMilliseconds: Double = 0,
        duplicateRate: Double = 0, clockDriftPPM: Double = 0
    ) {
        self.baseDelayMilliseconds = baseDelayMilliseconds
        self.jitterMilliseconds = jitterMilliseconds
        self.lossRate = lossRate
        self.meanBurstLength = meanBurstLength
        self.spikeIntervalSeconds = spikeIntervalSeconds
        self.spikeMilliseconds = spikeMilliseconds
        self.duplicateRate = duplicateRate
        self.clockDriftPPM = clockDriftPPM
    }

    /// 20 ms base, 10 ms mean exponential jitter, 1 % loss.
    public static let steady = NetworkModel(baseDelayMilliseconds: 20, jitterMilliseconds: 10, lossRate: 0.01)
    /// Steady plus a 300 ms spike every 10 s.
    public static let spiky = NetworkModel(
        baseDelayMilliseconds: 20, jitterMilliseconds: 10, lossRate: 0.01,
        spikeIntervalSeconds: 10, spikeMilliseconds: 300)
}

/// A per-packet network trace.
///
/// Text format (UTF-8, one item per line, `#` starts a comment, blank lines ignored):
/// ```
/// frame-ms 20
/// <sequence> <send-ms> <arrival-ms | lost>
/// ```
/// Sequence is an integer 0...10⁸ (not wrapped), times are decimal milliseconds (|t| ≤ 10⁹); a duplicate
/// is a second line with the same sequence.
public struct NetworkTrace: Sendable, Hashable {
    public struct Entry: Sendable, Hashable {
        public var sequence: Int
        public var sendMilliseconds: Double
        /// nil = lost.
        public var arrivalMilliseconds: Double?
        public init(sequence: Int, sendMilliseconds: Double, arrivalMilliseconds: Double?) {
            self.sequence = sequence
            self.sendMilliseconds = sendMilliseconds
            self.arrivalMilliseconds = arrivalMilliseconds
        }
    }
    public var frameMilliseconds: Int
    public var entries: [Entry]

    public init(frameMilliseconds: Int, entries: [Entry]) {
        self.frameMilliseconds = frameMilliseconds
        self.entries = entries
    }

    public init(parsing text: String) throws(VoiceError) {
        var frame: Int?
        var entries: [Entry] = []
        var lineNumber = 0
        for rawLine in text.split(separator: "\n", omittingEmptySubsequences: false) {
            lineNumber += 1
            var line = Substring(rawLine)
            if let hash = line.firstIndex(of: "#") { line = line[..<hash] }
            let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\r" })
            if fields.isEmpty { continue }
            if fields[0] == "frame-ms" {
                guard fields.count == 2, let f = Int(fields[1]), f > 0, f <= 1000 else {
                    throw .file(path: "trace", reason: "line \(lineNumber): expected `frame-ms <1...1000>`")
                }
                frame = f
                continue
            }
            guard fields.count == 3 else {
                throw .file(path: "trace", reason: "line \(lineNumber): expected `<sequence> <send-ms> <arrival-ms|lost>`")
            }
            guard let seq = Int(fields[0]), seq >= 0, seq <= 100_000_000 else {
                throw .file(path: "trace", reason: "line \(lineNumber): bad sequence `\(fields[0])`")
            }
            guard let send = Double(fields[1]), send.isFinite, abs(send) <= 1e9 else {
                throw .file(path: "trace", reason: "line \(lineNumber): bad send time `\(fields[1])`")
            }
            var arrival: Double?
            if fields[2] != "lost" {
                guard let a = Double(fields[2]), a.isFinite, a >= send, a <= 1e9 else {
                    throw .file(
                        path: "trace",
                        reason: "line \(lineNumber): bad arrival time `\(fields[2])` (a number ≥ send time, or `lost`)")
                }
                arrival = a
            }
            entries.append(Entry(sequence: seq, sendMilliseconds: send, arrivalMilliseconds: arrival))
        }
        guard let frame else { throw .file(path: "trace", reason: "line \(lineNumber): no `frame-ms` line") }
        self.init(frameMilliseconds: frame, entries: entries)
    }

    public static func load(path: String) throws(VoiceError) -> NetworkTrace {
        let text: String
        do { text = try String(contentsOfFile: path, encoding: .utf8) } catch {
            throw .file(path: path, reason: "cannot read: \(error)")
        }
        do { return try NetworkTrace(parsing: text) } catch {
            if case .file(_, let reason) = error { throw .file(path: path, reason: reason) }
            throw error
        }
    }

    public func formatted() -> String {
        var s = "# tusa network trace: sequence send-ms arrival-ms|lost\nframe-ms \(frameMilliseconds)\n"
        for e in entries {
            s += "\(e.sequence) \(Self.number(e.sendMilliseconds)) \(e.arrivalMilliseconds.map(Self.number) ?? "lost")\n"
        }
        return s
    }

    /// Decimal text that parses back to the same Double.
    private static func number(_ v: Double) -> String { "\(v)" }

    public func save(path: String) throws(VoiceError) {
        do { try formatted().write(toFile: path, atomically: true, encoding: .utf8) } catch {
            throw .file(path: path, reason: "cannot write: \(error)")
        }
    }

    /// What a receiver's reports would say of this trace's loss: the share of
    /// packets lost, in percent, and how many at a time on average (0: none lost).
    public var lossReport: (lossPercent: Double, meanBurstLength: Double) {
        let ordered = entries.sorted { $0.sequence < $1.sequence }
        guard !ordered.isEmpty else { return (0, 0) }
        var lost = 0
        var bursts = 0
        var inBurst = false
        for entry in ordered {
            let missing = entry.arrivalMilliseconds == nil
            if missing {
                lost += 1
                if !inBurst { bursts += 1 }
            }
            inBurst = missing
        }
        return (100 * Double(lost) / Double(ordered.count), bursts == 0 ? 0 : Double(lost) / Double(bursts))
    }

    /// Minimum transit (arrival − send) over arrived entries.
    public var minimumTransitMilliseconds: Double {
        entries.compactMap { e in e.arrivalMilliseconds.map { $0 - e.sendMilliseconds } }.min() ?? 0
    }

    public static func generate(_ model: NetworkModel, packets: Int, frameMilliseconds: Int, seed: UInt64) -> NetworkTrace {
        var rng = SplitMix64(seed: seed)
        var entries: [Entry] = []
        entries.reserveCapacity(packets + packets / 10)
        let burst = max(1, model.meanBurstLength)
        let loss = min(max(model.lossRate, 0), 0.999)
        let pBad = burst <= 1 ? loss : loss / (burst * (1 - loss))
        let pGood = 1 / burst
        var bad = false
        let interval = model.spikeIntervalSeconds * 1000
        var nextSpike = interval > 0 ? rng.uniform() * interval : .infinity
        let drift = 1 + model.clockDriftPPM * 1e-6
        for seq in 0..<max(0, packets) {
            let send = Double(seq * frameMilliseconds)
            let realSend = send / drift
            if realSend >= nextSpike + model.spikeMilliseconds { nextSpike += max(interval, 1) }
            if burst <= 1 { bad = rng.uniform() < loss } else { bad = bad ? rng.uniform() >= pGood : rng.uniform() < pBad }
            var delay = model.baseDelayMilliseconds + model.jitterMilliseconds * -Foundation.log(1 - rng.uniform())
            if realSend >= nextSpike && realSend < nextSpike + model.spikeMilliseconds {
                delay += nextSpike + model.spikeMilliseconds - realSend
            }
            let arrival = bad ? nil : realSend + delay
            entries.append(Entry(sequence: seq, sendMilliseconds: send, arrivalMilliseconds: arrival))
            if let arrival, rng.uniform() < model.duplicateRate {
                entries.append(Entry(sequence: seq, sendMilliseconds: send, arrivalMilliseconds: arrival + rng.uniform() * 10))
            }
        }
        return NetworkTrace(frameMilliseconds: frameMilliseconds, entries: entries)
    }
}
