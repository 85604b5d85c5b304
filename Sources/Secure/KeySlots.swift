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

    /// Younger than the configuration's `rejectAfter`.
    func usable(now: Timestamp, _ lifetimes: KeyLifetimes) -> Bool { age(at: now) < lifetimes.rejectAfter }

    /// `now - createdAt` in nanoseconds (negative before `createdAt`), saturating as
    /// `Timestamp`'s `-` does, without a `Duration`.
    @inline(__always)
    func age(at now: Timestamp) -> Int64 {
        now >= createdAt
            ? Int64(clamping: now.nanoseconds - createdAt.nanoseconds)
            : -Int64(clamping: createdAt.nanoseconds - now.nanoseconds)
    }

    func retire() {
        send.retire()
        receive.retire()
    }
}

/// A configuration's key lifetimes in whole nanoseconds (``Keypair/age(at:)`` is compared
/// with them): when keys stop being used, and when a rekey is due on the initiator's side
/// and on the responder's, which waits a handshake's timeout longer so that both do not
/// start at once.
struct KeyLifetimes {
    let rejectAfter: Int64
    let initiatorRekey: Int64
    let responderRekey: Int64

    init(_ c: SecureConfiguration) {
        rejectAfter = c.rejectAfter.nanoseconds
        initiatorRekey = c.rekeyAfter.nanoseconds
        responderRekey = (c.rekeyAfter + c.handshakeTimeout).nanoseconds
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
    func lastUsable(now: Timestamp, _ lifetimes: KeyLifetimes) -> Keypair? {
        if let k = previous, k.usable(now: now, lifetimes) { return k }
        if let k = current, k.usable(now: now, lifetimes) { return k }
        if let k = next, k.usable(now: now, lifetimes) { return k }
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
