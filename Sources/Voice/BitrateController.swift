/// The sender's bitrate from the receiver's loss reports: the loss-based half of
/// WebRTC's congestion control (draft-ietf-rmcat-gcc §6), for one voice stream.
///
/// Little loss (under 2 %) and the rate climbs back by 8 % a report toward the
/// configured bitrate; moderate loss (2–10 %) holds it, as FEC pays for it; heavy
/// loss (over 10 %), the sign of a link that cannot carry the stream, cuts it by
/// half the loss fraction, down to a floor where speech stays intelligible. A pure
/// value: feed it reports, read ``bitrate``.
public struct BitrateController: Sendable, Equatable {
    /// The configured bitrate: never exceeded.
    public let maximum: Int
    /// Never below this (Opus narrowband speech stays intelligible at 8 kb/s).
    public let minimum: Int
    public private(set) var bitrate: Int

    public init(maximum: Int, minimum: Int = 8_000) {
        self.maximum = max(maximum, 1)
        self.minimum = min(max(minimum, 1), self.maximum)
        bitrate = self.maximum
    }

    /// A receiver report's fraction lost (0…1). Returns the new bitrate when it changed.
    @discardableResult
    public mutating func report(lossFraction: Double) -> Int? {
        let loss = lossFraction.isFinite ? min(max(lossFraction, 0), 1) : 0
        let old = bitrate
        if loss < 0.02 {
            bitrate = min(maximum, Int((Double(bitrate) * 1.08).rounded()) + 1)
        } else if loss > 0.10 {
            bitrate = max(minimum, Int((Double(bitrate) * (1 - 0.5 * loss)).rounded()))
        }
        return bitrate == old ? nil : bitrate
    }
}
