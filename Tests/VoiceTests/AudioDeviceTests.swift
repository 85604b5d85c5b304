import Foundation
import Glibc
import Testing
import TusaBase

@testable import Voice

@Suite struct AudioDeviceTests {
    private func readAll(_ source: any AudioSource, chunk: Int = 256, limit: Int = 1_000_000) throws -> [Int16] {
        var all: [Int16] = []
        var buffer = [Int16](repeating: 0, count: chunk)
        while all.count < limit {
            let got = try buffer.withUnsafeMutableBufferPointer { try source.read(into: $0) }
            if got == 0 { break }
            all.append(contentsOf: buffer[0..<got])
        }
        return all
    }

    // MARK: WAV files

    @Test func wavWriteReadRoundTrip() throws {
        let directory = try #require(temporaryDirectory())
        defer { removeDirectory(directory) }
        let path = directory + "/round.wav"
        var random = SplitMix64(state: 42)
        let samples = (0..<12_345).map { _ in Int16.random(in: .min ... .max, using: &random) }
        try WAVFile.write(path: path, samples: samples, sampleRate: 16_000)
        let back = try WAVFile.read(path: path)
        #expect(back.sampleRate == 16_000)
        #expect(back.samples.count == samples.count)
        let same = back.samples == samples
        #expect(same)

        // The sink, written in frames, gives the same file content.
        let sinkPath = directory + "/sink.wav"
        let sink = try WAVFileSink(path: sinkPath, sampleRate: 8000)
        var start = 0
        while start < samples.count {
            let end = min(start + 160, samples.count)
            try samples.withUnsafeBufferPointer { try sink.write(UnsafeBufferPointer(rebasing: $0[start..<end])) }
            start = end
        }
        sink.close()
        sink.close()
        #expect(throws: VoiceError.self) { try samples.withUnsafeBufferPointer { try sink.write($0) } }
        let source = try WAVFileSource(path: sinkPath)
        #expect(source.sampleRate == 8000 && source.frameCount == samples.count && source.channels == 1)
        let read = try readAll(source, chunk: 1000)
        let sameAgain = read == samples
        #expect(sameAgain)
    }

    /// A recording cut short (the process killed before it closed the file) plays
    /// up to its last whole second: the header counts the samples every second.
    @Test func aRecordingNeverClosedPlaysUpToItsLastSecond() throws {
        let directory = try #require(temporaryDirectory())
        defer { removeDirectory(directory) }
        let path = directory + "/cut.wav"
        let sink = try WAVFileSink(path: path, sampleRate: 8000)
        let frame = [Int16](repeating: 1000, count: 160)
        for _ in 0..<125 { try frame.withUnsafeBufferPointer { try sink.write($0) } }  // 2.5 s
        // Read while the writer still holds it open, as after a SIGKILL: what the
        // header's data chunk declares is what a player trusts (libsndfile reads on
        // to the end of the file; Python's wave and most players do not).
        let bytes = try #require(FileManager.default.contents(atPath: path).map { [UInt8]($0) })
        let tag: [UInt8] = Array("data".utf8)
        let found = (12..<(bytes.count - 8)).first { Array(bytes[$0..<($0 + 4)]) == tag }
        let data = try #require(found, "no data chunk")
        let declared = (0..<4).reduce(0) { $0 | Int(bytes[data + 4 + $1]) << (8 * $1) }
        #expect(declared >= 32_000 && declared <= 40_000, "the header declares \(declared) bytes of the 40,000 written")
        sink.close()
        #expect(try WAVFile.read(path: path).samples.count == 20_000)
    }

    @Test func multichannelFilesAreMixedDown() throws {
        let directory = try #require(temporaryDirectory())
        defer { removeDirectory(directory) }
        let path = directory + "/stereo.wav"
        let frames = 5000
        var interleaved: [Int16] = []
        for i in 0..<frames {
            interleaved.append(Int16(i % 2000))  // left
            interleaved.append(Int16(-(i % 1000) * 3))  // right
        }
        try WAVFile.write(path: path, interleaved: interleaved, channels: 2, sampleRate: 22_050)
        let source = try WAVFileSource(path: path)
        #expect(source.channels == 2 && source.frameCount == frames && source.sampleRate == 22_050)
        let mono = try readAll(source, chunk: 777)  // chunks larger and smaller than the scratch buffer
        #expect(mono.count == frames)
        let expected = (0..<frames).map { Int16((Int(interleaved[2 * $0]) + Int(interleaved[2 * $0 + 1])) / 2) }
        let same = mono == expected
        #expect(same)
        #expect(try WAVFile.read(path: path).samples.count == frames)
    }

