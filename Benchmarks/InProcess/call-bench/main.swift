import Call
import Foundation
import Logging
import Relay
import Rendezvous
import STUN
import Secure
import ServiceLifecycle
import Synchronization
import Transport
import TusaBase
import Voice

// `call-bench`: real calls on loopback, in one process (one monotonic clock for
// both ends): a rendezvous, a callee, a caller playing a click train; then a
// party through the relay with the same clicks, codec and playout (Party.swift).
// - dial to first audio: the caller's dial until the first packet of the callee's
//   audio is played at the caller;
// - stack-added mouth-to-ear: a click "spoken" at the start of a frame (the frame
//   is handed over when complete, so one frame of packetisation counts) until the
//   callee's sink is handed the frame holding its onset, over the real call
//   (codec, sealing, UDP, jitter buffer, both audio clocks). Device buffers excluded.

func run(frameMs: Int, seconds: Int) async throws -> (dial: Double?, mouthToEar: [Double], report: CallReport) {
    var logger = Logger(label: "call-bench")
    logger.logLevel = .error
    let service = RendezvousService(address: TransportAddress(ip: .v4(0x7F00_0001), port: 0), logger: logger)
    let group = ServiceGroup(configuration: .init(services: [service], logger: logger))
    let running = Task { try await group.run() }
    defer { running.cancel() }
    let server = try await service.boundAddress()

    var options = CallAgent.Options()
    options.codec.frameDuration = FrameDuration(rawValue: frameMs) ?? .ms20
    let frames = seconds * 1000 / frameMs
    let calleeIdentity = Identity.generate()
    let callerIdentity = Identity.generate()
    let calleeConnection = try await RendezvousConnection.connect(to: server, identity: calleeIdentity.privateKey)
    let callerConnection = try await RendezvousConnection.connect(to: server, identity: callerIdentity.privateKey)
    let sink = TimedSink()
    let callee = CallAgent(rendezvous: calleeConnection, identity: calleeIdentity, options: options, logger: logger)
    let answering = Task { try await callee.answer(source: NullSource(sampleRate: 8000), sink: sink) }
    try await Task.sleep(for: .milliseconds(100))
    let source = ClickSource(frame: options.codec.samplesPerFrame, period: max(2, 400 / frameMs), frames: frames)
    let caller = CallAgent(rendezvous: callerConnection, identity: callerIdentity, options: options, logger: logger)
    let report = try await caller.call(calleeIdentity.publicKey, source: source, sink: nil)
    _ = try? await answering.value
    await calleeConnection.close()
    await callerConnection.close()
    await group.triggerGracefulShutdown()

    return (report.dialToFirstAudioMilliseconds, mouthToEar(source, sink, frameMs: frameMs), report)
}

let seconds = Int(CommandLine.arguments.dropFirst().first ?? "") ?? 10
print("## Calls on loopback (call-bench, \(seconds) s per call, Opus 8 kHz 24 kb/s, direct path)")
print()
print("| frame | dial → first audio (ms) | mouth-to-ear median / p95 / max (ms) | clicks | target |")
print("|---|---|---|---|---|")
var failed = false
var callMedians: [Int: Double] = [:]
for (frameMs, target) in [(20, 45.0), (10, 25.0)] {
    do {
        let (dial, delays, _) = try await run(frameMs: frameMs, seconds: seconds)
        let med = median(delays)
        callMedians[frameMs] = med
        let ok = med <= target && (dial ?? .infinity) < 200
        if !ok { failed = true }
        print(
            String(
                format: "| %d ms | %.0f | %.1f / %.1f / %.1f | %d | ≤ %.0f ms, dial < 200 ms: %@ |",
                frameMs, dial ?? .nan, med, percentile(delays, 0.95), delays.max() ?? .nan, delays.count, target,
                ok ? "met" : "NOT met"))
    } catch {
        print("| \(frameMs) ms | call failed: \(error) | | | |")
        failed = true
    }
}

// A party through the relay beside the call (issue 15: within 5 ms of a direct call),
// with the party's default playout (`PartyVoice.defaultPlayout`: no floor, as a call's)
// and with a frame held (`--min-delay` of a frame).
print()
print("## A party through the relay, beside the direct call (call-bench, \(seconds) s, same codec)")
print()
print("| frame | playout | party mouth-to-ear median / p95 / max (ms) | call median (ms) | party − call (ms) | clicks | target |")
print("|---|---|---|---|---|---|---|")
for frameMs in [20, 10] {
    for held in [false, true] {
        do {
            let delays = try await runParty(frameMs: frameMs, seconds: seconds, holdAFrame: held)
            let med = median(delays)
            let call = callMedians[frameMs] ?? .nan
            let ok = med - call <= 5
            if !ok && !held { failed = true }
            let verdict =
                held
                ? String(format: "a frame held by design (%+.1f ms)", med - call)
                : "within 5 ms of the call: \(ok ? "met" : "NOT met")"
            print(
                String(
                    format: "| %d ms | %@ | %.1f / %.1f / %.1f | %.1f | %+.1f | %d | %@ |",
                    frameMs, held ? "a frame held (--min-delay \(frameMs))" : "party default", med,
                    percentile(delays, 0.95), delays.max() ?? .nan, call, med - call, delays.count, verdict))
        } catch {
            print("| \(frameMs) ms | \(held ? "a frame held" : "party default") | party failed: \(error) | | | | |")
            failed = true
        }
    }
}
exit(failed ? 2 : 0)
