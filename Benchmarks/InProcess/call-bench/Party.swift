import Call
import Foundation
import Logging
import Party
import Relay
import STUN
import Secure
import ServiceLifecycle
import Transport
import TusaBase
import Voice

/// A party's mouth-to-ear through the relay, measured as the call's is: a
/// `PartyService` on loopback, a speaker playing the click train and a listener
/// recording, each a `PartyConnection` with its `PartyVoice` (the same codec and
/// 5 ms audio clock as a call; the party's default playout, or that with a frame
/// held). The path adds the relay's hop: the
/// speaker's frame is sealed end to end, then for the hop, opened by the relay,
/// sealed again for the listener, opened twice.
func runParty(frameMs: Int, seconds: Int, holdAFrame: Bool) async throws -> [Double] {
    var logger = Logger(label: "call-bench.party")
    logger.logLevel = .error
    let service = PartyService(
        address: TransportAddress(ip: .v4(0x7F00_0001), port: 0), identity: .generate(), streamPorts: [],
        logger: logger)
    let group = ServiceGroup(configuration: .init(services: [service], logger: logger))
    let running = Task { try await group.run() }
    defer { running.cancel() }
    let relay = try await service.boundAddress()

    var options = CallAgent.Options()
    options.codec.frameDuration = FrameDuration(rawValue: frameMs) ?? .ms20
    let source = ClickSource(
        frame: options.codec.samplesPerFrame, period: max(2, 400 / frameMs), frames: seconds * 1000 / frameMs)
    let sink = TimedSink()
    var playout = PartyVoice.defaultPlayout(for: options.codec)
    if holdAFrame { playout.minimumDelayMilliseconds = frameMs }
    let speaking = try PartyVoice(codec: options.codec, source: source, sink: nil)
    let listening = try PartyVoice(codec: options.codec, source: nil, sink: sink, playout: playout)
    let speaker = try await PartyConnection.connect(
        to: relay, relayKey: service.identity.publicKey, identity: .generate(), transport: .udp, audio: speaking.audioHandler,
        logger: logger)
    let listener = try await PartyConnection.connect(
        to: relay, relayKey: service.identity.publicKey, identity: .generate(), transport: .udp,
        audio: listening.audioHandler, logger: logger)
    let room = try await speaker.create(name: "call-bench")
    _ = try await listener.join(room.room)
    // Clicks start once the listener holds the speaker's key.
    let deadline = ContinuousClock.now + .seconds(5)
    while (try? await listener.read { $0.keyring.hasKey(from: room.me) }) != true, ContinuousClock.now < deadline {
        try await Task.sleep(for: .milliseconds(5))
    }
    listening.start(sending: listener)
    speaking.start(sending: speaker)
    while !speaking.sourceEnded { try await Task.sleep(for: .milliseconds(50)) }
    try await Task.sleep(for: .milliseconds(500))
    await speaking.stop()
    await listening.stop()
    await speaker.close()
    await listener.close()
    await group.triggerGracefulShutdown()
    return mouthToEar(source, sink, frameMs: frameMs)
}
