import Dispatch
import Foundation
import ICE
import NIOPosix
import STUN
import Testing
import Transport

// Our ICE agent (ICEUDPEndpoint, real UDP on loopback) against aioice's, in both
// roles: the harness swaps their descriptions as JSON lines, both run real
// connectivity checks, both must select the same pair, and data then flows
// both ways over it.

private struct WireDescription: Codable {
    var ufrag: String
    var pwd: String
    var candidates: [String]
}

private let script = Harness.packageRoot.appendingPathComponent("Tests/InteropTests/peers/aioice_ice.py").path

@Suite("ICE against aioice", .serialized)
struct ICEInteropTests {
    @Test(
        .enabled(if: Harness.python != nil, "needs .venv with aioice (make test sets it up)"),
        arguments: [ICERole.controlling, ICERole.controlled])
    func connectivityChecksCompleteWithAioice(ours: ICERole) async throws {
        let python = try #require(Harness.python)
        let theirs = ours == .controlling ? "controlled" : "controlling"
        let clock = ContinuousClock()
        let start = clock.now
        let peer = try Harness.Background(python, [script, theirs, "--timeout", "30"], withInput: true)
        defer { peer.kill() }
        let offerLine = await peer.waitForMatch(#"\{"ufrag"[^\n]*\}"#, timeout: 15)
        let offer = try JSONDecoder().decode(
            WireDescription.self, from: Data(try #require(offerLine, "aioice said: \(peer.stdout) \(peer.stderr)").utf8))
        let remote = ICEDescription(
            credentials: ICECredentials(ufrag: offer.ufrag, pwd: offer.pwd),
            candidates: try offer.candidates.map { try ICECandidate(sdp: $0) })
        #expect(!remote.candidates.isEmpty, "aioice offered no candidates: \(offer)")

        // An event loop of its own: the suite's other tests load the shared ones, and
        // what is measured here is the exchange with aioice, not their turn on a loop.
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { group.shutdownGracefully { _ in } }
        let me = try await ICEUDPEndpoint.bind(host: "127.0.0.1", role: ours, group: group)
        let local = try await me.localDescription()
        let answer = WireDescription(
            ufrag: local.credentials.ufrag, pwd: local.credentials.pwd, candidates: local.candidates.map(\.sdp))
        let offered = clock.now - start
        peer.send(String(decoding: try JSONEncoder().encode(answer), as: UTF8.self) + "\n")
        let answered = clock.now - start

        let pair: ICEPair
        do { pair = try await me.connect(to: remote, timeout: .seconds(15)) } catch {
            Issue.record(
                "our agent: \(error) (from the peer's start: answer ready at \(offered), sent at \(answered), gave up at \(clock.now - start)); aioice: \(peer.stdout) \(peer.stderr)"
            )
            await me.close()
            return
        }
        let connected = await peer.waitForMatch(#"\{"connected"[^\n]*\}"#, timeout: 15)
        let line = try #require(connected, "aioice did not connect: \(peer.stdout) \(peer.stderr)")
        // Both selected the same pair.
        #expect(
            line.contains("\"local\": \"\(pair.remote.address)\"") || line.contains("\"local\":\"\(pair.remote.address)\""),
            "\(line) vs \(pair)")
        #expect(line.contains("\(me.localAddress)"), "\(line) vs \(me.localAddress)")
        #expect(pair.local.candidate.address == me.localAddress)

        // Data both ways over the pair.
        let hello = await next(me.incoming, within: .seconds(10))
        #expect(hello.map { String(decoding: $0, as: UTF8.self) } == "hello from aioice", "\(peer.stdout) \(peer.stderr)")
        try await me.send(Array("hello from tusa".utf8))
        let bye = await next(me.incoming, within: .seconds(10))
        #expect(bye.map { String(decoding: $0, as: UTF8.self) } == "bye from aioice", "\(peer.stdout) \(peer.stderr)")
        _ = await peer.waitForExit(timeout: 10)
        let status = peer.status
        #expect(status == 0, "\(peer.stdout) \(peer.stderr)")
        #expect(
            peer.stdout.contains(#""received": "hello from tusa""#) || peer.stdout.contains(#""received":"hello from tusa""#),
            "\(peer.stdout)")
        await me.close()
    }

    @Test func aDescriptionWithBadCredentialsIsATypedError() async throws {
        let me = try await ICEUDPEndpoint.bind(host: "127.0.0.1", role: .controlling)
        await #expect(throws: ICEEndpointError.self) {
            try await me.connect(to: ICEDescription(credentials: ICECredentials(ufrag: "x", pwd: "y"), candidates: []))
        }
        await #expect(throws: ICEEndpointError.notConnected) { try await me.send([1, 2, 3]) }
        await me.close()
    }
}
