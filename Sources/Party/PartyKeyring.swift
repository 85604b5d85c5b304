import Secure
import TusaBase

/// The sender keys a member holds: its own (the one it seals under, and a fresh
/// one waiting to take over), and the others' (to open what they send), with a
/// replay window per sender.
///
/// Receivers follow a sender's ratchet on their own: a frame under step n+k of
/// an epoch they hold at step n is opened with the key ratcheted k times (k at
/// most ``maxSkip``). The step before the newest is kept for frames still in
/// flight; only the two newest epochs per sender are kept.
public struct PartyKeyring: Sendable {
    /// How far a receiver follows a sender's ratchet at once. Every join moves
    /// every member's key one step, so a member silent while a room filled speaks
    /// under a step as many joins ahead as members came meanwhile (a leave, and
    /// the rotation every 15 minutes, start a new epoch at step 0). 1,024 covers
    /// the joins of a long evening in a large room; a forged frame far ahead
    /// costs at most that many ratchet steps (each one hash) before it is
    /// refused, and moves nothing.
    public static let maxSkip: UInt16 = 1_024

    struct Received: Sendable {
        /// The newest step known, per epoch (at most two epochs).
        var newest: [UInt16: SenderKey] = [:]
        /// The step before the newest of each epoch, for frames in flight.
        var previous: [UInt16: SenderKey] = [:]
        var replay = ReplayWindow()
    }

    /// What this member seals under now.
    public private(set) var current: SenderKey?
    /// A fresh key handed to the others, used once they all have it (or at a deadline).
    public private(set) var pending: SenderKey?
    private var received: [MemberID: Received] = [:]
    /// The frame counter (SFrame CTR), never reused across keys.
    private var counter: UInt64 = 0

    public init() {}

    /// Starts sealing under `key` at once.
    public mutating func use(_ key: SenderKey) {
        current = key
        if pending?.id == key.id { pending = nil }
    }

    /// Holds `key` as the next one, until ``promotePending()``.
    public mutating func prepare(_ key: SenderKey) { pending = key }

    /// Makes the pending key the current one.
    @discardableResult
    public mutating func promotePending() -> SenderKey? {
        guard let p = pending else { return nil }
        current = p
        pending = nil
        return p
    }

    /// Moves the current key one ratchet step on (a member joined); returns the new one.
    @discardableResult
    public mutating func ratchetCurrent() -> SenderKey? {
        current = current?.ratcheted()
        return current
    }

    /// The next counter for a frame.
    public mutating func nextCounter() -> UInt64 {
        defer { counter &+= 1 }
        return counter
    }

    /// Keeps another member's key (handed to us sealed).
    public mutating func add(_ key: SenderKey) {
        var r = received[key.id.member] ?? Received()
        if let have = r.newest[key.id.epoch], have.id.step >= key.id.step { return }
        r.newest[key.id.epoch] = key
        r.previous[key.id.epoch] = nil
        if r.newest.count > 2, let oldest = r.newest.keys.min() {
            r.newest[oldest] = nil
            r.previous[oldest] = nil
        }
        received[key.id.member] = r
    }

    /// Forgets a member that left.
    public mutating func remove(_ member: MemberID) { received[member] = nil }

    /// Whether we can open frames from `member` under some key.
    public func hasKey(from member: MemberID) -> Bool { !(received[member]?.newest.isEmpty ?? true) }

    /// Opens a frame the relay says `header.sender` sent.
    public mutating func open(_ bytes: [UInt8], header: PartyFrameHeader) throws(FrameOpenError) -> [UInt8] {
        guard let id = SenderKeyID(kid: header.sframe.keyID) else {
            throw .noKey(SenderKeyID(member: header.sender, epoch: 0, step: 0))
        }
        guard id.member == header.sender else { throw .senderMismatch }
        guard var r = received[id.member] else { throw .noKey(id) }
        guard r.replay.check(header.sframe.counter) == .fresh else { throw .replayed }
        guard let newest = r.newest[id.epoch] else { throw .noKey(id) }
        var key: SenderKey
        var advanced: (newest: SenderKey, previous: SenderKey)?
        if id.step == newest.id.step {
            key = newest
        } else if id.step > newest.id.step, id.step - newest.id.step <= Self.maxSkip {
            var k = newest
            var before = newest
            while k.id.step < id.step {
                before = k
                k = k.ratcheted()
            }
            key = k
            advanced = (k, before)
        } else if let p = r.previous[id.epoch], p.id.step == id.step {
            key = p
        } else {
            throw .noKey(id)
        }
        let plain = try PartyFrame.open(bytes, header: header, key: key)
        // Only an authentic frame moves the ratchet and the replay window.
        if let advanced {
            r.newest[id.epoch] = advanced.newest
            r.previous[id.epoch] = advanced.previous
        }
        r.replay.accept(header.sframe.counter)
        received[id.member] = r
        return plain
    }
}
