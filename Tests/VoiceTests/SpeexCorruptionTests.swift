import Foundation
import Testing
import TusaBase

@testable import Voice

#if canImport(Glibc)
    import Glibc
#endif

/// libspeex writes "notification: … The stream is corrupted." to standard error
/// for each corrupt frame it is given. A peer's garbage must be refused before it
/// gets there: typed errors, and nothing on the user's terminal.
@Suite(.serialized) struct SpeexCorruptionTests {
    /// Runs `body` with this process's standard error going to a file; returns what
    /// was written there meanwhile. Anything not from libspeex goes back to the real
    /// standard error (other tests may write while it runs).
    static func capturingStandardError(_ body: () throws -> Void) throws -> [String] {
        let path = NSTemporaryDirectory() + "tusa-stderr-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let file = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0o600)
        try #require(file >= 0)
        defer { unlink(path) }
        fflush(nil)
        let saved = dup(STDERR_FILENO)
        try #require(saved >= 0)
        dup2(file, STDERR_FILENO)
        close(file)
        var failure: (any Error)?
        do { try body() } catch { failure = error }
        fflush(nil)
        dup2(saved, STDERR_FILENO)
        close(saved)
        let lines = ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        for line in lines where !line.hasPrefix("notification:") { FileHandle.standardError.write(Data((line + "\n").utf8)) }
        if let failure { throw failure }
        return lines.filter { $0.hasPrefix("notification:") }
    }

    @Test func garbageIsRefusedWithoutALineOnStandardError() throws {
        let decoder = try makeDecoder(CodecConfiguration(kind: .speex))
        var random = SplitMix64(seed: 7)
        var pcm = [Int16](repeating: 0, count: 160)
        var refused = 0
        var decoded = 0
        let said = try Self.capturingStandardError {
            for _ in 0..<2000 {
                let packet = (0..<(1 + Int(random.next() % 80))).map { _ in UInt8(truncatingIfNeeded: random.next()) }
                do {
                    _ = try packet.withUnsafeBytes { p in
                        try pcm.withUnsafeMutableBufferPointer { try decoder.decode(p, into: $0) }
                    }
                    decoded += 1
                } catch VoiceError.invalidPacket {
                    refused += 1
                }
            }
        }
        #expect(said.isEmpty, "\(said.count) lines, the first: \(said.first ?? "")")
        #expect(refused > 1000, "refused \(refused), decoded \(decoded)")
        // A real frame still decodes after all that.
        let encoder = try makeEncoder(CodecConfiguration(kind: .speex))
        var frame = [UInt8](repeating: 0, count: encoder.maximumPacketSize)
        let tone = (0..<160).map { Int16(8000 * sin(Double($0) * 0.2)) }
        let n = try tone.withUnsafeBufferPointer { t in try frame.withUnsafeMutableBytes { try encoder.encode(t, into: $0) } }
        let samples = try Array(frame[0..<n]).withUnsafeBytes { p in
            try pcm.withUnsafeMutableBufferPointer { try decoder.decode(p, into: $0) }
        }
        #expect(samples == 160)
    }
}