    @Test func aLoopingFileStartsAgainAtItsEndAndNeverEnds() throws {
        let directory = try #require(temporaryDirectory())
        defer { removeDirectory(directory) }
        let path = directory + "/loop.wav"
        let samples = (0..<1000).map { Int16($0 - 500) }
        try WAVFile.write(path: path, interleaved: samples, channels: 1, sampleRate: 8000)
        let source = try WAVFileSource(path: path)
        source.loops = true
        var got: [Int16] = []
        var chunk = [Int16](repeating: 0, count: 160)
        while got.count < 3500 {
            let n = try chunk.withUnsafeMutableBufferPointer { try source.read(into: $0) }
            try #require(n > 0, "a looping file never ends")
            got += chunk[0..<n]
        }
        #expect(Array(got[0..<3000]) == samples + samples + samples)
        let once = try WAVFileSource(path: path)
        #expect(try readAll(once, chunk: 160).count == 1000, "without loops it ends")
    }

    @Test func otherFormatsReadAsSixteenBit() throws {
        let directory = try #require(temporaryDirectory())
        defer { removeDirectory(directory) }
        let samples = (0..<4000).map { Int16(truncatingIfNeeded: ($0 * 37) % 20_000 - 10_000) }
        // SF_FORMAT_WAV | SF_FORMAT_FLOAT, SF_FORMAT_FLAC | SF_FORMAT_PCM_16, SF_FORMAT_AIFF | SF_FORMAT_PCM_24
        for (name, format) in [
            ("float.wav", Int32(0x01_0006)), ("speech.flac", Int32(0x17_0002)), ("deep.aiff", Int32(0x02_0003)),
        ] {
            let path = directory + "/" + name
            try WAVFile.write(path: path, interleaved: samples, channels: 1, sampleRate: 11_025, format: format)
            let back = try WAVFile.read(path: path)
            #expect(back.sampleRate == 11_025 && back.samples.count == samples.count, "\(name)")
            let maxError = zip(back.samples, samples).map { abs(Int($0) - Int($1)) }.max() ?? .max
            #expect(maxError <= 1, "\(name): max error \(maxError)")
        }
    }

    @Test func realSpeechWAVReads() throws {
        let path = Speech.directory + "cards/001.wav"
        let source = try WAVFileSource(path: path)
        #expect(source.sampleRate == 16_000)
        let samples = try readAll(source, chunk: 4096)
        #expect(samples.count == source.frameCount && samples.count > 16_000)
        #expect(Signal.rms(samples) > 100)
    }

