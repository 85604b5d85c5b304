import CSodium

/// One direction's packet key for media (RTP) and control (RTCP-style)
/// packets: ChaCha20-Poly1305-IETF, the whole packet header as associated
/// data, nonce = domain ‖ 0 0 0 ‖ 64-bit big-endian index (domain 0x00 for
/// media with the extended sequence number, 0x01 for control with the
/// control index), so nonces never repeat under one key.
///
/// Holds its own copy of the key; `retire()` zeroes it at once and every
/// later call throws `.keyRetired`. No allocation per packet. One owner
/// (not Sendable): build one per session direction and epoch.
public final class MediaCipher {
    public static let tagLength = AEAD.tagLength
    static let mediaDomain: UInt8 = 0x00
    static let controlDomain: UInt8 = 0x01

    /// The key's own 32 bytes, pointed to from here rather than through a `SecureBytes`
    /// object: a party relay seals each copy of a frame under another member's key, and
    /// every object between the session and the key bytes is one more cache miss per copy.
    private let key: UnsafeMutableRawPointer
    public private(set) var isRetired = false

    public init(key: SecretKey) {
        Sodium.ensureInitialized()
        self.key = UnsafeMutableRawPointer.allocate(byteCount: SecretKey.length, alignment: 16)
        key.withUnsafeBytes { self.key.copyMemory(from: $0.basePointer, byteCount: SecretKey.length) }
    }

    deinit {
        sodium_memzero(key, SecretKey.length)
        key.deallocate()
    }

    /// Zeroes the key now; later seals and opens throw `.keyRetired`.
    public func retire() {
        sodium_memzero(key, SecretKey.length)
        isRetired = true
    }

    @inline(__always)
    func withNonce<R>(domain: UInt8, index: UInt64, _ body: (UnsafeRawPointer) throws -> R) rethrows -> R {
        try withUnsafeTemporaryAllocation(byteCount: AEAD.nonceLength, alignment: 4) { n in
            n.storeBytes(of: UInt32(domain).bigEndian, toByteOffset: 0, as: UInt32.self)
            n.storeBytes(of: index.bigEndian, toByteOffset: 4, as: UInt64.self)
            return try body(UnsafeRawPointer(n.baseAddress!))
        }
    }

    /// Encrypts `plaintext` to `ciphertext` (the same memory or disjoint)
    /// and writes the tag to `tag`.
    @inline(__always)
    func seal(
        domain: UInt8, index: UInt64, ad: UnsafeRawBufferPointer, plaintext: UnsafeRawBufferPointer,
        ciphertext: UnsafeMutableRawPointer, tag: UnsafeMutableRawPointer
    ) throws {
        guard !isRetired else { throw SecureError.keyRetired }
        withNonce(domain: domain, index: index) { nonce in
            AEADConstruction.chaCha20Poly1305IETF.sealDetached(
                key: UnsafeRawPointer(key), nonce: nonce, ad: ad, plaintext: plaintext,
                ciphertext: ciphertext, tag: tag)
        }
    }

    /// Checks the tag after `ciphertext` and decrypts to `plaintext` (the
    /// ciphertext's own memory for in place, which libsodium zeroes on
    /// failure), or only checks when `plaintext` is nil.
    @inline(__always)
    func open(
        domain: UInt8, index: UInt64, ad: UnsafeRawBufferPointer,
        ciphertext: UnsafeRawBufferPointer, tag: UnsafeRawPointer,
        plaintext: UnsafeMutableRawPointer?
    ) throws {
        guard !isRetired else { throw SecureError.keyRetired }
        let ok = withNonce(domain: domain, index: index) { nonce in
            AEADConstruction.chaCha20Poly1305IETF.openDetached(
                key: UnsafeRawPointer(key), nonce: nonce, ad: ad, ciphertext: ciphertext, tag: tag, plaintext: plaintext)
        }
        guard ok else { throw SecureError.authenticationFailed }
    }

    // MARK: Media

    /// Writes `header` (plain 12 bytes) ‖ ciphertext ‖ tag into `out`;
    /// returns 12 + payload + 16. `payload` may already sit at `out[12...]`
    /// (sealed in place) but must not otherwise overlap `out`.
    /// `extendedSequence` must end in `header.sequenceNumber`.
    public func sealMedia(
        header: RTPHeader, payload: UnsafeRawBufferPointer, extendedSequence: UInt64,
        into out: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        let needed = RTPHeader.fixedLength + payload.count + Self.tagLength
        guard out.count >= needed else { throw SecureError.bufferTooSmall(needed: needed, have: out.count) }
        guard UInt16(truncatingIfNeeded: extendedSequence) == header.sequenceNumber else {
            throw SecureError.malformed("extended sequence does not end in the header's sequence number")
        }
        let headerLength = try header.write(into: out)
        try seal(
            domain: Self.mediaDomain, index: extendedSequence,
            ad: UnsafeRawBufferPointer(rebasing: out[..<headerLength]), plaintext: payload,
            ciphertext: out.basePointer + headerLength, tag: out.basePointer + headerLength + payload.count)
        return needed
    }

