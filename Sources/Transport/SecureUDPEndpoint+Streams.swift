import Logging
import NIOCore
import NIOExtras
import NIOPosix
import NIOSSL
import NIOTLS
import Secure
import Synchronization
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
            .channelOption(.writeBufferWaterMark, value: StreamFraming.writeWaterMark)
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
    /// is closed on accept, before any TLS work. With `streamLoop`, the listener and
    /// its connections live on that loop instead of the endpoint's: a TLS handshake
    /// costs a millisecond of CPU, and a flood of them must not hold up the media
    /// the endpoint's loop carries. The stream table stays on the endpoint's loop;
    /// each read's frames hop to it together, and a connection whose frames that
    /// loop has not yet taken reach ``StreamInbox/highWater`` bytes stops reading
    /// until they are down to ``StreamInbox/lowWater``. A connection that brings no
    /// whole frame for `readTimeout` is closed: a member's session sends at least a
    /// keepalive every 10 s, and bytes trickled into a frame that never completes
    /// (slowloris) do not count. Returns the bound address.
    @discardableResult
    public func listenForStreams(
        host: String, port: Int, maxStreams: Int = 4096, tls: NIOSSLContext? = nil, admission: ConnectionAdmission? = nil,
        streamLoop: (any EventLoop)? = nil, readTimeout: Duration = .seconds(30)
    ) async throws(SecureTransportError) -> TransportAddress {
        let loop = eventLoop
        let childLoop = streamLoop ?? loop
        let engine = self.engineOnLoop
        let counter = NIOLoopBoundBox.makeBoxSendingValue(UInt64(0), as: UInt64.self, eventLoop: loop)
        var bootstrap = ServerBootstrap(group: childLoop, childGroup: childLoop)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelOption(.writeBufferWaterMark, value: StreamFraming.writeWaterMark)
        if childLoop !== loop {
            // What one wake-up reads bounds what one hop carries past the high water.
            bootstrap = bootstrap.childChannelOption(.maxMessagesPerRead, value: 1)
                .childChannelOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: StreamInbox.readSize))
        }
        bootstrap = bootstrap.childChannelInitializer { stream in
            // On the accept loop, before anything else: the admission (thread-safe), so that
            // a refused connection costs the endpoint's loop nothing.
            if let refusal = admission?.admit(stream) {
                return stream.eventLoop.makeFailedFuture(SecureTransportError.stream("refused (\(refusal.rawValue) limit)", nil))
            }
            // On the endpoint's loop: the stream's place among the engine's.
            let admitted = Self.run(on: loop) { () throws -> TransportAddress in
                guard !engine.value.isClosed else { throw SecureTransportError.closed }
                guard engine.value.streams.count < maxStreams else {
                    throw SecureTransportError.stream("too many streams", nil)
                }
                counter.value &+= 1
                let remotePort = UInt16(clamping: stream.remoteAddress?.port ?? 0)
                let address = TransportAddress(ip: .v6(high: 0x0100_0000_0000_0000, low: counter.value), port: remotePort)
                engine.value.streams[address] = stream
                // The entry goes with the connection however it ends (one that fails
                // before it was active never sees channelInactive).
                stream.closeFuture.whenComplete { _ in
                    _ = Self.run(on: loop) {
                        if engine.value.streams[address] === stream { engine.value.streams[address] = nil }
                    }
                }
                return address
            }
            // On the connection's own loop: its handlers.
            return admitted.hop(to: stream.eventLoop).flatMapThrowing { address in
                if let tls { try stream.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls)) }
                // Only whole frames count as heard: a connection that never handshakes, or
                // trickles a frame, holds no slot long.
                let idle = TimeAmount.nanoseconds(Int64(clamping: readTimeout.nanoseconds))
                if childLoop === loop {
                    try StreamFraming.install(on: stream, readTimeout: idle) { frame in
                        engine.value.receivedFromStream(frame, from: address)
                    }
                } else {
                    let inbox = StreamInbox(stream, of: self)
                    try StreamFraming.install(on: stream, readTimeout: idle) { frame in
                        inbox.add(frame)
                    } readComplete: {
                        guard let (frames, bytes) = inbox.takeBatch() else { return }
                        loop.execute {
                            for frame in frames {
                                // Not for a connection that ended meanwhile (its address may answer no more).
                                guard engine.value.streams[address] === stream else { break }
                                engine.value.receivedFromStream(frame, from: address)
                            }
                            inbox.taken(bytes)
                        }
                    }
                }
            }
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
            try await onLoop { engine in
                // Closed meanwhile: nothing would close this listener later.
                guard !engine.isClosed else { throw SecureTransportError.closed }
                engine.streamListeners.append(listener)
            }
        } catch {
            try? await listener.close()
            throw error
        }
        return local
    }

    /// `body` now when on `loop`, else queued to it.
    private static func run<T: Sendable>(on loop: any EventLoop, _ body: @escaping @Sendable () throws -> T)
        -> EventLoopFuture<T>
    {
        if loop.inEventLoop {
            return loop.makeCompletedFuture(Result { try body() })
        }
        return loop.submit(body)
    }

    /// Times since start that a stream on another loop (``listenForStreams(host:port:maxStreams:tls:admission:streamLoop:readTimeout:)``)
    /// stopped reading until this endpoint's loop had taken its frames.
    public var streamReadsHeld: UInt64 { streamPauses.load(ordering: .relaxed) }

    /// The most bytes of one stream's frames (on another loop) that waited for this
    /// endpoint's loop at once since start: at most 80 KiB (the 64 KiB at which a
    /// stream stops reading, and the 16 KiB of the read that crossed it).
    public var streamBacklogPeakBytes: Int { streamBacklogPeak.load(ordering: .relaxed) }

    /// Streams given up since start because UDP worked again.
    public func streamsLeftForUDP() async -> UInt64 { (try? await onLoop { $0.streamsLeftForUDP }) ?? 0 }
}

