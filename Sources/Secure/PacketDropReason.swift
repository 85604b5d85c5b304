/// Why an inbound packet was dropped: one label per metric, never a crash.
/// The session itself uses `wrongEpoch` (including a retired key) and
/// `unknownSession`.
public enum PacketDropReason: String, Error, Sendable, CaseIterable {
    case truncated, malformed, authenticationFailed, replayed, tooOld, wrongEpoch, unknownSession

    init(_ error: SecureError) {
        switch error {
        case .truncated, .bufferTooSmall: self = .truncated
        case .authenticationFailed, .weakPublicKey: self = .authenticationFailed
        case .keyRetired: self = .wrongEpoch
        case .invalidKeyLength, .malformed, .handshakeState, .nonceExhausted, .unsupportedVersion: self = .malformed
        }
    }

    init(_ verdict: ReplayVerdict) {
        self = verdict == .tooOld ? .tooOld : .replayed
    }
}
