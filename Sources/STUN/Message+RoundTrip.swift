extension Message {
    /// Whether re-encoding this decoded message reproduces its wire bytes,
    /// padding bytes aside (RFC 5769 pads with spaces, encoders with zeros).
    /// Nil when the message was not decoded or was changed since.
    public func roundTrips() -> Bool? {
        guard let wire else { return nil }
        let encoded = encode()
        guard encoded.count == wire.count, encoded.prefix(Self.headerSize) == wire.prefix(Self.headerSize) else {
            return false
        }
        for (index, a) in attributes.enumerated() {
            guard let offset = wireOffset(of: index) else { return false }
            let end = offset + 4 + a.value.count
            guard encoded[offset..<end] == wire[offset..<end] else { return false }
        }
        return true
    }
}

extension Message {
    /// Messages are equal when type, transaction ID and attributes are; the
    /// remembered wire bytes do not count.
    public static func == (a: Message, b: Message) -> Bool {
        a.type == b.type && a.transactionID == b.transactionID && a.attributes == b.attributes
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(type)
        hasher.combine(transactionID)
        hasher.combine(attributes)
    }
}
