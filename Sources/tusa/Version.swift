import ArgumentParser
import COpus
import CSodium
import CSpeex
import CSpeexDSP

enum TusaVersion {
    static let string = "0.1.0"
}

/// `tusa version`: this build and the system libraries it links.
struct Version: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print the version and the linked libraries.")

    func run() throws {
        print("tusa \(TusaVersion.string)")
        if let v = sodium_version_string() { print("libsodium \(String(cString: v))") }
        if let v = opus_get_version_string() { print("opus \(String(cString: v))") }
        var speexVersion: UnsafePointer<CChar>? = nil
        withUnsafeMutablePointer(to: &speexVersion) { p in
            _ = speex_lib_ctl(SPEEX_LIB_GET_VERSION_STRING, UnsafeMutableRawPointer(p))
        }
        if let v = speexVersion { print("speex \(String(cString: v))") }
        // speexdsp has no version call; show that it links by creating and freeing a resampler.
        var err: Int32 = 0
        if let r = speex_resampler_init(1, 48000, 8000, 3, &err) {
            speex_resampler_destroy(r)
            print("speexdsp linked")
        }
    }
}
