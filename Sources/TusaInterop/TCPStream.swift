/// The reassembled bytes of one direction of one TCP connection.
public struct TCPStream: Sendable, Equatable {
    /// A run of ``TCPStream/data`` that came from one frame.
    public struct Chunk: Sendable, Equatable {
        /// Where the run starts in ``TCPStream/data``.
        public var offset: Int
        /// The 1-based frame number that carried it.
        public var frame: Int
        /// How many sequence-space bytes were missing (never captured) just before this run;
        /// 0 when the run follows the previous one directly.
        public var missingBefore: Int

        /// Creates a chunk record.
        public init(offset: Int, frame: Int, missingBefore: Int = 0) {
            self.offset = offset
            self.frame = frame
            self.missingBefore = missingBefore
        }
    }

    /// The connection's index in the capture, counting from 0 in order of first appearance
    /// (both directions share it; comparable to Wireshark's `tcp.stream`).
    public var connection: Int
    /// The sender of these bytes.
    public var source: CaptureEndpoint
    /// The receiver of these bytes.
    public var destination: CaptureEndpoint
    /// The payload in sequence order, retransmissions and overlaps removed. Holes are not
    /// filled: the bytes on either side of a hole are adjacent here (see ``Chunk/missingBefore``).
    public var data: [UInt8]
    /// Which frame each run of `data` came from, ordered by offset.
    public var chunks: [Chunk]
    /// The number of holes (sequence ranges never seen) before or between the captured runs.
    public var gaps: Int
    /// The total number of bytes missing in those holes.
    public var missingBytes: Int
    /// Whether the SYN of this direction was captured, so `data` starts at the first byte sent.
    public var synSeen: Bool
    /// Whether a FIN or RST was seen in this direction.
    public var closed: Bool
    /// The first frame seen in this direction (with or without payload).
    public var firstFrame: Int

    /// Creates a stream record.
    public init(
        connection: Int, source: CaptureEndpoint, destination: CaptureEndpoint, data: [UInt8],
        chunks: [Chunk], gaps: Int = 0, missingBytes: Int = 0, synSeen: Bool = false, closed: Bool = false,
        firstFrame: Int
    ) {
        self.connection = connection
        self.source = source
        self.destination = destination
        self.data = data
        self.chunks = chunks
        self.gaps = gaps
        self.missingBytes = missingBytes
        self.synSeen = synSeen
        self.closed = closed
        self.firstFrame = firstFrame
    }

    /// The frame that carried the byte at `offset` in ``data``, or `nil` when out of range.
    public func frame(at offset: Int) -> Int? {
        guard offset >= 0, offset < data.count else { return nil }
        var low = 0
        var high = chunks.count - 1
        var found: Int?
        while low <= high {
            let mid = (low + high) / 2
            if chunks[mid].offset <= offset {
                found = chunks[mid].frame
                low = mid + 1
            } else {
                high = mid - 1
            }
        }
        return found
    }
}
