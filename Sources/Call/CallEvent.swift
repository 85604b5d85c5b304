import Secure
import Transport
import TusaBase

/// What a call's driver awaits, from every source at once: the rendezvous
/// connection, the endpoint, the voice session and the controller's timer.
enum CallEvent: Sendable {
    /// A payload from a peer through the rendezvous.
    case signal(from: PublicKey, payload: [UInt8])
    /// The rendezvous connection of this generation closed (``CallAgent`` makes a
    /// new generation each time it registers again).
    case rendezvousClosed(generation: Int)
    case endpoint(SecureUDPEvent)
    /// The audio to send ended (or failed to be read).
    case sourceEnded
    /// The user hung up (``CallAgent/hangUp()``: Ctrl-C in `tusa call`).
    case hangUp
    /// Writing the audio received failed, and the call ends on it (a speaker).
    case sinkFailed
    /// The recording of the audio received failed (a full disk): it stops, the call goes on.
    case recordingStopped
    /// Our socket's address as the STUN server saw it (nil: no answer).
    case reflexive(TransportAddress?)
    /// A deadline passed (the controller's, or the ring timeout).
    case wake
}
