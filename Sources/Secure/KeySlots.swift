import TusaBase

/// One handshake's keys, both directions.
final class Keypair {
    let send: MediaCipher
    let receive: MediaCipher
    let createdAt: Timestamp
    /// Whether we initiated the handshake that made these keys.
    let initiator: Bool
    /// An initiator's keys are confirmed at once; a responder's by the first packet opened with them.
    var confirmed = false
    @exclusivity(unchecked) var sentPackets: UInt64 = 0
    var lowestReceived: UInt64?
    var retireAt: Timestamp?

    init(keys: NoiseTransportKeys, initiator: Bool, now: Timestamp) {
        send = MediaCipher(key: keys.send)
        receive = MediaCipher(key: keys.receive)
        createdAt = now
        self.initiator = initiator
    }

    func usable(now: Timestamp, _ c: SecureConfiguration) -> Bool { now - createdAt < c.rejectAfter }

    func retire() {
        send.retire()
        receive.retire()
    }
}

/// A peer's keys in three fixed slots, as WireGuard keeps its keypairs:
///
/// - `next`: a responder's keys, unconfirmed until the first packet under them;
/// - `current`: the keys media and control are sealed with (always confirmed);
/// - `previous`: the keys `current` replaced, lingering until `retireAt` for
///   packets still in flight.
///
/// A receiver tries `next`, `current`, `previous`, in that order (newest first).
struct KeySlots {
    var previous: Keypair?
    var current: Keypair?
    var next: Keypair?

    var isEmpty: Bool { previous == nil && current == nil && next == nil }

    /// Every key held: next, current, previous.
    var all: [Keypair] { [next, current, previous].compactMap { $0 } }

    /// The last usable key in a receiver's order: it may open a packet in place
    /// without verifying first (nothing is tried after it).
    func lastUsable(now: Timestamp, _ c: SecureConfiguration) -> Keypair? {
        if let k = previous, k.usable(now: now, c) { return k }
        if let k = current, k.usable(now: now, c) { return k }
        if let k = next, k.usable(now: now, c) { return k }
        return nil
    }

    /// Empties the slot holding `keys` (it is not retired here).
    mutating func remove(_ keys: Keypair) {
        if previous === keys { previous = nil }
        if current === keys { current = nil }
        if next === keys { next = nil }
    }

    /// Retires and drops every key.
    mutating func retireAll() {
        for k in all { k.retire() }
        self = KeySlots()
    }
}
