/// One TCP segment read from a capture, before reassembly.
public struct CapturedSegment: Sendable, Equatable {
    /// TCP header flags.
    public struct Flags: OptionSet, Sendable, Hashable {
        public var rawValue: UInt16
        public init(rawValue: UInt16) { self.rawValue = rawValue }

        public static let fin = Flags(rawValue: 0x001)
        public static let syn = Flags(rawValue: 0x002)
        public static let rst = Flags(rawValue: 0x004)
        public static let psh = Flags(rawValue: 0x008)
        public static let ack = Flags(rawValue: 0x010)
        public static let urg = Flags(rawValue: 0x020)
        public static let ece = Flags(rawValue: 0x040)
        public static let cwr = Flags(rawValue: 0x080)
        public static let ns = Flags(rawValue: 0x100)
    }

    /// The 1-based frame number, as Wireshark numbers it.
    public var frame: Int
    /// Seconds since the Unix epoch.
    public var timestamp: Double
    /// The sender.
    public var source: CaptureEndpoint
    /// The receiver.
    public var destination: CaptureEndpoint
    /// The raw sequence number from the header.
    public var sequence: UInt32
    /// The raw acknowledgment number from the header (meaningful when `flags` has `.ack`).
    public var acknowledgment: UInt32
    /// The header flags.
    public var flags: Flags
    /// The advertised receive window (unscaled).
    public var window: UInt16
    /// The segment's payload (may be empty).
    public var payload: [UInt8]

    /// Creates a segment record.
    public init(
        frame: Int, timestamp: Double, source: CaptureEndpoint, destination: CaptureEndpoint,
        sequence: UInt32, acknowledgment: UInt32 = 0, flags: Flags, window: UInt16 = 0, payload: [UInt8]
    ) {
        self.frame = frame
        self.timestamp = timestamp
        self.source = source
        self.destination = destination
        self.sequence = sequence
        self.acknowledgment = acknowledgment
        self.flags = flags
        self.window = window
        self.payload = payload
    }
}
