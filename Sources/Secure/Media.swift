import CSodium

/// Why a media or control packet was not accepted.
public enum PacketDropReason: String, Sendable, CaseIterable {
    case truncated, malformed, authenticationFailed, replayed, tooOld, wrongEpoch, unknownSession
}

/// An RTP header (RFC 3550), parsed in place.
public struct RTPHeader: Sendable, Equatable {
    public var marker: Bool
    public var payloadType: UInt8
    public var sequenceNumber: UInt16
    public var timestamp: UInt32
    public var ssrc: UInt32
    /// Bytes up to the payload: 12, plus CSRCs, plus the header extension.
    public private(set) var headerLength: Int

    /// A plain 12-byte header (no CSRC, no extension, no padding).
    public init(marker: Bool = false, payloadType: UInt8, sequenceNumber: UInt16, timestamp: UInt32, ssrc: UInt32) {
        self.marker = marker
        self.payloadType = payloadType & 0x7F
        self.sequenceNumber = sequenceNumber
        self.timestamp = timestamp
        self.ssrc = ssrc
        headerLength = 12
    }

    /// Parses the header at the start of `bytes`.
    public static func parse(_ bytes: UnsafeRawBufferPointer) throws(SecureError) -> RTPHeader {
        guard bytes.count >= 12 else { throw .truncated }
        let b0 = bytes[0]
        guard b0 >> 6 == 2 else { throw .malformed("RTP version \(b0 >> 6), not 2") }
        var length = 12 + Int(b0 & 0x0F) * 4
        if b0 & 0x10 != 0 {
            guard bytes.count >= length + 4 else { throw .truncated }
            length += 4 + (Int(bytes[length + 2]) << 8 | Int(bytes[length + 3])) * 4
        }
        guard bytes.count >= length else { throw .truncated }
        var h = RTPHeader(
            marker: bytes[1] & 0x80 != 0, payloadType: bytes[1] & 0x7F,
            sequenceNumber: UInt16(bytes[2]) << 8 | UInt16(bytes[3]),
            timestamp: bytes.loadBE32(4), ssrc: bytes.loadBE32(8))
        h.headerLength = length
        return h
    }

    public static func parse(_ bytes: [UInt8]) throws(SecureError) -> RTPHeader {
        let result = bytes.withUnsafeBytes { raw in Result { () throws(SecureError) in try RTPHeader.parse(raw) } }
        return try result.get()
    }

    /// Writes the plain 12-byte form.
    func write(into out: UnsafeMutableRawBufferPointer) {
        out[0] = 0x80
        out[1] = (marker ? 0x80 : 0) | payloadType
        out[2] = UInt8(sequenceNumber >> 8)
        out[3] = UInt8(truncatingIfNeeded: sequenceNumber)
        out.storeBE32(timestamp, at: 4)
        out.storeBE32(ssrc, at: 8)
    }
}

/// RFC 3711 Appendix A: the 48-bit extended sequence number (rollover counter ‖ sequence number).
public enum ExtendedSequence {
    public static func estimate(_ seq: UInt16, highest: UInt64?) -> UInt64 {
        guard let highest else { return UInt64(seq) }
        let roc = highest >> 16
        let s = UInt64(seq)
        let sL = highest & 0xFFFF
        var v = roc
        if sL < 32_768 {
            if s > sL + 32_768, roc > 0 { v = roc - 1 }
        } else if sL - 32_768 > s {
            v = roc + 1
        }
        return v << 16 | s
    }
}

/// Whether a packet may be opened: a sliding window over the last 2048
/// extended sequence numbers (RFC 6479 style: a ring of 64-bit blocks, so
/// sliding clears whole blocks). `check` before decryption, `accept` only after.
public struct ReplayWindow: Sendable, Equatable {
    public enum Verdict: Sendable, Equatable { case fresh, replayed, tooOld }

    public static let size: UInt64 = 2048
    private static let blocks = 33  // one spare block, so a full window of 2048 always fits
    private var bitmap = [UInt64](repeating: 0, count: ReplayWindow.blocks)
    public private(set) var highest: UInt64?

    public init() {}

    public func check(_ n: UInt64) -> Verdict {
        guard let highest else { return .fresh }
        if n > highest { return .fresh }
        if highest - n >= Self.size { return .tooOld }
        let block = Int((n >> 6) % UInt64(Self.blocks))
        return bitmap[block] & (1 << (n & 63)) != 0 ? .replayed : .fresh
    }

