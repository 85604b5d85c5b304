import Testing
import TusaBase

@testable import Voice

@Suite struct CodecTests {
    static let speech16k: [Int16] = Speech.raw16k() ?? []
    static let speech8k: [Int16] = Speech.decimate(speech16k)

    // MARK: round trips on real speech

    private func roundTrip(_ configuration: CodecConfiguration, _ input: [Int16]) throws -> (
        correlation: Double, lag: Int, decoded: [Int16], packets: [[UInt8]]
    ) {
        let encoder = try makeEncoder(configuration)
        let decoder = try makeDecoder(configuration)
        let packets = try encodeAll(encoder, input)
        let decoded = try decodeAll(decoder, packets)
        let best = Signal.bestLagCorrelation(input, decoded, maxLag: configuration.sampleRate / 25)
        return (best.correlation, best.lag, decoded, packets)
    }

    @Test func opusNarrowbandRoundTripOnSpeech() throws {
        try #require(Self.speech8k.count > 8000, "pocketsphinx-testdata's goforward.raw is needed")
        let result = try roundTrip(CodecConfiguration(kind: .opus), Self.speech8k)
        print("opus nb 24k: correlation \(result.correlation) at lag \(result.lag)")
        #expect(result.correlation > 0.7)
        // The best alignment is the encoder's lookahead (6.5 ms at 8 kHz).
        let lookahead = try OpusVoiceEncoder(CodecConfiguration(kind: .opus)).lookahead
        #expect(abs(result.lag - lookahead) <= 4, "lag \(result.lag), lookahead \(lookahead)")
        #expect(Signal.rms(result.decoded) > 0.3 * Signal.rms(Self.speech8k))
        #expect(result.packets.allSatisfy { $0.count == 60 })  // 24 kb/s CBR × 20 ms
    }

    @Test func opusWidebandRoundTripOnSpeech() throws {
        try #require(Self.speech16k.count > 16000)
        let configuration = CodecConfiguration(kind: .opus, sampleRate: 16_000, frameDuration: .ms10, bitrate: 32_000)
        let result = try roundTrip(configuration, Self.speech16k)
        print("opus wb 32k 10ms: correlation \(result.correlation) at lag \(result.lag)")
        #expect(result.correlation > 0.7)
        #expect(Signal.rms(result.decoded) > 0.3 * Signal.rms(Self.speech16k))
        #expect(result.decoded.count == Self.speech16k.count / 160 * 160)
    }

    @Test func speexRoundTripOnSpeech() throws {
        try #require(Self.speech8k.count > 8000)
        let configuration = CodecConfiguration(kind: .speex, bitrate: 15_000)
        let result = try roundTrip(configuration, Self.speech8k)
        print("speex 15k: correlation \(result.correlation) at lag \(result.lag)")
        // CELP plus the perceptual enhancer matches the waveform less closely than Opus (measured ≈ 0.66).
        #expect(result.correlation > 0.55)
        #expect(Signal.rms(result.decoded) > 0.3 * Signal.rms(Self.speech8k))
        #expect(Set(result.packets.map(\.count)) == [38])  // 15 kb/s mode: 300 bits per 20 ms frame
    }

    @Test func silenceIsNotMistakenForSpeech() throws {
        // The correlation measure must be able to fail: noise against speech correlates poorly.
        let noise = NoiseSource(level: 0.1, sampleRate: 8000, seed: 7)
        var samples = [Int16](repeating: 0, count: Self.speech8k.count)
        _ = try samples.withUnsafeMutableBufferPointer { try noise.read(into: $0) }
        #expect(Signal.bestLagCorrelation(Self.speech8k, samples, maxLag: 320).correlation < 0.2)
    }

    // MARK: packet sizes

    @Test func constantBitrateKeepsEveryPacketTheSameSize() throws {
        for kind in [CodecKind.opus, .speex] {
            let bitrate = kind == .opus ? 16_000 : 11_000
            let encoder = try makeEncoder(CodecConfiguration(kind: kind, bitrate: bitrate, constantBitrate: true))
            let sizes = Set(try encodeAll(encoder, Self.speech8k).map(\.count))
            #expect(sizes.count == 1, "\(kind) CBR sizes \(sizes)")
        }
    }

