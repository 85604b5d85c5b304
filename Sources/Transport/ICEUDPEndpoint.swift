import ICE
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import STUN
import TusaBase

/// What one side tells the other (in an offer or answer) for ICE.
public struct ICEDescription: Hashable, Sendable {
    public var credentials: ICECredentials
    public var candidates: [ICECandidate]

    public init(credentials: ICECredentials, candidates: [ICECandidate]) {
        self.credentials = credentials
        self.candidates = candidates
    }
}

public enum ICEEndpointError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The socket could not be bound to the address; the system's error is the cause.
    case bind(String, ErrorCause)
    /// The bound socket reports no local address.
    case noLocalAddress
    case closed
    /// No pair was selected in time.
    case timedOut(Duration)
    /// Every pair failed (the agent's reason).
    case failed(String)
    case badDescription(String)
    /// Sent before a pair was selected.
    case notConnected

    public var description: String {
        switch self {
        case .bind(let address, let cause): "cannot bind \(address): \(cause)"
        case .noLocalAddress: "the bound socket has no local address"
        case .closed: "the ICE endpoint is closed"
        case .timedOut(let d): "no ICE pair was selected within \(d)"
        case .failed(let s): "ICE failed: \(s)"
        case .badDescription(let s): "bad ICE description: \(s)"
        case .notConnected: "no ICE pair selected yet"
        }
    }
}

/// A SwiftNIO UDP driver for an ``ICEAgent`` on one socket: host candidates (the
/// bound address, or the ones given), a server-reflexive candidate when a STUN
/// server is given, connectivity checks and consent on the socket, and
/// afterwards plain datagrams to and from the selected pair. For apps that bring
/// their own protocol on top of ICE; `tusa call` keeps its Noise session on the
/// same kind of socket.
public final class ICEUDPEndpoint: Sendable {
    private let channel: any Channel
    private let engine: NIOLoopBound<ICEEngine>
    public let localAddress: TransportAddress
    /// Datagrams that are not STUN, from the selected remote address.
    public let incoming: AsyncStream<[UInt8]>
    /// The agent's events, in order.
    public let events: AsyncStream<ICEEvent>

    private init(
        channel: any Channel, engine: NIOLoopBound<ICEEngine>, localAddress: TransportAddress,
        incoming: AsyncStream<[UInt8]>, events: AsyncStream<ICEEvent>
    ) {
        self.channel = channel
        self.engine = engine
        self.localAddress = localAddress
        self.incoming = incoming
        self.events = events
    }

