/// Opens captured media and control packets with keys from a key log (for
/// `tusa interop decrypt`). Per SSRC it tracks the extended sequence number
/// and tries the logged keys, the last one that worked first.
public final class MediaDecryptor {
    public enum Result: Equatable, Sendable {
        case media(RTPHeader, payload: Range<Int>)
        case control(ssrc: UInt32, ControlReport)
        /// RTP/RTCP whose SSRC has no key in the log.
        case noKey(ssrc: UInt32)
        /// No logged key opens it.
        case failed(ssrc: UInt32)
        /// Not an RTP/RTCP packet.
        case notRTP
    }

    private var streams: [UInt32: Stream] = [:]

    private final class Stream {
        let ciphers: [MediaCipher]
        var preferred = 0
        var highest: UInt64?
        init(keys: [SecretKey]) { ciphers = keys.map { MediaCipher(key: $0) } }
    }

    public init(keys: [UInt32: [SecretKey]]) {
        for (ssrc, list) in keys { streams[ssrc] = Stream(keys: list) }
    }

    /// Decrypts `packet` in place; on `.media` the plaintext payload is at `payload`.
    public func open(_ packet: inout [UInt8]) -> Result {
        guard packet.count >= 8, (128...191).contains(packet[0]) else { return .notRTP }
        let ssrc = UInt32(packet[4]) << 24 | UInt32(packet[5]) << 16 | UInt32(packet[6]) << 8 | UInt32(packet[7])
        if packet.withUnsafeBytes({ SecurePacketKind.classify($0) }) == .control {
            guard let s = streams[ssrc] else { return .noKey(ssrc: ssrc) }
            let candidates = order(s)
            for (n, i) in candidates.enumerated() {
                let report = packet.withUnsafeMutableBytes { p -> ControlReport? in
                    guard (try? s.ciphers[i].decryptControlIfAuthentic(packet: p, verifyFirst: n < candidates.count - 1)) != nil
                    else { return nil }
                    return try? MediaCipher.decodeControlBody(p)
                }
                if let report {
                    s.preferred = i
                    return .control(ssrc: ssrc, report)
                }
            }
            return .failed(ssrc: ssrc)
        }
        let header: RTPHeader
        do { header = try packet.withUnsafeBytes { try RTPHeader.parse($0) } } catch { return .notRTP }
        guard let s = streams[header.ssrc] else { return .noKey(ssrc: header.ssrc) }
        let ext = ExtendedSequence.estimate(header.sequenceNumber, highest: s.highest)
        let candidates = order(s)
        for (n, i) in candidates.enumerated() {
            if let range = try? packet.withUnsafeMutableBytes({
                try s.ciphers[i].openMediaIfAuthentic(
                    packet: $0, headerLength: header.headerLength, extendedSequence: ext, verifyFirst: n < candidates.count - 1)
            }) {
                s.preferred = i
                if s.highest.map({ ext > $0 }) ?? true { s.highest = ext }
                return .media(header, payload: range)
            }
        }
        return .failed(ssrc: header.ssrc)
    }

    private func order(_ s: Stream) -> [Int] {
        [s.preferred] + s.ciphers.indices.filter { $0 != s.preferred }
    }
}
