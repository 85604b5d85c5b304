import Call
import Foundation
import Logging
import Party
import Relay
import Secure
import ServiceLifecycle
import Synchronization
import Testing
import Transport
import TusaBase
import Voice

/// Members of one room who encode differently, in-process: a `PartyService` on
/// loopback and `PartyVoice`s on real `PartyConnection`s. Each speaker's format
/// comes with its sender key; a listener decodes it as it is and resamples a
/// speaker at another rate into its own.
@Suite(.serialized) struct PartyVoiceFormatTests {
    /// What a listener plays, kept (a real sink, into memory).
    final class Recording: AudioSink, @unchecked Sendable {
        let sampleRate: Int
        private let samples = Mutex<[Int16]>([])
        init(sampleRate: Int) { self.sampleRate = sampleRate }
        func write(_ s: UnsafeBufferPointer<Int16>) throws(VoiceError) { samples.withLock { $0 += s } }
        func close() {}
        var all: [Int16] { samples.withLock { $0 } }
    }

    /// A relay's party service on loopback for `body`.
    static func withRelay(_ body: (TransportAddress, PublicKey, Logger) async throws -> Void) async throws {
        var logger = Logger(label: "test.party-format")
        logger.logLevel = .error
        let service = PartyService(
            address: TransportAddress(ip: .v4(0x7F00_0001), port: 0), identity: .generate(), streamPorts: [], logger: logger)
        let group = ServiceGroup(configuration: .init(services: [service], logger: logger))
        let running = Task { try await group.run() }
        defer { running.cancel() }
        try await body(try await service.boundAddress(), service.identity.publicKey, logger)
        await group.triggerGracefulShutdown()
    }