    /// Binds a UDP socket on `host` (port 0: any) as an ICE agent in `role`.
    ///
    /// - Parameters:
    ///   - hostAddresses: the host candidates' IPs; by default the bound IP
    ///     (which must then not be a wildcard).
    ///   - stunServer: where to learn a server-reflexive candidate (RFC 8489 Binding).
    public static func bind(
        host: String, port: Int = 0, role: ICERole, hostAddresses: [IPAddress]? = nil,
        stunServer: TransportAddress? = nil, configuration: ICEConfiguration = .init(),
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton
    ) async throws(ICEEndpointError) -> ICEUDPEndpoint {
        let (incoming, incomingYield) = AsyncStream.makeStream(of: [UInt8].self, bufferingPolicy: .bufferingNewest(1024))
        let (events, eventsYield) = AsyncStream.makeStream(of: ICEEvent.self, bufferingPolicy: .bufferingNewest(256))
        let channel: any Channel
        do {
            channel = try await DatagramBootstrap(group: group)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(
                            ICEDatagramHandler(
                                channel: channel, incoming: incomingYield, events: eventsYield))
                    }
                }
                .bind(host: host, port: port).get()
        } catch {
            incomingYield.finish()
            eventsYield.finish()
            throw .bind("\(host):\(port)", ErrorCause(error))
        }
        guard let local = channel.localAddress.flatMap({ TransportAddress($0) }) else {
            try? await channel.close()
            throw .noLocalAddress
        }
        let ips = hostAddresses ?? [local.ip]
        let candidates = ips.enumerated().map { i, ip in
            ICELocalCandidate.host(
                TransportAddress(ip: ip, port: local.port), base: 0, localPreference: UInt32(65535 - min(i, 65535)))
        }
        do {
            let engine = try await channel.eventLoop.submit {
                let engine = try channel.pipeline.syncOperations.handler(type: ICEDatagramHandler.self).engine
                engine.start(
                    ICEAgent(
                        role: role, candidates: candidates, gatheringComplete: stunServer == nil, configuration: configuration),
                    stunServer: stunServer, local: local)
                return NIOLoopBound(engine, eventLoop: channel.eventLoop)
            }.get()
            return ICEUDPEndpoint(channel: channel, engine: engine, localAddress: local, incoming: incoming, events: events)
        } catch {
            try? await channel.close()
            throw .bind("\(local)", ErrorCause(error))
        }
    }

    private func onLoop<T: Sendable>(_ body: @escaping @Sendable (ICEEngine) throws(ICEEndpointError) -> T)
        async throws(ICEEndpointError) -> T
    {
        let engine = self.engine
        do {
            return try await channel.eventLoop.submit { try engine.value.run(body) }.get()
        } catch let e as ICEEndpointError {
            throw e
        } catch {
            throw .closed
        }
    }

    /// Our credentials and candidates, once gathering is over (the STUN server
    /// answered or `timeout` passed).
    public func localDescription(timeout: Duration = .seconds(2)) async throws(ICEEndpointError) -> ICEDescription {
        let engine = self.engine
        let future: EventLoopFuture<Void>
        do {
            future = try await channel.eventLoop.submit { engine.value.gathered(timeout: timeout) }.get()
        } catch { throw .closed }
        _ = try? await future.get()
        return try await onLoop { $0.description }
    }

    /// Starts the checks against the peer's description and waits until a pair
    /// is selected (nominated), every pair failed, or `timeout`.
    @discardableResult
    public func connect(to remote: ICEDescription, timeout: Duration = .seconds(15)) async throws(ICEEndpointError) -> ICEPair {
        guard remote.credentials.isValid else { throw .badDescription("ice-ufrag/ice-pwd are not valid (4+/22+ ice-chars)") }
        let engine = self.engine
        let future: EventLoopFuture<ICEPair>
        do {
            future = try await channel.eventLoop.submit { engine.value.connect(remote, timeout: timeout) }.get()
        } catch { throw .closed }
        do { return try await future.get() } catch let e as ICEEndpointError { throw e } catch { throw .closed }
    }

    /// The selected pair, if any.
    public func selected() async throws(ICEEndpointError) -> ICEPair? { try await onLoop { $0.selected } }

    /// Sends `bytes` to the selected pair's remote address.
    public func send(_ bytes: [UInt8]) async throws(ICEEndpointError) {
        let channel = self.channel
        try await onLoop { e throws(ICEEndpointError) in
            guard let agent = e.agent, let pair = agent.selected, agent.state != .failed, !agent.consentExpired else {
                throw .notConnected
            }
            channel.write(
                AddressedEnvelope(
                    remoteAddress: SocketAddress(pair.remote.address), data: channel.allocator.buffer(bytes: bytes)), promise: nil
            )
            channel.flush()
        }
    }

    /// ICE restart: new credentials and candidates to signal; checks start again on ``connect(to:timeout:)``.
    public func restart() async throws(ICEEndpointError) -> ICEDescription {
        try await onLoop { $0.restart() }
    }

    public func close() async {
        try? await channel.close()
    }
}

/// An ``ICEAgent`` on an event loop, hosted by a ``CoreHost`` (its timers and
/// actions), with the STUN gathering of a server-reflexive candidate (a
/// ``ClientTransaction`` in a host of its own) and the wait for a selected pair.
/// What it sends goes out through `output` (the socket of base 0, or a relay
/// allocation), so the same engine serves ``ICEUDPEndpoint`` (one socket of its
/// own) and ``SecureUDPEndpoint`` (a socket shared with the Noise session and a
/// TURN client). Confined to the event loop.
final class ICEEngine {
    typealias Output = (_ bytes: [UInt8], _ base: Int, _ to: TransportAddress) -> Void
    private let eventLoop: any EventLoop
    private let output: Output
    private let flushOutput: () -> Void
    private let onEvent: (ICEEvent) -> Void
    private var host: CoreHost<ICEAgent>?
    /// The agent as it is now (a copy), nil before ``start(_:stunServer:local:)``.
    var agent: ICEAgent? { host?.read { $0 } }
    /// The selected pair, if any.
    var selected: ICEPair? { host?.read { $0.selected } }
    /// Whether a datagram from `source` that is not STUN is the peer's data
    /// (``ICEAgent/acceptsData(from:)``).
    func acceptsData(from source: TransportAddress) -> Bool { host?.read { $0.acceptsData(from: source) } ?? false }
    /// The selected pair's remote address while its consent is expired (RFC 7675
    /// §5.1: nothing but ICE's own checks may go there until a pair is selected again).
    var withdrawnAddress: TransportAddress? {
        host?.read { $0.consentExpired ? $0.selected?.remote.address : nil }
    }
    private var waiter: EventLoopPromise<ICEPair>?
    private var connectTimeout: Scheduled<Void>?
    private var gathering: (host: CoreHost<ClientTransaction>, server: TransportAddress)?
    private var gatheredPromise: EventLoopPromise<Void>?
    private var local = TransportAddress(ip: .v4(0), port: 0)
    private(set) var closed = false

