/// One UDP datagram read from a capture.
public struct CapturedDatagram: Sendable, Equatable {
    /// The 1-based frame number, as Wireshark numbers it.
    public var frame: Int
    /// Seconds since the Unix epoch.
    public var timestamp: Double
    /// The sender.
    public var source: CaptureEndpoint
    /// The receiver.
    public var destination: CaptureEndpoint
    /// The UDP payload (the datagram without its 8-byte header), trimmed to the UDP length.
    public var payload: [UInt8]

    /// Creates a datagram record.
    public init(frame: Int, timestamp: Double, source: CaptureEndpoint, destination: CaptureEndpoint, payload: [UInt8]) {
        self.frame = frame
        self.timestamp = timestamp
        self.source = source
        self.destination = destination
        self.payload = payload
    }
}
