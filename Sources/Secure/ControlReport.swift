/// The body of an encrypted control packet: receiver statistics in the
/// spirit of an RTCP receiver report block (RFC 3550 6.4.1), plus a loss hint
/// for the peer's encoder and the packet's purpose.
///
/// Encoding, version 2, 36 bytes, big-endian:
/// version(1) kind(1) fractionLost(1) lossHint(1) highestSequence(8)
/// cumulativeLost(4) jitter(4) lastReportTimestamp(4) delaySinceLastReport(4)
/// timestamp(4) meanBurstLength(1) reserved(3, zero)
///
/// Version 1 is the same without the last four bytes (32 bytes; read as no burst
/// length known). Keepalives and byes go as version 1 (they carry no report), and
/// so do reports to a peer whose own reports are version 1 (an older Tusa):
/// ``version`` says which a report is.
///
/// Round-trip time works as RFC 3550's LSR/DLSR: each report carries the
/// sender's compact clock (`timestamp`); the peer echoes the last one it got
/// (`lastReportTimestamp`) with the time it held it (`delaySinceLastReport`).
public struct ControlReport: Sendable, Equatable {
    public enum Kind: UInt8, Sendable, CaseIterable {
        case report = 0
        case keepalive = 1
        case bye = 2
    }

    public static let version: UInt8 = 2
    public static let encodedLength = 36
    /// Version 1's length (no burst length).
    static let versionOneLength = 32

    public var kind: Kind
    /// Highest extended sequence number received from the peer.
    public var highestSequence: UInt64
    /// Packets lost since the stream began (expected − received).
    public var cumulativeLost: UInt32
    /// Fraction lost since the previous report, in 1/256 (RFC 3550).
    public var fractionLost: UInt8
    /// Interarrival jitter in RTP timestamp units (RFC 3550 A.8).
    public var jitter: UInt32
    /// The compact timestamp (see `compactTimestamp`) of the last report
    /// received from the peer; 0 when none.
    public var lastReportTimestamp: UInt32
    /// Time since that report was received, in 1/65536 s; 0 when none.
    public var delaySinceLastReport: UInt32
    /// Suggested loss resilience for the peer's encoder, 0…100 %.
    public var lossHint: UInt8
    /// The sender's compact clock when it sent this report (`compactTimestamp`), for the peer to echo.
    public var timestamp: UInt32
    /// How many packets the peer's losses came in at a time lately, on average, in
    /// 1/16 packet (16: one at a time; 48: bursts of three); 0 when it lost none
    /// lately. In the spirit of RFC 3611's burst metrics: the peer's sender sizes its
    /// redundancy by it.
    public var meanBurstLength: UInt8
    /// The encoding it came in, or goes out in (1: without ``meanBurstLength``).
    public var version: UInt8 = ControlReport.version

    /// Its encoding's length.
    public var encodedLength: Int { version == 1 ? Self.versionOneLength : Self.encodedLength }

    public init(
        kind: Kind = .report, highestSequence: UInt64 = 0, cumulativeLost: UInt32 = 0,
        fractionLost: UInt8 = 0, jitter: UInt32 = 0, lastReportTimestamp: UInt32 = 0,
        delaySinceLastReport: UInt32 = 0, lossHint: UInt8 = 0, timestamp: UInt32 = 0, meanBurstLength: UInt8 = 0
    ) {
        self.meanBurstLength = meanBurstLength
        self.kind = kind
        self.highestSequence = highestSequence
        self.cumulativeLost = cumulativeLost
        self.fractionLost = fractionLost
        self.jitter = jitter
        self.lastReportTimestamp = lastReportTimestamp
        self.delaySinceLastReport = delaySinceLastReport
        self.lossHint = min(lossHint, 100)
        self.timestamp = timestamp
    }

