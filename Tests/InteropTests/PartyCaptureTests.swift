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

private let quiet: Logger = {
    var logger = Logger(label: "tusa.test.party-capture")
    logger.logLevel = .error
    return logger
}()

/// A party as an operator sees it: a capture of the relay's party port reads as
/// RTP without keys; with the relay's own key log, `tusa interop decrypt` opens
/// the hop-by-hop layer and finds party frames whose audio is still sealed. A
/// member's key log (its session's keys and the sender keys it holds) opens them.
@Suite(.serialized) struct PartyCaptureTests {
    @Test(
        .enabled(
            if: Harness.tusa != nil && Harness.which("tshark") != nil && Harness.isRoot,
            "needs tusa, tshark and root to capture on lo"))
    func theOperatorOpensItsOwnLayerAndFindsTheVoiceSealed() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tusa-party-\(UUID())").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let keylog = dir + "/relay-keys.log"
        let memberLog = dir + "/bob-keys.log"
        let memberDump = dir + "/bob.rtpdump"
        let capture = dir + "/party.pcapng"
        let dump = dir + "/party.rtpdump"
        let service = PartyService(
            address: TransportAddress(ip: .v4(0x7F00_0001), port: 0), identity: .generate(), keyLogPath: keylog,
            logger: quiet)
        let group = ServiceGroup(configuration: .init(services: [service], logger: quiet))
        let running = Task { try await group.run() }
        defer { running.cancel() }
        let relay = try await service.boundAddress()
        let relayKey = service.identity.publicKey

        let probe = try TestSocket.udp(bindingTo: .v4(0x7F00_0001))
        let tshark = try Harness.Background(
            try #require(Harness.which("tshark")),
            [
                "-i", "lo", "-f", "udp port \(relay.port) or udp port \(probe.localAddress.port)", "-w", capture, "-q", "-a",
                "duration:60",
            ])
        defer { tshark.kill() }
        #expect(
            await tshark.waitFor(timeout: 15) { _, err in err.contains("Capturing on") }, "tshark did not start: \(tshark.stderr)"
        )
        #expect(await Harness.syncCapture(capture, probe: probe), "the capture saw no probe: \(tshark.stderr)")

        let heard = Heard()
        // Over UDP, what the capture holds (on a busy machine TCP might win the race).
        let alice = try await PartyConnection.connect(
            to: relay, relayKey: relayKey, identity: .generate(), transport: .udp, logger: quiet)
        let bob = try await PartyConnection.connect(
            to: relay, relayKey: relayKey, identity: .generate(), transport: .udp, keyLogPath: memberLog,
            audio: { _, _, audio, _ in heard.add(audio) }, logger: quiet)
        let room = try await alice.create(name: "Hearthstone")
        _ = try await bob.join(room.room)
        // Bob holds Alice's key once her key message arrived; then her voice.
        let words = (0..<40).map { i in Array("the words of frame \(i) said in the room".utf8) }
        #expect(await eventually(within: .seconds(10)) { (try? await bob.read { $0.keyring.hasKey(from: room.me) }) == true })
        for (i, w) in words.enumerated() {
            alice.send(w, timestamp: UInt32(i * 160), level: AudioLevel(level: 20, voiced: true))
            try await Task.sleep(for: .milliseconds(5))  // pacing, not a wait
        }
        #expect(await eventually(within: .seconds(10)) { heard.count >= 40 }, "bob heard \(heard.count)")
        #expect(await Harness.syncCapture(capture, probe: probe), "the capture fell behind: \(tshark.stderr)")
        #expect(await tshark.stop() == 0, "tshark: \(tshark.stderr)")
        await alice.close()
        await bob.close()
        await group.triggerGracefulShutdown()

        // Without keys: the hop layer reads as RTP of payload type 111, both ways through the relay.
        let fields = try await Harness.run(
            try #require(Harness.which("tshark")),
            [
                "-r", capture, "-d", "udp.port==\(relay.port),rtp", "-Y", "rtp && rtp.p_type == 111", "-T", "fields",
                "-e", "rtp.ssrc",
            ])
        let rows = fields.stdout.split(separator: "\n")
        #expect(rows.count >= 80, "\(rows.count) RTP packets: \(fields.stderr)")
        #expect(Set(rows).count >= 4, "one SSRC per direction of each member's session: \(Set(rows))")

        // With the relay's key log the operator opens its own layer: party frames, the words still sealed.
        let decrypt = try await Harness.run(
            try #require(Harness.tusa), ["interop", "decrypt", capture, "--keylog", keylog, "--out", dump])
        #expect(decrypt.status == 0, "\(decrypt.stdout) \(decrypt.stderr)")
        let opened = try [UInt8](Data(contentsOf: URL(fileURLWithPath: dump)))
        #expect(opened.starts(with: Array("#!rtpplay1.0".utf8)))
        #expect(opened.firstRange(of: Array("Hearthstone".utf8)) != nil, "the relay's own layer: control messages in the clear")
        for w in words {
            #expect(opened.firstRange(of: w) == nil, "\(String(decoding: w, as: UTF8.self)) readable by the relay")
        }
        #expect(heard.all.sorted { $0.lexicographicallyPrecedes($1) } == words.sorted { $0.lexicographicallyPrecedes($1) })

        // With Bob's key log: his session with the relay, and the sender keys he holds, open every frame he got.
        let asBob = try await Harness.run(
            try #require(Harness.tusa), ["interop", "decrypt", capture, "--keylog", memberLog, "--out", memberDump])
        #expect(asBob.status == 0, "\(asBob.stdout) \(asBob.stderr)")
        #expect(asBob.stdout.contains("party member \(room.me): 40 voice frames opened, 0 failed"), "\(asBob.stdout)")
        let bobs = try [UInt8](Data(contentsOf: URL(fileURLWithPath: memberDump)))
        for w in words {
            #expect(bobs.firstRange(of: w) != nil, "\(String(decoding: w, as: UTF8.self)) not opened with Bob's keys")
        }
    }
}

private final class Heard: Sendable {
    private let frames = Mutex<[[UInt8]]>([])
    func add(_ audio: [UInt8]) { frames.withLock { $0.append(audio) } }
    var count: Int { frames.withLock { $0.count } }
    var all: [[UInt8]] { frames.withLock { $0 } }
}
