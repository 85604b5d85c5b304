import CZlib
import TusaBase

/// The STUN Binding service (RFC 8489 §6.3, RFC 5780 §6) as a stateless,
/// allocation-free core: one request in, at most one response out.
///
/// The driver hands it the datagram, the source address and which of the
/// server's addresses it arrived on; the core writes the response into a buffer
/// the driver owns and says where to send it and from which server address.
public struct BindingServer: Sendable {
    /// One of the up to four addresses of an RFC 5780 server: the primary IP
    /// or the alternate, the primary port or the alternate.
    public struct Origin: Hashable, Sendable, CustomStringConvertible {
        public var alternateIP: Bool
        public var alternatePort: Bool

        public init(alternateIP: Bool, alternatePort: Bool) {
            self.alternateIP = alternateIP
            self.alternatePort = alternatePort
        }

        public static let primary = Origin(alternateIP: false, alternatePort: false)
        /// All four combinations, primary first.
        public static let all: [Origin] = [
            .primary, Origin(alternateIP: false, alternatePort: true),
            Origin(alternateIP: true, alternatePort: false), Origin(alternateIP: true, alternatePort: true),
        ]

        public var description: String {
            "\(alternateIP ? "alternate" : "primary") IP, \(alternatePort ? "alternate" : "primary") port"
        }
    }

    public struct Configuration: Hashable, Sendable {
        /// The primary address (needed for RESPONSE-ORIGIN and OTHER-ADDRESS).
        public var primary: TransportAddress?
        /// The alternate IP and port for RFC 5780 behaviour discovery; without
        /// it CHANGE-REQUEST is answered with 420.
        public var alternate: TransportAddress?
        /// A SOFTWARE attribute for responses (none by default: smaller answers).
        public var software: String?

        public init(primary: TransportAddress? = nil, alternate: TransportAddress? = nil, software: String? = nil) {
            self.primary = primary
            self.alternate = alternate
            self.software = software
        }
    }

    /// Why a datagram got no answer.
    public enum DropReason: String, Hashable, Sendable, CaseIterable {
        case notSTUN = "not-stun"
        case malformed
        case classicSTUN = "classic-stun"
        case notRequest = "not-request"
        case badFingerprint = "bad-fingerprint"
        case noRoom = "no-room"
        /// Longer than ``BindingServer/largestRequest``: never parsed.
        case tooLarge = "too-large"
    }

    /// The longest datagram taken as a request: a Binding request with a
    /// full-MTU PADDING (RFC 5780) fits many times over. A driver whose
    /// receive buffers are fixed reads at least one byte more than this, so
    /// that a longer datagram shows as too large (``DropReason/tooLarge``)
    /// rather than cut short and counted as malformed.
    public static let largestRequest = 2048

    public enum Outcome: Hashable, Sendable {
        /// Send `length` bytes of the output buffer to `destination` from the
        /// server address `origin`.
        case reply(length: Int, destination: TransportAddress, origin: Origin)
        case drop(DropReason)
    }

    public let configuration: Configuration
    private let softwareBytes: [UInt8]

    /// The comprehension-required attributes a Binding request may carry.
    /// RESPONSE-ADDRESS and the other RFC 3489 attributes are not among them:
    /// a request with one is answered 420, never reflected elsewhere.
    private static let understood: Set<UInt16> = [
        AttributeType.mappedAddress, .username, .messageIntegrity, .errorCode, .unknownAttributes, .realm, .nonce,
        .messageIntegritySHA256, .passwordAlgorithm, .userhash, .xorMappedAddress, .priority, .useCandidate,
        .padding, .responsePort, .changeRequest, .accessToken, .channelNumber, .lifetime, .xorPeerAddress, .data,
        .xorRelayedAddress, .requestedAddressFamily, .evenPort, .requestedTransport, .dontFragment,
        .reservationToken, .connectionID,
    ].reduce(into: Set<UInt16>()) { $0.insert($1.rawValue) }

    /// The exact upper bound of a response to a request of `requestLength`
    /// bytes with this configuration: header, three IPv6 address attributes,
    /// SOFTWARE, a mirrored PADDING (never longer than the request) and
    /// FINGERPRINT; error responses are smaller. Small answers stay in
    /// malloc's fast per-thread cache.
    public func responseCapacity(requestLength: Int) -> Int {
        let software = softwareBytes.isEmpty ? 0 : 4 + padded4(softwareBytes.count)
        return 20 + 3 * 24 + software + 4 + padded4(requestLength) + 8
    }

    public init(configuration: Configuration = Configuration()) {
        self.configuration = configuration
        // At most 763 bytes, cut between characters so the value stays UTF-8.
        var software = Substring(configuration.software ?? "")
        while software.utf8.count > 763 { software = software.dropLast() }
        self.softwareBytes = Array(software.utf8)
    }

    public var supportsBehaviorDiscovery: Bool { configuration.alternate != nil && configuration.primary != nil }

