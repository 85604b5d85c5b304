import ICE
import Transport
import TusaBase

/// Why a call could not be placed, answered or kept up. Where a lower layer
/// failed, its error is kept as it was thrown.
public enum CallError: Error, Equatable, Sendable, CustomStringConvertible {
    case malformed(String)
    case unsupported(String)
    case rejected(String)
    case noPath(String)
    /// Relay-only was asked for, and no relayed candidate could be had.
    case noRelay(RelayProblem)
    /// ICE could not start or found no pair.
    case ice(SecureTransportError)
    /// Our handshake on the selected pair got no answer (the caller's side).
    case handshakeFailed(ICEPair, SecureTransportError)
    /// The caller's handshake never arrived on the selected pair (the callee's side).
    case handshakeMissing(ICEPair, SecureTransportError)
    case timedOut(String)
    case failed(String)
    /// ``CallAgent/hangUp()`` before the call was set up.
    case hungUp
    /// An impairment spec (`--impair`) that does not read.
    case badImpairment(String)

    public var description: String {
        switch self {
        case .malformed(let s): "malformed call message: \(s)"
        case .unsupported(let s): "unsupported: \(s)"
        case .rejected(let s): "the call was refused: \(s)"
        case .noPath(let s): "no path to the peer: \(s)"
        case .noRelay(let problem): "no path to the peer: relay-only, but no relay: \(problem)"
        case .ice(let e): "no path to the peer: \(e)"
        case .handshakeFailed(let pair, let e): "no path to the peer: the handshake on \(pair) failed: \(e)"
        case .handshakeMissing(let pair, let e): "no path to the peer: the caller's handshake did not arrive on \(pair): \(e)"
        case .timedOut(let s): "timed out: \(s)"
        case .failed(let s): s
        case .hungUp: "hung up before the call was set up"
        case .badImpairment(let s): s
        }
    }
}

/// Why a call has no relayed candidate.
public enum RelayProblem: Hashable, Sendable, CustomStringConvertible {
    /// The rendezvous handed out no TURN credentials.
    case noCredentials
    /// None of the grant's TURN URIs is one this client speaks (`turn:` with an address).
    case noUsableURI([String])
    /// The last relay tried refused or did not answer; its error is the cause.
    case allocationFailed(TransportAddress, TURNClientConnection.TransportProtocol, ErrorCause)

    public var description: String {
        switch self {
        case .noCredentials: "the rendezvous gave no TURN credentials (tusa relay --static-auth-secret)"
        case .noUsableURI(let uris): "no usable TURN URI among \(uris)"
        case .allocationFailed(let server, let transport, let cause): "\(transport.rawValue) \(server): \(cause)"
        }
    }
}
