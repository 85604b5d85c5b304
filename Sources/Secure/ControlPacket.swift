/// The wire form of an encrypted control packet, an RTCP APP packet (RFC 3550
/// 6.7) protected SRTCP-style:
///
///     0x80 (V=2, P=0, subtype 0) ‖ 204 (APP) ‖ length ‖ sender SSRC ‖ "TUSA"
///     ‖ ciphertext of the ControlReport (36) ‖ E=1 ‖ 31-bit index ‖ tag (16)
///
/// A packet four bytes shorter carries a version-1 report (32 bytes, no burst
/// length): it is read too.
///
/// `length` counts the RTCP part (header to ciphertext) in 32-bit words − 1,
/// as RFC 3550; the index and tag trail it as in SRTCP (RFC 3711 3.4).
/// AD = the 12 bytes before the ciphertext ‖ the 4 index bytes; nonce =
/// 0x01 0 0 0 ‖ 64-bit big-endian index. The first byte is 128–191, so the
/// packet demultiplexes as RTP/RTCP (RFC 7983), and PT 204 as RTCP (RFC 5761).
public enum ControlPacket {
    public static let payloadType: UInt8 = 204
    public static let name: [UInt8] = Array("TUSA".utf8)
    public static let prefixLength = 12
    public static let length = prefixLength + ControlReport.encodedLength + 4 + AEAD.tagLength
    /// Indices are 31 bits; the E bit is always set.
    public static let maxIndex: UInt32 = 0x7FFF_FFFF
    /// A version-1 packet's length (its report is four bytes shorter).
    static let versionOneLength = length - (ControlReport.encodedLength - ControlReport.versionOneLength)

    /// The encrypted report's length in a control packet of `count` bytes (nil: no such packet).
    static func reportLength(packet count: Int) -> Int? {
        switch count {
        case length: ControlReport.encodedLength
        case versionOneLength: ControlReport.versionOneLength
        default: nil
        }
    }

    /// Sender SSRC and index of a control packet, read without decrypting
    /// (for the replay check); `.truncated`/`.malformed` on anything else.
    public static func peek(_ packet: UnsafeRawBufferPointer) throws -> (ssrc: UInt32, index: UInt32) {
        guard packet.count >= versionOneLength else { throw SecureError.truncated }
        guard let report = reportLength(packet: packet.count) else {
            throw SecureError.malformed("control packet of \(packet.count) bytes")
        }
        guard packet[0] == 0x80, packet[1] == payloadType, packet.loadBigEndianUInt16(at: 2) == (prefixLength + report) / 4 - 1,
            packet[8] == name[0], packet[9] == name[1], packet[10] == name[2], packet[11] == name[3]
        else { throw SecureError.malformed("not a Tusa control packet") }
        let e = packet.loadBigEndianUInt32(at: prefixLength + report)
        guard e & 0x8000_0000 != 0 else { throw SecureError.malformed("control packet without the E bit") }
        return (packet.loadBigEndianUInt32(at: 4), e & maxIndex)
    }
}

/// Which of our packet kinds a datagram's first bytes look like.
public enum SecurePacketKind: Sendable, Equatable {
    case media, control, other

    /// RFC 7983: first byte 128–191 is RTP/RTCP; RFC 5761: second byte 204
    /// (our APP type) is RTCP. Anything else (STUN, handshake, …) is `other`.
    public static func classify(_ bytes: UnsafeRawBufferPointer) -> SecurePacketKind {
        guard bytes.count >= 2, (128...191).contains(bytes[0]) else { return .other }
        return bytes[1] == ControlPacket.payloadType ? .control : .media
    }
}

extension MediaCipher {
    /// Seals `report` as a control packet (`ControlPacket.length` = 68 bytes; 64 for a version-1 report)
    /// into `out`; returns its length. `index` must be ≤ 2^31 − 1 and never
    /// repeat under this key.
    public func sealControl(
        _ report: ControlReport, ssrc: UInt32, index: UInt32,
        into out: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        guard index <= ControlPacket.maxIndex else { throw SecureError.nonceExhausted }
        let total = ControlPacket.length - ControlReport.encodedLength + report.encodedLength
        guard out.count >= total else { throw SecureError.bufferTooSmall(needed: total, have: out.count) }
        let body = ControlPacket.prefixLength
        let trailer = body + report.encodedLength
        out[0] = 0x80
        out[1] = ControlPacket.payloadType
        out.storeBigEndian(UInt16((body + report.encodedLength) / 4 - 1), at: 2)
        out.storeBigEndian(ssrc, at: 4)
        for (i, b) in ControlPacket.name.enumerated() { out[8 + i] = b }
        _ = try report.encode(into: UnsafeMutableRawBufferPointer(rebasing: out[body..<trailer]))
        out.storeBigEndian(index | 0x8000_0000, at: trailer)
        try withControlAD(out, trailer: trailer) { ad in
            try seal(
                domain: Self.controlDomain, index: UInt64(index), ad: ad,
                plaintext: UnsafeRawBufferPointer(rebasing: out[body..<trailer]),
                ciphertext: out.basePointer + body, tag: out.basePointer + trailer + 4)
        }
        return total
    }

    /// Authenticates a control packet and decrypts it in place.
    public func openControl(packet: UnsafeMutableRawBufferPointer) throws -> ReceivedControl {
        let (ssrc, index) = try decryptControl(packet: packet)
        return ReceivedControl(ssrc: ssrc, index: index, report: try Self.decodeControlBody(packet))
    }