    /// The transport address of one of the server's origins.
    public func address(of origin: Origin) -> TransportAddress? {
        guard let primary = configuration.primary else { return nil }
        guard origin != .primary else { return primary }
        guard let alternate = configuration.alternate else { return nil }
        return TransportAddress(
            ip: origin.alternateIP ? alternate.ip : primary.ip,
            port: origin.alternatePort ? alternate.port : primary.port)
    }

    /// Handles one datagram. Never traps on any input.
    public func handle(
        _ request: UnsafeRawBufferPointer, from source: TransportAddress, arrivedOn: Origin = .primary,
        into out: UnsafeMutableRawBufferPointer
    ) -> Outcome {
        let r = RawReader(bytes: request)
        let n = request.count
        guard n <= Self.largestRequest else { return .drop(.tooLarge) }
        guard n >= 20, r.u8(0) & 0xC0 == 0 else { return .drop(.notSTUN) }
        let length = Int(r.u16(2))
        guard length % 4 == 0, 20 + length == n else { return .drop(.malformed) }
        guard r.u32(4) == magicCookie else { return .drop(.classicSTUN) }
        let type = MessageType(rawValue: r.u16(0))
        guard type.messageClass == .request else { return .drop(.notRequest) }

        // Walk the attributes in place.
        var change = ChangeRequest()
        var sawChangeRequest = false
        var responsePort: UInt16?
        var paddingLength = 0
        var unknown = UnknownTypes()
        // As in Message.effectiveAttributeCount: after MESSAGE-INTEGRITY only
        // MESSAGE-INTEGRITY-SHA256 and FINGERPRINT count; anything else ends the walk.
        var stage = 0
        var i = 20
        while i < n {
            guard i + 4 <= n else { return .drop(.malformed) }
            let t = r.u16(i)
            let l = Int(r.u16(i + 2))
            guard i + 4 + padded4(l) <= n else { return .drop(.malformed) }
            if t == AttributeType.fingerprint.rawValue && stage <= 2 {
                guard l == 4, Self.fingerprintMatches(request, at: i) else { return .drop(.badFingerprint) }
                break
            }
            if t == AttributeType.messageIntegrity.rawValue && stage == 0 {
                stage = 1
            } else if t == AttributeType.messageIntegritySHA256.rawValue && stage <= 1 {
                stage = 2
            } else if stage != 0 {
                break
            } else {
                switch t {
                case AttributeType.changeRequest.rawValue:
                    guard l == 4 else { return .drop(.malformed) }
                    sawChangeRequest = true
                    change = ChangeRequest(rawValue: r.u32(i + 4))
                case AttributeType.responsePort.rawValue:
                    guard l == 4 else { return .drop(.malformed) }
                    responsePort = r.u16(i + 4)
                case AttributeType.padding.rawValue:
                    paddingLength = l
                default:
                    if t < 0x8000 && !Self.understood.contains(t) { unknown.add(t) }
                }
            }
            i += 4 + padded4(l)
        }
        if sawChangeRequest && !supportsBehaviorDiscovery { unknown.add(AttributeType.changeRequest.rawValue) }

        var w = RawWriter(out)
        let tid = UnsafeRawBufferPointer(rebasing: request[8..<20])
        if unknown.count > 0 {
            writeHeader(&w, MessageType(method: type.method, class: .errorResponse), tid)
            writeErrorCode(&w, 420, "Unknown Attribute")
            unknown.write(&w)
            return finish(&w, to: source, origin: arrivedOn)
        }
        guard type.method == .binding else {
            writeHeader(&w, MessageType(method: type.method, class: .errorResponse), tid)
            writeErrorCode(&w, 400, "Bad Request: only Binding is served here")
            return finish(&w, to: source, origin: arrivedOn)
        }

        let origin = Origin(
            alternateIP: arrivedOn.alternateIP != change.contains(.changeIP),
            alternatePort: arrivedOn.alternatePort != change.contains(.changePort))
        writeHeader(&w, .bindingSuccess, tid)
        writeAddress(&w, .xorMappedAddress, source, xor: tid)
        if supportsBehaviorDiscovery, let from = address(of: origin),
            let other = address(of: Origin(alternateIP: !arrivedOn.alternateIP, alternatePort: !arrivedOn.alternatePort))
        {
            writeAddress(&w, .responseOrigin, from, xor: nil)
            writeAddress(&w, .otherAddress, other, xor: nil)
        }
        if !softwareBytes.isEmpty {
            w.u16(AttributeType.software.rawValue)
            w.u16(UInt16(softwareBytes.count))
            softwareBytes.withUnsafeBytes { w.copy($0) }
            w.zeros(padded4(softwareBytes.count) - softwareBytes.count)
        }
        if paddingLength > 0 {
            // Mirror the request's PADDING, never larger than it.
            w.u16(AttributeType.padding.rawValue)
            w.u16(UInt16(paddingLength))
            w.zeros(padded4(paddingLength))
        }
        var destination = source
        if let responsePort { destination.port = responsePort }
        return finish(&w, to: destination, origin: origin)
    }

