import ICE
import Logging
import NIOCore
import NIOPosix
import STUN
import Secure
import Synchronization
import TURN
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// What a `SecureUDPEndpoint` reports.
public enum SecureUDPEvent: Sendable, Equatable {
    /// What the session core reported (key-log lines go to the key log file instead).
    case session(SecureEvent)
    /// An authenticated media packet (when no media handler was given).
    case media(PeerID, RTPHeader, payload: [UInt8])
    /// What the ICE agent reported, when ICE runs on the endpoint (``SecureUDPEndpoint/startICE(role:candidates:credentials:stunServer:gatherTimeout:configuration:)``).
    case ice(ICEEvent)
}

/// Errors of the secure UDP driver.
public enum SecureTransportError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The socket could not be bound to the address; the system's error is the cause.
    case bind(String, ErrorCause)
    /// The bound socket reports no local address.
    case noLocalAddress
    case closed
    case timeout
    case handshakeFailed
    case send(SecureSendError)
    case relay(TURNClientError)
    case keyLog(String)
    case ice(ICEEndpointError)
    /// A stream (the session over TCP, RFC 4571) could not be opened or accepted.
    case stream(String, ErrorCause?)

    public var description: String {
        switch self {
        case .bind(let address, let cause): "cannot bind \(address): \(TURNClientConnection.describe(cause.error))"
        case .noLocalAddress: "the bound socket has no local address"
        case .closed: "the endpoint is closed"
        case .timeout: "timed out"
        case .handshakeFailed: "the peer did not answer the handshake"
        case .send(let e): "cannot send: \(e)"
        case .relay(let e): "relay: \(e)"
        case .keyLog(let s): "key log: \(s)"
        case .ice(let e): "\(e)"
        case .stream(let what, let cause): cause.map { "\(what): \(TURNClientConnection.describe($0.error))" } ?? what
        }
    }
}

/// A SwiftNIO UDP driver for a `SecureEndpoint`: one socket carries the
/// handshake, sealed RTP media and control, STUN Binding answers, and TURN
/// traffic to a relay when a peer is reached through one — demultiplexed by
/// the first byte (RFC 7983). Reads are batched (recvmmsg), writes are flushed
/// once per read burst or call.
///
/// ```swift
/// let me = try await SecureUDPEndpoint.bind(identity: id)
/// let peer = try await me.connect(to: theirKey, at: theirAddress)
/// me.send(frame, to: peer, payloadType: 111, timestamp: ts)
/// for await event in me.events { … }
/// ```
///
/// Through a relay: `try await me.useRelay(server, configuration:)` allocates
/// on a TURN server over this same socket; `try await me.reach(peerAddress,
/// viaRelay: true)` binds a channel, after which everything to that address
/// rides in ChannelData, still end-to-end sealed: the relay holds no keys.
public final class SecureUDPEndpoint: Sendable {
    private let channel: Channel
    private let engine: NIOLoopBound<SecureEngine>
    /// The engine, for this module's extensions (used only on `eventLoop`).
    var engineOnLoop: NIOLoopBound<SecureEngine> { engine }
    /// Times a stream living on another loop stopped reading until this endpoint's loop took its frames.
    let streamPauses = Atomic<UInt64>(0)
    /// The most bytes of one such stream's frames that waited for this endpoint's loop at once.
    let streamBacklogPeak = Atomic<Int>(0)
    public let localAddress: TransportAddress
    public let publicKey: PublicKey
    /// Where the endpoint's drivers log (its stream listener's accept failures).
    let logger: Logger
    /// Events, in order (the newest 8,192 kept if the reader falls behind).
    public let events: AsyncStream<SecureUDPEvent>

    /// Called on the event loop for each authenticated media packet, with the
    /// plaintext payload valid only during the call (no copy, no allocation).
    public typealias MediaHandler = @Sendable (PeerID, RTPHeader, UnsafeRawBufferPointer) -> Void

    /// Called on the event loop for each session event (a peer established, gone,
    /// moved), before it is yielded on `events`: for a driver whose state must
    /// follow the sessions packet by packet (a session opened before its first
    /// media is handed over).
    public typealias SessionHandler = @Sendable (SecureEvent) -> Void

    private init(
        channel: Channel, engine: NIOLoopBound<SecureEngine>, localAddress: TransportAddress, publicKey: PublicKey,
        events: AsyncStream<SecureUDPEvent>, logger: Logger
    ) {
        self.channel = channel
        self.engine = engine
        self.localAddress = localAddress
        self.publicKey = publicKey
        self.events = events
        self.logger = logger
    }

