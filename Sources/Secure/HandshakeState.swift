import TusaBase

/// Where a peer's handshake stands, one state at a time (the states WireGuard's
/// noise-protocol names, for Noise IK as Tusa runs it):
///
/// - initiator: `zeroed` → `initiationCreated` (message 1 sent) → the response
///   is consumed and split within one call: the keys go to `KeySlots.current`
///   and the state is `zeroed` again;
/// - responder: `zeroed` → the initiation is consumed and the response created
///   within one call → `responseCreated`: the keys wait in `KeySlots.next` until
///   the initiator's first packet under them confirms them → `zeroed`.
///
/// When both sides initiate at once, the initiation whose sender's static key
/// sorts lower wins: the other side gives its own up and answers; the winner
/// answers too but stays `initiationCreated` (the answered keys still wait in
/// `next`, where they expire unused).
enum HandshakeState {
    /// No handshake of ours under way and none of the peer's awaiting confirmation.
    case zeroed
    /// We sent an initiation and wait for its response (or a cookie reply).
    case initiationCreated(Initiation)
    /// We answered the peer's initiation; its keys wait in `next` for its first packet.
    case responseCreated

    /// Our initiation under way, if any.
    var initiation: Initiation? {
        if case .initiationCreated(let i) = self { i } else { nil }
    }
}

/// An initiation we sent and the handshake state that reads its response.
struct Initiation {
    let noise: NoiseHandshake
    /// Our sender index: the response and cookie replies name it.
    let localIndex: UInt32
    /// The first attempt of this handshake (retries keep it: the timeout counts from here).
    let firstAttempt: Timestamp
    let lastSent: Timestamp
    /// What a cookie reply to this attempt is sealed to.
    let lastMAC1: [UInt8]
    /// Whether keys were in place when it started.
    let rekey: Bool
    /// This attempt was sent at once on a cookie reply (the next one waits for the retry timer).
    let cookieRetry: Bool
}