    /// Convenience for tests and tools: handles a byte array and returns the response bytes.
    public func handle(_ request: [UInt8], from source: TransportAddress, arrivedOn: Origin = .primary)
        -> (response: [UInt8], destination: TransportAddress, origin: Origin)?
    {
        var out = [UInt8](repeating: 0, count: responseCapacity(requestLength: request.count))
        let outcome = request.withUnsafeBytes { req in
            out.withUnsafeMutableBytes { handle(req, from: source, arrivedOn: arrivedOn, into: $0) }
        }
        guard case .reply(let length, let destination, let origin) = outcome else { return nil }
        return (Array(out.prefix(length)), destination, origin)
    }

    /// The comprehension-required types a request carried that are not
    /// served, for a 420: the first four are kept, without allocating.
    private struct UnknownTypes {
        private var types: (UInt16, UInt16, UInt16, UInt16) = (0, 0, 0, 0)
        private(set) var count = 0

        mutating func add(_ type: UInt16) {
            switch count {
            case 0: types.0 = type
            case 1: types.1 = type
            case 2: types.2 = type
            case 3: types.3 = type
            default: break
            }
            count += 1
        }

        /// UNKNOWN-ATTRIBUTES listing the kept types, padded to four bytes.
        func write(_ w: inout RawWriter) {
            let listed = min(count, 4)
            w.u16(AttributeType.unknownAttributes.rawValue)
            w.u16(UInt16(listed * 2))
            if listed > 0 { w.u16(types.0) }
            if listed > 1 { w.u16(types.1) }
            if listed > 2 { w.u16(types.2) }
            if listed > 3 { w.u16(types.3) }
            if listed % 2 == 1 { w.u16(0) }
        }
    }

    // MARK: writing

    private func writeHeader(_ w: inout RawWriter, _ type: MessageType, _ tid: UnsafeRawBufferPointer) {
        w.u16(type.rawValue)
        w.u16(0)
        w.u32(magicCookie)
        w.copy(tid)
    }

    private func writeErrorCode(_ w: inout RawWriter, _ code: Int, _ reason: StaticString) {
        let reasonBytes = UnsafeRawBufferPointer(start: reason.utf8Start, count: reason.utf8CodeUnitCount)
        w.u16(AttributeType.errorCode.rawValue)
        w.u16(UInt16(4 + reasonBytes.count))
        w.u16(0)
        w.u8(UInt8(code / 100))
        w.u8(UInt8(code % 100))
        w.copy(reasonBytes)
        w.zeros(padded4(reasonBytes.count) - reasonBytes.count)
    }

    private func writeAddress(
        _ w: inout RawWriter, _ type: AttributeType, _ a: TransportAddress, xor tid: UnsafeRawBufferPointer?
    ) {
        let r = tid.map { RawReader(bytes: $0) }
        w.u16(type.rawValue)
        w.u16(a.ip.isIPv4 ? 8 : 20)
        w.u8(0)
        w.u8(a.ip.family)
        let portMask: UInt16 = r == nil ? 0 : UInt16(magicCookie >> 16)
        w.u16(a.port ^ portMask)
        let cookieMask: UInt32 = r == nil ? 0 : magicCookie
        switch a.ip {
        case .v4(let v):
            w.u32(v ^ cookieMask)
        case .v6(let high, let low):
            w.u32(UInt32(truncatingIfNeeded: high >> 32) ^ cookieMask)
            w.u32(UInt32(truncatingIfNeeded: high) ^ (r?.u32(0) ?? 0))
            w.u32(UInt32(truncatingIfNeeded: low >> 32) ^ (r?.u32(4) ?? 0))
            w.u32(UInt32(truncatingIfNeeded: low) ^ (r?.u32(8) ?? 0))
        }
    }

    private func finish(_ w: inout RawWriter, to destination: TransportAddress, origin: Origin) -> Outcome {
        w.set16(UInt16(truncatingIfNeeded: w.count - 20 + 8), at: 2)
        let crc = w.crc() ^ fingerprintXOR
        w.u16(AttributeType.fingerprint.rawValue)
        w.u16(4)
        w.u32(crc)
        guard !w.overflowed else { return .drop(.noRoom) }
        return .reply(length: w.count, destination: destination, origin: origin)
    }

    /// Checks a FINGERPRINT at `offset` in place: CRC-32 over the preceding
    /// bytes with the length field rewritten to end after the fingerprint.
    static func fingerprintMatches(_ message: UnsafeRawBufferPointer, at offset: Int) -> Bool {
        guard let base = message.baseAddress?.assumingMemoryBound(to: UInt8.self) else { return false }
        let r = RawReader(bytes: message)
        let coveredLength = UInt16(truncatingIfNeeded: offset + 8 - 20)
        var header: (UInt8, UInt8, UInt8, UInt8) = (
            message[0], message[1], UInt8(coveredLength >> 8), UInt8(truncatingIfNeeded: coveredLength)
        )
        var crc = withUnsafeBytes(of: &header) { h in
            CZlib.crc32(0, h.baseAddress?.assumingMemoryBound(to: UInt8.self), 4)
        }
        crc = CZlib.crc32(crc, base + 4, uInt(offset - 4))
        return UInt32(truncatingIfNeeded: crc) ^ fingerprintXOR == r.u32(offset + 4)
    }
}