    /// Binds a UDP socket (port 0: any) and starts the endpoint.
    ///
    /// - Parameter keyLogPath: append media keys to this file (mode 0600), for
    ///   `tusa interop decrypt`; when nil, the `TUSA_KEYLOG` environment variable
    ///   names the file, like SSLKEYLOGFILE for TLS. Off when neither is set.
    /// - Parameter socketBufferBytes: the socket's receive and send buffers (the
    ///   kernel caps them at net.core.rmem_max / wmem_max); the kernel's default
    ///   when nil. A relay serving many members asks for more, so that a burst that
    ///   comes while its loop is busy waits instead of being dropped.
    /// - Parameter boundSocket: a UDP socket the caller bound (`host` and `port`
    ///   are then only named in errors): the endpoint owns it from here on, failed
    ///   or not. A driver that writes some datagrams itself (``sealOnLoop(_:to:payloadType:timestamp:into:)``)
    ///   keeps a duplicate of it.
    public static func bind(
        host: String = "0.0.0.0", port: Int = 0, identity: Identity, configuration: SecureConfiguration = .init(),
        keyLogPath: String? = nil, mediaHandler: MediaHandler? = nil, socketBufferBytes: Int? = nil,
        boundSocket: NIOBSDSocket.Handle? = nil, group: EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger = Logger(label: "tusa.secure")
    ) async throws(SecureTransportError) -> SecureUDPEndpoint {
        var configuration = configuration
        configuration.unixNanosecondsAtZero = Timestamp.unixNanosecondsAtZero()
        var keyLog: KeyLogFile?
        let keyLogPath = KeyLogFile.path(keyLogPath)
        if let keyLogPath {
            logger.warning(
                "media keys are logged (TUSA_KEYLOG / keyLogPath): whoever reads the file can decrypt these calls",
                metadata: ["file": "\(keyLogPath)"])
            do { keyLog = try KeyLogFile(path: keyLogPath) } catch {
                #if canImport(Glibc)
                    if let boundSocket { _ = Glibc.close(boundSocket) }  // owned from the call on, failed or not
                #endif
                throw error
            }
            configuration.keyLog = true
        }
        let (stream, continuation) = AsyncStream.makeStream(of: SecureUDPEvent.self, bufferingPolicy: .bufferingNewest(8192))
        let config = configuration
        let log = keyLog
        let channel: Channel
        do {
            var bootstrap = DatagramBootstrap(group: group)
            if let socketBufferBytes {
                bootstrap = bootstrap.channelOption(.socketOption(.so_rcvbuf), value: SocketOptionValue(socketBufferBytes))
                    .channelOption(.socketOption(.so_sndbuf), value: SocketOptionValue(socketBufferBytes))
            }
            bootstrap =
                bootstrap
                .channelOption(.datagramVectorReadMessageCount, value: 32)
                .channelOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: 32 * 2048))
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let core = SecureEndpoint(identity: identity, configuration: config, now: Timestamp.now())
                        let engine = SecureEngine(
                            core: core, channel: channel, continuation: continuation, mediaHandler: mediaHandler,
                            keyLog: log, logger: logger)
                        try channel.pipeline.syncOperations.addHandler(SecureDatagramHandler(engine: engine))
                    }
                }
            if let boundSocket {
                channel = try await bootstrap.withBoundSocket(boundSocket).get()
            } else {
                channel = try await bootstrap.bind(host: host, port: port).get()
            }
        } catch {
            continuation.finish()
            throw .bind("\(host):\(port)", ErrorCause(error))
        }
        do {
            let engine = try await channel.eventLoop.submit {
                NIOLoopBound(
                    try channel.pipeline.syncOperations.handler(type: SecureDatagramHandler.self).engine,
                    eventLoop: channel.eventLoop)
            }.get()
            guard let local = channel.localAddress.flatMap({ TransportAddress($0) }) else {
                throw SecureTransportError.noLocalAddress
            }
            return SecureUDPEndpoint(
                channel: channel, engine: engine, localAddress: local, publicKey: identity.publicKey, events: stream,
                logger: logger)
        } catch {
            try? await channel.close()
            continuation.finish()
            if let error = error as? SecureTransportError { throw error }
            throw .bind("\(host):\(port)", ErrorCause(error))
        }
    }

    func onLoop<T: Sendable>(_ body: @escaping @Sendable (SecureEngine) throws -> T) async throws(SecureTransportError) -> T {
        let engine = self.engine
        do {
            return try await channel.eventLoop.submit { try body(engine.value) }.get()
        } catch let e as SecureTransportError {
            throw e
        } catch {
            throw .closed
        }
    }

    /// Adds a peer by key (and address, if known); returns its id.
    public func addPeer(_ key: PublicKey, at address: TransportAddress? = nil) async throws(SecureTransportError) -> PeerID {
        try await onLoop { $0.core.addPeer(key, address: address) }
    }

    /// Forgets a peer (its keys zeroed, its handshakes abandoned): one this endpoint moved away from.
    public func removePeer(_ id: PeerID) async {
        try? await onLoop { $0.core.removePeer(id) }
    }

    /// Handshakes with the peer with `key` at `address` and waits until keys are in place both ways.
    @discardableResult
    public func connect(to key: PublicKey, at address: TransportAddress, timeout: Duration = .seconds(10))
        async throws(SecureTransportError) -> PeerID
    {
        try await handshake(with: key, at: address, timeout: timeout, fresh: false)
    }

    /// Handshakes again with a peer whose session may be dead at the other end
    /// (it restarted, or went silent), and waits for that handshake's keys:
    /// unlike ``connect(to:at:timeout:)``, keys already in place do not count.
    @discardableResult
    public func reconnect(to key: PublicKey, at address: TransportAddress, timeout: Duration = .seconds(10))
        async throws(SecureTransportError) -> PeerID
    {
        try await handshake(with: key, at: address, timeout: timeout, fresh: true)
    }

    private func handshake(with key: PublicKey, at address: TransportAddress, timeout: Duration, fresh: Bool)
        async throws(SecureTransportError) -> PeerID
    {
        let promise = channel.eventLoop.makePromise(of: PeerID.self)
        let engine = self.engine
        channel.eventLoop.execute {
            let e = engine.value
            let id = e.core.addPeer(key, address: address)
            e.core.setAddress(address, of: id)
            e.waitEstablished(id, promise: promise, timeout: timeout, fresh: fresh)
            e.host.handle(.connect(id))
        }
        do { return try await promise.futureResult.get() } catch let e as SecureTransportError { throw e } catch { throw .closed }
    }

    /// Waits until the peer with `key` has handshaken with us (as responder).
    public func waitForPeer(_ key: PublicKey, timeout: Duration = .seconds(10)) async throws(SecureTransportError) -> PeerID {
        let promise = channel.eventLoop.makePromise(of: PeerID.self)
        let engine = self.engine
        channel.eventLoop.execute {
            let e = engine.value
            let id = e.core.addPeer(key)
            e.waitEstablished(id, promise: promise, timeout: timeout)
        }
        do { return try await promise.futureResult.get() } catch let e as SecureTransportError { throw e } catch { throw .closed }
    }

    /// Seals and sends one media payload (fire and forget: a packet that cannot
    /// be sent yet is counted in `statistics()` and dropped, as UDP would).
    public func send(_ payload: [UInt8], to peer: PeerID, payloadType: UInt8, timestamp: UInt32, marker: Bool = false) {
        let engine = self.engine
        channel.eventLoop.execute {
            engine.value.sendMedia(payload, to: peer, payloadType: payloadType, timestamp: timestamp, marker: marker)
            engine.value.flush()
        }
    }

    /// The same from the endpoint's own event loop (a media or session handler, a
    /// core hosted there), without a hop: the packet waits for the next flush, the
    /// end of the read burst under way, or ``flushOnLoop()``. A relay forwarding one
    /// frame to many members so writes them all with one `sendmmsg`.
    public func sendOnLoop(_ payload: [UInt8], to peer: PeerID, payloadType: UInt8, timestamp: UInt32, marker: Bool = false) {
        engine.value.sendMedia(payload, to: peer, payloadType: payloadType, timestamp: timestamp, marker: marker)
    }

    /// Where a payload sealed by ``sealOnLoop(_:to:payloadType:timestamp:into:)`` went.
    public enum DirectSeal: Sendable, Equatable {
        /// Sealed into the caller's buffer: `length` bytes, for the caller to write
        /// to `to` on this endpoint's socket.
        case sealed(length: Int, to: TransportAddress)
        /// Sealed and sent the endpoint's own way: its path is not the socket alone
        /// (a TCP stream, the relay allocation, the impairment layer, an address ICE
        /// withdrew).
        case sentOtherwise
        /// Not sealed: no session with the peer now, or the buffer is too small (counted as unsent).
        case unsent
    }

    /// Seals a media payload for `peer` into `out` for a driver that writes its
    /// datagrams itself, in batches of its own, on a duplicate of the socket (the
    /// party relay, a frame's copies in one sendmmsg without a buffer or a channel
    /// write per copy). On the endpoint's event loop. A peer whose path is not the
    /// plain socket is sent to the usual way instead.
    public func sealOnLoop(
        _ payload: [UInt8], to peer: PeerID, payloadType: UInt8, timestamp: UInt32, into out: UnsafeMutableRawBufferPointer
    ) -> DirectSeal {
        var result = DirectSeal.unsent
        let counts = engine.value.sealDirect(
            payload, toEach: [peer], payloadType: payloadType, timestamp: timestamp, into: out
        ) { sealed, to in result = .sealed(length: sealed.count, to: to) }
        return counts.sentOtherwise > 0 ? .sentOtherwise : result
    }

    /// What ``sealOnLoop(_:toEach:payloadType:timestamp:into:write:)`` did with a payload's copies.
    public struct DirectSeals: Sendable, Equatable {
        /// Sealed into the caller's buffer and handed to its `write`.
        public var sealed = 0
        /// Sealed and sent the endpoint's own way (see ``DirectSeal/sentOtherwise``).
        public var sentOtherwise = 0
        /// Not sealed (see ``DirectSeal/unsent``).
        public var unsent = 0
        public init() {}
    }

    /// One media payload sealed for each of `peers` in turn, the way
    /// ``sealOnLoop(_:to:payloadType:timestamp:into:)`` seals it for one: a copy for
    /// the socket is sealed into `out` and handed to `write` (its bytes, valid until
    /// `write` returns, and where they go), one for another path is sent the
    /// endpoint's way. The clock is read, and the endpoint's paths looked at, once
    /// for all of them: a party relay's copies of one voice frame. On the endpoint's
    /// event loop; `write` must not call into the endpoint (it runs while the
    /// endpoint is between two copies).
    public func sealOnLoop(
        _ payload: [UInt8], toEach peers: [PeerID], payloadType: UInt8, timestamp: UInt32,
        into out: UnsafeMutableRawBufferPointer, write: (UnsafeRawBufferPointer, TransportAddress) -> Void
    ) -> DirectSeals {
        engine.value.sealDirect(payload, toEach: peers, payloadType: payloadType, timestamp: timestamp, into: out, write: write)
    }

    /// Writes what ``sendOnLoop(_:to:payloadType:timestamp:marker:)`` queued (unless a
    /// read burst is under way: its end flushes). On the endpoint's event loop.
    public func flushOnLoop() {
        let engine = engine.value
        if !engine.inReadBurst { engine.flush() }
    }

    /// Sends several media payloads in one hop to the event loop and one flush
    /// (timestamps advance by `timestampStep` from `timestamp`).
    public func send(batch payloads: [[UInt8]], to peer: PeerID, payloadType: UInt8, timestamp: UInt32, timestampStep: UInt32) {
        let engine = self.engine
        channel.eventLoop.execute {
            var ts = timestamp
            for p in payloads {
                engine.value.sendMedia(p, to: peer, payloadType: payloadType, timestamp: ts, marker: false)
                ts &+= timestampStep
            }
            engine.value.flush()
        }
    }

    /// Seals and sends a control report.
    public func sendControl(_ report: ControlReport, to peer: PeerID) async throws(SecureTransportError) {
        try await onLoop { e in
            do {
                try e.host.with { core, now in try core.sendControl(report, to: peer, now: now) }
            } catch let s as SecureSendError {
                throw SecureTransportError.send(s)
            }
        }
    }

    /// Sends the peer a keepalive at `address` (its session address stays
    /// where it is): the first packet toward an address the peer told us, out
    /// of band and authenticated, that it is reachable at now. Sending opens
    /// our NAT's filter toward it; the peer's media, once it comes from there,
    /// moves the session by the roaming rule. Sent twice, 20 ms apart, against loss.
    public func probe(_ peer: PeerID, at address: TransportAddress) async throws(SecureTransportError) {
        try await onLoop { e in
            try e.probe(peer, at: address)
            let engine = NIOLoopBound(e, eventLoop: e.channelEventLoop)
            e.channelEventLoop.scheduleTask(in: .milliseconds(20)) { try? engine.value.probe(peer, at: address) }
        }
    }

    /// This socket's address as a STUN server sees it (server-reflexive: after
    /// a NAT, the NAT's mapping), from a Binding request sent from the socket
    /// and retransmitted at 100 and 300 ms (RFC 8489 §6.2.1 with a shorter RTO:
    /// this is asked when the path has just gone quiet).
    public func reflexiveAddress(from server: TransportAddress, timeout: Duration = .seconds(1))
        async throws(SecureTransportError) -> TransportAddress
    {
        let future = try await onLoop { e in e.queryReflexive(server, timeout: timeout) }
        do { return try await future.get() } catch let error as SecureTransportError { throw error } catch { throw .closed }
    }

    /// Allocates on a TURN server over this socket. Peers reached with
    /// `reach(_:viaRelay: true)` then go through it.
    @discardableResult
    public func useRelay(_ server: TransportAddress, configuration: TURNClient.Configuration) async throws(SecureTransportError)
        -> TURNClientAllocation
    {
        try await useRelay(server, over: .udp, configuration: configuration)
    }

    /// Allocates on a TURN server reached over UDP (this socket) or TCP (a
    /// connection of its own, for networks that block UDP: the relay still talks
    /// UDP to peers). Gives up after `timeout`. With a relay already in use, it is
    /// the one that allocates (``replaceRelay(_:over:configuration:timeout:)`` changes it).
    @discardableResult
    public func useRelay(
        _ server: TransportAddress, over transport: TURNClientConnection.TransportProtocol,
        configuration: TURNClient.Configuration, timeout: Duration = .seconds(10)
    ) async throws(SecureTransportError) -> TURNClientAllocation {
        let turn: TURNClientConnection
        switch transport {
        case .udp:
            turn = try await onLoop { e in try e.attachRelay(server: server, configuration: configuration) }
        case .tcp:
            if let existing = try await onLoop({ $0.turn }) {
                turn = existing
            } else {
                let c: TURNClientConnection
                do {
                    c = try await TURNClientConnection.connect(
                        to: server, over: .tcp, configuration: configuration,
                        connectTimeout: timeout, group: channel.eventLoop)
                } catch { throw .relay(error) }
                let engine = self.engine
                let loop = channel.eventLoop
                _ = try await onLoop { $0.attachStreamRelay(c) }
                // Data from peers comes through the connection's stream; opened on our loop.
                Task {
                    for await d in c.received { loop.execute { engine.value.receivedRelayed(d) } }
                }
                turn = c
            }
        }
        do { return try await turn.allocate(timeout: timeout) } catch { throw .relay(error) }
    }

    /// Releases the relay in use, if any, and allocates afresh on `server` (after a
    /// move, a NAT rebinding or a relay restart). The release waits at most 500 ms:
    /// a relay that restarted, or that sees us from a new address, answers at once
    /// that it has no allocation for us; one that still has it frees our 5-tuple for
    /// the new one. Peers reached through the old relay are reached directly until
    /// told otherwise.
    @discardableResult
    public func replaceRelay(
        _ server: TransportAddress, over transport: TURNClientConnection.TransportProtocol = .udp,
        configuration: TURNClient.Configuration, timeout: Duration = .seconds(10)
    ) async throws(SecureTransportError) -> TURNClientAllocation {
        if let old = try await onLoop({ $0.turn }) { try? await old.close(timeout: .milliseconds(500)) }
        _ = try await onLoop { $0.detachRelay() }
        return try await useRelay(server, over: transport, configuration: configuration, timeout: timeout)
    }

    /// Keeps the relay in use when `server` still holds its allocation for this
    /// socket (a Refresh answered within `check`), else replaces it as
    /// ``replaceRelay(_:over:configuration:timeout:)`` does. For an ICE restart
    /// after a pause: what the peer sends keeps reaching the same relayed
    /// address, where a fresh allocation would strand it until the peer learns
    /// the new one. After a NAT rebinding or a relay restart the relay answers
    /// 437 at once and the allocation is made anew.
    @discardableResult
    public func renewRelay(
        _ server: TransportAddress, over transport: TURNClientConnection.TransportProtocol = .udp,
        configuration: TURNClient.Configuration, check: Duration = .milliseconds(700), timeout: Duration = .seconds(10)
    ) async throws(SecureTransportError) -> TURNClientAllocation {
        if let old = try await onLoop({ $0.turn }), old.server == server, old.transport == transport {
            do {
                return try await old.refresh(timeout: min(check, timeout))
            } catch {
                logger.debug("relay allocation not renewed", metadata: ["server": "\(server)", "error": "\(error)"])
            }
        }
        return try await replaceRelay(server, over: transport, configuration: configuration, timeout: timeout)
    }

    /// Sends everything for `address` through the relay (a channel is bound to it).
    public func reach(_ address: TransportAddress, viaRelay: Bool) async throws(SecureTransportError) {
        guard viaRelay else {
            _ = try await onLoop { $0.relayed.remove(address) }
            return
        }
        let turn = try await onLoop { e -> TURNClientConnection in
            guard let t = e.turn else { throw SecureTransportError.relay(.notAllocated) }
            return t
        }
        do { try await turn.bindChannel(to: address, timeout: .seconds(10)) } catch { throw .relay(error) }
        _ = try await onLoop { $0.relayed.insert(address) }
    }

    /// Impairs outgoing media from now on (tests and demos; the CI kernel has no netem):
    /// `decide` is called once per sealed media datagram and returns nil to drop it or
    /// the delay to add (packets may then overtake each other, as jitter does).
    public func impairMedia(_ decide: @escaping @Sendable () -> Duration?) async {
        _ = try? await onLoop { $0.mediaImpairment = decide }
    }

    /// The round-trip time to the peer, from its control reports' echoes (nil until known).
    public func roundTripTime(of peer: PeerID) async -> Duration? {
        (try? await onLoop { $0.core.roundTripTime(of: peer) }) ?? nil
    }

    public func statistics() async throws(SecureTransportError) -> SecureStatistics {
        try await onLoop { $0.core.statistics }
    }

    /// Datagrams (media, control, handshakes) not sent because ICE lost the
    /// destination's consent (RFC 7675): they resume once a pair is selected again.
    public func withheldByConsent() async -> UInt64 {
        (try? await onLoop { $0.withheld }) ?? 0
    }

    /// Media datagrams dropped because the stream toward them had too much queued (its
    /// peer does not read): they go as a lost UDP datagram would, not into memory.
    public func droppedOnFullStreams() async -> UInt64 {
        (try? await onLoop { $0.streamFull }) ?? 0
    }

    /// The peer's current address and our and its SSRCs.
    public func describe(_ peer: PeerID) async throws(SecureTransportError) -> (
        address: TransportAddress?, local: UInt32, remote: UInt32?
    )? {
        try await onLoop { e in
            guard let s = e.core.ssrcs(of: peer) else { return nil }
            return (e.core.address(of: peer), s.local, s.remote)
        }
    }

    /// The event loop the endpoint runs on: where the media handler is called,
    /// and where a driver that hosts a core beside it can run that core.
    public var eventLoop: any EventLoop { channel.eventLoop }

    /// Replaces the media handler (nil: media comes as `.media` events), from the
    /// next packet on: for a driver whose handler needs the bound endpoint.
    public func setMediaHandler(_ handler: MediaHandler?) async {
        let engine = self.engine
        try? await channel.eventLoop.submit { engine.value.mediaHandler = handler }.get()
    }

    /// Sets the session handler (see ``SessionHandler``), from the next event on.
    public func setSessionHandler(_ handler: SessionHandler?) async {
        let engine = self.engine
        try? await channel.eventLoop.submit { engine.value.sessionHandler = handler }.get()
    }

    /// Called on the event loop at the end of each read burst, after the endpoint's
    /// own flush: a driver that batches its own writes (``sealOnLoop(_:to:payloadType:timestamp:into:)``)
    /// writes them then, a whole burst's in few system calls.
    public func setReadBurstEndHandler(_ handler: (@Sendable () -> Void)?) async {
        let engine = self.engine
        try? await channel.eventLoop.submit { engine.value.readBurstEnded = handler }.get()
    }

    /// Whether the endpoint is reading a burst of datagrams now (on the event loop):
    /// writes may wait for the burst's end.
    public var inReadBurstOnLoop: Bool { engine.value.inReadBurst }

    /// Releases the relay allocation, if any, and closes the socket.
    public func close() async {
        let engine = self.engine
        if let turn = try? await channel.eventLoop.submit({ engine.value.turn }).get() {
            try? await turn.close(timeout: .seconds(1))
        }
        let closing = try? await channel.eventLoop.submit { engine.value.shutDown() }.get()
        // The stream listeners and streams, which may live on other loops: closed
        // when this returns (their ports free again).
        for closed in closing ?? [] { try? await closed.get() }
        try? await channel.close()
    }
}

