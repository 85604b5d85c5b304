/// One thing that did not hold, at a packet of a file.
public struct InteropFailure: Sendable, Hashable, CustomStringConvertible {
    /// The capture frame number (1-based, as Wireshark numbers it); 1 for a raw message file.
    public var packet: Int
    public var reason: String

    public init(packet: Int, reason: String) {
        self.packet = packet
        self.reason = reason
    }

    public var description: String { "packet \(packet): \(reason)" }
}

/// What ``InteropChecker`` found in one file.
public struct InteropReport: Sendable {
    public var file: String
    /// STUN messages and ChannelData frames found (several may share a TCP
    /// segment), and datagrams on STUN/TURN flows that are neither (each failed).
    public var packets = 0
    /// Decoded, every known attribute's value included.
    public var decoded = 0
    /// Re-encoding reproduced the bytes (padding aside).
    public var roundTrip = 0
    /// Carried FINGERPRINT and/or MESSAGE-INTEGRITY(-SHA256), and every one was valid.
    public var verified = 0
    /// Packets with at least one failure.
    public var failed = 0
    public var failures: [InteropFailure] = []
    /// What could not be checked, without being wrong: MESSAGE-INTEGRITY for
    /// which no credentials were given.
    public var notes: [InteropFailure] = []

    /// UDP datagrams not checked: application data beside ICE checks
    /// (RFC 7983 multiplexing) and datagrams of flows that carry no STUN
    /// (a relay's traffic with its peers).
    public var other = 0

    public init(file: String) { self.file = file }

    /// `N packets: D decoded, R round-trip, V verified, F failed`, then
    /// `; K other datagrams not checked` when there are any.
    public var summary: String {
        "\(packets) packets: \(decoded) decoded, \(roundTrip) round-trip, \(verified) verified, \(failed) failed"
            + (other > 0 ? "; \(other) other datagrams not checked" : "")
    }

    public var passed: Bool { failed == 0 && failures.isEmpty }
}
