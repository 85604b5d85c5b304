/// An inbound media packet that parsed and passed the replay check, not yet
/// authenticated.
public struct InboundMedia: Sendable, Equatable {
    public let header: RTPHeader
    public let extendedSequence: UInt64
}

/// An authenticated, decrypted media packet: the payload is `packet[payload]`.
public struct ReceivedMedia: Sendable, Equatable {
    public let header: RTPHeader
    public let extendedSequence: UInt64
    public let payload: Range<Int>
    /// True when the fallback key (not the first one offered) opened it.
    public let openedWithFallback: Bool
}

/// The receive path of one media stream: parse → estimate the extended
/// sequence → replay check → open with the cipher the caller picks → accept.
/// The key choice stays with the session: during a rekey overlap it passes
/// both keys (`orElse:`); the first is tried without writing (a verify-only
/// pass, as a failed in-place open zeroes the payload), the second only if
/// the first does not authenticate. No allocation per packet.
public struct MediaReceiver: Sendable {
    public private(set) var window = ReplayWindow()

    public init() {}

    /// The highest extended sequence number accepted so far.
    public var highestExtendedSequence: UInt64? { window.highest }

    /// Parses the header and checks the replay window (no crypto).
    public func inspect(_ packet: UnsafeRawBufferPointer) -> Result<InboundMedia, PacketDropReason> {
        let header: RTPHeader
        do { header = try RTPHeader.parse(packet) } catch let e as SecureError { return .failure(PacketDropReason(e)) } catch {
            return .failure(.malformed)
        }
        guard packet.count >= header.headerLength + MediaCipher.tagLength else { return .failure(.truncated) }
        let ext = ExtendedSequence.estimate(header.sequenceNumber, highest: window.highest)
        let verdict = window.check(ext)
        guard verdict == .fresh else { return .failure(PacketDropReason(verdict)) }
        return .success(InboundMedia(header: header, extendedSequence: ext))
    }

    /// Opens an inspected packet in place with `cipher` (or `fallback` when
    /// `cipher` does not authenticate it); accepts its index in the window
    /// only when it authenticates.
    public mutating func open(
        _ packet: UnsafeMutableRawBufferPointer, _ inbound: InboundMedia,
        with cipher: MediaCipher, orElse fallback: MediaCipher? = nil
    )
        -> Result<ReceivedMedia, PacketDropReason>
    {
        let headerLength = inbound.header.headerLength
        let ext = inbound.extendedSequence
        func attempt(_ c: MediaCipher, verifyFirst: Bool) throws -> Range<Int>? {
            try c.openMediaIfAuthentic(
                packet: packet, headerLength: headerLength, extendedSequence: ext, verifyFirst: verifyFirst)
        }
        do {
            var tried = cipher
            var payload = try attempt(cipher, verifyFirst: fallback != nil)
            if payload == nil, let fallback {
                tried = fallback
                payload = try attempt(fallback, verifyFirst: false)
            }
            guard let payload else { return .failure(tried.isRetired ? .wrongEpoch : .authenticationFailed) }
            let usedFallback = tried !== cipher
            window.accept(ext)
            return .success(
                ReceivedMedia(
                    header: inbound.header, extendedSequence: ext, payload: payload,
                    openedWithFallback: usedFallback))
        } catch let e as SecureError {
            return .failure(PacketDropReason(e))
        } catch {
            return .failure(.malformed)
        }
    }

    /// `inspect` then `open` with one cipher.
    public mutating func receive(
        _ packet: UnsafeMutableRawBufferPointer, with cipher: MediaCipher,
        orElse fallback: MediaCipher? = nil
    ) -> Result<ReceivedMedia, PacketDropReason> {
        switch inspect(UnsafeRawBufferPointer(packet)) {
        case .failure(let reason): .failure(reason)
        case .success(let inbound): open(packet, inbound, with: cipher, orElse: fallback)
        }
    }

    /// Convenience for tests (allocates): the header and plaintext payload.
    public mutating func receive(_ packet: [UInt8], with cipher: MediaCipher, orElse fallback: MediaCipher? = nil)
        -> Result<(header: RTPHeader, payload: [UInt8]), PacketDropReason>
    {
        var copy = packet
        return copy.withUnsafeMutableBytes { p in
            receive(p, with: cipher, orElse: fallback).map { (header: $0.header, payload: Array(p[$0.payload])) }
        }
    }
}