    public mutating func accept(_ n: UInt64) {
        if let h = highest, n > h {
            // Clear the blocks between the old top block and the new one.
            let from = h >> 6, to = n >> 6
            if to - from >= UInt64(Self.blocks) {
                for i in bitmap.indices { bitmap[i] = 0 }
            } else if to > from {
                var b = from + 1
                while b <= to {
                    bitmap[Int(b % UInt64(Self.blocks))] = 0
                    b += 1
                }
            }
            highest = n
        } else if highest == nil {
            highest = n
        }
        let block = Int((n >> 6) % UInt64(Self.blocks))
        bitmap[block] |= 1 << (n & 63)
    }
}

/// Packet protection with one direction's key: RTP media and RTCP-style
/// control, ChaCha20-Poly1305-IETF. `retire()` zeroes the key at once.
public final class MediaCipher {
    private var key: SecretKey?

    public init(key: SecretKey) {
        Sodium.ensureInitialized()
        self.key = key
    }

    public func retire() { key = nil }
    public var isRetired: Bool { key == nil }

    /// The 12-byte nonce (domain, 0, 0, 0, then `n` big-endian), on the stack.
    @inline(__always)
    private func withNonce<R>(domain: UInt8, _ n: UInt64, _ body: (UnsafePointer<UInt8>) -> R) -> R {
        var nonce: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) = (
            domain, 0, 0, 0,
            UInt8(truncatingIfNeeded: n >> 56), UInt8(truncatingIfNeeded: n >> 48), UInt8(truncatingIfNeeded: n >> 40),
            UInt8(truncatingIfNeeded: n >> 32), UInt8(truncatingIfNeeded: n >> 24), UInt8(truncatingIfNeeded: n >> 16),
            UInt8(truncatingIfNeeded: n >> 8), UInt8(truncatingIfNeeded: n)
        )
        return withUnsafeBytes(of: &nonce) { body($0.baseAddress!.assumingMemoryBound(to: UInt8.self)) }
    }

    @inline(__always)
    private func withKey<R>(_ key: SecretKey, _ body: (UnsafePointer<UInt8>) -> R) -> R {
        key.withUnsafeBytes { body($0.baseAddress!.assumingMemoryBound(to: UInt8.self)) }
    }

    /// Seals `payload` as RTP into `out`: header (12) ‖ ciphertext ‖ tag (16). Returns the length.
    public func sealMedia(
        header: RTPHeader, payload: UnsafeRawBufferPointer, extendedSequence: UInt64, into out: UnsafeMutableRawBufferPointer
    ) throws(SecureError) -> Int {
        guard let key else { throw .keyRetired }
        let total = 12 + payload.count + 16
        guard out.count >= total, let o = out.baseAddress else { throw .bufferTooSmall(needed: total, have: out.count) }
        header.write(into: out)
        let p = o.assumingMemoryBound(to: UInt8.self)
        withKey(key) { k in
            withNonce(domain: 0, extendedSequence) { nonce in
                _ = crypto_aead_chacha20poly1305_ietf_encrypt_detached(
                    p + 12, p + 12 + payload.count, nil,
                    payload.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(payload.count),
                    p, 12, nil, nonce, k)
            }
        }
        return total
    }

    /// Opens an RTP packet in place; returns where the plaintext payload lies.
    /// The packet is left untouched when it does not authenticate (so another key can be tried).
    public func openMedia(
        packet: UnsafeMutableRawBufferPointer, headerLength: Int, extendedSequence: UInt64
    ) throws(SecureError) -> Range<Int> {
        guard headerLength >= 12, packet.count >= headerLength + 16, let p = packet.baseAddress else { throw .truncated }
        try open(packet, adLength: headerLength, trailer: 16, domain: 0, n: extendedSequence,
                 ad: UnsafeRawBufferPointer(start: p, count: headerLength))
        return headerLength..<(packet.count - 16)
    }

    /// Verifies the tag over `packet[adLength ..< count-trailer]` with `ad` as
    /// associated data, then decrypts that range in place. On failure the packet
    /// is left as it was (libsodium only verifies when given no output buffer).
    private func open(
        _ packet: UnsafeMutableRawBufferPointer, adLength: Int, trailer: Int, domain: UInt8, n: UInt64, ad: UnsafeRawBufferPointer
    ) throws(SecureError) {
        guard let key else { throw .keyRetired }
        guard packet.count >= adLength + trailer, let p = packet.baseAddress?.assumingMemoryBound(to: UInt8.self) else { throw .truncated }
        let cLength = packet.count - adLength - trailer
        let c = p + adLength
        let mac = p + packet.count - 16
        let ok = withKey(key) { k in
            withNonce(domain: domain, n) { nonce in
                guard crypto_aead_chacha20poly1305_ietf_decrypt_detached(
                    nil, nil, c, UInt64(cLength), mac, ad.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(ad.count), nonce, k) == 0
                else { return false }
                crypto_stream_chacha20_ietf_xor_ic(c, c, UInt64(cLength), nonce, 1, k)
                return true
            }
        }
        guard ok else { throw .authenticationFailed }
    }

    // MARK: control

    /// A control packet's associated data: its 12-byte header and the 4-byte index before the tag.
    private static func controlAD(_ p: UnsafeRawBufferPointer, bodyLength: Int) -> [UInt8] {
        Array(p[0..<12]) + Array(p[(12 + bodyLength)..<(16 + bodyLength)])
    }

    /// Seals a control report: RTCP APP header (V=2, PT 204, length, SSRC, name "TUSA")
    /// ‖ sealed report ‖ E-bit ‖ 31-bit index ‖ tag. AD: the header and the index.
    public func sealControl(_ report: ControlReport, ssrc: UInt32, index: UInt32, into out: UnsafeMutableRawBufferPointer) throws(SecureError) -> Int {
        guard let key else { throw .keyRetired }
        let body = report.encoded()
        let total = 12 + body.count + 4 + 16
        guard out.count >= total, let o = out.baseAddress?.assumingMemoryBound(to: UInt8.self) else {
            throw .bufferTooSmall(needed: total, have: out.count)
        }
        out[0] = 0x80
        out[1] = ControlReport.packetType
        out[2] = UInt8((total / 4 - 1) >> 8)
        out[3] = UInt8(truncatingIfNeeded: total / 4 - 1)
        out.storeBE32(ssrc, at: 4)
        out.storeBE32(ControlReport.name, at: 8)
        out.storeBE32(0x8000_0000 | index & 0x7FFF_FFFF, at: 12 + body.count)
        let ad = Self.controlAD(UnsafeRawBufferPointer(out), bodyLength: body.count)
        withKey(key) { k in
            withNonce(domain: 1, UInt64(index & 0x7FFF_FFFF)) { nonce in
                _ = crypto_aead_chacha20poly1305_ietf_encrypt_detached(
                    o + 12, o + total - 16, nil, body, UInt64(body.count), ad, UInt64(ad.count), nil, nonce, k)
            }
        }
        return total
    }

    /// Opens a control packet in place.
    public func openControl(packet: UnsafeMutableRawBufferPointer) throws(SecureError) -> ControlReport {
        let index = try ControlReport.index(ofSealed: UnsafeRawBufferPointer(packet))
        let ad = Self.controlAD(UnsafeRawBufferPointer(packet), bodyLength: packet.count - 32)
        let opened = ad.withUnsafeBytes { a in
            Result { () throws(SecureError) in try open(packet, adLength: 12, trailer: 20, domain: 1, n: UInt64(index), ad: a) }
        }
        try opened.get()
        return try ControlReport(decoding: UnsafeRawBufferPointer(rebasing: packet[12..<(packet.count - 20)]))
    }
}

