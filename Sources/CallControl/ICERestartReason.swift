/// Why the call restarts ICE (RFC 8445 §9): gathers again, new credentials, and
/// the new description sent to the peer.
public enum ICERestartReason: Sendable, Hashable, CustomStringConvertible {
    /// Nothing came from the peer for ``CallController/Configuration/restartAfterSilence``
    /// (we moved, its NAT rebound us, the relay restarted).
    case peerFellSilent
    /// ICE lost the peer's consent (RFC 7675): the endpoint sends nothing on the pair.
    case consentLost
    /// This machine's addresses changed (we moved): restart with the new candidates.
    case addressesChanged
    /// The peer restarted: ours go back to it as the restart's answer.
    case peerRestarted

    public var description: String {
        switch self {
        case .peerFellSilent: "the peer fell silent"
        case .consentLost: "the peer withdrew its consent"
        case .addressesChanged: "our addresses changed"
        case .peerRestarted: "the peer restarted ICE"
        }
    }
}
