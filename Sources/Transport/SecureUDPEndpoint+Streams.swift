import Logging
import NIOCore
import NIOExtras
import NIOPosix
import NIOSSL
import NIOTLS
import Secure
import TusaBase

/// The secure session over TCP where UDP does not pass: each datagram framed
/// as RFC 4571 frames RTP on a connection-oriented transport (a 16-bit length,
/// then the bytes), on the endpoint's own event loop; optionally inside TLS, for
/// networks that pass only TLS (port 443). The session core sees the same
/// datagrams either way; only the route differs. A peer reached over a stream
/// that answers over UDP again is moved back to UDP (the stream closes).
///
/// TLS here is a way through, not the security: the Noise session inside it
/// proves the peer's static key and seals every datagram, so the client takes
/// any certificate (a relay's self-signed one included) and checks the key.
extension SecureUDPEndpoint {
    /// Reaches `address` over a TCP connection from now on (every datagram for
    /// it, handshakes included, goes framed on the stream), for a network that
    /// blocks UDP; with `tls`, inside a TLS connection (returns once its handshake
    /// is done). Call ``restartHandshake(with:)`` after it to send a fresh
    /// initiation down the new route at once.
    public func useStream(to address: TransportAddress, tls: Bool = false, timeout: Duration = .seconds(5))
        async throws(SecureTransportError)
    {
        let loop = eventLoop
        let started = ContinuousClock.now
        let secured: EventLoopPromise<Void>? = tls ? loop.makePromise() : nil
        var bootstrap = ClientBootstrap(group: loop)
            .connectTimeout(.nanoseconds(max(1, timeout.nanoseconds)))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
        if let secured {
            bootstrap = bootstrap.channelInitializer { channel in
                do {
                    let context = try StreamTLS.clientContext.get()
                    try channel.pipeline.syncOperations.addHandlers([
                        NIOSSLClientHandler(context: context, serverHostname: nil),
                        StreamTLS.HandshakeWatch(done: secured),
                    ])
                    return loop.makeSucceededVoidFuture()
                } catch {
                    secured.fail(error)
                    return loop.makeFailedFuture(error)
                }
            }
        }
        let name = tls ? "TLS" : "TCP"
        let stream: Channel
        do {
            stream = try await bootstrap.connect(to: SocketAddress(address)).get()
        } catch {
            secured?.fail(error)
            throw .stream("cannot reach \(address) over \(name)", ErrorCause(error))
        }
        if let secured {
            let left = timeout - started.duration(to: .now)
            let expiry = loop.scheduleTask(in: .nanoseconds(max(1, left.nanoseconds))) {
                secured.fail(StreamTLS.HandshakeTimeout())
            }
            do {
                try await secured.futureResult.get()
                expiry.cancel()
            } catch {
                expiry.cancel()
                try? await stream.close()
                throw .stream("no TLS handshake with \(address)", ErrorCause(error))
            }
        }
        do {
            try await onLoop { engine in
                let bound = NIOLoopBound(engine, eventLoop: loop)
                try StreamFraming.install(on: stream) { frame in
                    bound.value.receivedFromStream(frame, from: address)
                } closed: {
                    if bound.value.streams[address] === stream { bound.value.streams[address] = nil }
                }
                engine.streams[address]?.close(promise: nil)
                engine.streams[address] = stream
            }
        } catch {
            try? await stream.close()
            throw error
        }
    }

    /// Whether `address` is reached over a stream now.
    public func usesStream(to address: TransportAddress) async -> Bool {
        (try? await onLoop { $0.streams[address] != nil }) ?? false
    }

    /// Sends a fresh handshake initiation to the peer now (after its route changed).
    public func restartHandshake(with peer: PeerID) async {
        _ = try? await onLoop { $0.host.handle(.restartHandshake(peer)) }
    }

    /// Sends the next datagram for stream-routed `address` over UDP instead: a
    /// probe of whether UDP passes again. The peer, hearing it, moves to our UDP
    /// address; its next datagram over UDP moves us back to UDP (the stream closes).
    /// Send something that the peer answers right after (a ping) to hear soon.
    public func probeUDP(to address: TransportAddress) {
        let engine = self.engineOnLoop
        eventLoop.execute {
            if engine.value.streams[address] != nil { engine.value.probeUDP.insert(address) }
        }
    }

