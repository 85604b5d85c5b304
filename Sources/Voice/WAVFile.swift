import CSndfile
import Glibc

private func sndfileError(_ file: OpaquePointer?) -> String {
    guard let message = sf_strerror(file) else { return "libsndfile error" }
    return String(cString: message)
}

/// Opens `path` for writing with `channels` channels (16-bit PCM WAV unless `format` says otherwise).
private func openForWriting(
    path: String, sampleRate: Int, channels: Int,
    format: Int32 = Int32(SF_FORMAT_WAV | SF_FORMAT_PCM_16)
) throws(VoiceError) -> OpaquePointer {
    guard sampleRate > 0, sampleRate <= 768_000 else {
        throw .file(path: path, reason: "sample rate \(sampleRate) Hz is outside 1...768000")
    }
    guard channels > 0, channels <= 256 else { throw .file(path: path, reason: "\(channels) channels is outside 1...256") }
    var info = SF_INFO()
    info.samplerate = Int32(sampleRate)
    info.channels = Int32(channels)
    info.format = format
    guard sf_format_check(&info) != 0 else {
        throw .file(path: path, reason: "format 0x\(String(format, radix: 16)) not writable")
    }
    guard let file = sf_open(path, Int32(SFM_WRITE), &info) else {
        throw .file(path: path, reason: sndfileError(nil))
    }
    return file
}

/// Any file libsndfile reads (WAV, FLAC, AIFF…; any rate and sample format), mixed down to mono 16-bit.
public final class WAVFileSource: AudioSource {
    public let path: String
    public let sampleRate: Int
    /// Frames (samples per channel) in the file.
    public let frameCount: Int
    /// Channels in the file (the output is their average).
    public let channels: Int
    private var file: OpaquePointer?
    private let scratch: UnsafeMutablePointer<Int16>
    private let scratchFrames = 1024

    public init(path: String) throws(VoiceError) {
        var info = SF_INFO()
        guard let file = sf_open(path, Int32(SFM_READ), &info) else {
            throw .file(path: path, reason: sndfileError(nil))
        }
        guard info.channels > 0, info.samplerate > 0 else {
            sf_close(file)
            throw .file(path: path, reason: "no audio (\(info.channels) channels at \(info.samplerate) Hz)")
        }
        self.path = path
        self.file = file
        sampleRate = Int(info.samplerate)
        channels = Int(info.channels)
        frameCount = Int(max(0, info.frames))
        scratch = .allocate(capacity: scratchFrames * Int(info.channels))
    }

    deinit {
        if let file { sf_close(file) }
        scratch.deallocate()
    }

    /// Starts again from the beginning at the end of the file, for ever (hold
    /// music, a long test call); false: reads return 0 at the end.
    public var loops = false

    public func read(into output: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        let n = try readOnce(into: output)
        guard n == 0, loops, frameCount > 0, let file, output.count > 0 else { return n }
        guard sf_seek(file, 0, SEEK_SET) == 0 else {
            throw .file(path: path, reason: "cannot go back to its start to play it again")
        }
        return try readOnce(into: output)
    }

    private func readOnce(into output: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        guard let file, let base = output.baseAddress, output.count > 0 else { return 0 }
        if channels == 1 {
            var total = 0
            while total < output.count {
                let got = Int(sf_readf_short(file, base + total, sf_count_t(output.count - total)))
                if got <= 0 { break }
                total += got
            }
            try checkError(file)
            return total
        }
        var total = 0
        while total < output.count {
            let want = min(scratchFrames, output.count - total)
            let got = Int(sf_readf_short(file, scratch, sf_count_t(want)))
            if got <= 0 { break }
            for frame in 0..<got {
                var sum = 0
                let row = scratch + frame * channels
                for channel in 0..<channels { sum += Int(row[channel]) }
                base[total + frame] = Int16(truncatingIfNeeded: sum / channels)
            }
            total += got
        }
        try checkError(file)
        return total
    }

    private func checkError(_ file: OpaquePointer) throws(VoiceError) {
        let code = sf_error(file)
        if code != 0 { throw .file(path: path, reason: sndfileError(file)) }
    }