    init(eventLoop: any EventLoop, output: @escaping Output, flush: @escaping () -> Void, onEvent: @escaping (ICEEvent) -> Void) {
        self.eventLoop = eventLoop
        self.output = output
        self.flushOutput = flush
        self.onEvent = onEvent
        gatheredPromise = eventLoop.makePromise()
    }

    func run<T>(_ body: (ICEEngine) throws(ICEEndpointError) -> T) throws(ICEEndpointError) -> T {
        guard !closed else { throw .closed }
        return try body(self)
    }

    /// Starts `agent`; with a STUN server, gathers a server-reflexive candidate
    /// for the socket (base 0) bound to `local`.
    func start(_ agent: ICEAgent, stunServer: TransportAddress?, local: TransportAddress) {
        host = CoreHost(agent, on: eventLoop) { [weak self] action in
            self?.perform(action)
        } afterActions: { [weak self] in
            self?.flushOutput()
        }
        self.local = local
        if let stunServer {
            let m = Message(type: .bindingRequest)
            let tr = ClientTransaction(
                transactionID: m.transactionID, request: m.encode(fingerprint: true),
                reliability: .unreliable(rto: .milliseconds(250), rc: 4, rm: 4))
            let gatheringHost = CoreHost(tr, on: eventLoop) { [weak self] action in
                self?.performGathering(action)
            } afterActions: { [weak self] in
                self?.flushOutput()
            }
            gathering = (gatheringHost, stunServer)
            gatheringHost.handle(.start)
        } else {
            gatheredPromise?.succeed(())
            gatheredPromise = nil
        }
        feed(nil)
    }

    var description: ICEDescription {
        host?.read { ICEDescription(credentials: $0.local, candidates: $0.advertised) }
            ?? ICEDescription(credentials: ICECredentials(ufrag: "", pwd: ""), candidates: [])
    }

    func gathered(timeout: Duration) -> EventLoopFuture<Void> {
        guard let promise = gatheredPromise else { return eventLoop.makeSucceededVoidFuture() }
        let me = NIOLoopBound(self, eventLoop: eventLoop)
        eventLoop.scheduleTask(in: .nanoseconds(timeout.nanoseconds)) { me.value.finishGathering() }
        return promise.futureResult
    }

    private func finishGathering() {
        gathering?.host.stop()
        gathering = nil
        host?.with { core, _ in core.localCandidatesComplete() }
        gatheredPromise?.succeed(())
        gatheredPromise = nil
    }

    func connect(_ remote: ICEDescription, timeout: Duration) -> EventLoopFuture<ICEPair> {
        guard !closed, host != nil else { return eventLoop.makeFailedFuture(ICEEndpointError.closed) }
        waiter?.fail(ICEEndpointError.failed("superseded by another connect"))
        let promise = eventLoop.makePromise(of: ICEPair.self)
        waiter = promise
        connectTimeout?.cancel()
        let me = NIOLoopBound(self, eventLoop: eventLoop)
        connectTimeout = eventLoop.scheduleTask(in: .nanoseconds(timeout.nanoseconds)) {
            me.value.waiter?.fail(ICEEndpointError.timedOut(timeout))
            me.value.waiter = nil
        }
        feed(.setRemote(remote.credentials, candidates: remote.candidates, complete: true))
        return promise.futureResult
    }

    /// ICE restart: new credentials, the peer's candidates forgotten (the selected pair stays until a new one).
    func restart(candidates: [ICELocalCandidate]? = nil) -> ICEDescription {
        feed(.restart(local: .random(), candidates: candidates))
        return description
    }

