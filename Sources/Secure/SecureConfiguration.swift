/// Timers and limits of a `SecureEndpoint`. The defaults suit voice calls.
public struct SecureConfiguration: Sendable {
    /// The initiator of the current keys starts a new handshake this long after
    /// it completed (the responder, if that side stays quiet, `rekeyAfter + handshakeTimeout`).
    public var rekeyAfter: Duration = .seconds(120)
    /// ...or after sending this many packets under one key, whichever comes first.
    public var rekeyAfterPackets: UInt64 = 1 << 40
    /// Keys older than this are never used to send or receive.
    public var rejectAfter: Duration = .seconds(180)
    /// How long the previous keys still open packets after newer keys are confirmed,
    /// so packets in flight at the switch are not lost.
    public var previousKeysLinger: Duration = .seconds(10)
    /// A handshake message is sent again after this long without an answer...
    public var handshakeRetry: Duration = .seconds(1)
    /// ...until the handshake has taken this long; then it fails.
    public var handshakeTimeout: Duration = .seconds(15)
    /// An encrypted keepalive goes out when nothing was sent for this long (keeps NAT bindings open).
    public var keepaliveInterval: Duration = .seconds(10)
    /// With nothing authenticated from the peer for this long, start a new handshake.
    public var rehandshakeAfterSilence: Duration = .seconds(15)
    /// With nothing authenticated from the peer for this long, it is gone.
    public var peerTimeout: Duration = .seconds(30)
    /// The peer's address follows its newest authenticated packet, at most once per this interval.
    public var roamInterval: Duration = .milliseconds(500)
    /// Initiations per second the responder does full work for before it asks for cookies.
    public var handshakeRate: Double = 50
    public var handshakeBurst: Double = 100
    /// Initiations per second per source IP accepted once cookies are required.
    public var handshakeRatePerSource: Double = 5
    /// Accept initiations from keys not added with `addPeer` (a peer is created for them).
    public var acceptUnknownPeers: Bool = false
    /// Wall-clock time at `Timestamp.zero`, in nanoseconds since 1970 (initiation timestamps).
    public var unixNanosecondsAtZero: UInt64 = 0
    /// An encrypted receiver report (loss, jitter, round-trip time, a loss hint
    /// for the peer's encoder) goes to each established peer this often; zero: never.
    public var reportInterval: Duration = .seconds(5)
    /// Timers run together on a grid of this step: a deadline waits for the next
    /// grid point, at most this long. With many peers (a relay's party members)
    /// their reports, keepalives and expiries then wake the endpoint at most once a
    /// step, where each wake walks every peer, not once per peer's deadline (which
    /// grew as the square of the peers). Zero (the default): each at its own time.
    public var timerSlack: Duration = .zero
    /// The first report goes this soon after the keys are confirmed, and each side
    /// answers the peer's first report at once: both know the round trip within
    /// a second, not two report intervals.
    public var firstReportAfter: Duration = .milliseconds(500)
    /// The RTP clock rate of incoming media, for the jitter in reports
    /// (8000: Speex narrowband and the 8 kHz pipeline; Opus streams use 48000).
    public var mediaClockRate: UInt32 = 8000
    /// Emit `.keyLog` events with every media key (for `tusa interop decrypt`); off by default.
    public var keyLog: Bool = false

    public init() {}
}