    /// Closes the file; later reads return 0.
    public func close() {
        if let file { sf_close(file) }
        file = nil
    }
}

/// A 16-bit PCM mono WAV file being written: a recording. Its header is brought up
/// to date after every second of audio, so a file cut short (the process killed, the
/// disk full) plays up to its last second. A write that fails says which limit it met.
public final class WAVFileSink: AudioSink {
    public let path: String
    public let sampleRate: Int
    /// Samples written so far.
    public private(set) var samplesWritten = 0
    /// `samplesWritten` when the header last counted them.
    private var samplesInHeader = 0
    private var file: OpaquePointer?
    /// A recording that fails stops; the call it records goes on.
    public var failureEndsCall: Bool { false }

    public init(path: String, sampleRate: Int) throws(VoiceError) {
        file = try openForWriting(path: path, sampleRate: sampleRate, channels: 1)
        self.path = path
        self.sampleRate = sampleRate
    }

    deinit { close() }

    public func write(_ samples: UnsafeBufferPointer<Int16>) throws(VoiceError) {
        guard let file else { throw .file(path: path, reason: "written after close") }
        guard let base = samples.baseAddress, samples.count > 0 else { return }
        errno = 0
        let written = Int(sf_writef_short(file, base, sf_count_t(samples.count)))
        samplesWritten += max(0, written)
        guard written == samples.count else {
            let code = errno
            let seconds = String(format: "%.1f", Double(samplesWritten) / Double(sampleRate))
            let limit =
                switch code {
                case ENOSPC: "the disk is full"
                case EDQUOT: "the disk quota is used up"
                case EFBIG: "the file size limit (ulimit -f) is reached"
                default: sndfileError(file)
                }
            throw .file(path: path, reason: "\(limit), after \(seconds) s recorded")
        }
        if samplesWritten - samplesInHeader >= sampleRate {
            samplesInHeader = samplesWritten
            sf_command(file, Int32(SFC_UPDATE_HEADER_NOW), nil, 0)
        }
    }

    public func close() {
        guard let file else { return }
        sf_close(file)
        self.file = nil
    }
}

/// Whole-file helpers.
public enum WAVFile {
    /// Reads a whole file (any format libsndfile reads), mixed down to mono.
    public static func read(path: String) throws(VoiceError) -> (samples: [Int16], sampleRate: Int) {
        let source = try WAVFileSource(path: path)
        // The header's frame count only sizes the first reservation: a file may claim more than it holds.
        var samples: [Int16] = []
        samples.reserveCapacity(min(source.frameCount, 1 << 22))
        var chunk = [Int16](repeating: 0, count: 8192)
        while true {
            var count = 0
            var failure: VoiceError?
            chunk.withUnsafeMutableBufferPointer { buffer in
                do throws(VoiceError) { count = try source.read(into: buffer) } catch { failure = error }
            }
            if let failure { throw failure }
            if count == 0 { break }
            samples.append(contentsOf: chunk[0..<count])
        }
        return (samples, source.sampleRate)
    }

    /// Writes mono 16-bit PCM WAV.
    public static func write(path: String, samples: [Int16], sampleRate: Int) throws(VoiceError) {
        try write(path: path, interleaved: samples, channels: 1, sampleRate: sampleRate)
    }

    /// Writes `channels` interleaved channels, 16-bit PCM WAV unless `format` (SF_FORMAT_*) says otherwise
    /// (used by tests for multichannel and other formats).
    static func write(
        path: String, interleaved samples: [Int16], channels: Int, sampleRate: Int,
        format: Int32 = Int32(SF_FORMAT_WAV | SF_FORMAT_PCM_16)
    ) throws(VoiceError) {
        let file = try openForWriting(path: path, sampleRate: sampleRate, channels: channels, format: format)
        defer { sf_close(file) }
        let frames = samples.count / max(1, channels)
        guard frames > 0 else { return }
        let written = samples.withUnsafeBufferPointer { sf_writef_short(file, $0.baseAddress, sf_count_t(frames)) }
        guard written == frames else { throw .file(path: path, reason: sndfileError(file)) }
    }
}
