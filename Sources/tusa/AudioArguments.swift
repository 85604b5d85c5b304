import ArgumentParser
import Call
import Foundation
import Secure
import Voice

// What `tusa call`, `tusa answer` and `tusa party` read from the same flags.
enum AudioArguments {
    /// `--codec`, `--frame`, `--bitrate` as a codec configuration the codec accepts.
    static func codec(_ codec: String, frame: Int, bitrate: Int) throws -> CodecConfiguration {
        guard let kind = CodecKind(rawValue: codec) else { throw ValidationError("--codec must be opus, speex or l16") }
        guard let duration = FrameDuration(rawValue: frame) else { throw ValidationError("--frame must be 10 or 20") }
        guard (6_000...128_000).contains(bitrate) else { throw ValidationError("--bitrate must be 6000-128000") }
        var c = CodecConfiguration(kind: kind, frameDuration: duration, bitrate: bitrate)
        if kind == .l16 { c.inbandFEC = false }
        _ = try makeEncoder(c)  // a configuration the codec refuses fails here, with its reason
        return c
    }

    /// The `--in` values that name no file.
    static let nonFileInputs: Set<String> = ["silence", "none", "tone", "device"]

    /// `--impair SPEC`, parsed (nil without the flag), or a usage error naming it.
    static func impairment(_ spec: String?) throws -> Impairment? {
        guard let spec else { return nil }
        do { return try Impairment(parsing: spec) } catch { throw ValidationError("--impair: \(error)") }
    }

    /// `--in`: a WAV file (played over and over with `--loop`), 'device', 'tone' or 'silence'.
    static func source(_ input: String, loop: Bool = false) throws -> AudioSource? {
        if loop && nonFileInputs.contains(input) {
            throw ValidationError("--loop plays a file over and over: give --in a WAV file, not '\(input)'")
        }
        switch input {
        case "silence", "none": return NullSource(sampleRate: voiceSampleRate)
        case "tone": return ToneSource(frequency: 440, amplitude: 8000, sampleRate: voiceSampleRate)
        case "device": return try PortAudioDevice(sampleRate: voiceSampleRate, framesPerBuffer: 160, capture: true, render: false)
        default:
            let file = try WAVFileSource(path: input)
            file.loops = loop
            return file
        }
    }

    /// `--out`: a WAV file, 'device' or 'none'.
    static func sink(_ output: String) throws -> AudioSink? {
        switch output {
        case "none": return nil
        case "device": return try PortAudioDevice(sampleRate: voiceSampleRate, framesPerBuffer: 160, capture: false, render: true)
        default: return try WAVFileSink(path: output, sampleRate: voiceSampleRate)
        }
    }

    /// `--identity FILE`, else the default key file, else a fresh key.
    static func identity(_ path: String?) throws -> Identity {
        if let path { return try Identity.read(from: path) }
        if FileManager.default.fileExists(atPath: Keygen.defaultPath) { return try Identity.read(from: Keygen.defaultPath) }
        return Identity.generate()
    }
}