/// The endpoint's state, confined to the channel's event loop. What a directly
/// sealed copy reads (``sealDirect(_:toEach:payloadType:timestamp:into:write:)``) is
/// `@exclusivity(unchecked)`, as in ``SecureEndpoint``.
final class SecureEngine {
    /// The session core, run by `host`; the hot paths (sealing, opening) and
    /// calls that leave nothing to do (addresses, reads) reach it directly.
    let core: SecureEndpoint
    /// Performs what the core leaves to do and keeps its timer armed.
    private(set) lazy var host = CoreHost(
        core, on: channel.eventLoop,
        perform: { [weak self] action in self?.perform(action) },
        afterActions: { [weak self] in self?.afterActions() })
    /// Within a read burst, writes wait for the burst's one flush (`channelReadComplete`).
    var inReadBurst = false
    /// ``SecureUDPEndpoint/setReadBurstEndHandler(_:)``.
    var readBurstEnded: (@Sendable () -> Void)?
    private let channel: Channel
    private let continuation: AsyncStream<SecureUDPEvent>.Continuation
    var mediaHandler: SecureUDPEndpoint.MediaHandler?
    var sessionHandler: SecureUDPEndpoint.SessionHandler?
    private let keyLog: KeyLogFile?
    private let logger: Logger
    private var binding = BindingServer()
    private var waiters: [PeerID: [EventLoopPromise<PeerID>]] = [:]
    @exclusivity(unchecked) private var closed = false
    /// Whether ``shutDown()`` ran: the endpoint takes nothing new.
    var isClosed: Bool { closed }
    /// Reused for every datagram: opened in place here, never allocated per packet.
    private var scratch = [UInt8](repeating: 0, count: 65_536)
    private(set) var pendingWrites = 0