/// An encrypted control report (RTCP-style): what the receiver saw, for the
/// sender to adapt (loss, jitter, RTT), or a keepalive, or a bye.
public struct ControlReport: Sendable, Equatable {
    public enum Kind: UInt8, Sendable { case report = 0, keepalive = 1, bye = 2 }

    static let packetType: UInt8 = 204  // RTCP APP
    static let name: UInt32 = 0x5455_5341  // "TUSA"
    static let version: UInt8 = 1
    static let encodedLength = 28
    public static let maximumSealedLength = 12 + encodedLength + 4 + 16

    public var kind: Kind
    /// Fraction of packets lost since the last report, in 1/256 (RFC 3550).
    public var fractionLost: UInt8
    /// The loss rate the sender should prepare for (0–100 %), e.g. for Opus's FEC.
    public var lossHint: UInt8
    public var cumulativeLost: UInt32
    public var highestSequence: UInt64
    /// Interarrival jitter in RTP timestamp units.
    public var jitter: UInt32
    /// The sender's report clock (ms, low 32 bits) of the last report received, and the delay since (ms): RTT.
    public var lastReport: UInt32
    public var delaySinceLastReport: UInt32

    public init(
        kind: Kind = .report, fractionLost: UInt8 = 0, lossHint: UInt8 = 0, cumulativeLost: UInt32 = 0,
        highestSequence: UInt64 = 0, jitter: UInt32 = 0, lastReport: UInt32 = 0, delaySinceLastReport: UInt32 = 0
    ) {
        self.kind = kind
        self.fractionLost = fractionLost
        self.lossHint = min(lossHint, 100)
        self.cumulativeLost = cumulativeLost
        self.highestSequence = highestSequence
        self.jitter = jitter
        self.lastReport = lastReport
        self.delaySinceLastReport = delaySinceLastReport
    }

