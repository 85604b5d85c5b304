import Secure
import TusaBase

extension CallController {
    /// What the driver tells the controller: signalling from the rendezvous, the
    /// endpoint's events, the outcome of an action it performed, the user.
    public enum Input: Sendable, Equatable {
        /// A call message that came through the rendezvous from `from` (anyone's: the
        /// controller keeps only the peer's for this call).
        case signal(CallMessage, from: PublicKey)
        /// The peer's media arrived (the latest authenticated packet, at `at`).
        case mediaArrived(at: Timestamp)
        /// ICE selected a pair (again, after a restart): media flows on it.
        case iceSelected
        /// ICE lost the peer's consent on the selected pair (RFC 7675).
        case iceConsentLost
        /// The secure layer heard nothing authenticated from the peer for its timeout.
        case peerGone
        /// This machine's addresses now (the answer to ``Action/lookAtLocalAddresses``).
        case localAddresses(Set<IPAddress>)
        /// Our connection to the rendezvous closed.
        case rendezvousLost
        /// A ``Action/rejoinRendezvous(replacing:)`` registered us again.
        case rendezvousRejoined
        /// A ``Action/rejoinRendezvous(replacing:)`` failed (the previous connection stays).
        case rejoinFailed
        /// The answer to ``Action/learnReflexiveAddress`` (nil: no answer in time).
        case reflexiveAddress(TransportAddress?)
        /// A ``Action/restartICE(_:)`` gathered again: our new description.
        case iceRestarted(CallMessage.Path)
        /// A ``Action/restartICE(_:)`` found nothing to signal.
        case iceRestartFailed
        /// A ``Action/send(_:)`` did not reach the peer (the rendezvous refused or is gone).
        case sendFailed(CallMessage)
        /// We hang up: the input ended or the user stopped us.
        case hangUp
        /// Our audio input or output failed.
        case audioFailed
    }
}
