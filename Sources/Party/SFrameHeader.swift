import TusaBase

/// The SFrame header (RFC 9605 §4.3): a key id (KID) and a counter (CTR), each
/// a big-endian integer of 0…2⁶⁴−1, in as few bytes as their values need.
///
/// ```
///  0 1 2 3 4 5 6 7
/// +-+-+-+-+-+-+-+-+---------------------------------+-------------------+
/// |X|  K  |Y|  C  |   KID (0-7 bytes, when X=1)     | CTR (when Y=1)    |
/// +-+-+-+-+-+-+-+-+---------------------------------+-------------------+
/// ```
/// X=0: KID is the 3-bit K itself (0…7); X=1: K+1 bytes of KID follow. Y and C
/// do the same for CTR, after the KID bytes.
public struct SFrameHeader: Hashable, Sendable {
    public var keyID: UInt64
    public var counter: UInt64

    public init(keyID: UInt64, counter: UInt64) {
        self.keyID = keyID
        self.counter = counter
    }

    /// How many bytes the encoding takes.
    public var encodedLength: Int { 1 + Self.extraBytes(keyID) + Self.extraBytes(counter) }

    /// Appends the encoding to `out`.
    public func encode(into out: inout [UInt8]) {
        let k = Self.extraBytes(keyID)
        let c = Self.extraBytes(counter)
        var first: UInt8 = 0
        first |= k == 0 ? UInt8(keyID) << 4 : 0x80 | UInt8(k - 1) << 4
        first |= c == 0 ? UInt8(counter) : 0x08 | UInt8(c - 1)
        out.append(first)
        Self.append(keyID, bytes: k, to: &out)
        Self.append(counter, bytes: c, to: &out)
    }

    /// Reads a header at the start of `bytes`; returns it and its length, which is
    /// always its ``encodedLength``: a value in more bytes than it needs (a KID of 5
    /// in a byte of its own, a leading zero byte) is refused, as RFC 9605 §4.3 asks for
    /// the fewest. The header as sent is the AEAD's associated data and the opener
    /// rebuilds it from the values, so a longer encoding could never open anyway.
    public static func decode(_ bytes: some Collection<UInt8>) throws(PartyWireError) -> (SFrameHeader, Int) {
        var it = bytes.makeIterator()
        guard let first = it.next() else { throw .truncated("SFrame header") }
        func read(_ x: Bool, _ low: UInt8) throws(PartyWireError) -> (UInt64, Int) {
            guard x else { return (UInt64(low), 0) }
            let n = Int(low) + 1
            var v: UInt64 = 0
            for _ in 0..<n {
                guard let b = it.next() else { throw .truncated("SFrame header") }
                v = v << 8 | UInt64(b)
            }
            guard extraBytes(v) == n else { throw .malformed("an SFrame KID or CTR not in the fewest bytes (RFC 9605 §4.3)") }
            return (v, n)
        }
        let (kid, kn) = try read(first & 0x80 != 0, (first >> 4) & 0x07)
        let (ctr, cn) = try read(first & 0x08 != 0, first & 0x07)
        return (SFrameHeader(keyID: kid, counter: ctr), 1 + kn + cn)
    }

    /// 0 when the value fits the 3 bits of the first byte, else its byte count.
    static func extraBytes(_ v: UInt64) -> Int {
        if v < 8 { return 0 }
        return (64 - v.leadingZeroBitCount + 7) / 8
    }

    static func append(_ v: UInt64, bytes n: Int, to out: inout [UInt8]) {
        var i = n
        while i > 0 {
            i -= 1
            out.append(UInt8(truncatingIfNeeded: v >> (8 * UInt64(i))))
        }
    }
}
