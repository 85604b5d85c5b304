/// Textual forms of raw IP addresses.
enum IPAddressText {
    /// Dotted-quad form of a 4-byte IPv4 address.
    static func ipv4(_ b: [UInt8]) -> String {
        b.map { String($0) }.joined(separator: ".")
    }

    /// RFC 5952 canonical form of a 16-byte IPv6 address: lowercase hex, no leading zeros,
    /// the longest run (two or more) of zero groups replaced by `::` (the first on a tie),
    /// IPv4-mapped addresses (`::ffff:a.b.c.d`) with a dotted-quad tail.
    static func ipv6(_ b: [UInt8]) -> String {
        guard b.count == 16 else { return b.map { String($0, radix: 16) }.joined(separator: ":") }
        if b[0..<10].allSatisfy({ $0 == 0 }) && b[10] == 0xff && b[11] == 0xff {
            return "::ffff:" + ipv4(Array(b[12..<16]))
        }
        var groups: [UInt16] = []
        for i in stride(from: 0, to: 16, by: 2) {
            groups.append(UInt16(b[i]) << 8 | UInt16(b[i + 1]))
        }
        var bestStart = -1
        var bestLength = 0
        var i = 0
        while i < groups.count {
            if groups[i] == 0 {
                var j = i
                while j < groups.count && groups[j] == 0 { j += 1 }
                if j - i > bestLength {
                    bestStart = i
                    bestLength = j - i
                }
                i = j
            } else {
                i += 1
            }
        }
        let hex = groups.map { String($0, radix: 16) }
        guard bestLength >= 2 else { return hex.joined(separator: ":") }
        let head = hex[0..<bestStart].joined(separator: ":")
        let tail = hex[(bestStart + bestLength)...].joined(separator: ":")
        return head + "::" + tail
    }
}