    // ICE, when it runs on this socket (base 0) and the relay allocation (base 1).
    @exclusivity(unchecked) var ice: ICEEngine?
    /// The peer whose address follows ICE's selected pair.
    var iceFollower: PeerID?

    // The relay, when one is in use.
    var turn: TURNClientConnection?
    private(set) var turnEngine: TURNClientEngine?
    private var turnServer: TransportAddress?
    /// Peer addresses reached through the relay.
    @exclusivity(unchecked) var relayed: Set<TransportAddress> = []
    /// Datagrams not sent because their destination withdrew its consent (see
    /// ``ICEEngine/withdrawnAddress``).
    private(set) var withheld: UInt64 = 0
    /// Media dropped because its stream (TCP or TLS) had ``StreamFraming/writeWaterMark``'s
    /// high mark queued: its peer does not read.
    private(set) var streamFull: UInt64 = 0
    /// Decides the fate of each outgoing media datagram: nil drops it, else its added delay.
    @exclusivity(unchecked) var mediaImpairment: (@Sendable () -> Duration?)?

    // Streams (RFC 4571 over TCP), for where UDP does not pass: see SecureUDPEndpoint+Streams.
    /// Addresses reached over a TCP connection instead of the socket (a member's
    /// relay, or, on the relay, each member that came over TCP, by a stand-in address).
    @exclusivity(unchecked) var streams: [TransportAddress: Channel] = [:]
    /// The listeners accepting streams (TCP, TLS), when this endpoint serves them.
    var streamListeners: [Channel] = []
    /// Stream-routed addresses whose next datagram takes the UDP socket (a probe of UDP).
    var probeUDP: Set<TransportAddress> = []
    /// Streams given up because the same peer answered over UDP again.
    private(set) var streamsLeftForUDP: UInt64 = 0

