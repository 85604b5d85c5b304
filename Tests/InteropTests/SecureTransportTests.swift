import Foundation
import ICE
import NIOCore
import NIOPosix
import STUN
import Secure
import TURN
import Testing
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#endif

// The secure UDP driver on real loopback sockets: direct, and through a real
// `tusa relay`. Every wait is bounded; every socket is loopback.

private let loopback = TransportAddress(ip: .v4(0x7F00_0001), port: 0)

/// Collects media and events from an endpoint's stream in the background.
private final class Collector: @unchecked Sendable {
    // Guarded by `lock`.
    private let lock = NSLock()
    private var _media: [(PeerID, RTPHeader, [UInt8])] = []
    private var _events: [SecureUDPEvent] = []
    private var task: Task<Void, Never>?

    init(_ endpoint: SecureUDPEndpoint) {
        task = Task { [weak self] in
            for await e in endpoint.events {
                guard let self else { return }
                self.lock.withLock {
                    if case .media(let p, let h, let payload) = e {
                        self._media.append((p, h, payload))
                    } else {
                        self._events.append(e)
                    }
                }
            }
        }
    }

    var media: [(PeerID, RTPHeader, [UInt8])] { lock.withLock { _media } }
    var events: [SecureUDPEvent] { lock.withLock { _events } }

    /// Waits up to `seconds` for `count` media packets.
    func waitForMedia(_ count: Int, seconds: Double = 10) async -> Bool {
        await eventually(within: .seconds(seconds), poll: .milliseconds(20)) { media.count >= count }
    }
}

private func frame(_ i: Int) -> [UInt8] { (0..<160).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ i) } }

/// Sends `count` frames each way (x's numbered from 0, y's from `offset`) and
/// checks that each side got the other's, intact and in order.
private func exchange(
    _ x: SecureUDPEndpoint, _ xToY: PeerID, _ cx: Collector, _ y: SecureUDPEndpoint, _ yToX: PeerID, _ cy: Collector,
    count: Int, offset: Int, payloadType: UInt8
) async {
    for i in 0..<count {
        x.send(frame(i), to: xToY, payloadType: payloadType, timestamp: UInt32(i * 160))
        y.send(frame(offset + i), to: yToX, payloadType: payloadType, timestamp: UInt32(i * 160))
    }
    let gotY = await cy.waitForMedia(count)
    let gotX = await cx.waitForMedia(count)
    #expect(gotY && gotX)
    #expect(cy.media.map(\.2) == (0..<count).map(frame), "in order and intact on loopback")
    #expect(cx.media.map(\.2) == (0..<count).map { frame(offset + $0) })
}

