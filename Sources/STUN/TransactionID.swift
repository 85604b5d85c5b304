import TusaBase

/// The 96-bit transaction ID of a STUN message.
public struct TransactionID: Hashable, Sendable, CustomStringConvertible {
    /// The first four bytes, big-endian.
    public var high: UInt32
    /// The last eight bytes, big-endian.
    public var low: UInt64

    public init(high: UInt32, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// Reads 12 bytes starting at `offset`; the caller guarantees they exist.
    init(bytes: [UInt8], at offset: Int) {
        high = bytes.readUInt32(at: offset)
        low = UInt64(bytes.readUInt32(at: offset + 4)) << 32 | UInt64(bytes.readUInt32(at: offset + 8))
    }

    /// Twelve bytes in wire order. Traps unless exactly 12 bytes are given: use
    /// ``init(validating:)`` for bytes from outside.
    public init?(validating bytes: [UInt8]) {
        guard bytes.count == 12 else { return nil }
        self.init(bytes: bytes, at: 0)
    }

    /// A cryptographically random transaction ID (RFC 8489 §5).
    public static func random() -> TransactionID {
        var g = SystemRandomNumberGenerator()
        return TransactionID(high: g.next(), low: g.next())
    }

    /// The 12 bytes in wire order.
    public var bytes: [UInt8] {
        var b: [UInt8] = []
        b.reserveCapacity(12)
        b.appendUInt32(high)
        b.appendUInt64(low)
        return b
    }

    public var description: String {
        bytes.map {
            let s = String($0, radix: 16)
            return s.count == 1 ? "0" + s : s
        }.joined()
    }
}
