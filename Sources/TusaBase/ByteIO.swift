/// Big-endian helpers over byte arrays, shared by the package's modules. Callers check bounds before reading.
extension Array where Element == UInt8 {
    @inlinable @inline(__always)
    package func readUInt16(at i: Int) -> UInt16 {
        UInt16(self[i]) << 8 | UInt16(self[i + 1])
    }

    @inlinable @inline(__always)
    package func readUInt32(at i: Int) -> UInt32 {
        UInt32(self[i]) << 24 | UInt32(self[i + 1]) << 16 | UInt32(self[i + 2]) << 8 | UInt32(self[i + 3])
    }

    @inlinable @inline(__always)
    package mutating func appendUInt16(_ v: UInt16) {
        append(UInt8(truncatingIfNeeded: v >> 8))
        append(UInt8(truncatingIfNeeded: v))
    }

    @inlinable @inline(__always)
    package mutating func appendUInt32(_ v: UInt32) {
        append(UInt8(truncatingIfNeeded: v >> 24))
        append(UInt8(truncatingIfNeeded: v >> 16))
        append(UInt8(truncatingIfNeeded: v >> 8))
        append(UInt8(truncatingIfNeeded: v))
    }

    @inlinable @inline(__always)
    package mutating func appendUInt64(_ v: UInt64) {
        appendUInt32(UInt32(truncatingIfNeeded: v >> 32))
        appendUInt32(UInt32(truncatingIfNeeded: v))
    }

    @inlinable @inline(__always)
    package mutating func writeUInt16(_ v: UInt16, at i: Int) {
        self[i] = UInt8(truncatingIfNeeded: v >> 8)
        self[i + 1] = UInt8(truncatingIfNeeded: v)
    }

    @inlinable @inline(__always)
    package mutating func writeUInt32(_ v: UInt32, at i: Int) {
        self[i] = UInt8(truncatingIfNeeded: v >> 24)
        self[i + 1] = UInt8(truncatingIfNeeded: v >> 16)
        self[i + 2] = UInt8(truncatingIfNeeded: v >> 8)
        self[i + 3] = UInt8(truncatingIfNeeded: v)
    }
}

/// Rounds up to the next multiple of four (STUN attribute and ChannelData padding).
@inlinable @inline(__always)
package func padded4(_ n: Int) -> Int { (n + 3) & ~3 }