    @Test func missingAndGarbageFilesAreFileErrors() throws {
        let directory = try #require(temporaryDirectory())
        defer { removeDirectory(directory) }
        let garbage = directory + "/garbage.wav"
        let file = try #require(fopen(garbage, "wb"))
        var random = SplitMix64(state: 9)
        let bytes = (0..<4096).map { _ in UInt8.random(in: 0...255, using: &random) }
        _ = bytes.withUnsafeBytes { fwrite($0.baseAddress, 1, $0.count, file) }
        fclose(file)
        for path in [directory + "/missing.wav", garbage, Speech.directory + "goforward.raw", directory] {
            do {
                _ = try WAVFileSource(path: path)
                Issue.record("\(path) opened")
            } catch {
                guard case .file(let failedPath, let reason) = error else {
                    Issue.record("\(error)")
                    continue
                }
                #expect(failedPath == path && !reason.isEmpty)
            }
        }
        // A file cut short: its header claims more frames than it holds; reading stops at the data's end.
        let truncatedPath = directory + "/truncated.wav"
        try WAVFile.write(path: truncatedPath, samples: [Int16](repeating: 300, count: 10_000), sampleRate: 8000)
        #expect(truncate(truncatedPath, 44 + 2 * 4000) == 0)
        let truncated = try WAVFile.read(path: truncatedPath)
        #expect(truncated.samples.count == 4000 && truncated.samples.allSatisfy { $0 == 300 })

        #expect(throws: VoiceError.self) {
            try WAVFile.write(path: directory + "/no/such/dir.wav", samples: [1, 2], sampleRate: 8000)
        }
        #expect(throws: VoiceError.self) { _ = try WAVFileSink(path: directory + "/zero.wav", sampleRate: 0) }
    }

    // MARK: generators

    @Test func toneHasItsFrequency() throws {
        let tone = ToneSource(frequency: 440, amplitude: 0.5, sampleRate: 8000, durationSeconds: 1)
        let samples = try readAll(tone, chunk: 160)
        #expect(samples.count == 8000)
        var crossings = 0
        for i in 1..<samples.count where (samples[i - 1] < 0) != (samples[i] < 0) { crossings += 1 }
        #expect(abs(crossings - 880) <= 2, "\(crossings) zero crossings")
        let peak = samples.map { abs(Int($0)) }.max() ?? 0
        #expect(abs(peak - 16_384) < 200)
    }

    @Test func noiseIsDeterministic() throws {
        let a = try readAll(NoiseSource(level: 0.1, sampleRate: 8000, seed: 1, durationSeconds: 0.5))
        let b = try readAll(NoiseSource(level: 0.1, sampleRate: 8000, seed: 1, durationSeconds: 0.5), chunk: 100)
        let c = try readAll(NoiseSource(level: 0.1, sampleRate: 8000, seed: 2, durationSeconds: 0.5))
        #expect(a.count == 4000)
        let sameSeed = a == b
        let otherSeed = a == c
        #expect(sameSeed && !otherSeed)
        #expect(abs(Signal.rms(a) - 3277) < 200, "rms \(Signal.rms(a))")
    }

    @Test func silenceAndDurations() throws {
        let null = NullSource(sampleRate: 8000, durationSeconds: 0.25)
        var buffer = [Int16](repeating: 7, count: 1500)
        #expect(try buffer.withUnsafeMutableBufferPointer { try null.read(into: $0) } == 1500)
        #expect(buffer.allSatisfy { $0 == 0 })
        #expect(try buffer.withUnsafeMutableBufferPointer { try null.read(into: $0) } == 500)
        #expect(try buffer.withUnsafeMutableBufferPointer { try null.read(into: $0) } == 0)
        let endless = ToneSource(frequency: 100, amplitude: 1, sampleRate: 8000)
        #expect(try readAll(endless, limit: 100_000).count >= 100_000)
        let sink = NullSink(sampleRate: 8000)
        try buffer.withUnsafeBufferPointer { try sink.write($0) }
        #expect(sink.samplesWritten == 1500)
    }

    // MARK: PCM taps

    @Test func pcmTapsWriteEachStage() throws {
        let root = try #require(temporaryDirectory())
        defer { removeDirectory(root) }
        let directory = root + "/taps"
        let taps = try PCMTaps(directory: directory, stages: [.captured, .echoCancelled, .played])
        let frame = [Int16](repeating: 1000, count: 160)
        frame.withUnsafeBufferPointer { pcm in
            for _ in 0..<50 { taps.write(.captured, pcm) }
            for _ in 0..<20 { taps.write(.echoCancelled, pcm) }
            for _ in 0..<5 { taps.write(.sent, pcm) }  // not tapped: ignored
        }
        taps.close()
        taps.close()
        #expect(taps.firstError == nil)
        #expect(try WAVFile.read(path: directory + "/captured.wav").samples.count == 8000)
        #expect(try WAVFile.read(path: directory + "/echo-cancelled.wav").samples.count == 3200)
        #expect(try WAVFile.read(path: directory + "/played.wav").samples.count == 0)
        #expect(throws: VoiceError.self) { _ = try WAVFile.read(path: directory + "/sent.wav") }
        #expect(throws: VoiceError.self) { _ = try PCMTaps(directory: "/proc/no-such-place/taps") }
    }

    // MARK: PortAudio

    @Test func portAudioIsLoadedAtRunTime() throws {
        // isAvailable reflects dlopen of the real library name.
        let handle = dlopen("libportaudio.so.2", RTLD_NOW)
        #expect(PortAudioDevice.isAvailable == (handle != nil))
        if let handle { dlclose(handle) }

        // A missing library is a typed error naming the package.
        do {
            _ = try PortAudioLibrary.load("libportaudio-missing.so.2")
            Issue.record("a missing library loaded")
        } catch {
            guard case .unavailable(let message) = error else {
                Issue.record("\(error)")
                return
            }
            #expect(message.contains("libportaudio2"))
        }
    }

    @Test func portAudioWithoutADeviceThrows() throws {
        guard PortAudioDevice.isAvailable else {
            // No libportaudio.so.2 on this machine: every entry point says which package to install.
            #expect(throws: VoiceError.self) { _ = try PortAudioDevice.listDevices() }
            do {
                _ = try PortAudioDevice(sampleRate: 8000, framesPerBuffer: 160, capture: true, render: false)
                Issue.record("opened without the library")
            } catch {
                guard case .unavailable(let message) = error else {
                    Issue.record("\(error)")
                    return
                }
                #expect(message.contains("libportaudio2"))
            }
            return
        }
        #expect(throws: VoiceError.self) {
            _ = try PortAudioDevice(sampleRate: 8000, framesPerBuffer: 160, capture: false, render: false)
        }
        #expect(throws: VoiceError.self) {
            _ = try PortAudioDevice(sampleRate: 1, framesPerBuffer: 160, capture: true, render: false)
        }
        let devices = try PortAudioDevice.listDevices()
        print("PortAudio devices: \(devices)")
        let device: PortAudioDevice
        do {
            device = try PortAudioDevice(sampleRate: 8000, framesPerBuffer: 160, capture: true, render: true)
        } catch {
            // This machine has no sound card: a typed device error, not a crash.
            switch error {
            case .device(let message):
                print("PortAudio without a device: \(message)")
                #expect(!message.isEmpty)
            default: Issue.record("unexpected \(error)")
            }
            return
        }
        // A machine with a sound card: one frame reads, and close is idempotent.
        var frame = [Int16](repeating: 0, count: 160)
        let got = try frame.withUnsafeMutableBufferPointer { try device.read(into: $0) }
        #expect(got == 160)
        device.close()
        device.close()
        #expect(throws: VoiceError.self) {
            _ = try PortAudioDevice(
                sampleRate: 8000, framesPerBuffer: 160, capture: true, render: false, deviceName: "no such device 1234")
        }
    }
}