    init(
        core: SecureEndpoint, channel: Channel, continuation: AsyncStream<SecureUDPEvent>.Continuation,
        mediaHandler: SecureUDPEndpoint.MediaHandler?, keyLog: KeyLogFile?, logger: Logger
    ) {
        self.core = core
        self.channel = channel
        self.continuation = continuation
        self.mediaHandler = mediaHandler
        self.keyLog = keyLog
        self.logger = logger
    }

    // MARK: input

    func received(_ buffer: ByteBuffer, from source: TransportAddress) {
        guard !closed else { return }
        if !reflexiveQueries.isEmpty, answersReflexiveQuery(buffer, from: source) { return }
        if let turnServer, source == turnServer, let turnEngine {
            turnEngine.received(Array(buffer.readableBytesView))
            return
        }
        let n = buffer.readableBytes
        guard n > 0, n <= scratch.count, let first = buffer.getInteger(at: buffer.readerIndex, as: UInt8.self) else { return }
        switch first {
        case 0...3:
            // ICE's checks and their answers first; other STUN gets a Binding answer.
            if let ice, ice.receiveSTUN(Array(buffer.readableBytesView), from: source, base: 0) { return }
            answerBinding(buffer, from: source)
        default:
            let authentic = scratch.withUnsafeMutableBytes { raw in
                buffer.withUnsafeReadableBytes { raw.copyMemory(from: $0) }
                return openDatagram(UnsafeMutableRawBufferPointer(rebasing: raw[0..<n]), from: source)
            }
            // UDP works again with a peer reached over a stream: back to UDP.
            if authentic, let stream = streams.removeValue(forKey: source) {
                streamsLeftForUDP += 1
                logger.info("UDP works again: leaving the TCP stream", metadata: ["peer": "\(source)"])
                stream.close(promise: nil)
            }
        }
    }

