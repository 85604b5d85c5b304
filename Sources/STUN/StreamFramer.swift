import TusaBase

/// One unit cut from a TURN/STUN byte stream.
public enum StreamFrame: Hashable, Sendable {
    /// A whole STUN message (header and attributes).
    case stun([UInt8])
    /// A whole ChannelData message including its padding.
    case channelData([UInt8])
}

/// Cuts STUN messages and padded ChannelData out of a byte stream (TURN over
/// TCP or TLS, RFC 8656 §12.5), whatever the segment boundaries.
///
/// Feed it bytes as they arrive with ``append(_:)`` and take frames with
/// ``next()``. A stream that carries anything else cannot be resynchronised:
/// ``next()`` throws and the connection should be closed.
public struct StreamFramer: Sendable {
    private var buffer: [UInt8] = []
    private var start = 0
    /// The largest frame accepted (defaults to the largest a 16-bit length allows).
    public let maximumFrameSize: Int

    public init(maximumFrameSize: Int = 65_535 + 20) {
        self.maximumFrameSize = maximumFrameSize
    }

    /// Bytes received but not yet returned as a frame.
    public var bufferedByteCount: Int { buffer.count - start }

    public mutating func append(_ bytes: some Sequence<UInt8>) {
        if start > 0 && start >= buffer.count / 2 {
            buffer.removeSubrange(0..<start)
            start = 0
        }
        buffer.append(contentsOf: bytes)
    }

    /// The next complete frame, or nil when more bytes are needed.
    public mutating func next() throws(STUNError) -> StreamFrame? {
        let available = buffer.count - start
        guard available >= 4 else { return nil }
        let first = buffer[start]
        let length = Int(buffer.readUInt16(at: start + 2))
        let total: Int
        let isSTUN: Bool
        switch first >> 6 {
        case 0:
            guard length % 4 == 0 else {
                throw STUNError(.badStream, "STUN length \(length) is not a multiple of 4")
            }
            total = 20 + length
            isSTUN = true
        case 1:
            total = 4 + padded4(length)
            isSTUN = false
        default:
            throw STUNError(.badStream, "byte 0x\(String(first, radix: 16)) starts neither STUN nor ChannelData")
        }
        guard total <= maximumFrameSize else {
            throw STUNError(.tooLarge, "frame of \(total) bytes exceeds \(maximumFrameSize)")
        }
        if isSTUN && available >= 8 && buffer.readUInt32(at: start + 4) != magicCookie {
            throw STUNError(.badStream, "STUN frame without the magic cookie")
        }
        guard available >= total else { return nil }
        let frame = Array(buffer[start..<(start + total)])
        start += total
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        }
        return isSTUN ? .stun(frame) : .channelData(frame)
    }
}
