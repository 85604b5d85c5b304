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
/// Each side's numbering belongs to a channel id drawn at random when the
/// channel starts: a peer that restarted (a member's client, the relay) sends
/// under a new id, and the other side learns it must start afresh too
/// (``Received/restarted``) instead of waiting for numbers that will never come.
///
/// ```
/// control  0x02 ‖ sender's channel id (4) ‖ sequence (4) ‖ JSON (PartyControl)
/// ack      0x03 ‖ acknowledged channel id (4) ‖ sequence (4)
/// ```
public struct ControlChannel: Sendable {
    public static let window: UInt32 = 64
    public static let initialTimeout: Duration = .milliseconds(250)
    public static let maxTimeout: Duration = .seconds(2)
    public static let maxAttempts = 8
    static let headerLength = 9

    struct Outstanding: Sendable {
        var bytes: [UInt8]
        var attempts: Int
        var due: Timestamp
        var timeout: Duration
    }

    /// What a packet brought.
    public struct Received: Sendable {
        /// The acknowledgement to send back (for a control packet).
        public var ack: [UInt8]?
        /// Messages now deliverable, in order.
        public var messages: [PartyControl]
        /// The other side started a new channel (it restarted): this channel
        /// restarted too; whatever state hung on the old one is stale.
        public var restarted: Bool
    }

    /// This side's channel id.
    public private(set) var id: UInt32
    /// The other side's channel id, once it sent something.
    public private(set) var remoteID: UInt32?
    private var nextSequence: UInt32 = 1
    private var outstanding: [UInt32: Outstanding] = [:]
    private var expected: UInt32 = 1
    private var early: [UInt32: PartyControl] = [:]
    /// True once a message went unacknowledged through every attempt.
    public private(set) var failed = false

    public init(id: UInt32) { self.id = id }

    /// The packet carrying `message`, kept until acknowledged.
    public mutating func send(_ message: PartyControl, now: Timestamp) -> [UInt8] {
        send(json: message.encodedJSON(), now: now)
    }

    /// The same, for a message already encoded (one encoding for many members).
    public mutating func send(json: [UInt8], now: Timestamp) -> [UInt8] {
        let sequence = nextSequence
        nextSequence &+= 1
        var bytes: [UInt8] = [PartyPacketType.control.rawValue]
        bytes.appendUInt32(id)
        bytes.appendUInt32(sequence)
        bytes += json
        outstanding[sequence] = Outstanding(
            bytes: bytes, attempts: 1, due: now + Self.initialTimeout, timeout: Self.initialTimeout)
        return bytes
    }

    /// Reads a control or ack packet. `newID` is this side's id should the other
    /// side turn out to have restarted (this side then restarts its numbering too).
    public mutating func receive(_ packet: [UInt8], newID: @autoclosure () -> UInt32) throws(PartyWireError) -> Received {
        guard let type = packet.first else { throw .truncated("control packet") }
        guard packet.count >= Self.headerLength else { throw .truncated("control packet") }
        let channel = packet.readUInt32(at: 1)
        let sequence = packet.readUInt32(at: 5)
        switch type {
        case PartyPacketType.ack.rawValue:
            if channel == id { outstanding[sequence] = nil }
            return Received(ack: nil, messages: [], restarted: false)
        case PartyPacketType.control.rawValue:
            let message = try PartyControl(json: packet[Self.headerLength...])
            var restarted = false
            if let known = remoteID, known != channel {
                // The other side restarted: so do we, numbering from 1 under a new id.
                self = ControlChannel(id: newID())
                restarted = true
            }
            remoteID = channel
            var ack: [UInt8] = [PartyPacketType.ack.rawValue]
            ack.appendUInt32(channel)
            ack.appendUInt32(sequence)
            let ahead = sequence &- expected
            // Behind: a resend of something delivered (our ack was lost). Too far ahead: not yet.
            if ahead >= UInt32.max / 2 { return Received(ack: ack, messages: [], restarted: restarted) }
            guard ahead < Self.window else { return Received(ack: nil, messages: [], restarted: restarted) }
            early[sequence] = message
            var messages: [PartyControl] = []
            while let next = early.removeValue(forKey: expected) {
                messages.append(next)
                expected &+= 1
            }
            return Received(ack: ack, messages: messages, restarted: restarted)
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