    /// A speaker and a listener, each on a connection of its own with its member
    /// configuration, in one room: the speaker's source played to its end, then
    /// `settle` for its last frames. The speaker's member id.
    static func speak(
        _ speaking: PartyVoice, as speaker: PartyMember.Configuration, to listening: PartyVoice,
        listening listener: PartyMember.Configuration, through relay: (TransportAddress, PublicKey, Logger),
        settle: Duration
    ) async throws -> MemberID {
        let (address, key, logger) = relay
        let speakerConnection = try await PartyConnection.connect(
            to: address, relayKey: key, identity: .generate(), transport: .udp, configuration: speaker,
            audio: speaking.audioHandler, logger: logger)
        let listenerConnection = try await PartyConnection.connect(
            to: address, relayKey: key, identity: .generate(), transport: .udp, configuration: listener,
            audio: listening.audioHandler, logger: logger)
        let room = try await speakerConnection.create(name: "formats")
        _ = try await listenerConnection.join(room.room)
        #expect(
            await eventually(within: .seconds(5)) {
                (try? await listenerConnection.read { $0.keyring.hasKey(from: room.me) }) == true
            })
        listening.start(sending: listenerConnection)
        speaking.start(sending: speakerConnection)
        #expect(await eventually(within: .seconds(10)) { speaking.sourceEnded })
        try await Task.sleep(for: settle)
        await speaking.stop()
        await listening.stop()
        await speakerConnection.close()
        await listenerConnection.close()
        return room.me
    }

    /// The power of `x` at `frequency` (Goertzel), per sample.
    static func power(_ x: ArraySlice<Int16>, at frequency: Double, rate: Int) -> Double {
        let w = 2 * Double.pi * frequency / Double(rate)
        let c = 2 * cos(w)
        var (s1, s2) = (0.0, 0.0)
        for v in x {
            let s = Double(v) + c * s1 - s2
            (s2, s1) = (s1, s)
        }
        return (s1 * s1 + s2 * s2 - c * s1 * s2) / Double(max(1, x.count * x.count))
    }

    struct Pair: Sendable, CustomTestStringConvertible {
        var speaker: CodecConfiguration
        var listener: CodecConfiguration
        var testDescription: String {
            func name(_ c: CodecConfiguration) -> String { "\(c.kind) \(c.sampleRate) Hz \(c.frameDuration.milliseconds) ms" }
            return "\(name(speaker)) heard at \(name(listener))"
        }
    }

    static let pairs = [
        Pair(
            speaker: CodecConfiguration(kind: .l16, sampleRate: 16_000, frameDuration: .ms10, inbandFEC: false),
            listener: CodecConfiguration()),
        Pair(
            speaker: CodecConfiguration(kind: .speex),
            listener: CodecConfiguration(kind: .opus, sampleRate: 16_000, frameDuration: .ms10)),
    ]

    /// A 1 kHz tone for 2 s from a speaker at one rate and frame, heard by a listener
    /// at another: at its pitch, for as long as it was said.
    @Test(arguments: pairs)
    func aSpeakerAtAnotherRateIsHeardAtItsPitchAndPace(_ pair: Pair) async throws {
        try await Self.withRelay { relay, relayKey, logger in
            let speakerCodec = pair.speaker
            let listenerCodec = pair.listener
            let rate = listenerCodec.sampleRate
            let tone = ToneSource(frequency: 1000, amplitude: 0.3, sampleRate: speakerCodec.sampleRate, durationSeconds: 2)
            let recording = Recording(sampleRate: rate)
            let speaking = try PartyVoice(codec: speakerCodec, source: tone, sink: nil)
            let listening = try PartyVoice(codec: listenerCodec, source: nil, sink: recording)
            var announcing = PartyMember.Configuration()
            announcing.audioFormat = speaking.announcedFormat
            var listenerConfiguration = PartyMember.Configuration()
            listenerConfiguration.audioFormat = listening.announcedFormat
            let me = try await Self.speak(
                speaking, as: announcing, to: listening, listening: listenerConfiguration, through: (relay, relayKey, logger),
                settle: .milliseconds(500))

            let heard = listening.speakers
            try #require(heard.count == 1, "\(heard)")
            #expect(
                heard[0].codec.kind == speakerCodec.kind && heard[0].codec.sampleRate == speakerCodec.sampleRate
                    && heard[0].codec.frameDuration == speakerCodec.frameDuration, "\(heard[0].codec)")
            let frames = 2000 / speakerCodec.frameDuration.milliseconds
            #expect(heard[0].packetsReceived >= frames * 95 / 100, "\(heard[0])")  // sent on loopback
            // The tone, at its pitch: 1 kHz at the listener's rate, not 500 Hz or 2 kHz
            // (a stream played at half or twice its rate)…
            let samples = recording.all
            let loud = samples.indices.filter { abs(Int(samples[$0])) > 3000 }
            let first = try #require(loud.first, "the listener played nothing loud")
            let last = try #require(loud.last)
            let middle = samples[(first + rate / 5)..<max(first + rate / 5, last - rate / 5)]
            let at1k = Self.power(middle, at: 1000, rate: rate)
            let at500 = Self.power(middle, at: 500, rate: rate)
            let at2k = Self.power(middle, at: 2000, rate: rate)
            #expect(at1k > 100 * max(at500, at2k), "1 kHz \(at1k), 500 Hz \(at500), 2 kHz \(at2k)")
            // …and for as long as it was said: 2 s (a stream paced at the wrong rate
            // plays longer; one whose chunks were lost, shorter).
            let seconds = Double(last - first) / Double(rate)
            #expect((1.9...2.15).contains(seconds), "the tone played for \(seconds) s")
            // The speaker's report stays when it leaves, its jitter buffer not.
            listening.forget(me)
            #expect(listening.speakers.map(\.packetsReceived) == [heard[0].packetsReceived])
        }
    }

    /// A speaker that said nothing of its format (an older member, or frames before
    /// the format came) and then says it encodes as this member does keeps its jitter
    /// buffer; one that says another decoder gets a new one, and so does one that
    /// said a format and then says none.
    @Test func aFormatSaidLaterKeepsTheBufferWhenItDecodesTheSame() throws {
        let voice = try PartyVoice(codec: CodecConfiguration(), source: nil, sink: nil)
        let m = MemberID(3)
        func frame(_ n: UInt16, _ format: PartyAudioFormat?) {
            let header = PartyFrameHeader(
                sender: m, sequence: n, timestamp: UInt32(n) * 160, level: .silence, sframe: SFrameHeader(keyID: 1, counter: 0))
            voice.audioHandler(m, header, [0xF8, 0xFF, 0xFE], format)
        }
        frame(1, nil)
        frame(2, PartyAudioFormat(codec: "opus", sampleRate: 8000, frameMilliseconds: 20))
        frame(3, PartyAudioFormat(codec: "opus", sampleRate: 8000, frameMilliseconds: 20))
        #expect(voice.speakers.map(\.jitterBuffers) == [1])
        frame(4, PartyAudioFormat(codec: "speex", sampleRate: 8000, frameMilliseconds: 20))
        #expect(voice.speakers.map(\.jitterBuffers) == [2])
        #expect(voice.speakers.map(\.codec.kind) == [.speex])
        // One that said its format and now says none is someone else in the seat (an
        // older member): a new buffer, even where it decodes the same.
        frame(5, PartyAudioFormat(codec: "opus", sampleRate: 8000, frameMilliseconds: 20))
        frame(6, nil)
        #expect(voice.speakers.map(\.jitterBuffers) == [4])
        // Every frame that came is counted, whatever buffer it went to.
        #expect(voice.speakers.map(\.packetsReceived) == [6])
    }

    /// A speaker whose session was lost leaves the room and comes back to its seat:
    /// a new jitter buffer, and its frames counted from its first (a TCP member whose
    /// link hung reported a third of them).
    @Test func aSpeakerThatLeavesAndComesBackIsCountedWhole() throws {
        let voice = try PartyVoice(codec: CodecConfiguration(), source: nil, sink: nil)
        let m = MemberID(2)
        func frame(_ n: UInt16) {
            let header = PartyFrameHeader(
                sender: m, sequence: n, timestamp: UInt32(n) * 160, level: .silence, sframe: SFrameHeader(keyID: 1, counter: 0))
            voice.audioHandler(m, header, [0xF8, 0xFF, 0xFE], nil)
        }
        for n: UInt16 in 1...5 { frame(n) }
        voice.forget(m)
        #expect(voice.speakers.map(\.packetsReceived) == [5])
        for n: UInt16 in 6...8 { frame(n) }
        #expect(voice.speakers.map(\.packetsReceived) == [8])
        #expect(voice.speakers.map(\.jitterBuffers) == [2])
    }

    @Test func aSpeakerWhoseFormatThisBuildCannotDecodeIsNamedNotPlayed() async throws {
        try await Self.withRelay { relay, relayKey, logger in
            let codec = CodecConfiguration()
            let speaking = try PartyVoice(
                codec: codec, source: ToneSource(frequency: 440, amplitude: 0.3, sampleRate: 8000, durationSeconds: 1), sink: nil)
            let recording = Recording(sampleRate: 8000)
            let listening = try PartyVoice(codec: codec, source: nil, sink: recording)
            let told = Mutex<[(MemberID, String)]>([])
            listening.onUndecodableSpeaker = { member, why in told.withLock { $0.append((member, why)) } }
            // A member whose client says it sends G.722, which this build has no decoder for.
            var g722 = PartyMember.Configuration()
            g722.audioFormat = PartyAudioFormat(codec: "g722", sampleRate: 16_000, frameMilliseconds: 20)
            let me = try await Self.speak(
                speaking, as: g722, to: listening, listening: .init(), through: (relay, relayKey, logger),
                settle: .milliseconds(300))

            // Told once, though 50 frames came; named in the report; nothing played.
            let calls = told.withLock { $0 }
            #expect(calls.count == 1, "\(calls)")
            #expect(calls.first?.0 == me)
            #expect(calls.first?.1.contains("g722 16000 Hz 20 ms") == true, "\(calls)")
            #expect(listening.undecodableSpeakers[me]?.contains("g722") == true)
            #expect(listening.speakers.isEmpty, "\(listening.speakers)")
            #expect(recording.all.allSatisfy { $0 == 0 })
        }
    }
}
