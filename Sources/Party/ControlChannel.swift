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
/// A message longer than ``maxChunk`` bytes of JSON (a roster of many members)
/// travels in parts, each a packet of its own number, so that no packet outgrows
/// what a path carries without IP fragments or a receiver reads in one buffer;
/// the receiver, which hands on in order anyway, joins them (at most
/// ``maxMessage`` bytes) before it reads the JSON. A whole message is read as it
/// comes: one that does not read is refused unacknowledged, as before parts
/// existed; a message put together from parts is acknowledged part by part, and
/// reported in ``Received/malformed`` when it does not read. Only a whole message,
/// or the first part of one (sequence 1), announces a restarted peer.
///
/// ```
/// control  0x02 ‖ sender's channel id (4) ‖ sequence (4) ‖ JSON (PartyControl)
/// part     0x04 ‖ sender's channel id (4) ‖ sequence (4) ‖ a part of the JSON, more follows
/// last     0x05 ‖ sender's channel id (4) ‖ sequence (4) ‖ the JSON's last part
/// ack      0x03 ‖ acknowledged channel id (4) ‖ sequence (4)
/// ```
public struct ControlChannel: Sendable {
    public static let window: UInt32 = 64
    public static let initialTimeout: Duration = .milliseconds(250)
    public static let maxTimeout: Duration = .seconds(2)
    public static let maxAttempts = 8
    /// JSON bytes in one packet: with the headers of the party hop and the secure
    /// session the datagram stays near 1,150 bytes.
    public static let maxChunk = 1_100
    /// The longest message the receiver puts together from parts.
    public static let maxMessage = 64 * 1024
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
        /// Messages that came in order but did not read (each acknowledged and
        /// dropped: resending the same bytes would not mend them).
        public var malformed: [PartyWireError] = []
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
    /// What a packet carries: a message, or a part of one.
    enum Piece: Sendable {
        case whole(PartyControl)
        case part(ArraySlice<UInt8>, last: Bool)
    }
    /// Packets that came ahead of ``expected``.
    private var early: [UInt32: Piece] = [:]
    /// The parts of a message so far, while its last part has not come.
    private var partial: [UInt8] = []
    /// A message that grew past ``maxMessage``: its parts are dropped up to its last.
    private var oversized = false
    /// True once a message went unacknowledged through every attempt.
    public private(set) var failed = false

    public init(id: UInt32) { self.id = id }

    /// The packets carrying `message` (one, unless it is longer than ``maxChunk``),
    /// each kept until acknowledged.
    public mutating func send(_ message: PartyControl, now: Timestamp) -> [[UInt8]] {
        send(json: message.encodedJSON(), now: now)
    }

    /// The same, for a message already encoded (one encoding for many members).
    public mutating func send(json: [UInt8], now: Timestamp) -> [[UInt8]] {
        var packets: [[UInt8]] = []
        var start = 0
        repeat {
            let end = min(start + Self.maxChunk, json.count)
            let type: PartyPacketType =
                start == 0 && end == json.count ? .control : end == json.count ? .controlLastPart : .controlPart
            let sequence = nextSequence
            nextSequence &+= 1
            var bytes: [UInt8] = [type.rawValue]
            bytes.reserveCapacity(Self.headerLength + end - start)
            bytes.appendUInt32(id)
            bytes.appendUInt32(sequence)
            bytes += json[start..<end]
            outstanding[sequence] = Outstanding(
                bytes: bytes, attempts: 1, due: now + Self.initialTimeout, timeout: Self.initialTimeout)
            packets.append(bytes)
            start = end
        } while start < json.count
        return packets
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
        case PartyPacketType.control.rawValue, PartyPacketType.controlPart.rawValue,
            PartyPacketType.controlLastPart.rawValue:
            let piece: Piece
            if type == PartyPacketType.control.rawValue {
                piece = .whole(try PartyControl(json: packet[Self.headerLength...]))
            } else {
                piece = .part(packet[Self.headerLength...], last: type == PartyPacketType.controlLastPart.rawValue)
            }
            var restarted = false
            if let known = remoteID, known != channel {
                // Only what a restarted peer sends first says it restarted: not a stray part.
                if case .part = piece, type == PartyPacketType.controlLastPart.rawValue || sequence != 1 {
                    return Received(ack: nil, messages: [], restarted: false)
                }
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
            early[sequence] = piece
            var received = Received(ack: ack, messages: [], restarted: restarted)
            while let next = early.removeValue(forKey: expected) {
                expected &+= 1
                deliver(next, into: &received)
            }
            return received
        default:
            throw .unknownType(type)
        }
    }

    /// Hands on a message that came in order, or joins a part to the message it
    /// belongs to (read once its last part is in).
    private mutating func deliver(_ piece: Piece, into received: inout Received) {
        switch piece {
        case .whole(let message):
            if !partial.isEmpty || oversized {
                received.malformed.append(.malformed("a control message's parts without its last part"))
                partial = []
                oversized = false
            }
            received.messages.append(message)
        case .part(let json, let last):
            if !oversized, partial.count + json.count > Self.maxMessage {
                oversized = true
                partial = []
                received.malformed.append(.malformed("a control message of more than \(Self.maxMessage) bytes"))
            }
            if !oversized { partial += json }
            guard last else { return }
            defer {
                partial = []
                oversized = false
            }
            guard !oversized else { return }
            do { received.messages.append(try PartyControl(json: partial)) } catch { received.malformed.append(error) }
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
