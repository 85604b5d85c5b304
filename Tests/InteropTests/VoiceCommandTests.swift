import Foundation
import Testing

/// `tusa voice simulate` as a user runs it: real speech in, a WAV out, a report.
@Suite struct VoiceCommandTests {
    static let speech = "/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav"
    static let ready = Harness.tusa != nil && FileManager.default.fileExists(atPath: speech)
    static let needs = "needs .build/debug/tusa and Debian's pocketsphinx-testdata (make test installs it)"

    static func temporary(_ name: String) -> String {
        NSTemporaryDirectory() + "tusa-voice-\(getpid())-\(name)"
    }

    @Test(.enabled(if: ready, "\(needs)"))
    func simulateWritesWhatTheReceiverHeardAndReportsIt() async throws {
        let out = Self.temporary("out.wav")
        let trace = Self.temporary("trace.txt")
        let taps = Self.temporary("taps")
        defer {
            for p in [out, trace] { unlink(p) }
            try? FileManager.default.removeItem(atPath: taps)
        }
        let r = try await TURNClientPeerTests.tusa([
            "voice", "simulate", "--in", Self.speech, "--out", out, "--loss", "10%", "--jitter", "20",
            "--seed", "3", "--save-trace", trace, "--taps", taps, "--json",
        ])
        #expect(r.status == 0, "\(r.stderr)")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any], "\(r.stdout)")
        let sent = try #require(json["packetsSent"] as? Int)
        #expect(sent == 150)  // 2.99 s in 20 ms frames
        let networkLoss = try #require(json["networkLossRate"] as? Double)
        #expect(networkLoss > 0.03 && networkLoss < 0.2)
        let stats = try #require(json["playoutStatistics"] as? [String: Any])
        let recovered: Int = stats["framesRecoveredByFEC"] as? Int ?? 0
        #expect(recovered > 0, "\(stats)")
        // The output is a WAV at 8 kHz at least as long as the input; the trace is the documented text format.
        let wav = try #require(FileManager.default.contents(atPath: out))
        let minimumBytes: Int = 44 + 2 * 8000 * 29 / 10
        #expect(wav.count > minimumBytes)
        #expect(String(decoding: wav.prefix(4), as: UTF8.self) == "RIFF")
        let traceText = try String(contentsOfFile: trace, encoding: .utf8)
        #expect(traceText.contains("frame-ms 20"))
        let lostLines: Int = traceText.split(separator: "\n").filter { $0.hasSuffix(" lost") }.count
        #expect(lostLines > 0)
        for stage in ["captured", "sent", "received", "played"] {
            #expect(FileManager.default.fileExists(atPath: "\(taps)/\(stage).wav"), "tap \(stage)")
        }

        // Replaying the saved trace gives the same network.
        let again = try await TURNClientPeerTests.tusa([
            "voice", "simulate", "--in", Self.speech, "--out", out, "--trace", trace, "--json",
        ])
        let json2 = try #require(
            try JSONSerialization.jsonObject(with: Data(again.stdout.utf8)) as? [String: Any], "\(again.stdout) \(again.stderr)")
        #expect(json2["networkLossRate"] as? Double == networkLoss)
    }

    @Test(.enabled(if: ready, "\(needs)"))
    func badInputGetsAClearErrorAndExitCode1() async throws {
        let out = Self.temporary("bad.wav")
        defer { unlink(out) }
        let cases: [([String], String)] = [
            (["--in", Self.speech, "--out", out, "--codec", "mp3"], "--codec must be opus, speex or l16"),
            (["--in", Self.speech, "--out", out, "--loss", "150"], "--loss must be a percentage"),
            (["--in", Self.speech, "--out", out, "--codec", "speex", "--frame", "10"], "Speex"),
            (["--in", "/nonexistent.wav", "--out", out], "/nonexistent.wav"),
            (["--in", "/etc/hostname", "--out", out], "/etc/hostname"),
            (["--in", Self.speech, "--out", out, "--trace", "/etc/hostname"], "line"),
        ]
        for (arguments, message) in cases {
            let r = try await TURNClientPeerTests.tusa(["voice", "simulate"] + arguments)
            #expect(r.status == 1, "\(arguments): status \(r.status) \(r.stderr)")
            #expect(r.stderr.contains(message), "\(arguments): \(r.stderr)")
        }
    }
}