    public static let keepalive = ControlReport(kind: .keepalive)
    public static let bye = ControlReport(kind: .bye)

    func encoded() -> [UInt8] {
        var b = [UInt8](repeating: 0, count: Self.encodedLength)
        b.withUnsafeMutableBytes { o in
            o[0] = Self.version
            o[1] = kind.rawValue
            o[2] = fractionLost
            o[3] = lossHint
            o.storeBE32(cumulativeLost, at: 4)
            o.storeBE32(UInt32(truncatingIfNeeded: highestSequence >> 32), at: 8)
            o.storeBE32(UInt32(truncatingIfNeeded: highestSequence), at: 12)
            o.storeBE32(jitter, at: 16)
            o.storeBE32(lastReport, at: 20)
            o.storeBE32(delaySinceLastReport, at: 24)
        }
        return b
    }

    init(decoding b: UnsafeRawBufferPointer) throws(SecureError) {
        guard b.count == Self.encodedLength else { throw .malformed("control report of \(b.count) bytes") }
        guard b[0] == Self.version else { throw .malformed("control report version \(b[0])") }
        guard let kind = Kind(rawValue: b[1]) else { throw .malformed("control report kind \(b[1])") }
        self.init(
            kind: kind, fractionLost: b[2], lossHint: b[3], cumulativeLost: b.loadBE32(4),
            highestSequence: UInt64(b.loadBE32(8)) << 32 | UInt64(b.loadBE32(12)),
            jitter: b.loadBE32(16), lastReport: b.loadBE32(20), delaySinceLastReport: b.loadBE32(24))
    }

    /// The 31-bit index of a sealed control packet (checked against the replay window before opening).
    public static func index(ofSealed p: UnsafeRawBufferPointer) throws(SecureError) -> UInt32 {
        guard p.count >= 12 + 4 + 16 else { throw .truncated }
        guard p[0] >> 6 == 2, p[1] == packetType, p.loadBE32(8) == name else { throw .malformed("not a Tusa control packet") }
        let words = Int(p[2]) << 8 | Int(p[3])
        guard (words + 1) * 4 == p.count else { throw .malformed("RTCP length \(words) for \(p.count) bytes") }
        let e = p.loadBE32(p.count - 20)
        guard e & 0x8000_0000 != 0 else { throw .malformed("control packet not encrypted (E bit clear)") }
        return e & 0x7FFF_FFFF
    }
}

extension UnsafeRawBufferPointer {
    @inline(__always) func loadBE32(_ i: Int) -> UInt32 {
        UInt32(self[i]) << 24 | UInt32(self[i + 1]) << 16 | UInt32(self[i + 2]) << 8 | UInt32(self[i + 3])
    }
}

extension UnsafeMutableRawBufferPointer {
    @inline(__always) func storeBE32(_ v: UInt32, at i: Int) {
        self[i] = UInt8(truncatingIfNeeded: v >> 24)
        self[i + 1] = UInt8(truncatingIfNeeded: v >> 16)
        self[i + 2] = UInt8(truncatingIfNeeded: v >> 8)
        self[i + 3] = UInt8(truncatingIfNeeded: v)
    }
}