    /// A datagram that came framed on a stream (RFC 4571), as if from `address`.
    func receivedFromStream(_ buffer: ByteBuffer, from address: TransportAddress) {
        guard !closed else { return }
        let n = buffer.readableBytes
        // Only the secure session rides streams (no STUN: nobody to answer a Binding).
        guard n > 0, n <= scratch.count, let first = buffer.getInteger(at: buffer.readerIndex, as: UInt8.self), first > 3
        else { return }
        scratch.withUnsafeMutableBytes { raw in
            buffer.withUnsafeReadableBytes { raw.copyMemory(from: $0) }
            _ = openDatagram(UnsafeMutableRawBufferPointer(rebasing: raw[0..<n]), from: address)
        }
        flush()
    }

    /// Datagrams a relay delivered from a peer.
    func receivedRelayed(_ d: TURNClient.Datagram) {
        guard !d.payload.isEmpty, d.payload.count <= scratch.count else { return }
        if d.payload[0] <= 3 {
            if let ice { _ = ice.receiveSTUN(d.payload, from: d.peer, base: ICEBase.relay) }
            return
        }
        scratch.withUnsafeMutableBytes { raw in
            d.payload.withUnsafeBytes { raw.copyMemory(from: $0) }
            openDatagram(UnsafeMutableRawBufferPointer(rebasing: raw[0..<d.payload.count]), from: d.peer)
        }
    }

    /// Opens one datagram; true when it was authentic (media, or a handshake or control message handled).
    @discardableResult
    private func openDatagram(_ bytes: UnsafeMutableRawBufferPointer, from source: TransportAddress) -> Bool {
        switch core.receive(bytes, from: source, now: Timestamp.now()) {
        case .media(let peer, let header, let range):
            // A media packet can confirm new keys or move the peer: report that first,
            // so that whoever handles the media knows the session it came on.
            if core.hasOutputs { performLeftovers() }
            let payload = UnsafeRawBufferPointer(rebasing: bytes[range])
            if let mediaHandler {
                mediaHandler(peer, header, payload)
            } else {
                continuation.yield(.media(peer, header, payload: Array(payload)))
            }
            return true
        case .handled:
            performLeftovers()
            return true
        case .dropped, .droppedHandshake:
            // A drop changes nothing but may answer (a cookie reply under load).
            if core.hasOutputs { performLeftovers() }
            return false
        }
    }

    private func answerBinding(_ buffer: ByteBuffer, from source: TransportAddress) {
        let request = Array(buffer.readableBytesView)
        guard let (response, destination, _) = binding.handle(request, from: source) else { return }
        write(response, to: destination)
    }

    // MARK: reflexive address

    /// Binding requests in flight for ``SecureUDPEndpoint/reflexiveAddress(from:timeout:)``,
    /// each a ``ClientTransaction`` (its retransmissions) on a host of its own.
    private(set) var reflexiveQueries:
        [TransactionID: (
            host: CoreHost<ClientTransaction>, server: TransportAddress, promise: EventLoopPromise<TransportAddress>
        )] =
            [:]

    func queryReflexive(_ server: TransportAddress, timeout: Duration) -> EventLoopFuture<TransportAddress> {
        let promise = channel.eventLoop.makePromise(of: TransportAddress.self)
        let request = Message(type: .bindingRequest)
        let id = request.transactionID
        let bound = NIOLoopBound(self, eventLoop: channel.eventLoop)
        // RFC 8489's schedule with a 100 ms RTO (sent at 0, 100 and 300 ms): this is
        // asked when the path has just gone quiet, and the caller's timeout ends it.
        let transaction = ClientTransaction(
            transactionID: id, request: request.encode(fingerprint: true),
            reliability: .unreliable(rto: .milliseconds(100), rc: 3, rm: 16))
        // (The host is dropped with its entry, which ends the cycle through this closure.)
        let host = CoreHost(transaction, on: channel.eventLoop) { action in
            switch action {
            case .send(let bytes):
                bound.value.writeDirect(bytes, to: server)
                bound.value.flush()
            case .timedOut:
                bound.value.endReflexiveQuery(id, .failure(SecureTransportError.timeout))
            case .answered:
                break  // (answers are matched in `answersReflexiveQuery`)
            }
        }
        reflexiveQueries[id] = (host, server, promise)
        channel.eventLoop.scheduleTask(in: .nanoseconds(max(0, timeout.nanoseconds))) {
            bound.value.endReflexiveQuery(id, .failure(SecureTransportError.timeout))
        }
        host.handle(.start)
        return promise.futureResult
    }

    /// Takes the answer to one of our Binding requests: true when it was one.
    private func answersReflexiveQuery(_ buffer: ByteBuffer, from source: TransportAddress) -> Bool {
        guard buffer.readableBytes >= 20, let first = buffer.getInteger(at: buffer.readerIndex, as: UInt8.self), first <= 3,
            let message = try? Message(decoding: Array(buffer.readableBytesView)),
            reflexiveQueries[message.transactionID]?.server == source
        else { return false }
        if message.type == .bindingSuccess, case .xorMappedAddress(let mapped)? = try? message.value(.xorMappedAddress) {
            endReflexiveQuery(message.transactionID, .success(mapped))
        } else {
            endReflexiveQuery(message.transactionID, .failure(SecureTransportError.timeout))
        }
        return true
    }

