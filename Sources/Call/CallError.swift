import ICE
import Transport

/// Why a call could not be placed, answered or kept up. Where a lower layer
/// failed, its error is kept as it was thrown.
public enum CallError: Error, Equatable, Sendable, CustomStringConvertible {
    case malformed(String)
    case unsupported(String)
    case rejected(String)
    case noPath(String)
    /// ICE could not start or found no pair.
    case ice(SecureTransportError)
    /// Our handshake on the selected pair got no answer (the caller's side).
    case handshakeFailed(ICEPair, SecureTransportError)
    /// The caller's handshake never arrived on the selected pair (the callee's side).
    case handshakeMissing(ICEPair, SecureTransportError)
    case timedOut(String)
    case failed(String)

    public var description: String {
        switch self {
        case .malformed(let s): "malformed call message: \(s)"
        case .unsupported(let s): "unsupported: \(s)"
        case .rejected(let s): "the call was refused: \(s)"
        case .noPath(let s): "no path to the peer: \(s)"
        case .ice(let e): "no path to the peer: \(e)"
        case .handshakeFailed(let pair, let e): "no path to the peer: the handshake on \(pair) failed: \(e)"
        case .handshakeMissing(let pair, let e): "no path to the peer: the caller's handshake did not arrive on \(pair): \(e)"
        case .timedOut(let s): "timed out: \(s)"
        case .failed(let s): s
        }
    }
}
