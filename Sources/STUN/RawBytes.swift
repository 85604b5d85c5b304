import CZlib

/// Bounds-checked big-endian reads over a borrowed buffer (no allocation).
struct RawReader {
    let bytes: UnsafeRawBufferPointer

    @inline(__always)
    func u8(_ i: Int) -> UInt8 { bytes[i] }

    @inline(__always)
    func u16(_ i: Int) -> UInt16 { UInt16(bytes[i]) << 8 | UInt16(bytes[i + 1]) }

    @inline(__always)
    func u32(_ i: Int) -> UInt32 {
        UInt32(bytes[i]) << 24 | UInt32(bytes[i + 1]) << 16 | UInt32(bytes[i + 2]) << 8 | UInt32(bytes[i + 3])
    }
}

/// Big-endian writes into a borrowed buffer; every write checks room and
/// `overflowed` records a write that did not fit.
struct RawWriter {
    let bytes: UnsafeMutableRawBufferPointer
    private(set) var count = 0
    private(set) var overflowed = false

    init(_ bytes: UnsafeMutableRawBufferPointer) { self.bytes = bytes }

    @inline(__always)
    private mutating func room(_ n: Int) -> Bool {
        if count + n > bytes.count { overflowed = true }
        return !overflowed
    }

    @inline(__always)
    mutating func u8(_ v: UInt8) {
        guard room(1) else { return }
        bytes[count] = v
        count += 1
    }

    @inline(__always)
    mutating func u16(_ v: UInt16) {
        guard room(2) else { return }
        bytes[count] = UInt8(truncatingIfNeeded: v >> 8)
        bytes[count + 1] = UInt8(truncatingIfNeeded: v)
        count += 2
    }

    @inline(__always)
    mutating func u32(_ v: UInt32) {
        guard room(4) else { return }
        bytes[count] = UInt8(truncatingIfNeeded: v >> 24)
        bytes[count + 1] = UInt8(truncatingIfNeeded: v >> 16)
        bytes[count + 2] = UInt8(truncatingIfNeeded: v >> 8)
        bytes[count + 3] = UInt8(truncatingIfNeeded: v)
        count += 4
    }

    mutating func copy(_ source: UnsafeRawBufferPointer) {
        guard room(source.count), let base = bytes.baseAddress, let src = source.baseAddress else { return }
        (base + count).copyMemory(from: src, byteCount: source.count)
        count += source.count
    }

    mutating func zeros(_ n: Int) {
        guard room(n) else { return }
        for i in 0..<n { bytes[count + i] = 0 }
        count += n
    }

    /// Overwrites a 16-bit field already written.
    mutating func set16(_ v: UInt16, at i: Int) {
        guard i + 2 <= count else { return }
        bytes[i] = UInt8(truncatingIfNeeded: v >> 8)
        bytes[i + 1] = UInt8(truncatingIfNeeded: v)
    }

    /// CRC-32 of what has been written so far.
    func crc() -> UInt32 {
        guard let base = bytes.baseAddress else { return 0 }
        return UInt32(truncatingIfNeeded: CZlib.crc32(0, base.assumingMemoryBound(to: UInt8.self), uInt(count)))
    }
}
