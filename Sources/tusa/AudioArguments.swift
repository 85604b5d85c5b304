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
        // A configuration the codec refuses fails here, with its reason: a usage error.
        do { _ = try makeEncoder(c) } catch { throw ValidationError("--codec \(codec) --frame \(frame): \(error)") }
        return c
    }

    /// The `--in` values that name no file (and `device:NAME`).
    static let nonFileInputs: Set<String> = ["silence", "none", "tone", "device"]

    /// Whether `--in` or `--out` names a live device ('device' or 'device:NAME').
    static func isDevice(_ value: String) -> Bool { value == "device" || value.hasPrefix("device:") }

    /// `--echo-cancel`: on, off, or (auto) on when both what is sent and what is heard are
    /// live devices, where the speaker's sound reaches the microphone.
    static func echoCancellation(_ value: EchoCancelArgument, input: String, output: String) -> Bool {
        switch value {
        case .on: return true
        case .off: return false
        case .auto: return isDevice(input) && isDevice(output)
        }
    }

    /// Whether `--in` names a WAV file.
    static func isFile(_ input: String) -> Bool { !nonFileInputs.contains(input) && !input.hasPrefix("device:") }

    /// `--impair SPEC`, parsed (nil without the flag), or a usage error naming it.
    static func impairment(_ spec: String?) throws -> Impairment? {
        guard let spec else { return nil }
        do { return try Impairment(parsing: spec) } catch { throw ValidationError("--impair: \(error)") }
    }

    /// `--in`: a WAV file (played over and over with `--loop`), 'device' or 'device:NAME'
    /// (`--in-device NAME` names it too), 'tone' or 'silence'. `placing`: the user placed
    /// the call or joined the party now, so what they say before its audio starts is sent;
    /// not when answering.
    static func source(_ input: String, loop: Bool = false, device: String? = nil, placing: Bool) throws
        -> AudioSource?
    {
        if loop && !isFile(input) {
            throw ValidationError("--loop plays a file over and over: give --in a WAV file, not '\(input)'")
        }
        if let name = try deviceName(input, flag: "--in", named: device) {
            let (device, rate) = try AudioDevices.choose(name, direction: .capture, fallbackRate: voiceSampleRate)
            return LiveCapture(
                deviceName: device, sampleRate: rate, keepMilliseconds: placing ? 200 : 0, notice: printNotice)
        }
        switch input {
        case "silence", "none": return NullSource(sampleRate: voiceSampleRate)
        case "tone": return ToneSource(frequency: 440, amplitude: 8000, sampleRate: voiceSampleRate)
        default:
            let file = try WAVFileSource(path: input)
            file.loops = loop
            return file
        }
    }

    /// `--out`: a WAV file, 'device' or 'device:NAME' (`--out-device NAME` names it too), or 'none'.
    static func sink(_ output: String, device: String? = nil) throws -> AudioSink? {
        if let name = try deviceName(output, flag: "--out", named: device) {
            let (device, rate) = try AudioDevices.choose(name, direction: .playback, fallbackRate: voiceSampleRate)
            return LivePlayback(deviceName: device, sampleRate: rate, notice: printNotice)
        }
        switch output {
        case "none": return nil
        default: return try WAVFileSink(path: output, sampleRate: voiceSampleRate)
        }
    }

    /// For a device: .some(the name asked for, nil for the default); nil when `value` is not a device.
    private static func deviceName(_ value: String, flag: String, named: String?) throws -> String?? {
        let inline: String?
        if value == "device" {
            inline = nil
        } else if value.hasPrefix("device:") {
            inline = String(value.dropFirst("device:".count))
            guard inline?.isEmpty == false else { throw ValidationError("\(flag) device:NAME needs a NAME") }
        } else {
            if let named { throw ValidationError("\(flag)-device '\(named)' picks a device for \(flag) device, not '\(value)'") }
            return nil
        }
        if let inline, let named, inline != named {
            throw ValidationError("\(flag) names device '\(inline)' and \(flag)-device '\(named)': give one")
        }
        return .some(inline ?? named)
    }

    /// A live device's notice (it fell back to the default), on stderr on a line of its own.
    private static let printNotice: @Sendable (String) -> Void = { message in
        FileHandle.standardError.write(Data("\ntusa: \(message)\n".utf8))
    }

    /// `--identity FILE`, else the default key file, else a fresh key.
    static func identity(_ path: String?) throws -> Identity {
        if let path { return try Identity.read(from: path) }
        if FileManager.default.fileExists(atPath: Keygen.defaultPath) { return try Identity.read(from: Keygen.defaultPath) }
        return Identity.generate()
    }
}

/// `--echo-cancel auto|on|off`.
enum EchoCancelArgument: String, ExpressibleByArgument, CaseIterable {
    case auto
    case on
    case off
}
