/// An RTP fixed header (RFC 3550 section 5.1), parsed as a view over the wire.
///
/// `parse` walks the CSRC list and the header extension (when X is set) so
/// `headerLength` is where the payload starts; it does not strip padding
/// (with protected media the padding lives inside the encrypted payload).
public struct RTPHeader: Sendable, Equatable {
    public static let fixedLength = 12

    public var marker: Bool
    public var payloadType: UInt8
    public var sequenceNumber: UInt16
    public var timestamp: UInt32
    public var ssrc: UInt32
    /// Bytes from the start of the packet to the payload (12 + CSRCs + extension).
    public private(set) var headerLength: Int
    /// P bit as received.
    public private(set) var hasPadding: Bool
    public private(set) var csrcCount: Int
    public private(set) var hasExtension: Bool

    /// A plain header (no CSRC, no extension, no padding) for `write(into:)`.
    public init(marker: Bool = false, payloadType: UInt8, sequenceNumber: UInt16, timestamp: UInt32, ssrc: UInt32) {
        self.marker = marker
        self.payloadType = payloadType & 0x7F
        self.sequenceNumber = sequenceNumber
        self.timestamp = timestamp
        self.ssrc = ssrc
        headerLength = Self.fixedLength
        hasPadding = false
        csrcCount = 0
        hasExtension = false
    }

    /// Parses the header at the start of `bytes`. Version must be 2;
    /// `.truncated` when the CSRC list or extension runs past the end.
    public static func parse(_ bytes: UnsafeRawBufferPointer) throws -> RTPHeader {
        guard bytes.count >= fixedLength else { throw SecureError.truncated }
        let b0 = bytes[0]
        let b1 = bytes[1]
        guard b0 >> 6 == 2 else { throw SecureError.malformed("RTP version \(b0 >> 6), expected 2") }
        let csrcCount = Int(b0 & 0x0F)
        var length = fixedLength + 4 * csrcCount
        let hasExtension = b0 & 0x10 != 0
        if hasExtension {
            guard bytes.count >= length + 4 else { throw SecureError.truncated }
            let words = Int(bytes.loadBigEndianUInt16(at: length + 2))
            length += 4 + 4 * words
        }
        guard bytes.count >= length else { throw SecureError.truncated }
        var header = RTPHeader(
            marker: b1 & 0x80 != 0, payloadType: b1 & 0x7F,
            sequenceNumber: bytes.loadBigEndianUInt16(at: 2),
            timestamp: bytes.loadBigEndianUInt32(at: 4),
            ssrc: bytes.loadBigEndianUInt32(at: 8))
        header.headerLength = length
        header.hasPadding = b0 & 0x20 != 0
        header.csrcCount = csrcCount
        header.hasExtension = hasExtension
        return header
    }

    public static func parse(_ bytes: [UInt8]) throws -> RTPHeader {
        try bytes.withUnsafeBytes { try parse($0) }
    }

    /// Writes the plain 12-byte form (V=2, P=0, X=0, CC=0); returns 12.
    /// A parsed header with CSRCs or an extension cannot be rewritten this way.
    public func write(into out: UnsafeMutableRawBufferPointer) throws -> Int {
        guard csrcCount == 0, !hasExtension else {
            throw SecureError.malformed("only a plain 12-byte RTP header can be written")
        }
        guard out.count >= Self.fixedLength else {
            throw SecureError.bufferTooSmall(needed: Self.fixedLength, have: out.count)
        }
        out[0] = 0x80
        out[1] = (marker ? 0x80 : 0) | (payloadType & 0x7F)
        out.storeBigEndian(sequenceNumber, at: 2)
        out.storeBigEndian(timestamp, at: 4)
        out.storeBigEndian(ssrc, at: 8)
        return Self.fixedLength
    }
}

extension UnsafeRawBufferPointer {
    @inline(__always) func loadBigEndianUInt16(at offset: Int) -> UInt16 {
        UInt16(self[offset]) << 8 | UInt16(self[offset + 1])
    }

    @inline(__always) func loadBigEndianUInt32(at offset: Int) -> UInt32 {
        UInt32(loadBigEndianUInt16(at: offset)) << 16 | UInt32(loadBigEndianUInt16(at: offset + 2))
    }

    @inline(__always) func loadBigEndianUInt64(at offset: Int) -> UInt64 {
        UInt64(loadBigEndianUInt32(at: offset)) << 32 | UInt64(loadBigEndianUInt32(at: offset + 4))
    }
}

extension UnsafeMutableRawBufferPointer {
    @inline(__always) func storeBigEndian<T: FixedWidthInteger>(_ value: T, at offset: Int) {
        storeBytes(of: value.bigEndian, toByteOffset: offset, as: T.self)
    }
}
