import CSodium

/// The media key log, like SSLKEYLOGFILE: opt-in, one line per key and stream:
///
///     TUSA_MEDIA_KEY <SSRC, 8 hex digits> <key, 64 hex digits>
///
/// Each line is a direction's key for one epoch of the RTP stream with that
/// SSRC (its control packets use the same key). Lines starting with `#` and
/// blank lines are ignored. Whoever holds the file can read the calls it covers.
public enum KeyLog {
    public static let label = "TUSA_MEDIA_KEY"

    static func line(ssrc: UInt32, key: SecretKey) -> String {
        let hex = key.withUnsafeBytes { raw in raw.map { byteHex($0) }.joined() }
        return "\(label) \(hex8(ssrc)) \(hex)"
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

    /// The keys in a key log, by SSRC, in the order they were logged.
    public static func parse(_ text: String) throws -> [UInt32: [SecretKey]] {
        var keys: [UInt32: [SecretKey]] = [:]
        for (i, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let fields = raw.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\r" })
            if fields.isEmpty || fields[0].hasPrefix("#") { continue }
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
