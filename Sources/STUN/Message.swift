import TusaBase

/// A STUN message (RFC 8489 §5): type, transaction ID and attributes in order.
///
/// Attributes are kept as ``RawAttribute``s so that `Message(decoding:)`
/// followed by ``encode()`` reproduces the original bytes (padding aside);
/// ``attribute(_:)`` and ``value(_:)`` give typed access. A decoded message also
/// remembers its wire bytes, which integrity and fingerprint checks need; any
/// change to the message forgets them.
public struct Message: Hashable, Sendable {
    public var type: MessageType { didSet { forgetWire() } }
    public var transactionID: TransactionID { didSet { forgetWire() } }
    public var attributes: [RawAttribute] { didSet { forgetWire() } }

    /// The bytes this message was decoded from, if it was decoded and not changed since.
    public private(set) var wire: [UInt8]?
    /// Byte offset of each attribute's header in ``wire``.
    private var offsets: [Int] = []

    /// The fixed header size.
    public static let headerSize = 20

    public init(type: MessageType, transactionID: TransactionID = .random(), attributes: [Attribute] = []) {
        self.type = type
        self.transactionID = transactionID
        self.attributes = attributes.map { $0.raw(transactionID: transactionID) }
    }

    private mutating func forgetWire() {
        wire = nil
        offsets = []
    }

    // MARK: decoding

    /// Decodes one STUN message that fills `bytes` exactly (a UDP datagram or a
    /// frame cut from a stream).
    ///
    /// - Throws: ``STUNError``: `.truncated`, `.notSTUN`, `.badLength`,
    ///   `.classicSTUN` (no magic cookie, RFC 3489), `.badAttribute`.
    public init(decoding bytes: [UInt8]) throws(STUNError) {
        guard bytes.count >= Self.headerSize else {
            throw .truncated("STUN header", need: Self.headerSize, have: bytes.count)
        }
        guard bytes[0] & 0xC0 == 0 else {
            throw STUNError(.notSTUN, "first byte 0x\(String(bytes[0], radix: 16)) has its top bits set")
        }
        let length = Int(bytes.readUInt16(at: 2))
        guard length % 4 == 0 else {
            throw STUNError(.badLength, "message length \(length) is not a multiple of 4")
        }
        guard Self.headerSize + length == bytes.count else {
            throw STUNError(.badLength, "header says \(length) attribute bytes, \(bytes.count - Self.headerSize) present")
        }
        guard bytes.readUInt32(at: 4) == magicCookie else {
            throw STUNError(.classicSTUN, "no magic cookie: an RFC 3489 (classic STUN) message, not supported")
        }
        var attributes: [RawAttribute] = []
        var offsets: [Int] = []
        var i = Self.headerSize
        while i < bytes.count {
            guard i + 4 <= bytes.count else {
                throw .truncated("attribute header at offset \(i)", need: 4, have: bytes.count - i)
            }
            let type = AttributeType(rawValue: bytes.readUInt16(at: i))
            let valueLength = Int(bytes.readUInt16(at: i + 2))
            guard i + 4 + padded4(valueLength) <= bytes.count else {
                throw .badAttribute(type, "value of \(valueLength) bytes at offset \(i + 4) overruns the message")
            }
            attributes.append(RawAttribute(type: type, value: Array(bytes[(i + 4)..<(i + 4 + valueLength)])))
            offsets.append(i)
            i += 4 + padded4(valueLength)
        }
        self.type = MessageType(rawValue: bytes.readUInt16(at: 0))
        self.transactionID = TransactionID(bytes: bytes, at: 8)
        self.attributes = attributes
        self.wire = bytes
        self.offsets = offsets
    }

    /// Checks cheaply whether `bytes` could be a STUN message (RFC 8489 §5:
    /// top bits zero, magic cookie, length consistent with the datagram).
    public static func isSTUN(_ bytes: [UInt8]) -> Bool {
        bytes.count >= headerSize && bytes[0] & 0xC0 == 0 && bytes.readUInt32(at: 4) == magicCookie
            && Int(bytes.readUInt16(at: 2)) + headerSize == bytes.count
    }

