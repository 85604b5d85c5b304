import TusaBase

/// The receiver-report side of one peer's session, apart from the crypto:
/// what we saw of its media (``ReceptionStatistics``), when our next report is
/// due, the round-trip time from the peer's echo of our report, and the loss
/// hint for its encoder, smoothed across intervals.
///
/// The endpoint holds one per peer; it seals and sends what ``makeReport(now:)``
/// returns and feeds in every authenticated report with ``peerReported(_:now:canAnswer:)``.
public struct ReceiverReports: Sendable {
    /// What we received from the peer so far.
    public private(set) var reception: ReceptionStatistics
    /// The round-trip time from the latest report that echoed one of ours.
    public private(set) var roundTrip: Duration?
    /// The latest report the peer sent us (its view of our media), and when it came.
    public private(set) var lastPeerReport: (report: ControlReport, at: Timestamp)?
    /// Reports made so far.
    public private(set) var sent = 0
    /// The time report intervals count from: the last report, or the session's start.
    public private(set) var lastSent: Timestamp?
    /// The encoder's loss hint before rounding, in 0...1.
    public private(set) var smoothedLoss = 0.0
    /// The mean length of the peer's loss bursts, smoothed across intervals that lost any (0: none yet).
    public private(set) var smoothedBurst = 0.0
    private var answeredFirstReport = false
    /// Zero: no periodic reports.
    public let interval: Duration
    /// The wait before the first report, when shorter than `interval`.
    public let firstReportAfter: Duration

    public init(clockRate: UInt32, interval: Duration, firstReportAfter: Duration) {
        reception = ReceptionStatistics(clockRate: clockRate)
        self.interval = interval
        self.firstReportAfter = firstReportAfter
    }

    /// Records one authenticated media packet.
    public mutating func record(extendedSequence: UInt64, rtpTimestamp: UInt32, arrival: Timestamp) {
        reception.record(extendedSequence: extendedSequence, rtpTimestamp: rtpTimestamp, arrival: arrival)
    }

    /// The peer started a new stream (a new SSRC): reception counts from scratch.
    public mutating func restartReception() {
        reception = ReceptionStatistics(clockRate: reception.clockRate)
    }

    /// Keys are in place: the first report's wait counts from `now` (once).
    public mutating func sessionStarted(now: Timestamp) {
        lastSent = lastSent ?? now
    }

    /// The wait before the next report: short before the first.
    private var wait: Duration { sent == 0 ? min(firstReportAfter, interval) : interval }

    /// When the next periodic report is due; nil when reports are off.
    public var nextReportAt: Timestamp? {
        interval > .zero ? (lastSent ?? .zero) + wait : nil
    }

    /// Whether a periodic report is due at `now`.
    public func isDue(now: Timestamp) -> Bool {
        nextReportAt.map { now >= $0 } ?? false
    }

    /// Notes an authenticated report from the peer: keeps it (its timestamp is
    /// echoed in our next report) and takes the round-trip time from its echo of
    /// ours. Returns true for the peer's first report when `canAnswer` (reports
    /// are on and we can send): it gets one at once, so both sides know the round
    /// trip early.
    public mutating func peerReported(_ report: ControlReport, now: Timestamp, canAnswer: Bool) -> Bool {
        lastPeerReport = (report, now)
        if let rtt = ControlReport.roundTrip(
            now: ControlReport.compactTimestamp(nanoseconds: now.nanoseconds),
            lastReportTimestamp: report.lastReportTimestamp, delaySinceLastReport: report.delaySinceLastReport)
        {
            roundTrip = rtt
        }
        guard !answeredFirstReport, canAnswer, interval > .zero else { return false }
        answeredFirstReport = true
        return true
    }

    /// Our report for the peer at `now`: what we saw of its media since the last
    /// one, and the echo of its latest report for its round-trip time. Counts as sent.
    public mutating func makeReport(now: Timestamp) -> ControlReport {
        lastSent = now
        sent += 1
        let fraction = reception.takeFractionLost()
        // The loss hint follows the reported loss, smoothed so one bad interval does not swing the encoder.
        smoothedLoss = 0.7 * smoothedLoss + 0.3 * Double(fraction) / 256
        if let burst = reception.takeMeanBurstLength() {
            smoothedBurst = smoothedBurst == 0 ? burst : 0.7 * smoothedBurst + 0.3 * burst
        } else if smoothedLoss < 0.005 {
            smoothedBurst = 0  // nothing lost lately: no burst length to speak of
        }
        var echo: UInt32 = 0
        var held: UInt32 = 0
        if let (report, at) = lastPeerReport, report.timestamp != 0 {
            echo = report.timestamp
            held = UInt32(truncatingIfNeeded: (now.nanoseconds &- at.nanoseconds) << 16 / 1_000_000_000)
        }
        let stamp = ControlReport.compactTimestamp(nanoseconds: now.nanoseconds)
        return ControlReport(
            kind: .report, highestSequence: reception.highestSequence,
            cumulativeLost: UInt32(clamping: reception.cumulativeLost), fractionLost: fraction,
            jitter: reception.jitter, lastReportTimestamp: echo, delaySinceLastReport: held,
            lossHint: UInt8(min(100, (smoothedLoss * 100).rounded(.up))), timestamp: stamp == 0 ? 1 : stamp,
            meanBurstLength: UInt8(min(255, (smoothedBurst * 16).rounded())))
    }
}