    /// The middle 32 bits of a 32.32 fixed-point seconds clock (RFC 3550's
    /// LSR/DLSR unit, 1/65536 s), from any monotonic nanosecond clock.
    public static func compactTimestamp(nanoseconds: UInt64) -> UInt32 {
        let seconds = nanoseconds / 1_000_000_000
        let fraction = (nanoseconds % 1_000_000_000) << 16 / 1_000_000_000
        return UInt32(truncatingIfNeeded: seconds << 16 | fraction)
    }

    /// Round-trip time from a report that echoes our timestamp: now − LSR − DLSR
    /// (all compact timestamps). `nil` when the report echoes nothing or the
    /// result would be negative.
    public static func roundTrip(now: UInt32, lastReportTimestamp: UInt32, delaySinceLastReport: UInt32) -> Duration? {
        guard lastReportTimestamp != 0 else { return nil }
        let elapsed = now &- lastReportTimestamp
        guard elapsed >= delaySinceLastReport, elapsed < 0x8000_0000 else { return nil }
        let units = UInt64(elapsed - delaySinceLastReport)
        return .nanoseconds(Int64(units * 1_000_000_000 >> 16))
    }

    /// Writes the encoding of ``version`` (36 bytes, or 32 for version 1); returns its length.
    public func encode(into out: UnsafeMutableRawBufferPointer) throws -> Int {
        guard out.count >= encodedLength else {
            throw SecureError.bufferTooSmall(needed: encodedLength, have: out.count)
        }
        out[0] = version == 1 ? 1 : Self.version
        out[1] = kind.rawValue
        out[2] = fractionLost
        out[3] = min(lossHint, 100)
        out.storeBigEndian(highestSequence, at: 4)
        out.storeBigEndian(cumulativeLost, at: 12)
        out.storeBigEndian(jitter, at: 16)
        out.storeBigEndian(lastReportTimestamp, at: 20)
        out.storeBigEndian(delaySinceLastReport, at: 24)
        out.storeBigEndian(timestamp, at: 28)
        guard version != 1 else { return Self.versionOneLength }
        out[32] = meanBurstLength
        out[33] = 0
        out[34] = 0
        out[35] = 0
        return Self.encodedLength
    }

    /// Decodes exactly one version-2 (or version-1) encoding.
    public static func decode(_ bytes: UnsafeRawBufferPointer) throws -> ControlReport {
        guard bytes.count >= 1 else { throw SecureError.truncated }
        guard bytes[0] == version || bytes[0] == 1 else { throw SecureError.unsupportedVersion(bytes[0]) }
        let length = bytes[0] == 1 ? versionOneLength : encodedLength
        guard bytes.count == length else {
            throw bytes.count < length
                ? SecureError.truncated
                : SecureError.malformed("control report of \(bytes.count) bytes, expected \(length)")
        }
        guard let kind = Kind(rawValue: bytes[1]) else { throw SecureError.malformed("unknown control kind \(bytes[1])") }
        guard bytes[3] <= 100 else { throw SecureError.malformed("loss hint \(bytes[3]) above 100") }
        var report = ControlReport(
            kind: kind, highestSequence: bytes.loadBigEndianUInt64(at: 4),
            cumulativeLost: bytes.loadBigEndianUInt32(at: 12), fractionLost: bytes[2],
            jitter: bytes.loadBigEndianUInt32(at: 16), lastReportTimestamp: bytes.loadBigEndianUInt32(at: 20),
            delaySinceLastReport: bytes.loadBigEndianUInt32(at: 24), lossHint: bytes[3],
            timestamp: bytes.loadBigEndianUInt32(at: 28), meanBurstLength: length > 32 ? bytes[32] : 0)
        report.version = bytes[0]
        return report
    }

    public func encoded() -> [UInt8] {
        var out = [UInt8](repeating: 0, count: encodedLength)
        _ = out.withUnsafeMutableBytes { try? encode(into: $0) }
        return out
    }

    public static func decode(_ bytes: [UInt8]) throws -> ControlReport {
        try bytes.withUnsafeBytes { try decode($0) }
    }
}
