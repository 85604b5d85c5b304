import TusaBase

/// A TURN channel number (RFC 8656 §12): 0x4000 through 0x4FFF.
public struct ChannelNumber: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt16
    /// Returns nil outside 0x4000–0x4FFF.
    public init?(rawValue: UInt16) {
        guard Self.validRange.contains(rawValue) else { return nil }
        self.rawValue = rawValue
    }

    public static let validRange: ClosedRange<UInt16> = 0x4000...0x4FFF
    public var description: String { "0x" + String(rawValue, radix: 16, uppercase: true) }
}

/// A TURN ChannelData message (RFC 8656 §12.4): a channel number, a length,
/// and application data; padded to a multiple of four bytes on streams.
public struct ChannelData: Hashable, Sendable {
    public var channel: UInt16
    public var data: [UInt8]

    public init(channel: UInt16, data: [UInt8]) {
        self.channel = channel
        self.data = data
    }

    /// Decodes ChannelData from a UDP datagram or a stream frame. Trailing
    /// padding (up to the next multiple of four) is accepted and ignored.
    ///
    /// Any channel 0x4000–0x7FFF is accepted here: RFC 5766 allowed them all
    /// and coturn still binds numbers above 0x4FFF. RFC 8656's narrower range
    /// is enforced where channels are bound (``ChannelNumber``).
    ///
    /// - Throws: ``STUNError`` `.badChannelData` when the first two bits are not
    ///   01 or the length disagrees with the bytes.
    public init(decoding bytes: [UInt8]) throws(STUNError) {
        guard bytes.count >= 4 else { throw .truncated("ChannelData header", need: 4, have: bytes.count) }
        let channel = bytes.readUInt16(at: 0)
        guard channel & 0xC000 == 0x4000 else {
            throw STUNError(.badChannelData, "first bits of 0x\(String(channel, radix: 16)) are not 01")
        }
        let length = Int(bytes.readUInt16(at: 2))
        guard 4 + length <= bytes.count else {
            throw STUNError(.badChannelData, "length \(length) but only \(bytes.count - 4) data bytes")
        }
        guard bytes.count <= 4 + padded4(length) else {
            throw STUNError(.badChannelData, "\(bytes.count - 4 - length) bytes after the data, more than padding")
        }
        self.channel = channel
        self.data = Array(bytes[4..<(4 + length)])
    }

    /// The frame; `padded` adds zero padding to a multiple of four (required on streams).
    public func encode(padded: Bool = false) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(4 + padded4(data.count))
        out.appendUInt16(channel)
        out.appendUInt16(UInt16(truncatingIfNeeded: data.count))
        out += data
        if padded { for _ in data.count..<padded4(data.count) { out.append(0) } }
        return out
    }
}
