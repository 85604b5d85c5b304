import CSodium
import TusaBase

/// Everything a `SecureEndpoint` keeps for one peer: who it is and where, its
/// handshake (`HandshakeState`), its keys (`KeySlots`), the two RTP streams
/// (ours to it and its to us, with their replay windows), liveness, and its
/// receiver reports.
final class PeerState {
    // What sealing a media packet reads and writes comes first, together (a party
    // relay seals each copy of a frame for another peer: one cache line to fetch
    // per copy rather than three).
    @exclusivity(unchecked) var keys = KeySlots()
    @exclusivity(unchecked) var address: TransportAddress?
    @exclusivity(unchecked) var nextSequence: UInt64
    /// Ours toward this peer: drawn again when a first handshake fails (see ``SecureEndpoint``'s timers).
    var localSSRC: UInt32
    @exclusivity(unchecked) var lastSent: Timestamp?
    @exclusivity(unchecked) var handshake = HandshakeState.zeroed

    let id: PeerID
    let key: PublicKey
    var lastRoam: Timestamp?
    /// The newest initiation timestamp accepted from the peer (older ones are replays).
    var lastTimestamp: TAI64N?
    /// The latest cookie the peer's responder gave us, and when.
    var cookie: ([UInt8], Timestamp)?
    /// Keys were confirmed both ways at least once since the peer last went silent.
    var everEstablished = false
    /// Made for an initiation from a key nobody added (`acceptUnknownPeers`): forgotten
    /// once it has no keys, no session and no handshake of ours under way.
    var addedByInitiation = false

    var remoteSSRC: UInt32?
    var nextControlIndex: UInt32 = 0
    /// The version of the peer's own reports: ours to it go in the same (an older peer reads only 1).
    var peerReportVersion: UInt8 = ControlReport.version
    var replay = ReplayWindow()
    var controlReplay = ReplayWindow()
    var highestReceived: UInt64?
    /// Media below this sequence number was sealed under keys now retired.
    var retiredBelow: UInt64?
    var lastReceived: Timestamp?
    var lastKeepaliveAttempt: Timestamp?
    /// Receiver reports: reception statistics, the round trip, the loss hint.
    var reports: ReceiverReports
    /// When this peer's live entry in the endpoint's `TimerQueue` is due; nil when it has none.
    var timerAt: Timestamp?
    /// The peer waits in the endpoint's list of peers whose timers to queue again.
    var timersChanged = false

    init(
        id: PeerID, key: PublicKey, address: TransportAddress?, localSSRC: UInt32, firstSequence: UInt64,
        configuration c: SecureConfiguration
    ) {
        reports = ReceiverReports(clockRate: c.mediaClockRate, interval: c.reportInterval, firstReportAfter: c.firstReportAfter)
        self.id = id
        self.key = key
        self.address = address
        self.localSSRC = localSSRC
        nextSequence = firstSequence
    }

    var hasKeys: Bool { !keys.isEmpty }

    /// Starts fetching the current keys' object into the cache (see `tusa_prefetch`).
    func prefetchSendKeys() {
        if let k = keys.current { tusa_prefetch(Unmanaged.passUnretained(k).toOpaque()) }
    }

    /// The keys to seal with: the current ones if confirmed and not expired.
    func sendKeys(now: Timestamp?, _ lifetimes: KeyLifetimes) -> Keypair? {
        guard let k = keys.current, k.confirmed else { return nil }
        if let now, !k.usable(now: now, lifetimes) { return nil }
        return k
    }

    /// When this peer's timers are next due (key expiry, a handshake retry, dead-peer
    /// detection, a rekey, a report, a keepalive), or nil when none is scheduled: what
    /// `SecureEndpoint.handleTimeout(now:)` does for the peer is due no earlier.
    func nextDeadline(_ c: SecureConfiguration) -> Timestamp? {
        var best: Timestamp?
        func consider(_ t: Timestamp) { best = best.map { min($0, t) } ?? t }
        for keys in keys.all {
            if let at = keys.retireAt { consider(at) }
            consider(keys.createdAt + c.rejectAfter)
        }
        if let h = handshake.initiation { consider(h.lastSent + c.handshakeRetry) }
        guard everEstablished, let last = lastReceived else { return best }
        consider(last + c.peerTimeout)
        if handshake.initiation == nil { consider(last + c.rehandshakeAfterSilence) }
        if let current = keys.current {
            if let due = reports.nextReportAt { consider(due) }
            consider(max(lastSent ?? .zero, lastKeepaliveAttempt ?? .zero) + c.keepaliveInterval)
            if handshake.initiation == nil {
                consider(current.createdAt + c.rekeyAfter + (current.initiator ? .zero : c.handshakeTimeout))
            }
        }
        return best
    }
}
