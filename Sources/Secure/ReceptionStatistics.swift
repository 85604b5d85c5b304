import TusaBase

/// What a receiver saw of one RTP stream, as RFC 3550 counts it: packets
/// expected and lost (A.3), the fraction lost per report interval, and the
/// interarrival jitter (A.8) in RTP timestamp units. Fed only with packets that
/// authenticated (duplicates never reach it: the replay window drops them).
public struct ReceptionStatistics: Sendable, Equatable {
    /// The RTP clock rate of the stream's payload (8000 for Speex narrowband, 48000 for Opus).
    public let clockRate: UInt32
    public private(set) var baseSequence: UInt64?
    public private(set) var highestSequence: UInt64 = 0
    public private(set) var received: UInt64 = 0
    private var expectedPrior: UInt64 = 0
    private var receivedPrior: UInt64 = 0
    private var lastTransit: UInt32?
    private var jitterEstimate: Double = 0
    /// Since the last ``takeMeanBurstLength()``: gaps in the sequence, and packets missing in them.
    private var gapsInterval: UInt64 = 0
    private var missingInterval: UInt64 = 0

    public init(clockRate: UInt32) { self.clockRate = max(clockRate, 1) }

    /// Records one authenticated packet.
    public mutating func record(extendedSequence ext: UInt64, rtpTimestamp: UInt32, arrival: Timestamp) {
        if baseSequence == nil {
            baseSequence = ext
            highestSequence = ext
        }
        if ext > highestSequence + 1 {
            // A gap: that many packets lost together (or late: reordering is rare enough to ignore here).
            gapsInterval += 1
            missingInterval += ext - highestSequence - 1
        }
        if ext > highestSequence { highestSequence = ext }
        received += 1
        // Arrival in RTP units; only differences matter, so wrapping arithmetic is right.
        let units = arrival.nanoseconds / 1000 &* UInt64(clockRate) / 1_000_000
        let transit = UInt32(truncatingIfNeeded: units) &- rtpTimestamp
        if let last = lastTransit {
            let d = Double(Int32(bitPattern: transit &- last).magnitude)
            jitterEstimate += (d - jitterEstimate) / 16
        }
        lastTransit = transit
    }

    /// Packets expected from the first to the highest sequence number.
    public var expected: UInt64 { baseSequence.map { highestSequence - $0 + 1 } ?? 0 }
    /// Packets lost (never negative here: duplicates are not counted).
    public var cumulativeLost: UInt64 { expected > received ? expected - received : 0 }
    /// Interarrival jitter in RTP timestamp units.
    public var jitter: UInt32 { UInt32(min(jitterEstimate, Double(UInt32.max))) }

    /// How many packets went missing at a time since the previous call, on average
    /// (nil: none went missing), starting a new interval.
    public mutating func takeMeanBurstLength() -> Double? {
        defer {
            gapsInterval = 0
            missingInterval = 0
        }
        return gapsInterval == 0 ? nil : Double(missingInterval) / Double(gapsInterval)
    }

    /// The fraction lost since the previous call, in 1/256 (RFC 3550 A.3), starting a new interval.
    public mutating func takeFractionLost() -> UInt8 {
        let expectedInterval = expected - expectedPrior
        let receivedInterval = received - receivedPrior
        expectedPrior = expected
        receivedPrior = received
        guard expectedInterval > 0, expectedInterval > receivedInterval else { return 0 }
        return UInt8(min(255, (expectedInterval - receivedInterval) << 8 / expectedInterval))
    }
}