    // MARK: attribute access

    /// How many leading attributes count: those up to MESSAGE-INTEGRITY, then
    /// only MESSAGE-INTEGRITY-SHA256 and FINGERPRINT may follow (RFC 8489 §14.5,
    /// §14.6, §14.7); anything after them is ignored.
    public var effectiveAttributeCount: Int {
        // 0: anything may come; 1: after MESSAGE-INTEGRITY; 2: after
        // MESSAGE-INTEGRITY-SHA256; 3: after FINGERPRINT.
        var stage = 0
        for (index, a) in attributes.enumerated() {
            switch a.type {
            case .messageIntegrity where stage == 0: stage = 1
            case .messageIntegritySHA256 where stage <= 1: stage = 2
            case .fingerprint where stage <= 2: stage = 3
            default: if stage != 0 { return index }
            }
        }
        return attributes.count
    }

    /// The attributes a receiver acts on (see ``effectiveAttributeCount``).
    public var effectiveAttributes: ArraySlice<RawAttribute> {
        attributes.prefix(effectiveAttributeCount)
    }

    /// The first counted attribute of a type, as bytes.
    public func attribute(_ type: AttributeType) -> RawAttribute? {
        effectiveAttributes.first { $0.type == type }
    }

    /// The typed value of the first counted attribute of a type.
    public func value(_ type: AttributeType) throws(STUNError) -> Attribute? {
        guard let raw = attribute(type) else { return nil }
        return try Attribute(raw, transactionID: transactionID)
    }

    /// Every counted attribute, typed.
    public func typedAttributes() throws(STUNError) -> [Attribute] {
        var out: [Attribute] = []
        for raw in effectiveAttributes { out.append(try Attribute(raw, transactionID: transactionID)) }
        return out
    }

    /// Appends a typed attribute.
    public mutating func append(_ attribute: Attribute) {
        attributes.append(attribute.raw(transactionID: transactionID))
    }

    /// Comprehension-required attribute types in this message that are not in `known`.
    public func unknownComprehensionRequired(known: Set<AttributeType>) -> [AttributeType] {
        var seen: [AttributeType] = []
        for a in effectiveAttributes where a.type.isComprehensionRequired && !known.contains(a.type) {
            if !seen.contains(a.type) { seen.append(a.type) }
        }
        return seen
    }

    // MARK: encoding

    /// The message on the wire, attributes padded with zeros.
    public func encode() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(Self.headerSize + attributes.reduce(0) { $0 + 4 + padded4($1.value.count) })
        appendHeader(to: &out)
        for a in attributes { Self.appendAttribute(a, to: &out) }
        out.writeUInt16(UInt16(truncatingIfNeeded: out.count - Self.headerSize), at: 2)
        return out
    }

    func appendHeader(to out: inout [UInt8]) {
        out.appendUInt16(type.rawValue)
        out.appendUInt16(0)
        out.appendUInt32(magicCookie)
        out.appendUInt32(transactionID.high)
        out.appendUInt64(transactionID.low)
    }

    static func appendAttribute(_ a: RawAttribute, to out: inout [UInt8]) {
        out.appendUInt16(a.type.rawValue)
        out.appendUInt16(UInt16(truncatingIfNeeded: a.value.count))
        out += a.value
        for _ in a.value.count..<padded4(a.value.count) { out.append(0) }
    }

    /// Offset of attribute `index` in ``wire`` (only for decoded, unchanged messages).
    package func wireOffset(of index: Int) -> Int? {
        index < offsets.count ? offsets[index] : nil
    }
}

extension Message: CustomStringConvertible {
    public var description: String {
        let names = attributes.map { $0.type.description }.joined(separator: ", ")
        return "\(type) \(transactionID) [\(names)]"
    }
}
