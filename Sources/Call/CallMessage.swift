@_exported import CallControl
import ICE
import Transport
import Voice

extension CallMessage.Path {
    /// What an ICE agent signals.
    public init(_ description: ICEDescription) {
        self.init(
            ufrag: description.credentials.ufrag, password: description.credentials.pwd,
            candidates: description.candidates.map { "candidate:" + $0.sdp })
    }

    /// For the ICE agent: the credentials and the candidates it can use (a
    /// candidate line it cannot read, or one past the 64th, is left out).
    public var iceDescription: ICEDescription {
        ICEDescription(
            credentials: ICECredentials(ufrag: ufrag, pwd: password),
            candidates: candidates.prefix(64).compactMap { try? ICECandidate(sdp: $0) })
    }
}

extension CallMessage.Codec {
    /// What a codec configuration is called on the wire.
    public init(_ c: CodecConfiguration) {
        self.init(
            name: c.kind.rawValue, sampleRate: c.sampleRate, frameMilliseconds: c.frameDuration.milliseconds, bitrate: c.bitrate)
    }

    /// The configuration this describes, or a typed error for one this build cannot run.
    public func configuration() throws(CallError) -> CodecConfiguration {
        var c: CodecConfiguration
        do { c = try decoderConfiguration(codec: name, sampleRate: sampleRate, frameMilliseconds: frameMilliseconds) } catch {
            // (The codec or frame it names, or the codec's own reason, a typed VoiceError.)
            if case .unavailable(let what) = error { throw .unsupported(what) }
            throw .unsupported("\(error)")
        }
        c.bitrate = bitrate
        return c
    }
}
