/// How many previous frames a sender carries again (``RedundantAudio``), from the
/// receiver's reports: its smoothed loss and how many packets it loses at a time.
///
/// Measured in `make quality` (Opus 8 kHz, 24 kb/s): on random loss the frame
/// before (depth 1, twice the bitrate) gains 0.1–0.4 PESQ over in-band FEC alone;
/// on bursts (mean 3) only two frames back (depth 2, three times the bitrate) do,
/// 0.5–0.6, where FEC rebuilds only a burst's last frame. Below a few percent of
/// loss it is not worth the bitrate. Turned on at 3 %, off below 1.5 %, so a
/// path near the line does not flap.
public struct RedundancyPolicy: Sendable, Equatable {
    public private(set) var depth = 0
    public var onAtLossPercent = 3.0
    public var offBelowLossPercent = 1.5
    /// A mean burst this long or longer (packets) asks for two frames back.
    public var burstyAt = 1.5

    public init() {}

    /// The depth after a report: `lossPercent` smoothed by the receiver, its mean
    /// loss burst in packets (0 when unknown).
    @discardableResult
    public mutating func report(lossPercent: Double, meanBurstLength: Double) -> Int {
        let on = depth > 0 ? lossPercent >= offBelowLossPercent : lossPercent >= onAtLossPercent
        depth = on ? (meanBurstLength >= burstyAt ? 2 : 1) : 0
        return depth
    }
}
