import Foundation
import ICE
import Transport
import Voice

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
    }

    /// The path a peer offers: where it can be reached (ICE-style candidate lines)
    /// and the short-term credentials its connectivity checks use.
    public struct Path: Codable, Equatable, Sendable {
        public var ufrag: String
        public var password: String
        /// `candidate:` attribute values (RFC 8839 syntax).
        public var candidates: [String]
        public init(ufrag: String, password: String, candidates: [String]) {
            self.ufrag = ufrag; self.password = password; self.candidates = candidates
        }

        /// What an ICE agent signals.
        public init(_ description: ICEDescription) {
            self.init(ufrag: description.credentials.ufrag, password: description.credentials.pwd,
                      candidates: description.candidates.map { "candidate:" + $0.sdp })
        }

        /// For the ICE agent: the credentials and the candidates it can use (a
        /// candidate line it cannot read, or one past the 64th, is left out).
        public var iceDescription: ICEDescription {
            ICEDescription(credentials: ICECredentials(ufrag: ufrag, pwd: password),
                           candidates: candidates.prefix(64).compactMap { try? ICECandidate(sdp: $0) })
        }
    }

    /// The codec the caller proposes (and the callee confirms).
    public struct Codec: Codable, Equatable, Sendable {
        public var name: String
        public var sampleRate: Int
        public var frameMilliseconds: Int
        public var bitrate: Int
        public init(_ c: CodecConfiguration) {
            name = c.kind.rawValue; sampleRate = c.sampleRate; frameMilliseconds = c.frameDuration.milliseconds; bitrate = c.bitrate
        }

        /// The configuration this describes, or a typed error for one this build cannot run.
        public func configuration() throws(CallError) -> CodecConfiguration {
            guard let kind = CodecKind(rawValue: name) else { throw .unsupported("codec \(name)") }
            guard let frame = FrameDuration(rawValue: frameMilliseconds) else { throw .unsupported("\(frameMilliseconds) ms frames") }
            var c = CodecConfiguration(kind: kind, sampleRate: sampleRate, frameDuration: frame)
            c.bitrate = bitrate
            // The codec itself checks the rest when it is made (a typed VoiceError).
            do { _ = try makeDecoder(c) } catch { throw .unsupported("\(error)") }
            return c
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

    public init(kind: Kind, call: String, path: Path? = nil, codec: Codec? = nil, reason: String? = nil) {
        self.kind = kind; self.call = call; self.path = path; self.codec = codec; self.reason = reason
    }

    public func encoded() -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? Array(encoder.encode(self))) ?? []
    }

    public init(decoding bytes: [UInt8]) throws(CallError) {
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
    }
}

public enum CallError: Error, Equatable, Sendable, CustomStringConvertible {
    case malformed(String)
    case unsupported(String)
    case rejected(String)
    case noPath(String)
    case timedOut(String)
    case failed(String)

    public var description: String {
        switch self {
        case .malformed(let s): "malformed call message: \(s)"
        case .unsupported(let s): "unsupported: \(s)"
        case .rejected(let s): "the call was refused: \(s)"
        case .noPath(let s): "no path to the peer: \(s)"
        case .timedOut(let s): "timed out: \(s)"
        case .failed(let s): s
        }
    }
}
