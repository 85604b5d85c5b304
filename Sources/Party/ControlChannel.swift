import TusaBase

/// Reliable, ordered control messages over the unreliable hop between a member
/// and the relay (the secure session carries datagrams; a lost join, roster
/// change or sender key would leave a member deaf).
///
/// Each message is numbered; the receiver acknowledges every one, drops
/// duplicates and hands messages on in order (holding up to ``window`` that
/// came early); the sender resends what is not acknowledged after a timeout
/// that doubles from ``initialTimeout`` to ``maxTimeout``, and after
/// ``maxAttempts`` sends gives the hop up (``failed``).
///
/// ```
/// control  0x02 ‖ sequence (4) ‖ JSON (PartyControl)
/// ack      0x03 ‖ sequence (4)
/// ```
public struct ControlChannel: Sendable {
    public static let window: UInt32 = 64
    public static let initialTimeout: Duration = .milliseconds(250)
    public static let maxTimeout: Duration = .seconds(2)
    public static let maxAttempts = 8

    struct Outstanding: Sendable {
        var bytes: [UInt8]
        var attempts: Int
        var due: Timestamp
        var timeout: Duration
    }

    private var nextSequence: UInt32 = 1
    private var outstanding: [UInt32: Outstanding] = [:]
    private var expected: UInt32 = 1
    private var early: [UInt32: PartyControl] = [:]
    /// True once a message went unacknowledged through every attempt.
    public private(set) var failed = false

    public init() {}

    /// The packet carrying `message`, kept until acknowledged.
    public mutating func send(_ message: PartyControl, now: Timestamp) -> [UInt8] {
        send(json: message.encodedJSON(), now: now)
    }

    /// The same, for a message already encoded (one encoding for many members).
    public mutating func send(json: [UInt8], now: Timestamp) -> [UInt8] {
        let sequence = nextSequence
        nextSequence &+= 1
        var bytes: [UInt8] = [PartyPacketType.control.rawValue]
        bytes.appendUInt32(sequence)
        bytes += json
        outstanding[sequence] = Outstanding(
            bytes: bytes, attempts: 1, due: now + Self.initialTimeout, timeout: Self.initialTimeout)
        return bytes
    }

    /// Reads a control or ack packet: the ack to send back (for a control
    /// packet) and the messages now deliverable, in order.
    public mutating func receive(_ packet: [UInt8]) throws(PartyWireError) -> (ack: [UInt8]?, messages: [PartyControl]) {
        guard let type = packet.first else { throw .truncated("control packet") }
        guard packet.count >= 5 else { throw .truncated("control packet") }
        let sequence = packet.readUInt32(at: 1)
        switch type {
        case PartyPacketType.ack.rawValue:
            outstanding[sequence] = nil
            return (nil, [])
        case PartyPacketType.control.rawValue:
            var ack: [UInt8] = [PartyPacketType.ack.rawValue]
            ack.appendUInt32(sequence)
            let ahead = sequence &- expected
            // Behind: a resend of something delivered (our ack was lost). Too far ahead: not yet.
            if ahead >= UInt32.max / 2 { return (ack, []) }
            guard ahead < Self.window else { return (nil, []) }
            let message = try PartyControl(json: packet[5...])
            early[sequence] = message
            var messages: [PartyControl] = []
            while let next = early.removeValue(forKey: expected) {
                messages.append(next)
                expected &+= 1
            }
            return (ack, messages)
        default:
            throw .unknownType(type)
        }
    }

    /// Packets to send again now; sets ``failed`` when one ran out of attempts.
    public mutating func resend(now: Timestamp) -> [[UInt8]] {
        var out: [[UInt8]] = []
        for sequence in outstanding.keys.sorted() {
            guard var o = outstanding[sequence], o.due <= now else { continue }
            guard o.attempts < Self.maxAttempts else {
                failed = true
                outstanding[sequence] = nil
                continue
            }
            o.attempts += 1
            o.timeout = min(o.timeout * 2, Self.maxTimeout)
            o.due = now + o.timeout
            outstanding[sequence] = o
            out.append(o.bytes)
        }
        return out
    }

    /// When ``resend(now:)`` has something to do; nil when all is acknowledged.
    public var nextDeadline: Timestamp? { outstanding.values.map(\.due).min() }

    /// Messages not yet acknowledged.
    public var unacknowledged: Int { outstanding.count }
}
