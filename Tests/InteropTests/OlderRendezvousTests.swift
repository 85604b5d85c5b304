import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Rendezvous
import Secure
import TestSupport
import Testing
import Transport
import TusaBase

// `tusa party create --rendezvous` against an older rendezvous, one that knows no
// `place` (a relay's embedded rendezvous before directories placed rooms): it refuses
// the request as malformed and closes the connection. The CLI registers again and
// makes the room on the relay the rendezvous named at registration. The older server
// is today's relay behind a proxy that answers `place` as the older one did.

/// A TCP proxy to a rendezvous that passes every frame both ways, but answers a
/// client's `place` as a rendezvous that does not know it: a `malformed` error with no
/// request id, then the connection closed.
final class OlderRendezvousProxy: Sendable {
    let address: TransportAddress
    private let listener: any Channel
    private let counts = NIOLockedValueBox((connections: 0, placesRefused: 0))

    var connections: Int { counts.withLockedValue { $0.connections } }
    var placesRefused: Int { counts.withLockedValue { $0.placesRefused } }

    init(to upstream: TransportAddress) async throws {
        let counts = self.counts
        listener = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { client in
                counts.withLockedValue { $0.connections += 1 }
                let toServer = ClientBootstrap(group: client.eventLoop)
                    .channelInitializer { server in
                        server.eventLoop.makeCompletedFuture {
                            try server.pipeline.syncOperations.addHandler(Relay(to: client))
                        }
                    }
                    .connect(host: "127.0.0.1", port: Int(upstream.port))
                return client.eventLoop.makeCompletedFuture {
                    try client.pipeline.syncOperations.addHandler(
                        ClientSide(server: toServer) { counts.withLockedValue { $0.placesRefused += 1 } })
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        address = try #require(listener.localAddress.flatMap(TransportAddress.init))
    }

    func close() async { try? await listener.close() }

    /// Server to client: bytes as they come; the server's close closes the client.
    private final class Relay: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        private let client: any Channel
        init(to client: any Channel) { self.client = client }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            client.writeAndFlush(unwrapInboundIn(data), promise: nil)
        }
        func channelInactive(context: ChannelHandlerContext) { client.close(promise: nil) }
    }

    /// Client to server, frame by frame.
    private final class ClientSide: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        private let server: EventLoopFuture<any Channel>
        private let refused: @Sendable () -> Void
        private var framer = RendezvousFrame()

        init(server: EventLoopFuture<any Channel>, refused: @escaping @Sendable () -> Void) {
            self.server = server
            self.refused = refused
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let bytes = Array(buffer: unwrapInboundIn(data))
            guard let frames = try? framer.append(bytes) else { return context.close(promise: nil) }
            for frame in frames {
                if case .place? = try? RendezvousMessage(decoding: frame) {
                    refused()
                    let refusal = RendezvousFrame.frame(
                        .error(code: .malformed, detail: "unknown message type 'place'", id: nil))
                    let channel = context.channel
                    context.writeAndFlush(NIOAny(channel.allocator.buffer(bytes: refusal))).whenComplete { _ in
                        channel.close(promise: nil)
                    }
                    server.whenSuccess { $0.close(promise: nil) }
                    return
                }
                let framed = RendezvousFrame.frame(body: frame)
                server.whenSuccess { $0.writeAndFlush($0.allocator.buffer(bytes: framed), promise: nil) }
            }
        }

        func channelInactive(context: ChannelHandlerContext) {
            server.whenSuccess { $0.close(promise: nil) }
        }
    }
}

@Suite("tusa party create against an older rendezvous")
struct OlderRendezvousTests {
    @Test(
        "an older rendezvous closes the connection over place: the creator registers again and makes the room on the relay it named",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func aNewRoomGoesToTheRelayAnOlderRendezvousNames() async throws {
        let tusa = try #require(Harness.tusa)
        let relay = try Harness.Background(
            tusa, ["relay", "--listen", "127.0.0.1:0", "--no-tcp", "--party-port", "0", "--rendezvous-port", "0"])
        defer { relay.kill() }
        let line = try #require(await relay.waitForMatch(#"rendezvous tcp 127\.0\.0\.1:[0-9]+"#), "\(relay.stderr)")
        let rendezvous = try #require(TransportAddress(String(line.dropFirst("rendezvous tcp ".count))))
        let proxy = try await OlderRendezvousProxy(to: rendezvous)
        // A friend online at the rendezvous: the invitation goes through the connection
        // registered again (the first one is closed).
        let friend = PrivateKey.generate()
        let online = try await RendezvousConnection.connect(to: rendezvous, identity: friend, timeout: .seconds(10))
        let creator = try Harness.Background(
            tusa,
            [
                "party", "create", "Quake", "--rendezvous", "\(proxy.address)", "--invite", friend.publicKey.base64, "--in",
                "tone", "--duration", "2", "--quiet",
            ])
        defer { creator.kill() }
        let created = try #require(
            await creator.waitForMatch(#"party [a-z0-9-]+"#, timeout: 20), "\(creator.stdout) \(creator.stderr)")
        #expect(await creator.waitForExit(timeout: 20))
        #expect(creator.status == 0, "\(creator.stdout) \(creator.stderr)")
        // The room is on the relay behind the older rendezvous, after one refused place
        // and a second registration.
        let room = String(created.dropFirst("party ".count))
        #expect(relay.stderr.contains("room=\(room)"), "\(relay.stderr)")
        #expect(proxy.placesRefused == 1)
        #expect(proxy.connections == 2)
        let invitation = await Harness.next(online.incoming, within: .seconds(10))
        #expect(invitation != nil, "the friend was not invited")
        await online.close()
        await proxy.close()
    }
}