@Suite("Secure transport on loopback sockets", .serialized)
struct SecureTransportTests {
    /// A `tusa relay` on loopback with user alice that relays to loopback peers, and
    /// its UDP address. (Process waits run off the cooperative pool: a blocked pool
    /// thread stalls other suites' async tests.)
    /// A relay on `port` (0: the kernel's pick; a test that restarts it on the same
    /// number passes `Harness.freePort()`, where nothing takes the number in between).
    static func startRelay(port: UInt16 = 0) async throws -> (Harness.Background, TransportAddress) {
        let (relay, port) = try #require(
            try await Harness.startRelay([
                "--listen", "127.0.0.1:\(port)", "-r", "example.org", "-u", "alice:wonderland", "--allow-loopback-peers",
            ]))
        return (relay, TransportAddress(ip: .v4(0x7F00_0001), port: port))
    }

    /// Two endpoints on loopback with fresh identities.
    static func twoEndpoints() async throws -> (SecureUDPEndpoint, SecureUDPEndpoint) {
        (
            try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate()),
            try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate())
        )
    }

    @Test("handshake and media both ways, direct")
    func directCall() async throws {
        let a = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate())
        let b = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate())
        let ca = Collector(a)
        let cb = Collector(b)
        async let waiting = b.waitForPeer(a.publicKey)
        let bAtA = try await a.connect(to: b.publicKey, at: b.localAddress)
        let aAtB = try await waiting
        await exchange(a, bAtA, ca, b, aAtB, cb, count: 100, offset: 1000, payloadType: 111)
        let stats = try await b.statistics()
        #expect(stats.dropped.isEmpty, "\(stats.dropped)")
        #expect(cb.events.contains { if case .session(.established) = $0 { true } else { false } })
        await a.close()
        await b.close()
    }

    @Test(
        "a STUN server (tusa relay) tells the socket's address; a silent server is a timeout; a probe leaves the session where it is"
    )
    func reflexiveAddressAndProbe() async throws {
        let (relay, server) = try await Self.startRelay()
        defer { relay.kill() }
        let (a, b) = try await Self.twoEndpoints()
        #expect(try await a.reflexiveAddress(from: server) == a.localAddress)
        // Nobody answers here: retransmitted, then a timeout after the time given (long
        // enough past the last retransmission, at 300 ms, for a loaded machine to send it).
        let silent = try TestSocket.udp(bindingTo: .v4(0x7F00_0001))
        let started = ContinuousClock.now
        await #expect(throws: SecureTransportError.timeout) {
            try await a.reflexiveAddress(from: silent.localAddress, timeout: .milliseconds(900))
        }
        #expect(ContinuousClock.now - started >= .milliseconds(900))
        var requests = 0
        while try await Harness.offPool({ try silent.receive(timeout: 0.05) }) != nil { requests += 1 }
        #expect(requests == 3, "the request and its retransmissions at 100 and 300 ms")

        async let waiting = b.waitForPeer(a.publicKey)
        let bAtA = try await a.connect(to: b.publicKey, at: b.localAddress)
        _ = try await waiting
        // A probe of another address: two keepalives there, sealed for the peer; its session address stays.
        try await a.probe(bAtA, at: silent.localAddress)
        var probes: [[UInt8]] = []
        while let (bytes, _) = try await Harness.offPool({ try silent.receive(timeout: 0.5) }) { probes.append(bytes) }
        #expect(probes.count == 2)
        #expect(probes.allSatisfy { !$0.isEmpty && PacketKind.classify($0) == .rtp && PacketKind.isRTCP($0) })
        #expect(try await a.describe(bAtA)?.address == b.localAddress)
        await a.close()
        await b.close()
    }

    @Test("TUSA_KEYLOG in the environment turns the key log on, mode 0600")
    func keyLogFromTheEnvironment() async throws {
        let path = "/tmp/tusa-keylog-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).log"
        defer { unlink(path) }
        setenv("TUSA_KEYLOG", path, 1)
        let a = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate())
        unsetenv("TUSA_KEYLOG")
        let b = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate())
        async let waiting = b.waitForPeer(a.publicKey)
        let peer = try await a.connect(to: b.publicKey, at: b.localAddress)
        _ = try await waiting
        let ssrcs = try #require(try await a.describe(peer))
        await a.close()
        await b.close()
        let text = try String(contentsOfFile: path, encoding: .utf8)
        // (The environment is the process's: an endpoint another test binds meanwhile
        // logs here too. A's session is the one that must be there, both ways.)
        let keys = try KeyLog.parse(text)
        let remote = try #require(ssrcs.remote)
        #expect(keys[ssrcs.local]?.count == 1 && keys[remote]?.count == 1, "one key per direction: \(text)")
        var st = stat()
        #expect(stat(path, &st) == 0 && st.st_mode & 0o777 == 0o600)
    }

    @Test("a third endpoint's packets and replays are refused on real sockets")
    func strangersAreRefused() async throws {
        let a = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate())
        let b = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate())
        let cb = Collector(b)
        async let waiting = b.waitForPeer(a.publicKey)
        let bAtA = try await a.connect(to: b.publicKey, at: b.localAddress)
        _ = try await waiting
        a.send(frame(1), to: bAtA, payloadType: 111, timestamp: 0)
        #expect(await cb.waitForMedia(1))
        // Mallory: a plain UDP socket sending garbage, RTP-shaped forgeries and handshake noise.
        let mallory = try TestSocket.udp(bindingTo: .v4(0x7F00_0001))
        var rtp: [UInt8] = [0x80, 111, 0, 1, 0, 0, 0, 0] + [0, 0, 0, 0] + [UInt8](repeating: 0xAA, count: 176)
        if let (_, local, _) = try await a.describe(bAtA) {
            rtp[8] = UInt8(local >> 24)
            rtp[9] = UInt8(local >> 16 & 0xFF)
            rtp[10] = UInt8(local >> 8 & 0xFF)
            rtp[11] = UInt8(local & 0xFF)
        }
        for _ in 0..<20 {
            try mallory.sendDatagram(rtp, to: b.localAddress)
            try mallory.sendDatagram([4, 0, 0, 0] + [UInt8](repeating: 4, count: 148), to: b.localAddress)
            try mallory.sendDatagram([0xFF, 0x00], to: b.localAddress)
        }
        // Every forgery accounted for as a drop (none can still become media), then
        // a later legitimate frame on A's path still arrives, and only it.
        _ = try await eventually(within: .seconds(10)) {
            let s = try await b.statistics()
            return s.dropped[.authenticationFailed, default: 0] + s.dropped[.tooOld, default: 0] >= 20
                && s.dropped[.malformed, default: 0] >= 20 && s.handshakeDrops[.badMAC, default: 0] >= 20
        }
        a.send(frame(2), to: bAtA, payloadType: 111, timestamp: 160)
        #expect(await cb.waitForMedia(2))
        #expect(cb.media.map(\.2) == [frame(1), frame(2)])
        let stats = try await b.statistics()
        // The forged media fails authentication, or the replay window first if its sequence number is far behind.
        #expect(stats.dropped[.authenticationFailed, default: 0] + stats.dropped[.tooOld, default: 0] == 20, "\(stats.dropped)")
        #expect(stats.dropped[.malformed, default: 0] == 20, "\(stats.dropped)")
        #expect(stats.handshakeDrops[.badMAC, default: 0] == 20, "\(stats.handshakeDrops)")
        await a.close()
        await b.close()
    }

    @Test(
        "media rides TURN ChannelData through a real tusa relay, end to end sealed",
        .enabled(if: Harness.tusa != nil, "needs the built tusa binary"))
    func throughTusaRelay() async throws {
        let (relay, server) = try await Self.startRelay()
        defer { relay.kill() }
        let (a, b) = try await Self.twoEndpoints()
        let ca = Collector(a)
        let cb = Collector(b)
        // A sits behind the relay: B only ever talks to A's relayed address.
        let allocation = try await a.useRelay(server, configuration: .init(username: "alice", password: "wonderland"))
        try await a.reach(b.localAddress, viaRelay: true)
        async let waiting = a.waitForPeer(b.publicKey)
        let aAtB = try await b.connect(to: a.publicKey, at: allocation.relayed)
        let bAtA = try await waiting
        await exchange(b, aAtB, cb, a, bAtA, ca, count: 50, offset: 500, payloadType: 0)
        #expect(try await b.describe(aAtB)?.address == allocation.relayed, "B sees A only at the relay")
        await a.close()
        await b.close()
        #expect(await relay.stop() == 0)
        #expect(relay.stdout.contains("turn: "), "\(relay.stdout)")
    }

    @Test(
        "renewRelay keeps the allocation a relay still holds (media goes on through it) and allocates anew on one that restarted",
        .enabled(if: Harness.tusa != nil, "needs the built tusa binary"))
    func renewRelayKeepsWhatTheRelayStillHolds() async throws {
        let (relay, server) = try await Self.startRelay(port: Harness.freePort())
        let (a, b) = try await Self.twoEndpoints()
        let ca = Collector(a)
        let cb = Collector(b)
        let credentials = TURNClient.Configuration(username: "alice", password: "wonderland")
        let first = try await a.useRelay(server, configuration: credentials)
        try await a.reach(b.localAddress, viaRelay: true)
        async let waiting = a.waitForPeer(b.publicKey)
        let aAtB = try await b.connect(to: a.publicKey, at: first.relayed)
        let bAtA = try await waiting
        await exchange(b, aAtB, cb, a, bAtA, ca, count: 20, offset: 500, payloadType: 0)

        // The relay still holds it: the same relayed address, and the peer's channel still works.
        let kept = try await a.renewRelay(server, configuration: credentials)
        #expect(kept.relayed == first.relayed)
        #expect(kept.expiresAt > first.expiresAt, "refreshed, not just read back")
        for i in 0..<20 { b.send(frame(100 + i), to: aAtB, payloadType: 0, timestamp: UInt32(i * 160)) }
        #expect(await ca.waitForMedia(40), "B's media still reaches A through the kept allocation")

        // A relay restarted on the same port has forgotten it: 437, and a new allocation.
        relay.kill()
        _ = await relay.stop()
        let (again, port) = try #require(
            try await Harness.startRelay([
                "--listen", "127.0.0.1:\(server.port)", "-r", "example.org", "-u", "alice:wonderland", "--allow-loopback-peers",
            ]))
        defer { again.kill() }
        #expect(port == server.port)
        _ = try await a.renewRelay(server, configuration: credentials)
        // (The relay's log reaches us through a pipe: wait for the line, do not read at once.)
        let allocated = await again.waitFor(timeout: 10) { _, err in
            err.split(separator: "\n").contains { $0.contains("user=alice") && $0.hasSuffix(" allocation") }
        }
        #expect(allocated, "the restarted relay made a new allocation: \(again.stderr)")
        await a.close()
        await b.close()
        #expect(await again.stop() == 0)
    }

    @Test("ICE on the endpoint's socket: checks, the selected pair, then the handshake and media on it")
    func iceThenHandshake() async throws {
        let (a, b) = try await Self.twoEndpoints()
        let ca = Collector(a)
        let cb = Collector(b)
        let da = try await a.startICE(role: .controlling, candidates: [.host(a.localAddress, base: ICEBase.socket)])
        let db = try await b.startICE(role: .controlled, candidates: [.host(b.localAddress, base: ICEBase.socket)])
        async let bPair = b.connectICE(to: da, timeout: .seconds(5))
        let aPair = try await a.connectICE(to: db, timeout: .seconds(5))
        #expect(try await bPair.remote.address == a.localAddress)
        #expect(aPair.remote.address == b.localAddress && !aPair.isRelayed)
        async let waiting = b.waitForPeer(a.publicKey)
        let bAtA = try await a.connect(to: b.publicKey, at: aPair.remote.address)
        let aAtB = try await waiting
        try await a.followICE(bAtA)
        await exchange(a, bAtA, ca, b, aAtB, cb, count: 50, offset: 500, payloadType: 111)
        #expect(ca.events.contains(.ice(.selected(aPair))))
        // A second startICE is refused, and a bad peer description is a typed error.
        await #expect(throws: SecureTransportError.self) {
            try await a.startICE(role: .controlling, candidates: [.host(a.localAddress, base: 0)])
        }
        await #expect(throws: SecureTransportError.self) {
            try await a.connectICE(to: ICEDescription(credentials: ICECredentials(ufrag: "x", pwd: "y"), candidates: []))
        }
        await a.close()
        await b.close()
    }

    @Test("consent lost (RFC 7675): nothing more goes to the peer on the pair until an ICE restart selects it again")
    func consentLossStopsSendingUntilARestart() async throws {
        let (a, b) = try await Self.twoEndpoints()
        let ca = Collector(a)
        let cb = Collector(b)
        var quick = ICEConfiguration()
        quick.consentInterval = .milliseconds(200)
        quick.consentTimeout = .seconds(3)
        let da = try await a.startICE(
            role: .controlling, candidates: [.host(a.localAddress, base: ICEBase.socket)], configuration: quick)
        let db = try await b.startICE(role: .controlled, candidates: [.host(b.localAddress, base: ICEBase.socket)])
        async let bPair = b.connectICE(to: da, timeout: .seconds(5))
        let aPair = try await a.connectICE(to: db, timeout: .seconds(5))
        _ = try await bPair
        async let waiting = b.waitForPeer(a.publicKey)
        let bAtA = try await a.connect(to: b.publicKey, at: aPair.remote.address)
        let aAtB = try await waiting
        try await a.followICE(bAtA)
        await exchange(a, bAtA, ca, b, aAtB, cb, count: 20, offset: 500, payloadType: 111)

        // B restarts and tells A nothing: A's consent checks carry the old credentials, B refuses them.
        let db2 = try await b.restartICE()
        // (The engine marks the pair withdrawn before it reports the loss.)
        let lost = await eventually(within: .seconds(10), poll: .milliseconds(50)) {
            ca.events.contains(.ice(.consentLost(aPair)))
        }
        #expect(lost, "A never lost B's consent: \(ca.events)")

        // A withholds everything from B; B (its pair still selected) still reaches A.
        let before = cb.media.count
        let heardFromB = ca.media.count
        for i in 0..<20 { a.send(frame(100 + i), to: bAtA, payloadType: 111, timestamp: UInt32((100 + i) * 160)) }
        for i in 0..<20 { b.send(frame(900 + i), to: aAtB, payloadType: 111, timestamp: UInt32((100 + i) * 160)) }
        #expect(await ca.waitForMedia(heardFromB + 20), "B's media still reaches A")
        // A's sends ran on its event loop before this count: all 20 were withheld.
        // Any that went out anyway would reach B before the frames sent after the
        // restart, the sentinels checked below.
        #expect(await a.withheldByConsent() >= 20)
        #expect(cb.media.count == before, "A sent \(cb.media.count - before) packets after B withdrew its consent")

        // A restart on both sides selects the pair again: A's media flows.
        let da2 = try await a.restartICE()
        async let bAgain = b.connectICE(to: da2, timeout: .seconds(5))
        let aAgain = try await a.connectICE(to: db2, timeout: .seconds(5))
        _ = try await bAgain
        #expect(aAgain.remote.address == b.localAddress)
        for i in 0..<20 { a.send(frame(200 + i), to: bAtA, payloadType: 111, timestamp: UInt32((200 + i) * 160)) }
        #expect(await cb.waitForMedia(before + 20), "A's media flows again after the restart")
        #expect(cb.media.dropFirst(before).map(\.2) == (200..<220).map(frame), "what was withheld was not sent late")
        await a.close()
        await b.close()
    }

    @Test(
        "ICE with a relayed candidate over TURN/TCP: the peer reaches A only at the relay",
        .enabled(if: Harness.tusa != nil, "needs the built tusa binary"))
    func iceThroughTURNOverTCP() async throws {
        let (relay, server) = try await Self.startRelay()
        defer { relay.kill() }
        let (a, b) = try await Self.twoEndpoints()
        let ca = Collector(a)
        let cb = Collector(b)
        let allocation = try await a.useRelay(server, over: .tcp, configuration: .init(username: "alice", password: "wonderland"))
        let da = try await a.startICE(
            role: .controlling, candidates: [.relayed(allocation.relayed, mapped: allocation.mapped, base: ICEBase.relay)])
        let db = try await b.startICE(role: .controlled, candidates: [.host(b.localAddress, base: ICEBase.socket)])
        async let bPair = b.connectICE(to: da, timeout: .seconds(8))
        let aPair = try await a.connectICE(to: db, timeout: .seconds(8))
        #expect(aPair.isRelayed && aPair.local.candidate.type == .relay)
        #expect(try await bPair.remote.address == allocation.relayed)
        async let waiting = a.waitForPeer(b.publicKey)
        let aAtB = try await b.connect(to: a.publicKey, at: allocation.relayed)
        let bAtA = try await waiting
        await exchange(b, aAtB, cb, a, bAtA, ca, count: 50, offset: 500, payloadType: 0)
        #expect(try await b.describe(aAtB)?.address == allocation.relayed, "B sees A only at the relay")
        await a.close()
        await b.close()
        #expect(await relay.stop() == 0)
    }

    @Test(
        "tshark reads the sealed media as RTP without keys; tusa interop decrypt opens it with the key log",
        .enabled(
            if: Harness.tusa != nil && Harness.which("tshark") != nil && Harness.isRoot,
            "needs tusa, tshark and root to capture on lo"))
    func captureDecodesAsRTPAndDecryptsWithTheKeyLog() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tusa-secure-\(UUID())").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let keylog = dir + "/keys.log"
        let capture = dir + "/call.pcapng"
        let dump = dir + "/call.rtpdump"
        let a = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate(), keyLogPath: keylog)
        let b = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate())
        let cb = Collector(b)
        let port = b.localAddress.port
        let probe = try TestSocket.udp(bindingTo: .v4(0x7F00_0001))
        let tshark = try Harness.Background(
            try #require(Harness.which("tshark")),
            [
                "-i", "lo", "-f", "udp port \(port) or udp port \(probe.localAddress.port)", "-w", capture, "-q", "-a",
                "duration:60",
            ])
        defer { tshark.kill() }
        #expect(
            await tshark.waitFor(timeout: 15) { _, err in err.contains("Capturing on") }, "tshark did not start: \(tshark.stderr)"
        )
        #expect(await Harness.syncCapture(capture, probe: probe), "the capture saw no probe: \(tshark.stderr)")
        async let waiting = b.waitForPeer(a.publicKey)
        let bAtA = try await a.connect(to: b.publicKey, at: b.localAddress)
        _ = try await waiting
        for i in 0..<40 {
            a.send(frame(i), to: bAtA, payloadType: 0, timestamp: UInt32(i * 160))
            try await Task.sleep(for: .milliseconds(5))  // pacing, not a wait
        }
        #expect(await cb.waitForMedia(40))
        #expect(await Harness.syncCapture(capture, probe: probe), "the capture fell behind: \(tshark.stderr)")
        #expect(await tshark.stop() == 0, "tshark: \(tshark.stderr)")
        await a.close()
        await b.close()
        let ssrc = try #require(cb.media.first?.1.ssrc)

        // Without keys: RTP fields (SSRC, sequence numbers) as Wireshark shows them.
        let fields = try await Harness.run(
            try #require(Harness.which("tshark")),
            [
                "-r", capture, "-d", "udp.port==\(port),rtp", "-Y", "rtp && rtp.p_type == 0", "-T", "fields", "-e", "rtp.ssrc",
                "-e", "rtp.seq",
            ])
        let rows = fields.stdout.split(separator: "\n").map { $0.split(separator: "\t") }
        #expect(rows.count == 40, "\(fields.stdout) \(fields.stderr)")
        #expect(rows.allSatisfy { $0.first.map { UInt32($0.dropFirst(2), radix: 16) } == ssrc })
        let seqs = rows.compactMap { $0.last.flatMap { Int($0) } }
        #expect(zip(seqs, seqs.dropFirst()).allSatisfy { ($1 - $0 + 65536) % 65536 == 1 })

        // With the key log: every media packet opens; the rtpdump holds the plaintext.
        let decrypt = try await Harness.run(
            try #require(Harness.tusa), ["interop", "decrypt", capture, "--keylog", keylog, "--out", dump])
        #expect(decrypt.status == 0, "\(decrypt.stdout) \(decrypt.stderr)")
        #expect(decrypt.stdout.contains("SSRC 0x\(String(ssrc, radix: 16)): 40 media"), "\(decrypt.stdout)")
        let written = try [UInt8](Data(contentsOf: URL(fileURLWithPath: dump)))
        #expect(written.starts(with: Array("#!rtpplay1.0".utf8)))
        for i in [0, 17, 39] {
            #expect(written.firstRange(of: frame(i)) != nil, "frame \(i) in the clear in the rtpdump")
        }
        // A wrong key log opens nothing and says so.
        try "TUSA_MEDIA_KEY \(String(format: "%08x", ssrc)) \(String(repeating: "ab", count: 32))\n".write(
            toFile: keylog, atomically: true, encoding: .utf8)
        let wrong = try await Harness.run(try #require(Harness.tusa), ["interop", "decrypt", capture, "--keylog", keylog])
        #expect(wrong.status == 1, "\(wrong.stdout)")
    }
}