    /// Accepts streams on TCP `host`:`port` (0: any) beside the UDP socket: each
    /// connection is a peer of its own, under a stand-in address in the
    /// discard-only prefix 100::/64 (RFC 6666), so that it never meets a real UDP
    /// source. With `tls`, each connection is TLS first (a server context: the
    /// certificate clients see). With `admission`, a connection over its limits
    /// (in all, or from one source: shared by the listeners given the same one)
    /// is closed on accept, before any TLS work. Returns the bound address.
    @discardableResult
    public func listenForStreams(
        host: String, port: Int, maxStreams: Int = 4096, tls: NIOSSLContext? = nil, admission: ConnectionAdmission? = nil
    ) async throws(SecureTransportError) -> TransportAddress {
        let loop = eventLoop
        let engine = self.engineOnLoop
        let counter = NIOLoopBoundBox.makeBoxSendingValue(UInt64(0), as: UInt64.self, eventLoop: loop)
        let bootstrap = ServerBootstrap(group: loop, childGroup: loop)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { stream in
                // Initializers run on the child's loop, which is the endpoint's.
                guard engine.value.streams.count < maxStreams else {
                    return loop.makeFailedFuture(SecureTransportError.stream("too many streams", nil))
                }
                if let refusal = admission?.admit(stream) {
                    return loop.makeFailedFuture(SecureTransportError.stream("refused (\(refusal.rawValue) limit)", nil))
                }
                counter.value &+= 1
                let remotePort = UInt16(clamping: stream.remoteAddress?.port ?? 0)
                let address = TransportAddress(ip: .v6(high: 0x0100_0000_0000_0000, low: counter.value), port: remotePort)
                do {
                    if let tls { try stream.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls)) }
                    // A member's session sends at least a keepalive every 10 s: a stream silent
                    // for 30 s is closed (a connection that never handshakes holds no slot long;
                    // behind TLS, only whole records count as heard).
                    try stream.pipeline.syncOperations.addHandler(IdleStateHandler(readTimeout: .seconds(30)))
                    try StreamFraming.install(on: stream) { frame in
                        engine.value.receivedFromStream(frame, from: address)
                    } closed: {
                        if engine.value.streams[address] === stream { engine.value.streams[address] = nil }
                    }
                } catch {
                    return loop.makeFailedFuture(error)
                }
                engine.value.streams[address] = stream
                return loop.makeSucceededVoidFuture()
            }
        let listener: Channel
        do {
            guard let ip = IPAddress(host), (0...65535).contains(port) else {
                throw IOError(errnoCode: EINVAL, reason: "not an IP address and port")
            }
            let address = TransportAddress(ip: ip, port: UInt16(port))
            listener = try await bootstrap.listen(on: address, listener: "streams \(address)", logger: logger)
        } catch {
            throw .bind("\(tls == nil ? "tcp" : "tls") \(host):\(port)", ErrorCause(error))
        }
        guard let local = listener.localAddress.flatMap(TransportAddress.init) else {
            try? await listener.close()
            throw .noLocalAddress
        }
        do {
            try await onLoop { $0.streamListeners.append(listener) }
        } catch {
            try? await listener.close()
            throw error
        }
        return local
    }

    /// Streams given up since start because UDP worked again.
    public func streamsLeftForUDP() async -> UInt64 { (try? await onLoop { $0.streamsLeftForUDP }) ?? 0 }
}

/// RFC 4571 framing on a TCP channel: a 16-bit big-endian length before each datagram.
enum StreamFraming {
    static func install(
        on channel: Channel, received: @escaping (ByteBuffer) -> Void, closed: @escaping () -> Void
    ) throws {
        try channel.pipeline.syncOperations.addHandlers([
            ByteToMessageHandler(LengthFieldBasedFrameDecoder(lengthFieldBitLength: .twoBytes)),
            LengthFieldPrepender(lengthFieldBitLength: .twoBytes),
            DatagramHandler(received: received, closed: closed),
        ])
    }

    /// Hands each frame on; reports the stream's end.
    final class DatagramHandler: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        private let received: (ByteBuffer) -> Void
        private let closed: () -> Void

        init(received: @escaping (ByteBuffer) -> Void, closed: @escaping () -> Void) {
            self.received = received
            self.closed = closed
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            received(unwrapInboundIn(data))
        }

        func channelInactive(context: ChannelHandlerContext) {
            closed()
            context.fireChannelInactive()
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if event is IdleStateHandler.IdleStateEvent {
                context.close(promise: nil)
            } else {
                context.fireUserInboundEventTriggered(event)
            }
        }

        func errorCaught(context: ChannelHandlerContext, error: Error) {
            // A reset, or a frame the decoder refused: the stream ends, the session may move on.
            context.close(promise: nil)
        }
    }
}

/// TLS around a stream: the client's context, and the wait for the handshake.
enum StreamTLS {
    /// TLS 1.2 or later, any certificate: the Noise session inside proves the peer.
    static let clientContext: Result<NIOSSLContext, any Error> = Result {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.minimumTLSVersion = .tlsv12
        configuration.certificateVerification = .none
        return try NIOSSLContext(configuration: configuration)
    }

    struct HandshakeTimeout: Error, CustomStringConvertible {
        var description: String { "timed out" }
    }

    /// Fulfils `done` when the TLS handshake completes, fails it when the
    /// connection errs or ends first; passes everything on.
    final class HandshakeWatch: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        private let done: EventLoopPromise<Void>

        init(done: EventLoopPromise<Void>) { self.done = done }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if case .handshakeCompleted = event as? TLSUserEvent { done.succeed() }
            context.fireUserInboundEventTriggered(event)
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            done.fail(error)
            context.fireErrorCaught(error)
        }

        func channelInactive(context: ChannelHandlerContext) {
            done.fail(ChannelError.eof)
            context.fireChannelInactive()
        }
    }
}