    private func endReflexiveQuery(_ id: TransactionID, _ result: Result<TransportAddress, any Error>) {
        guard let query = reflexiveQueries.removeValue(forKey: id) else { return }
        query.host.stop()
        query.promise.completeWith(result)
    }

    func probe(_ peer: PeerID, at address: TransportAddress) throws(SecureTransportError) {
        do {
            try host.with { core, now in try core.sendControl(ControlReport(kind: .keepalive), to: peer, at: address, now: now) }
        } catch let s as SecureSendError {
            throw SecureTransportError.send(s)
        } catch {
            throw .closed
        }
    }

    // MARK: output

    func sendMedia(_ payload: [UInt8], to peer: PeerID, payloadType: UInt8, timestamp: UInt32, marker: Bool) {
        guard !closed else { return }
        let now = Timestamp.now()
        // Sealed straight into the datagram's buffer.
        var buffer = channel.allocator.buffer(capacity: payload.count + 28)
        var destination: TransportAddress?
        do {
            try payload.withUnsafeBytes { p in
                _ = try buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: payload.count + 28) { out in
                    let (n, to) = try core.sealMedia(
                        to: peer, payloadType: payloadType, marker: marker, timestamp: timestamp, payload: p, into: out, now: now)
                    destination = to
                    return n
                }
            }
        } catch {
            unsent += 1
        }
        if let destination { writeMedia(buffer, to: destination) }
        // Sealing may have started a handshake (no keys yet, or a rekey due): send it, arm its timer.
        if core.hasOutputs { performLeftovers() }
    }

    /// ``SecureUDPEndpoint/sealOnLoop(_:toEach:payloadType:timestamp:into:write:)``.
    func sealDirect(
        _ payload: [UInt8], toEach peers: [PeerID], payloadType: UInt8, timestamp: UInt32,
        into out: UnsafeMutableRawBufferPointer, write: (UnsafeRawBufferPointer, TransportAddress) -> Void
    ) -> SecureUDPEndpoint.DirectSeals {
        var counts = SecureUDPEndpoint.DirectSeals()
        guard !closed else {
            counts.unsent = peers.count
            return counts
        }
        // Sealing may start a handshake (no keys yet, or a rekey due): send it, arm its timer.
        defer { if core.hasOutputs { performLeftovers() } }
        // Every copy goes to the socket unless some path is not the socket's (the usual
        // case on a party relay: the empty tables are not hashed into per copy).
        let onlySocket = mediaImpairment == nil && ice?.withdrawnAddress == nil && relayed.isEmpty && streams.isEmpty
        payload.withUnsafeBytes { p in
            core.sealMedia(toEach: peers, payloadType: payloadType, timestamp: timestamp, payload: p, into: out, now: .now()) {
                guard case .success(let sealed) = $0 else {
                    unsent += 1
                    counts.unsent += 1
                    return
                }
                let to = sealed.to
                let bytes = UnsafeRawBufferPointer(rebasing: out[..<sealed.length])
                if onlySocket
                    || (mediaImpairment == nil && ice?.withdrawnAddress != to && !relayed.contains(to) && streams[to] == nil)
                {
                    write(bytes, to)
                    counts.sealed += 1
                } else {
                    var buffer = channel.allocator.buffer(capacity: sealed.length)
                    buffer.writeBytes(bytes)
                    writeMedia(buffer, to: to)
                    counts.sentOtherwise += 1
                }
            }
        }
        return counts
    }

    /// A sealed media datagram to its path, through the impairment layer when one is set.
    private func writeMedia(_ buffer: ByteBuffer, to destination: TransportAddress) {
        guard let impair = mediaImpairment else { return write(buffer, to: destination) }
        // The project's impairment layer: after sealing (the sequence number is
        // spent, so the receiver sees the loss), before the socket.
        guard let delay = impair() else { return }  // dropped
        if delay > .zero {
            let engine = NIOLoopBound(self, eventLoop: channel.eventLoop)
            channel.eventLoop.scheduleTask(in: .nanoseconds(delay.nanoseconds)) {
                engine.value.write(buffer, to: destination)
                engine.value.flush()
            }
        } else {
            write(buffer, to: destination)
        }
    }

    /// Media that could not be sealed (no keys yet, unknown peer).
    @exclusivity(unchecked) private(set) var unsent: UInt64 = 0

    private func write(_ bytes: [UInt8], to address: TransportAddress) {
        bytes.withUnsafeBytes { write($0, to: address) }
    }

    private func write(_ bytes: UnsafeRawBufferPointer, to address: TransportAddress) {
        var buffer = channel.allocator.buffer(capacity: bytes.count)
        buffer.writeBytes(bytes)
        write(buffer, to: address)
    }

    /// Straight to the socket, or wrapped for the relay when the address is reached
    /// through one (`direct`: the socket in any case).
    private func write(_ buffer: ByteBuffer, to address: TransportAddress, direct: Bool = false) {
        if !direct, let withdrawn = ice?.withdrawnAddress, withdrawn == address {
            withheld += 1
            return
        }
        if !direct, relayed.contains(address) {
            do { try sendThroughRelay(Array(buffer.readableBytesView), to: address) } catch { unsent += 1 }
            return
        }
        if !direct, let stream = streams[address], probeUDP.remove(address) == nil {
            // A connection whose peer does not read drops media as UDP would, rather
            // than queue it without end. Handshakes and control (few, and a session
            // needs them) still go.
            guard stream.isWritable || !(0x80...0xBF).contains(buffer.getInteger(at: buffer.readerIndex, as: UInt8.self) ?? 0)
            else {
                streamFull += 1
                return
            }
            // The framing handler adds the length; one flush per datagram (TCP coalesces).
            stream.writeAndFlush(buffer, promise: nil)
            return
        }
        channel.write(AddressedEnvelope(remoteAddress: SocketAddress(address), data: buffer), promise: nil)
        pendingWrites += 1
    }

    /// To the socket, even when the address is otherwise reached through the relay (ICE's checks on base 0).
    func writeDirect(_ bytes: [UInt8], to address: TransportAddress) {
        write(channel.allocator.buffer(bytes: bytes), to: address, direct: true)
    }

    var channelEventLoop: any EventLoop { channel.eventLoop }

    func yield(_ event: SecureUDPEvent) { continuation.yield(event) }

    func flush() {
        if pendingWrites > 0 {
            pendingWrites = 0
            channel.flush()
        }
    }

    /// What a hot-path call on the core left to do: the host performs it and re-arms the timer.
    private func performLeftovers() {
        host.with { _, _ in }
    }

    private func perform(_ action: SecureOutput) {
        switch action {
        case .send(let bytes, let to): write(bytes, to: to)
        case .event(let event): report(event)
        }
    }

    /// One flush per run of actions, or per read burst while one is under way.
    private func afterActions() {
        if !inReadBurst { flush() }
    }

    private func report(_ event: SecureEvent) {
        switch event {
        case .established(let id, _, _):
            for w in waiters.removeValue(forKey: id) ?? [] { w.succeed(id) }
        case .handshakeFailed(let id):
            for w in waiters.removeValue(forKey: id) ?? [] { w.fail(SecureTransportError.handshakeFailed) }
        case .keyLog(let line):
            if let failure = keyLog?.append(line) { logger.error("\(failure)") }
            return
        case .peerMoved(let id, _, let to):
            // ICE's consent checks follow the session to the peer's new address, when its
            // packets came there directly (checks leave from the socket, not the relay or a stream).
            if id == iceFollower, !relayed.contains(to), streams[to] == nil { ice?.remoteMoved(to: to) }
        case .peerGone, .control:
            break
        }
        sessionHandler?(event)
        continuation.yield(.session(event))
    }

    func waitEstablished(_ id: PeerID, promise: EventLoopPromise<PeerID>, timeout: Duration, fresh: Bool = false) {
        if !fresh, core.isEstablished(id) {
            promise.succeed(id)
            return
        }
        waiters[id, default: []].append(promise)
        let bound = NIOLoopBound(self, eventLoop: channel.eventLoop)
        channel.eventLoop.scheduleTask(in: .nanoseconds(max(0, timeout.nanoseconds))) {
            promise.fail(SecureTransportError.timeout)
            bound.value.waiters[id]?.removeAll { $0.futureResult === promise.futureResult }
        }
    }

    /// To a peer through the relay: over this socket, or the relay's TCP connection.
    func sendThroughRelay(_ bytes: [UInt8], to address: TransportAddress) throws(TURNClientError) {
        if let turnEngine {
            try turnEngine.send(bytes, to: address)
        } else if let turn {
            try turn.sendFromLoop(bytes, to: address)
        } else {
            throw .notAllocated
        }
    }

    func attachStreamRelay(_ connection: TURNClientConnection) {
        turn = connection
        turnEngine = nil
        turnServer = nil
    }

    func detachRelay() {
        turnEngine?.shutDown(.closed)
        turnEngine = nil
        turn = nil
        turnServer = nil
        relayed.removeAll()
    }

    func attachRelay(server: TransportAddress, configuration: TURNClient.Configuration) throws -> TURNClientConnection {
        if let turn { return turn }
        let bound = NIOLoopBound(self, eventLoop: channel.eventLoop)
        do {
            let (connection, engine) = try TURNClientConnection.attached(
                to: channel, server: server, configuration: configuration,
                deliver: { bound.value.receivedRelayed($0) }, logger: logger)
            turn = connection
            turnEngine = engine
            turnServer = server
            return connection
        } catch {
            throw SecureTransportError.relay(error)
        }
    }

    /// Stops everything; the returned futures complete when the stream listeners
    /// and streams (closed here, maybe on other loops) are closed.
    @discardableResult
    func shutDown() -> [EventLoopFuture<Void>] {
        closed = true
        host.stop()
        for (_, ws) in waiters { for w in ws { w.fail(SecureTransportError.closed) } }
        waiters.removeAll()
        turnEngine?.shutDown(.closed)
        ice?.shutDown()
        ice = nil
        let closing = (streamListeners + Array(streams.values)).map { channel in
            channel.close().recover { _ in }  // (already closed: as good)
        }
        streamListeners.removeAll()
        streams.removeAll()
        continuation.finish()
        return closing
    }
}