    @Test func variableBitrateVariesPacketSizes() throws {
        for kind in [CodecKind.opus, .speex] {
            let bitrate = kind == .opus ? 16_000 : 11_000
            let encoder = try makeEncoder(CodecConfiguration(kind: kind, bitrate: bitrate, constantBitrate: false))
            let sizes = Set(try encodeAll(encoder, Self.speech8k).map(\.count))
            #expect(sizes.count >= 3, "\(kind) VBR sizes \(sizes.sorted())")
        }
    }

    @Test func bitrateChangesMidStream() throws {
        let encoder = try makeEncoder(CodecConfiguration(kind: .opus, bitrate: 24_000))
        let first = try encodeAll(encoder, Array(Self.speech8k.prefix(8000)))
        try encoder.setBitrate(12_000)
        try encoder.setPacketLossPercent(30)
        try encoder.setInbandFEC(false)
        let second = try encodeAll(encoder, Array(Self.speech8k.prefix(8000)))
        #expect(Set(first.map(\.count)) == [60])
        #expect(Set(second.map(\.count)) == [30])
        #expect(
            encoder.configuration.bitrate == 12_000 && encoder.configuration.packetLossPercent == 30
                && !encoder.configuration.inbandFEC)

        let speex = try makeEncoder(CodecConfiguration(kind: .speex, bitrate: 24_600))
        let high = try encodeAll(speex, Array(Self.speech8k.prefix(4000)))
        try speex.setBitrate(8_000)
        let low = try encodeAll(speex, Array(Self.speech8k.prefix(4000)))
        #expect(Set(high.map(\.count)) == [62])
        #expect(Set(low.map(\.count)) == [20])
        #expect(speex.configuration.bitrate == 8_000)
    }

    @Test func speexBitrateMapsToTheNearestModeNotAbove() throws {
        let encoder = try SpeexVoiceEncoder(CodecConfiguration(kind: .speex, bitrate: 14_000))
        #expect(encoder.configuration.bitrate == 11_000)
        try encoder.setBitrate(24_000)
        #expect(encoder.configuration.bitrate == 18_200)
    }

    @Test func discontinuousTransmissionOnSilence() throws {
        let silence = [Int16](repeating: 0, count: 8000 * 2)
        for kind in [CodecKind.opus, .speex] {
            let bitrate = kind == .opus ? 24_000 : 15_000
            let encoder = try makeEncoder(CodecConfiguration(kind: kind, bitrate: bitrate, discontinuousTransmission: true))
            let packets = try encodeAll(encoder, silence)
            let empty = packets.filter(\.isEmpty).count
            print("\(kind) DTX: \(empty) of \(packets.count) frames empty, sizes \(Set(packets.map(\.count)).sorted())")
            #expect(empty >= packets.count * 3 / 4, "\(kind): \(empty) of \(packets.count) empty")
            let withoutDTX = try encodeAll(try makeEncoder(CodecConfiguration(kind: kind, bitrate: bitrate)), silence)
            #expect(withoutDTX.allSatisfy { !$0.isEmpty })
            // Empty frames decode as concealment (comfort noise), exactly one frame each.
            let decoded = try decodeAll(try makeDecoder(CodecConfiguration(kind: kind)), packets)
            #expect(decoded.count == packets.count * 160)
        }
    }

    // MARK: loss

    @Test func opusFECBeatsConcealment() throws {
        let configuration = CodecConfiguration(kind: .opus, bitrate: 24_000, inbandFEC: true, packetLossPercent: 20)
        let packets = try encodeAll(try makeEncoder(configuration), Self.speech8k)
        let clean = try decodeAll(try makeDecoder(configuration), packets)
        let lost: (Int) -> Bool = { $0 % 5 == 2 }
        let recovered = try decodeAll(try makeDecoder(configuration), packets) { lost($0) ? .redundancy : .decode }
        let concealed = try decodeAll(try makeDecoder(configuration), packets) { lost($0) ? .conceal : .decode }
        let lostRanges = packets.indices.filter(lost).map { $0 * 160..<($0 + 1) * 160 }
        let fecSNR = Signal.snr(clean, recovered, ranges: lostRanges)
        let plcSNR = Signal.snr(clean, concealed, ranges: lostRanges)
        print("FEC SNR \(fecSNR) dB, concealment SNR \(plcSNR) dB against the clean decode")
        #expect(fecSNR > plcSNR + 3)
        #expect(try makeDecoder(configuration).recoversFromNextPacket)
    }

    @Test func speexRedundancyIsConcealment() throws {
        let configuration = CodecConfiguration(kind: .speex, bitrate: 15_000)
        let packets = try encodeAll(try makeEncoder(configuration), Array(Self.speech8k.prefix(8000)))
        let lost: (Int) -> Bool = { $0 % 5 == 2 }
        let viaRedundancy = try decodeAll(try makeDecoder(configuration), packets) { lost($0) ? .redundancy : .decode }
        let concealed = try decodeAll(try makeDecoder(configuration), packets) { lost($0) ? .conceal : .decode }
        let same = viaRedundancy == concealed
        #expect(same)
        #expect(try makeDecoder(configuration).recoversFromNextPacket == false)
    }

    @Test func decoderResetForgetsHistory() throws {
        for kind in [CodecKind.opus, .speex] {
            let configuration = CodecConfiguration(kind: kind, bitrate: kind == .opus ? 24_000 : 15_000)
            let packets = try encodeAll(try makeEncoder(configuration), Array(Self.speech8k.prefix(8000)))
            let decoder = try makeDecoder(configuration)
            let first = try decodeAll(decoder, packets)
            decoder.reset()
            let again = try decodeAll(decoder, packets)
            let same = first == again
            #expect(same, "\(kind): decoding after reset differs from a fresh decoder")
        }
    }

    // MARK: malformed input

    @Test func malformedPacketsNeverCrash() throws {
        var random = SplitMix64(state: 0x7E5A_0001)
        var frame = [Int16](repeating: 0, count: 320)
        for kind in [CodecKind.opus, .speex] {
            let configuration = CodecConfiguration(kind: kind)
            let decoder = try makeDecoder(configuration)
            let valid = try encodeAll(
                try makeEncoder(CodecConfiguration(kind: kind, bitrate: kind == .opus ? 24_000 : 15_000)),
                Array(Self.speech8k.prefix(16000)))
            var decoded = 0
            var rejected = 0
            for iteration in 0..<3000 {
                var packet: [UInt8]
                switch iteration % 3 {
                case 0:
                    packet = (0..<Int.random(in: 0...200, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
                case 1:
                    let source = valid[Int.random(in: 0..<valid.count, using: &random)]
                    packet = Array(source.prefix(Int.random(in: 0...source.count, using: &random)))
                default:
                    packet = valid[Int.random(in: 0..<valid.count, using: &random)]
                    for _ in 0..<4 where !packet.isEmpty {
                        packet[Int.random(in: 0..<packet.count, using: &random)] ^= UInt8.random(in: 1...255, using: &random)
                    }
                }
                do {
                    let n = try frame.withUnsafeMutableBufferPointer { out in
                        try packet.withUnsafeBytes { bytes in
                            iteration % 7 == 0
                                ? try decoder.decodeRedundancy(from: bytes, into: out) : try decoder.decode(bytes, into: out)
                        }
                    }
                    #expect(n == configuration.samplesPerFrame)
                    decoded += 1
                } catch let error as VoiceError {
                    switch error {
                    case .invalidPacket, .library: rejected += 1
                    default: Issue.record("\(kind): unexpected \(error)")
                    }
                }
            }
            print("\(kind) fuzz: \(decoded) decoded, \(rejected) rejected")
            #expect(rejected > 0 && decoded > 0)
        }
    }

    @Test func packetLimitsAreTyped() throws {
        var out = [Int16](repeating: 0, count: 160)
        for kind in [CodecKind.opus, .speex] {
            let decoder = try makeDecoder(CodecConfiguration(kind: kind))
            let empty: [UInt8] = []
            let oversized = [UInt8](repeating: 0x55, count: 1276)
            for packet in [empty, oversized] {
                #expect(throws: VoiceError.self) {
                    _ = try out.withUnsafeMutableBufferPointer { o in
                        try packet.withUnsafeBytes { try decoder.decode($0, into: o) }
                    }
                }
                #expect(throws: VoiceError.self) {
                    _ = try out.withUnsafeMutableBufferPointer { o in
                        try packet.withUnsafeBytes { try decoder.decodeRedundancy(from: $0, into: o) }
                    }
                }
            }
            var short = [Int16](repeating: 0, count: 100)
            #expect(throws: VoiceError.bufferTooSmall(needed: 160, available: 100)) {
                _ = try short.withUnsafeMutableBufferPointer { try decoder.conceal(into: $0) }
            }
            let encoder = try makeEncoder(CodecConfiguration(kind: kind, bitrate: kind == .opus ? 24_000 : 15_000))
            var packet = [UInt8](repeating: 0, count: encoder.maximumPacketSize)
            #expect(throws: VoiceError.bufferTooSmall(needed: 160, available: 100)) {
                _ = try short.withUnsafeBufferPointer { pcm in
                    try packet.withUnsafeMutableBytes { try encoder.encode(pcm, into: $0) }
                }
            }
        }
        // Opus: a code-3 packet declaring zero frames is invalid; a 20 ms packet into a 10 ms decoder is too long.
        let opus = try makeDecoder(CodecConfiguration(kind: .opus, frameDuration: .ms10))
        let zeroFrames: [UInt8] = [0x03, 0x00]
        #expect(throws: VoiceError.self) {
            _ = try out.withUnsafeMutableBufferPointer { o in try zeroFrames.withUnsafeBytes { try opus.decode($0, into: o) } }
        }
        let twentyMs = try encodeAll(try makeEncoder(CodecConfiguration(kind: .opus)), Array(Self.speech8k.prefix(320)))
        let error = #expect(throws: VoiceError.self) {
            _ = try out.withUnsafeMutableBufferPointer { o in try twentyMs[0].withUnsafeBytes { try opus.decode($0, into: o) } }
        }
        if case .invalidPacket = error {} else { Issue.record("expected invalidPacket, got \(String(describing: error))") }
    }

    @Test func tenMillisecondPacketsIntoTwentyMillisecondDecoderFillTheFrame() throws {
        let packets = try encodeAll(
            try makeEncoder(CodecConfiguration(kind: .opus, frameDuration: .ms10)), Array(Self.speech8k.prefix(1600)))
        let decoded = try decodeAll(try makeDecoder(CodecConfiguration(kind: .opus, frameDuration: .ms20)), packets)
        #expect(decoded.count == packets.count * 160)
    }

    // MARK: configuration

    @Test func configurationValidation() {
        func rejected(_ configuration: CodecConfiguration, mentioning text: String) {
            do {
                _ = try makeEncoder(configuration)
                Issue.record("accepted \(configuration)")
            } catch {
                guard case .invalidConfiguration(let message) = error else {
                    Issue.record("\(error)")
                    return
                }
                #expect(message.contains(text), "\(message)")
            }
        }
        rejected(CodecConfiguration(kind: .opus, bitrate: 5_000), mentioning: "6000...510000")
        rejected(CodecConfiguration(kind: .opus, bitrate: 600_000), mentioning: "6000...510000")
        rejected(CodecConfiguration(kind: .opus, complexity: 11), mentioning: "0...10")
        rejected(CodecConfiguration(kind: .opus, complexity: -1), mentioning: "0...10")
        rejected(CodecConfiguration(kind: .opus, packetLossPercent: 101), mentioning: "0...100")
        rejected(CodecConfiguration(kind: .opus, sampleRate: 44_100), mentioning: "16000")
        rejected(CodecConfiguration(kind: .speex, frameDuration: .ms10, bitrate: 15_000), mentioning: "20 ms")
        rejected(CodecConfiguration(kind: .speex, sampleRate: 16_000, bitrate: 15_000), mentioning: "narrowband")
        rejected(CodecConfiguration(kind: .speex, bitrate: 30_000), mentioning: "2150...24600")
        rejected(CodecConfiguration(kind: .speex, bitrate: 15_000, packetLossPercent: -1), mentioning: "0...100")
        #expect(throws: VoiceError.self) { _ = try makeDecoder(CodecConfiguration(kind: .speex, frameDuration: .ms10)) }
        #expect(throws: VoiceError.self) { _ = try OpusVoiceEncoder(CodecConfiguration(kind: .speex)) }

        let encoder = try? makeEncoder(CodecConfiguration(kind: .opus))
        #expect(throws: VoiceError.self) { try encoder?.setBitrate(1_000) }
        #expect(throws: VoiceError.self) { try encoder?.setPacketLossPercent(150) }
        #expect(encoder?.configuration.bitrate == 24_000)
    }

    @Test func libraryVersions() {
        let versions = codecLibraryVersions()
        #expect(versions.contains("libopus 1.") && versions.contains("speex 1."), "\(versions)")
    }
}
