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

    @Test func aSpeakerAt16kHzIsHeardAtItsPitchAndPaceByAListenerAt8kHz() async throws {
        try await Self.withRelay { relay, relayKey, logger in
            // L16 at 16 kHz in 10 ms frames, a 1 kHz tone for 2 s; the listener runs Opus at 8 kHz in 20 ms.
            let speakerCodec = CodecConfiguration(kind: .l16, sampleRate: 16_000, frameDuration: .ms10, inbandFEC: false)
            let listenerCodec = CodecConfiguration()
            let tone = ToneSource(frequency: 1000, amplitude: 0.3, sampleRate: 16_000, durationSeconds: 2)
            let recording = Recording(sampleRate: 8000)
            let speaking = try PartyVoice(codec: speakerCodec, source: tone, sink: nil)
            let listening = try PartyVoice(codec: listenerCodec, source: nil, sink: recording)
            var announcing = PartyMember.Configuration()
            announcing.audioFormat = speaking.announcedFormat
            let speaker = try await PartyConnection.connect(
                to: relay, relayKey: relayKey, identity: .generate(), transport: .udp, configuration: announcing,
                audio: speaking.audioHandler, logger: logger)
            var listenerConfiguration = PartyMember.Configuration()
            listenerConfiguration.audioFormat = listening.announcedFormat
            let listener = try await PartyConnection.connect(
                to: relay, relayKey: relayKey, identity: .generate(), transport: .udp, configuration: listenerConfiguration,
                audio: listening.audioHandler, logger: logger)
            let room = try await speaker.create(name: "formats")
            _ = try await listener.join(room.room)
            #expect(
                await eventually(within: .seconds(5)) { (try? await listener.read { $0.keyring.hasKey(from: room.me) }) == true })
            listening.start(sending: listener)
            speaking.start(sending: speaker)
            #expect(await eventually(within: .seconds(10)) { speaking.sourceEnded })
            try await Task.sleep(for: .milliseconds(500))
            await speaking.stop()
            await listening.stop()
            await speaker.close()
            await listener.close()

            let heard = listening.speakers
            try #require(heard.count == 1, "\(heard)")
            #expect(heard[0].codec.kind == .l16 && heard[0].codec.sampleRate == 16_000 && heard[0].codec.frameDuration == .ms10)
            #expect(heard[0].packetsReceived >= 190, "\(heard[0])")  // 200 frames sent on loopback
            // The tone, at its pitch: 1 kHz at the listener's 8 kHz, not 500 Hz or 2 kHz
            // (a 16 kHz stream played as 8 kHz, or the other way round)…
            let samples = recording.all
            let loud = samples.indices.filter { abs(Int(samples[$0])) > 3000 }
            let first = try #require(loud.first, "the listener played nothing loud")
            let last = try #require(loud.last)
            let middle = samples[(first + 1600)..<max(first + 1600, last - 1600)]
            let at1k = Self.power(middle, at: 1000, rate: 8000)
            let at500 = Self.power(middle, at: 500, rate: 8000)
            let at2k = Self.power(middle, at: 2000, rate: 8000)
            #expect(at1k > 100 * max(at500, at2k), "1 kHz \(at1k), 500 Hz \(at500), 2 kHz \(at2k)")
            // …and all of it: the 2 s of tone play for about as long (a stalled machine's
            // concealment may stretch it; a speaker paced at the wrong rate plays 500 Hz above).
            let seconds = Double(last - first) / 8000
            #expect(seconds >= 1.8, "the tone played for \(seconds) s")
        }
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
            let speaker = try await PartyConnection.connect(
                to: relay, relayKey: relayKey, identity: .generate(), transport: .udp, configuration: g722,
                audio: speaking.audioHandler, logger: logger)
            let listener = try await PartyConnection.connect(
                to: relay, relayKey: relayKey, identity: .generate(), transport: .udp, audio: listening.audioHandler,
                logger: logger)
            let room = try await speaker.create(name: "formats")
            _ = try await listener.join(room.room)
            #expect(
                await eventually(within: .seconds(5)) { (try? await listener.read { $0.keyring.hasKey(from: room.me) }) == true })
            listening.start(sending: listener)
            speaking.start(sending: speaker)
            #expect(await eventually(within: .seconds(10)) { speaking.sourceEnded })
            try await Task.sleep(for: .milliseconds(300))
            await speaking.stop()
            await listening.stop()
            await speaker.close()
            await listener.close()

            // Told once, though 50 frames came; named in the report; nothing played.
            let calls = told.withLock { $0 }
            #expect(calls.count == 1, "\(calls)")
            #expect(calls.first?.0 == room.me)
            #expect(calls.first?.1.contains("g722 16000 Hz 20 ms") == true, "\(calls)")
            #expect(listening.undecodableSpeakers[room.me]?.contains("g722") == true)
            #expect(listening.speakers.isEmpty, "\(listening.speakers)")
            #expect(recording.all.allSatisfy { $0 == 0 })
        }
    }
}
