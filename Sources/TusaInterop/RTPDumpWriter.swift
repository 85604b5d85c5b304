import TusaBase

/// Builds an rtptools rtpdump file (`#!rtpplay1.0 address/port`), which
/// Wireshark and rtptools read: a text line, a binary file header (start time,
/// source address and port), then one record per RTP packet (lengths and the
/// milliseconds since the start).
public struct RTPDumpWriter: Sendable {
    /// The file so far: empty until the first packet.
    public private(set) var bytes: [UInt8] = []
    /// The packets written.
    public private(set) var count = 0
    private var start: Double?

    /// The largest packet a record holds (its 16-bit length includes the 8-byte record header).
    public static let maximumPacketLength = 65_535 - 8

    public init() {}

    /// Appends one RTP packet captured at `time` (Unix seconds); the first packet's
    /// time is the file's start. A packet longer than ``maximumPacketLength`` is skipped.
    public mutating func add(_ packet: [UInt8], at time: Double) {
        if start == nil {
            start = time
            bytes += Array("#!rtpplay1.0 0.0.0.0/0\n".utf8)
            let sec = UInt32(clamping: Self.whole(time.rounded(.down)))
            let usec = UInt32(clamping: Self.whole((time - time.rounded(.down)) * 1e6))
            bytes.appendUInt32(sec)
            bytes.appendUInt32(usec)
            bytes.appendUInt32(0)  // source address
            bytes.appendUInt16(0)  // port
            bytes.appendUInt16(0)  // padding
        }
        guard packet.count <= Self.maximumPacketLength else { return }
        let offset = UInt32(clamping: Self.whole(((time - (start ?? time)) * 1000).rounded()))
        bytes.appendUInt16(UInt16(packet.count + 8))
        bytes.appendUInt16(UInt16(packet.count))
        bytes.appendUInt32(offset)
        bytes += packet
        count += 1
    }

    /// `x` as an Int, held to Int's range (0 for NaN): a capture's times are the file's
    /// to say (a pcapng block's resolution and offset can put them anywhere).
    private static func whole(_ x: Double) -> Int {
        guard !x.isNaN else { return 0 }
        return Int(max(-9.0e18, min(9.0e18, x)))
    }
}
