import Testing

@testable import Voice

@Suite struct CodecConfigurationTests {
    @Test func framesAreWholeSamples() {
        #expect(FrameDuration.ms20.samples(atRate: 8000) == 160)
        #expect(FrameDuration.ms10.samples(atRate: 8000) == 80)
        #expect(CodecConfiguration(sampleRate: 16000, frameDuration: .ms10).samplesPerFrame == 160)
        #expect(CodecConfiguration().timestampStep == 160)
    }
}
