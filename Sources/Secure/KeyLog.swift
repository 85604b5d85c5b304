import CSodium

/// The media key log, like SSLKEYLOGFILE: opt-in, one line per key and stream:
///
///     TUSA_MEDIA_KEY <SSRC, 8 hex digits> <key, 64 hex digits>
///
/// Each line is a direction's key for one epoch of the RTP stream with that
/// SSRC (its control packets use the same key). A party member's log also
/// holds the end-to-end sender keys it used or was handed:
///
///     TUSA_PARTY_KEY <key id (SFrame KID), 16 hex digits> <base secret, 64 hex digits>
///
/// Lines starting with `#` and blank lines are ignored. Whoever holds the file
/// can read the calls and parties it covers.
public enum KeyLog {
    public static let label = "TUSA_MEDIA_KEY"
    public static let partyLabel = "TUSA_PARTY_KEY"

    static func line(ssrc: UInt32, key: SecretKey) -> String {
        "\(label) \(hex8(ssrc)) \(hex(key))"
    }

    /// A party sender key's line.
    public static func partyLine(kid: UInt64, base: SecretKey) -> String {
        let id = String(kid, radix: 16)
        return "\(partyLabel) \(String(repeating: "0", count: 16 - id.count) + id) \(hex(base))"
    }

    private static func hex(_ key: SecretKey) -> String {
        key.withUnsafeBytes { raw in raw.map { byteHex($0) }.joined() }
    }

    static func hex8(_ v: UInt32) -> String {
        let s = String(v, radix: 16)
        return String(repeating: "0", count: 8 - s.count) + s
    }

    private static func byteHex(_ b: UInt8) -> String {
        let digits = Array("0123456789abcdef")
        return String([digits[Int(b >> 4)], digits[Int(b & 15)]])
    }

    public struct ParseError: Error, Equatable, Sendable, CustomStringConvertible {
        public let line: Int
        public let reason: String
        public var description: String { "key log line \(line): \(reason)" }
    }

    /// The media keys in a key log, by SSRC, in the order they were logged
    /// (party key lines are checked and left to ``parseParty(_:)``).
    public static func parse(_ text: String) throws -> [UInt32: [SecretKey]] {
        var keys: [UInt32: [SecretKey]] = [:]
        for (i, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let fields = raw.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\r" })
            if fields.isEmpty || fields[0].hasPrefix("#") { continue }
            if fields[0] == partyLabel {
                _ = try partyKey(fields, line: i + 1)
                continue
            }
            guard fields.count == 3, fields[0] == label else {
                throw ParseError(line: i + 1, reason: "expected '\(label) SSRC KEY'")
            }
            guard fields[1].count == 8, let ssrc = UInt32(fields[1], radix: 16) else {
                throw ParseError(line: i + 1, reason: "SSRC is not 8 hex digits")
            }
            guard fields[2].count == 64, var bytes = hexBytes(fields[2]) else {
                throw ParseError(line: i + 1, reason: "key is not 64 hex digits")
            }
            defer { sodium_memzero(&bytes, bytes.count) }
            do {
                keys[ssrc, default: []].append(try SecretKey(bytes: bytes))
            } catch {
                throw ParseError(line: i + 1, reason: "bad key")
            }
        }
        return keys
    }

    /// The party sender keys in a key log: key id and base secret, in the order logged.
    public static func parseParty(_ text: String) throws -> [(kid: UInt64, base: SecretKey)] {
        var keys: [(kid: UInt64, base: SecretKey)] = []
        for (i, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let fields = raw.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\r" })
            guard fields.first == Substring(partyLabel) else { continue }
            keys.append(try partyKey(fields, line: i + 1))
        }
        return keys
    }

    private static func partyKey(_ fields: [Substring], line: Int) throws -> (kid: UInt64, base: SecretKey) {
        guard fields.count == 3 else { throw ParseError(line: line, reason: "expected '\(partyLabel) KID KEY'") }
        guard fields[1].count == 16, let kid = UInt64(fields[1], radix: 16) else {
            throw ParseError(line: line, reason: "KID is not 16 hex digits")
        }
        guard fields[2].count == 64, var bytes = hexBytes(fields[2]) else {
            throw ParseError(line: line, reason: "key is not 64 hex digits")
        }
        defer { sodium_memzero(&bytes, bytes.count) }
        do { return (kid, try SecretKey(bytes: bytes)) } catch { throw ParseError(line: line, reason: "bad key") }
    }

    static func hexBytes(_ s: Substring) -> [UInt8]? {
        var out: [UInt8] = []
        out.reserveCapacity(s.count / 2)
        var it = s.makeIterator()
        while let hi = it.next() {
            guard let lo = it.next(), let h = hi.hexDigitValue, let l = lo.hexDigitValue else { return nil }
            out.append(UInt8(h << 4 | l))
        }
        return out
    }
}