    /// As above with a header already on the wire in `out[..<headerLength]`
    /// (CSRCs or an extension included): only the payload is written.
    public func sealMedia(
        headerLength: Int, payload: UnsafeRawBufferPointer, extendedSequence: UInt64,
        into out: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        let needed = headerLength + payload.count + Self.tagLength
        guard out.count >= needed else { throw SecureError.bufferTooSmall(needed: needed, have: out.count) }
        let header = try RTPHeader.parse(UnsafeRawBufferPointer(rebasing: out[..<headerLength]))
        guard header.headerLength == headerLength else { throw SecureError.malformed("RTP header length mismatch") }
        guard UInt16(truncatingIfNeeded: extendedSequence) == header.sequenceNumber else {
            throw SecureError.malformed("extended sequence does not end in the header's sequence number")
        }
        try seal(
            domain: Self.mediaDomain, index: extendedSequence,
            ad: UnsafeRawBufferPointer(rebasing: out[..<headerLength]), plaintext: payload,
            ciphertext: out.basePointer + headerLength, tag: out.basePointer + headerLength + payload.count)
        return needed
    }

    /// Authenticates header ‖ ciphertext ‖ tag and decrypts the payload in
    /// place; returns where the plaintext payload is. On failure libsodium
    /// zeroes the payload bytes: to try a second key, check with
    /// `authenticatesMedia` first (or let `MediaReceiver` do it).
    public func openMedia(
        packet: UnsafeMutableRawBufferPointer, headerLength: Int,
        extendedSequence: UInt64
    ) throws -> Range<Int> {
        let body = try Self.mediaBody(UnsafeRawBufferPointer(packet), headerLength: headerLength)
        try open(
            domain: Self.mediaDomain, index: extendedSequence,
            ad: UnsafeRawBufferPointer(rebasing: packet[..<headerLength]),
            ciphertext: UnsafeRawBufferPointer(rebasing: packet[body]),
            tag: UnsafeRawPointer(packet.basePointer + body.upperBound),
            plaintext: packet.basePointer + headerLength)
        return body
    }

    /// Decrypts the payload into `out` (the packet is not written); returns
    /// the payload length.
    public func openMedia(
        packet: UnsafeRawBufferPointer, headerLength: Int, extendedSequence: UInt64,
        into out: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        let body = try Self.mediaBody(packet, headerLength: headerLength)
        guard out.count >= body.count else { throw SecureError.bufferTooSmall(needed: body.count, have: out.count) }
        try open(
            domain: Self.mediaDomain, index: extendedSequence,
            ad: UnsafeRawBufferPointer(rebasing: packet[..<headerLength]),
            ciphertext: UnsafeRawBufferPointer(rebasing: packet[body]),
            tag: packet.basePointer + body.upperBound, plaintext: out.basePointer)
        return body.count
    }

    /// Whether the packet authenticates under this key; writes nothing.
    /// Throws only for a truncated packet or a retired key.
    public func authenticatesMedia(
        packet: UnsafeRawBufferPointer, headerLength: Int,
        extendedSequence: UInt64
    ) throws -> Bool {
        let body = try Self.mediaBody(packet, headerLength: headerLength)
        do {
            try open(
                domain: Self.mediaDomain, index: extendedSequence,
                ad: UnsafeRawBufferPointer(rebasing: packet[..<headerLength]),
                ciphertext: UnsafeRawBufferPointer(rebasing: packet[body]),
                tag: packet.basePointer + body.upperBound, plaintext: nil)
            return true
        } catch SecureError.authenticationFailed {
            return false
        }
    }

    /// Opens a media packet in place if this key authenticates it; nil, the
    /// packet untouched, if it does not. `verifyFirst` checks the tag without
    /// writing before decrypting: needed whenever another key may still be
    /// tried, since a failed in-place open zeroes the payload. A retired key
    /// authenticates nothing (nil). Throws only for a packet too short to hold a tag.
    public func openMediaIfAuthentic(
        packet: UnsafeMutableRawBufferPointer, headerLength: Int,
        extendedSequence: UInt64, verifyFirst: Bool
    ) throws -> Range<Int>? {
        if isRetired { return nil }
        if verifyFirst,
            try !authenticatesMedia(
                packet: UnsafeRawBufferPointer(packet), headerLength: headerLength,
                extendedSequence: extendedSequence)
        {
            return nil
        }
        do {
            return try openMedia(packet: packet, headerLength: headerLength, extendedSequence: extendedSequence)
        } catch SecureError.authenticationFailed {
            return nil
        }
    }

    /// The ciphertext range of a media packet, between header and tag.
    private static func mediaBody(_ packet: UnsafeRawBufferPointer, headerLength: Int) throws -> Range<Int> {
        guard headerLength >= RTPHeader.fixedLength, packet.count >= headerLength + tagLength else {
            throw SecureError.truncated
        }
        return headerLength..<(packet.count - tagLength)
    }

    /// Convenience for tests and tools (allocates).
    public func sealMedia(header: RTPHeader, payload: [UInt8], extendedSequence: UInt64) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: RTPHeader.fixedLength + payload.count + Self.tagLength)
        _ = try payload.withUnsafeBytes { p in
            try out.withUnsafeMutableBytes {
                try sealMedia(header: header, payload: p, extendedSequence: extendedSequence, into: $0)
            }
        }
        return out
    }

    /// Convenience for tests and tools (allocates): the plaintext payload.
    public func openMedia(_ packet: [UInt8], extendedSequence: UInt64) throws -> [UInt8] {
        var copy = packet
        let range = try copy.withUnsafeMutableBytes { p in
            let header = try RTPHeader.parse(UnsafeRawBufferPointer(p))
            return try openMedia(packet: p, headerLength: header.headerLength, extendedSequence: extendedSequence)
        }
        return Array(copy[range])
    }
}
