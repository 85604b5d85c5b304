/// Why frames were concealed.
public struct ConcealmentCauses: Sendable, Hashable {
    /// The frame's packet was missing while later packets were buffered (lost or still late).
    public var lost = 0
    /// The frame's packet arrived after its time (counted when the late packet arrives).
    public var late = 0
    /// Nothing at all was buffered (underrun; the playout point waits).
    public var bufferEmpty = 0
    public init() {}
}

/// Counters of a playout buffer, a value the pipeline can copy out.
public struct PlayoutStatistics: Sendable, Hashable, CustomStringConvertible {
    public var packetsReceived = 0
    public var duplicates = 0
    public var packetsPlayed = 0
    /// Arrived after their frame was played (or concealed); discarded.
    public var latePackets = 0
    /// Frames whose packet was not there when their time came (includes those that arrive late).
    public var lostPackets = 0
    public var framesDecoded = 0
    public var framesRecoveredByFEC = 0
    /// Frames whose packet was lost, played from the copy a later packet carried (``RedundantAudio``).
    public var framesRecoveredByRedundancy = 0
    public var framesConcealed = 0
    public var framesComfortNoise = 0
    public var concealedByCause = ConcealmentCauses()
    public var accelerateSamples = 0
    public var expandSamples = 0
    public var framesDroppedInSilence = 0
    public var framesInsertedInSilence = 0
    /// Samples cut from silent frames: less than a frame too much delay, taken off in a pause.
    public var silenceTrimmedSamples = 0
    public var catchUps = 0
    public var framesDroppedInCatchUp = 0
    /// Concealment runs of 150 ms or more, and their total length.
    public var interruptions = 0
    public var interruptionMilliseconds = 0
    public var targetDelayMilliseconds = 0.0
    /// Buffer delay (playout time of a packet's first sample − its arrival), over played packets.
    public var delayMeanMilliseconds = 0.0
    public var delayP95Milliseconds = 0.0
    /// The longest a played packet waited.
    public var delayMaxMilliseconds = 0.0
    /// Buffer delay over the last 50 played packets (a second of 20 ms frames): where
    /// the delay stands now, e.g. whether it came back down after a stall's pile-up.
    public var delayRecentMilliseconds = 0.0
    /// latePackets / unique packets received.
    public var lateLossRate = 0.0
    public init() {}

    /// The delay figures, from the buffer's histogram of played packets' delays.
    mutating func takeDelays(from delays: DelayHistogram) {
        delayMeanMilliseconds = delays.mean
        delayP95Milliseconds = delays.quantile(0.95)
        delayMaxMilliseconds = delays.maximum
        delayRecentMilliseconds = delays.recentMean
    }

    public var description: String {
        """
        | statistic | value |
        |---|---|
        | packets received / duplicates / played | \(packetsReceived) / \(duplicates) / \(packetsPlayed) |
        | late / lost | \(latePackets) / \(lostPackets) |
        | decoded / FEC / concealed / comfort noise | \(framesDecoded) / \(framesRecoveredByFEC) / \(framesConcealed) / \(framesComfortNoise) |
        | concealed: lost / late / empty | \(concealedByCause.lost) / \(concealedByCause.late) / \(concealedByCause.bufferEmpty) |
        | accelerate / expand samples | \(accelerateSamples) / \(expandSamples) |
        | silence frames dropped / inserted; samples trimmed | \(framesDroppedInSilence) / \(framesInsertedInSilence); \(silenceTrimmedSamples) |
        | catch-ups (frames dropped) | \(catchUps) (\(framesDroppedInCatchUp)) |
        | interruptions ≥150 ms | \(interruptions) (\(interruptionMilliseconds) ms) |
        | target / mean / p95 / max / recent delay ms | \(fmt(targetDelayMilliseconds)) / \(fmt(delayMeanMilliseconds)) / \(fmt(delayP95Milliseconds)) / \(fmt(delayMaxMilliseconds)) / \(fmt(delayRecentMilliseconds)) |
        | late loss rate | \(fmt(lateLossRate * 100))% |
        """
    }
    private func fmt(_ v: Double) -> String { String(Int((v * 10).rounded())).withDecimal }
}

extension String {
    fileprivate var withDecimal: String {
        var s = self
        let neg = s.hasPrefix("-")
        if neg { s.removeFirst() }
        while s.count < 2 { s = "0" + s }
        s.insert(".", at: s.index(before: s.endIndex))
        return (neg ? "-" : "") + s
    }
}

/// Players that can report when each frame's first sample is played (for delay measurement).
public protocol PlayoutTimingReporting: AnyObject {
    /// Called with the packet's RTP timestamp and the playout time (ns) of its first sample.
    var onPacketPlayed: ((UInt32, Int64) -> Void)? { get set }
}

/// A fixed histogram of delays in 1 ms bins (0...2047 ms).
struct DelayHistogram {
    private var bins = [Int](repeating: 0, count: 2048)
    private(set) var count = 0
    private var sum = 0.0
    /// The largest delay added.
    private(set) var maximum = 0.0
    /// The last ``recentCount`` delays (a ring), for the delay as it is now.
    private var recent = [Double](repeating: 0, count: DelayHistogram.recentCount)
    private var recentSum = 0.0
    /// One second of 20 ms frames.
    static let recentCount = 50
    mutating func add(_ ms: Double) {
        let b = max(0, min(bins.count - 1, Int(ms.rounded(.down))))
        bins[b] += 1
        let slot = count % Self.recentCount
        if count >= Self.recentCount { recentSum -= recent[slot] }
        recent[slot] = ms
        recentSum += ms
        count += 1
        sum += ms
        maximum = count == 1 ? ms : max(maximum, ms)
    }
    mutating func reset() {
        for i in 0..<bins.count { bins[i] = 0 }
        count = 0
        sum = 0
        maximum = 0
        recentSum = 0
    }
    var mean: Double { count > 0 ? sum / Double(count) : 0 }
    /// The mean of the last ``recentCount`` delays added (fewer at the start).
    var recentMean: Double { count > 0 ? recentSum / Double(min(count, Self.recentCount)) : 0 }
    func quantile(_ q: Double) -> Double {
        guard count > 0 else { return 0 }
        let want = Int((q * Double(count)).rounded(.up))
        var acc = 0
        for i in 0..<bins.count {
            acc += bins[i]
            if acc >= want { return Double(i) + 0.5 }
        }
        return Double(bins.count)
    }
}
