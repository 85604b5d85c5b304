/// A bounds-checked view of part of a packet's bytes.
///
/// Every read returns `nil` instead of trapping when it would leave the window, so header
/// parsing on untrusted capture data cannot read out of bounds. Offsets are relative to the
/// window's start; multi-byte reads are big-endian (network order) unless stated otherwise.
struct ByteWindow {
    let bytes: [UInt8]
    let lower: Int
    let upper: Int

    /// A window over all of `bytes`.
    init(_ bytes: [UInt8]) {
        self.bytes = bytes
        self.lower = 0
        self.upper = bytes.count
    }

    private init(bytes: [UInt8], lower: Int, upper: Int) {
        self.bytes = bytes
        self.lower = lower
        self.upper = upper
    }

    /// The number of bytes in the window.
    var count: Int { upper - lower }

    /// Whether `length` bytes starting at `offset` lie inside the window.
    func contains(_ offset: Int, length: Int) -> Bool {
        offset >= 0 && length >= 0 && offset <= count && length <= count - offset
    }

    func u8(_ offset: Int) -> UInt8? {
        guard contains(offset, length: 1) else { return nil }
        return bytes[lower + offset]
    }

    func u16(_ offset: Int) -> UInt16? {
        guard contains(offset, length: 2) else { return nil }
        let i = lower + offset
        return UInt16(bytes[i]) << 8 | UInt16(bytes[i + 1])
    }

    func u32(_ offset: Int) -> UInt32? {
        guard contains(offset, length: 4) else { return nil }
        let i = lower + offset
        return UInt32(bytes[i]) << 24 | UInt32(bytes[i + 1]) << 16 | UInt32(bytes[i + 2]) << 8 | UInt32(bytes[i + 3])
    }

    /// A little-endian 32-bit read.
    func u32LE(_ offset: Int) -> UInt32? {
        u32(offset).map { $0.byteSwapped }
    }

    /// The bytes from `offset` to the end, or `nil` if `offset` is past the end.
    func dropping(_ offset: Int) -> ByteWindow? {
        guard contains(offset, length: 0) else { return nil }
        return ByteWindow(bytes: bytes, lower: lower + offset, upper: upper)
    }

    /// The first `length` bytes, or `nil` if the window is shorter.
    func prefix(_ length: Int) -> ByteWindow? {
        guard contains(0, length: length) else { return nil }
        return ByteWindow(bytes: bytes, lower: lower, upper: lower + length)
    }

    /// `length` bytes at `offset` copied out, or `nil` if they are not all inside.
    func copy(_ offset: Int, length: Int) -> [UInt8]? {
        guard contains(offset, length: length) else { return nil }
        return Array(bytes[(lower + offset)..<(lower + offset + length)])
    }

    /// The window's bytes copied out.
    func array() -> [UInt8] {
        Array(bytes[lower..<upper])
    }
}
