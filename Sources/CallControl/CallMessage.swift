import Foundation
import TusaBase

/// What two callers exchange through the rendezvous, sealed end to end (the
/// server forwards it without reading it): an offer, its answer, a refusal or a
/// hang-up, as one JSON object.
public struct CallMessage: Codable, Equatable, Sendable {
    public enum Kind: String, Codable, Sendable {
        case offer, answer, reject, hangup
        /// Mid-call ICE restart (RFC 8445 §9): new credentials and candidates after a
        /// move or a relay restart, and the peer's in return.
        case restart
        case restartAnswer = "restart-answer"
        /// The sender heard nothing from us for a moment and names where it is
        /// reachable now (its socket's address as a STUN server sees it): a NAT
        /// that rebound it gave it a new one. We send a probe there, which opens
        /// our own NAT's filter toward it; its media then moves the session.
        case reachable
    }

    /// The path a peer offers: where it can be reached (ICE-style candidate lines)
    /// and the short-term credentials its connectivity checks use.
    public struct Path: Codable, Equatable, Sendable {
        public var ufrag: String
        public var password: String
        /// `candidate:` attribute values (RFC 8839 syntax).
        public var candidates: [String]
        public init(ufrag: String, password: String, candidates: [String]) {
            self.ufrag = ufrag
            self.password = password
            self.candidates = candidates
        }
    }

    /// The codec the caller proposes (and the callee confirms).
    public struct Codec: Codable, Equatable, Sendable {
        public var name: String
        public var sampleRate: Int
        public var frameMilliseconds: Int
        public var bitrate: Int
        public init(name: String, sampleRate: Int, frameMilliseconds: Int, bitrate: Int) {
            self.name = name
            self.sampleRate = sampleRate
            self.frameMilliseconds = frameMilliseconds
            self.bitrate = bitrate
        }
    }

    public static let version = 1
    public var version = CallMessage.version
    public var kind: Kind
    /// Names the call; an answer, refusal or hang-up carries the offer's.
    public var call: String
    public var path: Path?
    public var codec: Codec?
    public var reason: String?
    /// A ``Kind/reachable`` message's address, `IP:PORT` (`[IPv6]:PORT`).
    public var address: String?

    public init(
        kind: Kind, call: String, path: Path? = nil, codec: Codec? = nil, reason: String? = nil, address: String? = nil
    ) {
        self.kind = kind
        self.call = call
        self.path = path
        self.codec = codec
        self.reason = reason
        self.address = address
    }

    /// The message as the JSON object sealed to the peer.
    public func encoded() -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? Array(encoder.encode(self))) ?? []
    }

    /// A message a peer sent; a typed error for anything else (never a crash).
    public init(decoding bytes: [UInt8]) throws(CallMessageError) {
        do { self = try JSONDecoder().decode(CallMessage.self, from: Data(bytes)) } catch {
            throw .malformed("not a call message")
        }
        guard version == Self.version else { throw .unsupported("call message version \(version)") }
        guard !call.isEmpty, call.count <= 64 else { throw .malformed("call id must be 1-64 characters") }
        if kind == .offer || kind == .answer {
            guard path != nil, codec != nil else { throw .malformed("\(kind.rawValue) without path or codec") }
        }
        if kind == .restart || kind == .restartAnswer {
            guard path != nil else { throw .malformed("\(kind.rawValue) without path") }
        }
        if kind == .reachable {
            guard let address, TransportAddress(address) != nil else {
                throw .malformed("reachable without an IP:PORT address")
            }
        }
    }
}
