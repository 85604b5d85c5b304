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
        guard let kind = CodecKind(rawValue: name) else { throw .unsupported("codec \(name)") }
        guard let frame = FrameDuration(rawValue: frameMilliseconds) else { throw .unsupported("\(frameMilliseconds) ms frames") }
        var c = CodecConfiguration(kind: kind, sampleRate: sampleRate, frameDuration: frame)
        c.bitrate = bitrate
        // The codec itself checks the rest when it is made (a typed VoiceError).
        do { _ = try makeDecoder(c) } catch { throw .unsupported("\(error)") }
        return c
    }
}
