import Glibc

/// Real speech from Debian's `pocketsphinx-testdata` (read English from LibriVox,
/// 16 kHz), for tests, benchmarks and quality runs.
public enum SpeechCorpus {
    public static let directory = "/usr/share/pocketsphinx/test/data"
    public static let utterances = [
        "librivox/sense_and_sensibility_01_austen_64kb-0870.wav",
        "librivox/sense_and_sensibility_01_austen_64kb-0880.wav",
        "librivox/sense_and_sensibility_01_austen_64kb-0890.wav",
        "librivox/sense_and_sensibility_01_austen_64kb-0920.wav",
        "librivox/sense_and_sensibility_01_austen_64kb-0930.wav",
    ]

    public static var isAvailable: Bool {
        utterances.allSatisfy { access(directory + "/" + $0, R_OK) == 0 }
    }

    /// Utterances in a fixed order starting at `offsetUtterance`, concatenated and
    /// repeated until `seconds` long, resampled to `sampleRate`.
    public static func speech(seconds: Double, sampleRate: Int = voiceSampleRate, offsetUtterance: Int = 0) throws(VoiceError)
        -> [Int16]
    {
        guard seconds > 0 else { throw .invalidConfiguration("seconds must be positive") }
        var all: [Int16] = []
        var index = 0
        var rate = 16_000
        while Double(all.count) < seconds * Double(rate) {
            let name = utterances[(offsetUtterance + index) % utterances.count]
            let file = try WAVFile.read(path: directory + "/" + name)
            rate = file.sampleRate
            all += file.samples
            index += 1
        }
        let wanted = Int(seconds * Double(rate))
        return try Resampler.resampleAll(Array(all.prefix(wanted)), from: rate, to: sampleRate)
    }
}
