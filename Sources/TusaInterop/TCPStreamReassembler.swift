/// Rebuilds per-direction TCP byte streams from segments in capture order.
///
/// Segments are grouped by connection (the unordered endpoint pair) and direction.
/// A SYN on a pair whose connection has already seen FIN or RST, or a SYN with a new
/// initial sequence number, starts a new connection. Within a direction, segments are
/// placed by sequence number (32-bit wrap-around handled), the SYN consumes one sequence
/// number, retransmitted and overlapping bytes are kept once (the first copy in sequence
/// order wins), and ranges never seen are counted as gaps.
public struct TCPStreamReassembler: Sendable {
    private struct Piece: Sendable {
        var start: Int64
        var payload: [UInt8]
        var frame: Int
        var arrival: Int
    }

    private struct Direction: Sendable {
        var source: CaptureEndpoint
        var destination: CaptureEndpoint
        var firstFrame: Int
        var lastSequence: Int64?
        var synSequence: UInt32?
        var synStart: Int64?
        var closed = false
        var pieces: [Piece] = []

        /// Maps a 32-bit sequence number to a 64-bit one near the previous one.
        mutating func unwrap(_ sequence: UInt32) -> Int64 {
            guard let last = lastSequence else {
                lastSequence = Int64(sequence)
                return Int64(sequence)
            }
            let delta = Int64(Int32(bitPattern: sequence &- UInt32(truncatingIfNeeded: last)))
            let value = last + delta
            lastSequence = value
            return value
        }
    }

    private struct Connection: Sendable {
        var index: Int
        var directions: [Direction] = []
        var finished: Bool { directions.contains { $0.closed } }

        func direction(from source: CaptureEndpoint) -> Int? {
            directions.firstIndex { $0.source == source }
        }
    }

    private struct PairKey: Hashable, Sendable {
        var low: CaptureEndpoint
        var high: CaptureEndpoint
        init(_ a: CaptureEndpoint, _ b: CaptureEndpoint) {
            (low, high) = a < b ? (a, b) : (b, a)
        }
    }

    private var connections: [Connection] = []
    private var current: [PairKey: Int] = [:]
    private var arrivals = 0

    /// Creates an empty reassembler.
    public init() {}

    /// Adds the next segment, in capture order.
    public mutating func add(_ segment: CapturedSegment) {
        arrivals += 1
        let key = PairKey(segment.source, segment.destination)
        let isSYN = segment.flags.contains(.syn)
        var index: Int
        if let existing = current[key] {
            index = existing
            if isSYN {
                let connection = connections[existing]
                let previousSYN = connection.direction(from: segment.source).flatMap { connection.directions[$0].synSequence }
                let newISN = previousSYN.map { $0 != segment.sequence } ?? false
                let reopened = connection.finished && previousSYN != segment.sequence
                if newISN || reopened {
                    index = connections.count
                    connections.append(Connection(index: index))
                    current[key] = index
                }
            }
        } else {
            index = connections.count
            connections.append(Connection(index: index))
            current[key] = index
        }

        let directionIndex: Int
        if let found = connections[index].direction(from: segment.source) {
            directionIndex = found
        } else {
            connections[index].directions.append(
                Direction(source: segment.source, destination: segment.destination, firstFrame: segment.frame))
            directionIndex = connections[index].directions.count - 1
        }

        var direction = connections[index].directions[directionIndex]
        let start = direction.unwrap(segment.sequence)
        if isSYN && direction.synSequence == nil {
            direction.synSequence = segment.sequence
            direction.synStart = start
        }
        if segment.flags.contains(.fin) || segment.flags.contains(.rst) {
            direction.closed = true
        }
        if !segment.payload.isEmpty {
            // SYN data (TCP Fast Open) starts after the sequence number the SYN consumes.
            direction.pieces.append(
                Piece(
                    start: start + (isSYN ? 1 : 0), payload: segment.payload, frame: segment.frame, arrival: arrivals))
        }
        connections[index].directions[directionIndex] = direction
    }

    /// The reassembled streams: connections in order of first appearance, each connection's
    /// directions in the order they were first seen.
    public func streams() -> [TCPStream] {
        connections.flatMap { connection in
            connection.directions.map { Self.assemble($0, connection: connection.index) }
        }
    }

    /// Reassembles `segments` (in capture order) in one call.
    public static func reassemble(_ segments: [CapturedSegment]) -> [TCPStream] {
        var reassembler = TCPStreamReassembler()
        for segment in segments { reassembler.add(segment) }
        return reassembler.streams()
    }

    private static func assemble(_ direction: Direction, connection: Int) -> TCPStream {
        let pieces = direction.pieces.sorted { ($0.start, $0.arrival) < ($1.start, $1.arrival) }
        var next: Int64 = direction.synStart.map { $0 + 1 } ?? pieces.first?.start ?? 0
        var data: [UInt8] = []
        var chunks: [TCPStream.Chunk] = []
        var gaps = 0
        var missing: Int64 = 0
        for piece in pieces {
            let end = piece.start + Int64(piece.payload.count)
            guard end > next else { continue }  // entirely retransmitted
            var missingBefore: Int64 = 0
            if piece.start > next {
                missingBefore = piece.start - next
                gaps += 1
                missing += missingBefore
                next = piece.start
            }
            let skip = Int(next - piece.start)
            chunks.append(TCPStream.Chunk(offset: data.count, frame: piece.frame, missingBefore: Int(clamping: missingBefore)))
            data.append(contentsOf: piece.payload[skip...])
            next = end
        }
        return TCPStream(
            connection: connection, source: direction.source, destination: direction.destination, data: data,
            chunks: chunks, gaps: gaps, missingBytes: Int(clamping: missing), synSeen: direction.synStart != nil,
            closed: direction.closed, firstFrame: direction.firstFrame)
    }
}