/// Routes every datagram to the engine; flushes once per read burst.
final class SecureDatagramHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    let engine: SecureEngine

    init(engine: SecureEngine) { self.engine = engine }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let envelope = unwrapInboundIn(data)
        guard let source = TransportAddress(envelope.remoteAddress) else { return }
        engine.inReadBurst = true
        engine.received(envelope.data, from: source)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        engine.inReadBurst = false
        engine.flush()
        engine.readBurstEnded?()
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        // ICMP errors on an unconnected UDP socket (e.g. ECONNREFUSED) are not fatal.
    }

    func channelInactive(context: ChannelHandlerContext) {
        engine.shutDown()
        context.fireChannelInactive()
    }
}

/// The opt-in key log file: created 0600, lines appended and flushed at once.
/// A line that cannot be written (a full disk) is said once; the call goes on.
final class KeyLogFile: Sendable {
    private let fd: Int32
    private let path: String
    private let failed = Atomic(false)

    /// The key log to write: the one given, else the file `TUSA_KEYLOG` names, else none.
    static func path(_ given: String?) -> String? {
        given ?? getenv("TUSA_KEYLOG").map { String(cString: $0) }.flatMap { $0.isEmpty ? nil : $0 }
    }

    init(path: String) throws(SecureTransportError) {
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .keyLog("cannot open \(path): \(String(cString: strerror(errno)))") }
        self.fd = fd
        self.path = path
    }

    /// Appends a line; the first failure is returned, for the caller to report.
    func append(_ line: String) -> String? {
        var bytes = Array((line + "\n").utf8)
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        let code = errno
        for i in bytes.indices { bytes[i] = 0 }
        guard written != bytes.count, !failed.exchange(true, ordering: .relaxed) else { return nil }
        let why = written < 0 ? String(cString: strerror(code)) : "cut short (\(written) of \(bytes.count) bytes)"
        return "cannot write the key log \(path): \(why); its lines are missing from here on"
    }

    deinit { close(fd) }
}