/// A connection's frames on their way to the endpoint's loop from the loop the
/// connection lives on: each read's frames go together, and once ``highWater``
/// bytes of them wait there, the connection stops reading (TCP's window then holds
/// the sender back) until the endpoint's loop has taken them down to ``lowWater``.
/// A busy media loop so holds at most ``highWater`` + ``readSize`` bytes of a
/// connection's, however fast its client writes.
final class StreamInbox: Sendable {
    static let highWater = 64 * 1024
    static let lowWater = 16 * 1024
    /// Bytes one read takes at most (one read per wake-up).
    static let readSize = 16 * 1024
    private let stream: any Channel
    private let endpoint: SecureUDPEndpoint
    private let state = Mutex((waiting: 0, paused: false))
    /// This read's frames, on the connection's loop.
    private let batch: NIOLoopBoundBox<(frames: [ByteBuffer], bytes: Int)>

    /// On the connection's loop.
    init(_ stream: any Channel, of endpoint: SecureUDPEndpoint) {
        self.stream = stream
        self.endpoint = endpoint
        batch = NIOLoopBoundBox(([], 0), eventLoop: stream.eventLoop)
    }

    /// On the connection's loop: a frame of this read.
    func add(_ frame: ByteBuffer) {
        batch.value.frames.append(frame)
        batch.value.bytes += frame.readableBytes
    }

    /// On the connection's loop, at the end of a read: this read's frames, counted as
    /// waiting (nil when there were none); reading stops when too many wait.
    func takeBatch() -> ([ByteBuffer], Int)? {
        guard !batch.value.frames.isEmpty else { return nil }
        let (frames, bytes) = batch.value
        batch.value = ([], 0)
        let (pause, waiting) = state.withLock { state in
            state.waiting += bytes
            guard state.waiting >= Self.highWater, !state.paused else { return (false, state.waiting) }
            state.paused = true
            return (true, state.waiting)
        }
        endpoint.streamBacklogPeak.max(waiting, ordering: .relaxed)
        if pause {
            endpoint.streamPauses.add(1, ordering: .relaxed)
            try? stream.syncOptions?.setOption(.autoRead, value: false)
        }
        return (frames, bytes)
    }

    /// On the endpoint's loop, once it took a batch of `bytes`.
    func taken(_ bytes: Int) {
        let resume = state.withLock { state in
            state.waiting -= bytes
            guard state.paused, state.waiting <= Self.lowWater else { return false }
            state.paused = false
            return true
        }
        // (A closed connection reads no more: nothing to resume, and its loop may be gone.)
        guard resume, stream.isActive else { return }
        stream.eventLoop.execute { [self] in
            // Paused again since (more frames came first): the next drain resumes it.
            guard !state.withLock({ $0.paused }) else { return }
            try? stream.syncOptions?.setOption(.autoRead, value: true)
        }
    }
}

/// RFC 4571 framing on a TCP channel: a 16-bit big-endian length before each datagram.
enum StreamFraming {
    /// What a stream may have queued toward its peer before it counts as full and
    /// datagrams for it are dropped (``SecureUDPEndpoint/droppedOnFullStreams()``):
    /// a peer that stops reading costs at most this much, not all it is sent. 256 KiB
    /// holds a minute of one voice or seconds of a room's; a backlog older than that
    /// would be dropped by the listener's jitter buffer anyway.
    static let writeWaterMark = ChannelOptions.Types.WriteBufferWaterMark(low: 64 * 1024, high: 256 * 1024)

    /// `received` for each frame, `readComplete` at the end of each read (after its
    /// frames), `closed` when the stream ends. With `readTimeout`, the stream is closed
    /// once no whole frame has come for that long (the timer sits behind the decoder:
    /// bytes of a frame not yet whole do not reset it).
    static func install(
        on channel: Channel, readTimeout: TimeAmount? = nil, received: @escaping (ByteBuffer) -> Void,
        readComplete: @escaping () -> Void = {}, closed: @escaping () -> Void = {}
    ) throws {
        let handlers: [any ChannelHandler] = [
            ByteToMessageHandler(LengthFieldBasedFrameDecoder(lengthFieldBitLength: .twoBytes)),
            LengthFieldPrepender(lengthFieldBitLength: .twoBytes),
        ]
        try channel.pipeline.syncOperations.addHandlers(
            handlers + (readTimeout.map { [IdleStateHandler(readTimeout: $0)] } ?? [])
                + [DatagramHandler(received: received, readComplete: readComplete, closed: closed)])
    }

    /// Hands each frame on; reports each read's end and the stream's.
    final class DatagramHandler: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        private let received: (ByteBuffer) -> Void
        private let readComplete: () -> Void
        private let closed: () -> Void

        init(received: @escaping (ByteBuffer) -> Void, readComplete: @escaping () -> Void, closed: @escaping () -> Void) {
            self.received = received
            self.readComplete = readComplete
            self.closed = closed
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            received(unwrapInboundIn(data))
        }

        func channelReadComplete(context: ChannelHandlerContext) {
            readComplete()
            context.fireChannelReadComplete()
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