    /// Authentication and decryption only; the report is left at bytes 12..<48 (12..<44 for version 1).
    /// `verifyOnly`: check the tag and write nothing.
    func decryptControl(packet: UnsafeMutableRawBufferPointer, verifyOnly: Bool = false) throws -> (ssrc: UInt32, index: UInt32) {
        let (ssrc, index) = try ControlPacket.peek(UnsafeRawBufferPointer(packet))
        let body = ControlPacket.prefixLength
        let trailer = body + (ControlPacket.reportLength(packet: packet.count) ?? ControlReport.encodedLength)
        try withControlAD(packet, trailer: trailer) { ad in
            try open(
                domain: Self.controlDomain, index: UInt64(index), ad: ad,
                ciphertext: UnsafeRawBufferPointer(rebasing: packet[body..<trailer]),
                tag: UnsafeRawPointer(packet.basePointer + trailer + 4),
                plaintext: verifyOnly ? nil : packet.basePointer + body)
        }
        return (ssrc, index)
    }

    /// Decrypts a control packet in place if this key authenticates it; nil,
    /// the packet untouched, if it does not (`verifyFirst`: as for
    /// `openMediaIfAuthentic`; a retired key authenticates nothing). Throws for
    /// a packet that is not a control packet.
    func decryptControlIfAuthentic(packet: UnsafeMutableRawBufferPointer, verifyFirst: Bool) throws -> (
        ssrc: UInt32, index: UInt32
    )? {
        if isRetired { return nil }
        do {
            if verifyFirst { _ = try decryptControl(packet: packet, verifyOnly: true) }
            return try decryptControl(packet: packet)
        } catch SecureError.authenticationFailed {
            return nil
        }
    }

    static func decodeControlBody(_ packet: UnsafeMutableRawBufferPointer) throws -> ControlReport {
        let body = ControlPacket.prefixLength
        let report = ControlPacket.reportLength(packet: packet.count) ?? ControlReport.encodedLength
        guard packet.count >= body + report else { throw SecureError.truncated }
        return try ControlReport.decode(UnsafeRawBufferPointer(rebasing: packet[body..<body + report]))
    }

    /// Convenience (allocates).
    public func sealControl(_ report: ControlReport, ssrc: UInt32, index: UInt32) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: ControlPacket.length)
        let n = try out.withUnsafeMutableBytes { try sealControl(report, ssrc: ssrc, index: index, into: $0) }
        return Array(out.prefix(n))
    }

    /// Convenience (copies the packet).
    public func openControl(_ packet: [UInt8]) throws -> ReceivedControl {
        var copy = packet
        return try copy.withUnsafeMutableBytes { try openControl(packet: $0) }
    }

    /// The AD of a control packet: its 12-byte prefix ‖ the E‖index word,
    /// gathered on the stack.
    private func withControlAD<R>(
        _ packet: UnsafeMutableRawBufferPointer, trailer: Int,
        _ body: (UnsafeRawBufferPointer) throws -> R
    ) rethrows -> R {
        try withUnsafeTemporaryAllocation(byteCount: ControlPacket.prefixLength + 4, alignment: 4) { ad in
            ad.copyMemory(from: UnsafeRawBufferPointer(rebasing: packet[..<ControlPacket.prefixLength]))
            for i in 0..<4 { ad[ControlPacket.prefixLength + i] = packet[trailer + i] }
            return try body(UnsafeRawBufferPointer(ad))
        }
    }
}

/// An authenticated control packet.
public struct ReceivedControl: Sendable, Equatable {
    public let ssrc: UInt32
    public let index: UInt32
    public let report: ControlReport
}

/// The receive path of control packets: peek → replay check on the index
/// (its own 2048 window) → open with the caller's cipher (or the first of
/// two that authenticates, during a rekey overlap) → accept.
public struct ControlReceiver: Sendable {
    public private(set) var window = ReplayWindow()

    public init() {}

    public mutating func receive(
        _ packet: UnsafeMutableRawBufferPointer, with cipher: MediaCipher,
        orElse fallback: MediaCipher? = nil
    ) -> Result<ReceivedControl, PacketDropReason> {
        let index: UInt32
        let ssrc: UInt32
        do {
            (ssrc, index) = try ControlPacket.peek(UnsafeRawBufferPointer(packet))
            let verdict = window.check(UInt64(index))
            guard verdict == .fresh else { return .failure(PacketDropReason(verdict)) }
            var tried = cipher
            var opened = try cipher.decryptControlIfAuthentic(packet: packet, verifyFirst: fallback != nil) != nil
            if !opened, let fallback {
                tried = fallback
                opened = try fallback.decryptControlIfAuthentic(packet: packet, verifyFirst: false) != nil
            }
            guard opened else { return .failure(tried.isRetired ? .wrongEpoch : .authenticationFailed) }
        } catch let e as SecureError {
            return .failure(PacketDropReason(e))
        } catch {
            return .failure(.malformed)
        }
        // Authentic: the index is spent even if the body does not decode.
        window.accept(UInt64(index))
        guard let report = try? MediaCipher.decodeControlBody(packet) else { return .failure(.malformed) }
        return .success(ReceivedControl(ssrc: ssrc, index: index, report: report))
    }

    public mutating func receive(
        _ packet: [UInt8], with cipher: MediaCipher,
        orElse fallback: MediaCipher? = nil
    ) -> Result<ReceivedControl, PacketDropReason> {
        var copy = packet
        return copy.withUnsafeMutableBytes { receive($0, with: cipher, orElse: fallback) }
    }
}
