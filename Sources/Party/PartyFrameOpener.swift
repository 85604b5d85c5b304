import Secure
import TusaBase

/// Opens captured voice frames with the sender keys a member's key log holds
/// (`tusa interop decrypt`): each frame under the logged key with its KID, or
/// a later ratchet step of a logged key of the same member and epoch (up to
/// ``PartyKeyring/maxSkip`` steps on). No replay window: a capture is read, not played.
public struct PartyFrameOpener: Sendable {
    public enum Outcome: Sendable {
        case opened(PartyFrameHeader, audio: [UInt8])
        /// No logged key opens this KID (another member's log, or from before the log began).
        case noKey(SenderKeyID?)
        /// A key for the KID is logged but the frame does not open under it.
        case failed(PartyFrameHeader?, FrameOpenError)
        /// Not a voice frame (a control message or acknowledgement).
        case notAFrame
    }

    private var keys: [UInt64: SenderKey] = [:]

    public init(keys: [(kid: UInt64, base: SecretKey)]) {
        for (kid, base) in keys {
            guard let id = SenderKeyID(kid: kid) else { continue }
            self.keys[kid] = SenderKey(id: id, base: base)
        }
    }

    public var isEmpty: Bool { keys.isEmpty }

    public func open(_ bytes: [UInt8]) -> Outcome {
        guard bytes.first == PartyPacketType.media.rawValue else { return .notAFrame }
        let header: PartyFrameHeader
        do { header = try PartyFrameHeader.decode(bytes) } catch { return .failed(nil, .malformed(error)) }
        guard let id = SenderKeyID(kid: header.sframe.keyID) else { return .noKey(nil) }
        guard id.member == header.sender else { return .failed(header, .senderMismatch) }
        guard let key = key(for: id) else { return .noKey(id) }
        do { return .opened(header, audio: try PartyFrame.open(bytes, header: header, key: key)) } catch {
            return .failed(header, error)
        }
    }

    private func key(for id: SenderKeyID) -> SenderKey? {
        if let exact = keys[id.kid] { return exact }
        var best: SenderKey?
        for k in keys.values
        where k.id.member == id.member && k.id.epoch == id.epoch && k.id.step < id.step
            && id.step - k.id.step <= PartyKeyring.maxSkip && k.id.step >= (best?.id.step ?? 0)
        {
            best = k
        }
        guard var k = best else { return nil }
        while k.id.step < id.step { k = k.ratcheted() }
        return k
    }
}
