import TusaBase

extension CallController {
    /// What the controller asks of the driver, in order.
    public enum Action: Sendable, Equatable {
        /// Send this message to the peer through the rendezvous (on failure: ``Input/sendFailed(_:)``).
        case send(CallMessage)
        /// Gather again (a fresh relay allocation) and restart the ICE agent with new
        /// credentials; answer with ``Input/iceRestarted(_:)`` or ``Input/iceRestartFailed``.
        case restartICE(ICERestartReason)
        /// Run connectivity checks against the peer's new description (in the background).
        case checkICE(CallMessage.Path)
        /// Register at the rendezvous over a new connection (after it dropped, or,
        /// `replacing`, after our addresses changed: then close the old one);
        /// answer with ``Input/rendezvousRejoined`` or ``Input/rejoinFailed``.
        case rejoinRendezvous(replacing: Bool)
        /// Read this machine's addresses; answer with ``Input/localAddresses(_:)``.
        case lookAtLocalAddresses
        /// Ask a STUN server (the relay) what our socket's address is now;
        /// answer with ``Input/reflexiveAddress(_:)``.
        case learnReflexiveAddress
        /// Send the peer an authenticated keepalive at this address, which it
        /// named in a ``CallMessage/Kind/reachable`` message (its session
        /// address moves only when its media comes from there).
        case probe(TransportAddress)
        /// Time for the live status report.
        case report
        /// The call is over (any hang-up to send came as ``send(_:)`` before).
        case end(CallEnd)
    }
}
