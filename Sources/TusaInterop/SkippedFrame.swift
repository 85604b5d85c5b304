/// A frame that carried IP but could not be decoded to a UDP datagram or TCP segment.
///
/// Frames that are simply not UDP or TCP (ARP, ICMP, other link protocols) are not listed.
public struct SkippedFrame: Sendable, Equatable, CustomStringConvertible {
    /// The 1-based frame number, as Wireshark numbers it.
    public var frame: Int
    /// Why the frame was skipped, e.g. `"IPv4 fragment at offset 1480"`.
    public var reason: String

    /// Creates a record of a skipped frame.
    public init(frame: Int, reason: String) {
        self.frame = frame
        self.reason = reason
    }

    /// `"frame N: reason"`.
    public var description: String { "frame \(frame): \(reason)" }
}
