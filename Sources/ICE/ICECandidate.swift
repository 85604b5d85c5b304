import STUN
import TusaBase

/// The kind of an ICE candidate (RFC 8445 §5.1.1).
public enum ICECandidateType: String, Hashable, Sendable, CaseIterable {
    case host
    /// Server-reflexive: the address a STUN server saw.
    case srflx
    /// Peer-reflexive: learnt from a connectivity check.
    case prflx
    /// Relayed: a TURN allocation's relayed address.
    case relay

    /// The recommended type preference (RFC 8445 §5.1.2.2).
    public var typePreference: UInt32 {
        switch self {
        case .host: 126
        case .prflx: 110
        case .srflx: 100
        case .relay: 0
        }
    }
}

/// Why a candidate line could not be read.
public struct ICECandidateError: Error, Hashable, Sendable, CustomStringConvertible {
    public let line: String
    public let reason: String
    public var description: String { "bad ICE candidate \"\(line.prefix(120))\": \(reason)" }
}

/// One UDP candidate, as exchanged in offers and answers (the RFC 8839
/// candidate-attribute syntax: `foundation component udp priority address port
/// typ type [raddr a rport p]`).
public struct ICECandidate: Hashable, Sendable, CustomStringConvertible {
    public var foundation: String
    public var component: Int
    public var priority: UInt32
    public var address: TransportAddress
    public var type: ICECandidateType
    /// For reflexive and relayed candidates: the base (or the mapped address).
    public var relatedAddress: TransportAddress?

    public init(
        foundation: String, component: Int = 1, priority: UInt32, address: TransportAddress,
        type: ICECandidateType, relatedAddress: TransportAddress? = nil
    ) {
        self.foundation = foundation
        self.component = component
        self.priority = priority
        self.address = address
        self.type = type
        self.relatedAddress = relatedAddress
    }

    /// RFC 8445 §5.1.2.1: (2^24)·type preference + (2^8)·local preference + (256 − component).
    public static func priority(type: ICECandidateType, localPreference: UInt32 = 65535, component: Int = 1) -> UInt32 {
        (type.typePreference << 24) | ((localPreference & 0xFFFF) << 8) | UInt32(max(0, min(255, 256 - component)))
    }

    /// The candidate-attribute value (without the `candidate:` prefix).
    public var sdp: String {
        var s = "\(foundation) \(component) udp \(priority) \(address.ip) \(address.port) typ \(type.rawValue)"
        if let r = relatedAddress { s += " raddr \(r.ip) rport \(r.port)" }
        return s
    }

    public var description: String { "\(type.rawValue) \(address)" }