    /// The peer's authenticated packets come from `address` now: consent follows (``ICEAgent/remoteMoved(to:now:)``).
    func remoteMoved(to address: TransportAddress) {
        feed(.remoteMoved(address))
    }

    // MARK: input

    /// Feeds `input` (if any), then runs the agent's timers at once, as every
    /// input may make a check due (a triggered check, the first of a new remote).
    private func feed(_ input: ICEAgent.Input?) {
        guard !closed, let host else { return }
        host.with { core, now in
            if let input { core.handle(input, now: now) }
            core.handleTimeout(now: now)
        }
    }

    /// A datagram from `source` on `base`: true when it was ICE's (a check, a
    /// check's answer, the gathering's answer); anything else is the caller's.
    func receiveSTUN(_ bytes: [UInt8], from source: TransportAddress, base: Int) -> Bool {
        guard !closed, let host else { return false }
        let wasICE = host.with { core, now -> Bool in
            guard core.receive(bytes, from: source, base: base, now: now) else { return false }
            core.handleTimeout(now: now)
            return true
        }
        if wasICE { return true }
        if base == 0, let g = gathering, source == g.server, Message.isSTUN(bytes), let m = try? Message(decoding: bytes) {
            return g.host.with { core, now -> Bool in
                core.handle(.response(m), now: now)
                return core.state == .answered
            }
        }
        return false
    }

    // MARK: output

    private func performGathering(_ action: ClientTransaction.Action) {
        guard let server = gathering?.server else { return }
        switch action {
        case .send(let bytes):
            output(bytes, 0, server)
        case .timedOut:
            finishGathering()
        case .answered(let m):
            if case .xorMappedAddress(let mapped)? = try? m.value(.xorMappedAddress), mapped != local {
                host?.with { core, _ in core.addLocal(.serverReflexive(mapped, baseAddress: local, base: 0)) }
            }
            finishGathering()
            feed(nil)
        }
    }

    private func perform(_ action: ICEOutput) {
        switch action {
        case .send(let bytes, let base, let to):
            output(bytes, base, to)
        case .event(let e):
            onEvent(e)
            switch e {
            case .selected(let pair):
                waiter?.succeed(pair)
                waiter = nil
                connectTimeout?.cancel()
            case .failed(let why):
                waiter?.fail(ICEEndpointError.failed(why))
                waiter = nil
                connectTimeout?.cancel()
            case .consentLost, .roleChanged:
                break
            }
        }
    }

    func shutDown() {
        guard !closed else { return }
        closed = true
        host?.stop()
        gathering?.host.stop()
        connectTimeout?.cancel()
        waiter?.fail(ICEEndpointError.closed)
        waiter = nil
        gatheredPromise?.succeed(())
        gatheredPromise = nil
    }
}

/// ``ICEUDPEndpoint``'s socket: STUN to the engine, other datagrams from the
/// peer's candidates to `incoming`.
final class ICEDatagramHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    let engine: ICEEngine
    private let incoming: AsyncStream<[UInt8]>.Continuation
    private let events: AsyncStream<ICEEvent>.Continuation

    init(channel: any Channel, incoming: AsyncStream<[UInt8]>.Continuation, events: AsyncStream<ICEEvent>.Continuation) {
        self.incoming = incoming
        self.events = events
        engine = ICEEngine(
            eventLoop: channel.eventLoop,
            output: { bytes, _, to in
                channel.write(
                    AddressedEnvelope(remoteAddress: SocketAddress(to), data: channel.allocator.buffer(bytes: bytes)),
                    promise: nil)
            },
            flush: { channel.flush() },
            onEvent: { events.yield($0) })
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let envelope = unwrapInboundIn(data)
        guard let source = TransportAddress(envelope.remoteAddress) else { return }
        let bytes = Array(envelope.data.readableBytesView)
        if engine.receiveSTUN(bytes, from: source, base: 0) { return }
        // Application data: only from the peer's candidates (RFC 8445 §12.2).
        guard !Message.isSTUN(bytes), engine.acceptsData(from: source) else { return }
        incoming.yield(bytes)
    }

    func channelReadComplete(context: ChannelHandlerContext) { context.flush() }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // ICMP port unreachable on an unconnected UDP socket is not fatal: the check times out.
    }

    func channelInactive(context: ChannelHandlerContext) {
        engine.shutDown()
        incoming.finish()
        events.finish()
        context.fireChannelInactive()
    }
}
