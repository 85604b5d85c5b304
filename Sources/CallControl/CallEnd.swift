/// How a call ended, for the report and the exit code.
public enum CallEnd: String, Sendable, Codable {
    /// We hung up (our input ended, or the user stopped us).
    case localHangup = "local-hangup"
    /// The peer sent a hang-up.
    case remoteHangup = "remote-hangup"
    /// Nothing authenticated came from the peer for the secure layer's timeout.
    case peerVanished = "peer-vanished"
    /// The time limit (`--duration`) ran out.
    case timeLimit = "time-limit"
    /// Our audio input or output failed (the report's `audioError` says how).
    case audioFailed = "audio-error"

    /// Whether the peer still needs our hang-up (it neither sent one nor vanished).
    public var tellsPeer: Bool { self != .remoteHangup && self != .peerVanished }
}