    private static func isICEChar(_ c: UInt8) -> Bool {
        (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(c) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(c)
            || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(c) || c == UInt8(ascii: "+") || c == UInt8(ascii: "/")
    }

    /// Reads a candidate-attribute value, with or without `a=candidate:` /
    /// `candidate:`. Extension attributes (generation, ufrag, …) are ignored;
    /// TCP candidates are refused (this agent speaks UDP).
    public init(sdp line: String) throws(ICECandidateError) {
        var text = Substring(line.trimmingWhitespace())
        for prefix in ["a=candidate:", "candidate:"] where text.hasPrefix(prefix) { text = text.dropFirst(prefix.count) }
        let f = text.split(separator: " ", omittingEmptySubsequences: true).map(String.init)
        func fail(_ why: String) -> ICECandidateError { ICECandidateError(line: line, reason: why) }
        guard f.count >= 8 else { throw fail("expected at least 8 fields") }
        // RFC 8839 §5.1: foundation = 1*32ice-char; ice-char = ALPHA / DIGIT / "+" / "/".
        guard (1...32).contains(f[0].utf8.count), f[0].utf8.allSatisfy(Self.isICEChar) else { throw fail("foundation") }
        guard let component = Int(f[1]), (1...256).contains(component) else { throw fail("component") }
        guard f[2].lowercased() == "udp" else { throw fail("transport \(f[2]) (only udp)") }
        guard let priority = UInt32(f[3]), priority > 0 else { throw fail("priority") }
        guard let ip = IPAddress(f[4]) else { throw fail("address \(f[4]) (host names are not resolved)") }
        guard let port = UInt16(f[5]), port > 0 else { throw fail("port") }
        guard f[6] == "typ", let type = ICECandidateType(rawValue: f[7]) else { throw fail("candidate type") }
        var related: TransportAddress?
        var i = 8
        var raddr: IPAddress?
        var rport: UInt16?
        while i + 1 < f.count {
            switch f[i] {
            case "raddr": raddr = IPAddress(f[i + 1])
            case "rport": rport = UInt16(f[i + 1])
            default: break
            }
            i += 2
        }
        if let raddr, let rport { related = TransportAddress(ip: raddr, port: rport) }
        self.init(
            foundation: f[0], component: component, priority: priority,
            address: TransportAddress(ip: ip, port: port), type: type, relatedAddress: related)
    }
}

extension String {
    fileprivate func trimmingWhitespace() -> Substring {
        var s = Substring(self)
        while let c = s.first, c == " " || c == "\t" || c == "\r" || c == "\n" { s = s.dropFirst() }
        while let c = s.last, c == " " || c == "\t" || c == "\r" || c == "\n" { s = s.dropLast() }
        return s
    }
}

/// A candidate of ours, with the socket (or relay allocation) it is sent from.
public struct ICELocalCandidate: Hashable, Sendable {
    public var candidate: ICECandidate
    /// The driver's name for the socket or relay allocation (the candidate's base).
    public var base: Int

    public init(_ candidate: ICECandidate, base: Int) {
        self.candidate = candidate
        self.base = base
    }

    /// A host candidate on `base` bound to `address`; `localPreference` orders
    /// several interfaces (the higher, the better).
    public static func host(_ address: TransportAddress, base: Int, localPreference: UInt32 = 65535) -> ICELocalCandidate {
        ICELocalCandidate(
            ICECandidate(
                foundation: foundation(.host, address.ip, base: nil),
                priority: ICECandidate.priority(type: .host, localPreference: localPreference),
                address: address, type: .host), base: base)
    }

    /// A server-reflexive candidate found through a STUN server from `base` (whose address is `baseAddress`).
    public static func serverReflexive(
        _ mapped: TransportAddress, baseAddress: TransportAddress, base: Int,
        localPreference: UInt32 = 65535
    ) -> ICELocalCandidate {
        ICELocalCandidate(
            ICECandidate(
                foundation: foundation(.srflx, baseAddress.ip, base: nil),
                priority: ICECandidate.priority(type: .srflx, localPreference: localPreference),
                address: mapped, type: .srflx, relatedAddress: baseAddress), base: base)
    }

    /// A relayed candidate: the TURN allocation `base` whose relayed address is `relayed`.
    public static func relayed(
        _ relayed: TransportAddress, mapped: TransportAddress?, base: Int,
        localPreference: UInt32 = 65535
    ) -> ICELocalCandidate {
        ICELocalCandidate(
            ICECandidate(
                foundation: foundation(.relay, relayed.ip, base: nil),
                priority: ICECandidate.priority(type: .relay, localPreference: localPreference),
                address: relayed, type: .relay, relatedAddress: mapped), base: base)
    }

    /// RFC 8445 §5.1.1.3: the same for candidates of one type, one base IP and one server.
    static func foundation(_ type: ICECandidateType, _ ip: IPAddress, base: Int?) -> String {
        var h: UInt32 = 2_166_136_261
        for b in Array(type.rawValue.utf8) + ip.bytes + (base.map { [UInt8(truncatingIfNeeded: $0)] } ?? []) {
            h = (h ^ UInt32(b)) &* 16_777_619
        }
        return String(h % 1_000_000_000)
    }
}
