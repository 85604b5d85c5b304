import ICE
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import STUN

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
    case bind(String)
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
        case .bind(let s): "cannot bind: \(s)"
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

    private init(channel: any Channel, engine: NIOLoopBound<ICEEngine>, localAddress: TransportAddress,
                 incoming: AsyncStream<[UInt8]>, events: AsyncStream<ICEEvent>) {
        self.channel = channel; self.engine = engine; self.localAddress = localAddress
        self.incoming = incoming; self.events = events
    }

    /// Binds a UDP socket on `host` (port 0: any) as an ICE agent in `role`.
    ///
    /// - Parameters:
    ///   - hostAddresses: the host candidates' IPs; by default the bound IP
    ///     (which must then not be a wildcard).
    ///   - stunServer: where to learn a server-reflexive candidate (RFC 8489 Binding).
    public static func bind(host: String, port: Int = 0, role: ICERole, hostAddresses: [IPAddress]? = nil,
                            stunServer: TransportAddress? = nil, configuration: ICEConfiguration = .init(),
                            group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) async throws(ICEEndpointError) -> ICEUDPEndpoint {
        let (incoming, incomingYield) = AsyncStream.makeStream(of: [UInt8].self, bufferingPolicy: .bufferingNewest(1024))
        let (events, eventsYield) = AsyncStream.makeStream(of: ICEEvent.self, bufferingPolicy: .bufferingNewest(256))
        let channel: any Channel
        do {
            channel = try await DatagramBootstrap(group: group)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(ICEDatagramHandler(
                            engine: ICEEngine(channel: channel, incoming: incomingYield, events: eventsYield)))
                    }
                }
                .bind(host: host, port: port).get()
        } catch {
            incomingYield.finish(); eventsYield.finish()
            throw .bind("\(host):\(port): \(error)")
        }
        guard let local = channel.localAddress.flatMap({ TransportAddress($0) }) else {
            try? await channel.close()
            throw .bind("no local address")
        }
        let ips = hostAddresses ?? [local.ip]
        let candidates = ips.enumerated().map { i, ip in
            ICELocalCandidate.host(TransportAddress(ip: ip, port: local.port), base: 0, localPreference: UInt32(65535 - min(i, 65535)))
        }
        do {
            let engine = try await channel.eventLoop.submit {
                let engine = try channel.pipeline.syncOperations.handler(type: ICEDatagramHandler.self).engine
                engine.start(ICEAgent(role: role, candidates: candidates, gatheringComplete: stunServer == nil, configuration: configuration),
                             stunServer: stunServer, local: local)
                return NIOLoopBound(engine, eventLoop: channel.eventLoop)
            }.get()
            return ICEUDPEndpoint(channel: channel, engine: engine, localAddress: local, incoming: incoming, events: events)
        } catch {
            try? await channel.close()
            throw .bind("\(error)")
        }
    }

    private func onLoop<T: Sendable>(_ body: @escaping @Sendable (ICEEngine) throws(ICEEndpointError) -> T) async throws(ICEEndpointError) -> T {
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
    public func selected() async throws(ICEEndpointError) -> ICEPair? { try await onLoop { $0.agent?.selected } }

    /// Sends `bytes` to the selected pair's remote address.
    public func send(_ bytes: [UInt8]) async throws(ICEEndpointError) {
        try await onLoop { e throws(ICEEndpointError) in try e.sendData(bytes) }
    }

    /// ICE restart: new credentials and candidates to signal; checks start again on ``connect(to:timeout:)``.
    public func restart() async throws(ICEEndpointError) -> ICEDescription {
        try await onLoop { e in
            e.agent?.restart()
            return e.description
        }
    }

    public func close() async {
        try? await channel.close()
    }
}

/// The agent and its socket, confined to the channel's event loop.
final class ICEEngine {
    private let channel: any Channel
    private let incoming: AsyncStream<[UInt8]>.Continuation
    private let events: AsyncStream<ICEEvent>.Continuation
    var agent: ICEAgent?
    private var timer: Scheduled<Void>?
    private var timerAt: Timestamp?
    private var waiter: EventLoopPromise<ICEPair>?
    private var connectTimeout: Scheduled<Void>?
    private var gathering: (transaction: ClientTransaction, server: TransportAddress)?
    private var gatheredPromise: EventLoopPromise<Void>?
    private var local = TransportAddress(ip: .v4(0), port: 0)
    private var closed = false

    init(channel: any Channel, incoming: AsyncStream<[UInt8]>.Continuation, events: AsyncStream<ICEEvent>.Continuation) {
        self.channel = channel; self.incoming = incoming; self.events = events
        gatheredPromise = channel.eventLoop.makePromise()
    }

    static func now() -> Timestamp { Timestamp(nanoseconds: NIODeadline.now().uptimeNanoseconds) }

    func run<T>(_ body: (ICEEngine) throws(ICEEndpointError) -> T) throws(ICEEndpointError) -> T {
        guard !closed else { throw .closed }
        return try body(self)
    }

    func start(_ agent: ICEAgent, stunServer: TransportAddress?, local: TransportAddress) {
        self.agent = agent
        self.local = local
        if let stunServer {
            let m = Message(type: .bindingRequest)
            var tr = ClientTransaction(transactionID: m.transactionID, request: m.encode(fingerprint: true),
                                       reliability: .unreliable(rto: .milliseconds(250), rc: 4, rm: 4))
            if case .send(let bytes, _) = tr.start(now: Self.now()) { write(bytes, to: stunServer) }
            gathering = (tr, stunServer)
            flush()
        } else {
            gatheredPromise?.succeed(())
            gatheredPromise = nil
        }
        drive()
    }

    var description: ICEDescription {
        ICEDescription(credentials: agent?.local ?? ICECredentials(ufrag: "", pwd: ""), candidates: agent?.advertised ?? [])
    }

    func gathered(timeout: Duration) -> EventLoopFuture<Void> {
        guard let promise = gatheredPromise else { return channel.eventLoop.makeSucceededVoidFuture() }
        let me = NIOLoopBound(self, eventLoop: channel.eventLoop)
        channel.eventLoop.scheduleTask(in: .nanoseconds(timeout.nanoseconds)) { me.value.finishGathering() }
        return promise.futureResult
    }

    private func finishGathering() {
        gathering = nil
        agent?.localCandidatesComplete()
        gatheredPromise?.succeed(())
        gatheredPromise = nil
    }

    func connect(_ remote: ICEDescription, timeout: Duration) -> EventLoopFuture<ICEPair> {
        guard !closed, agent != nil else { return channel.eventLoop.makeFailedFuture(ICEEndpointError.closed) }
        waiter?.fail(ICEEndpointError.failed("superseded by another connect"))
        let promise = channel.eventLoop.makePromise(of: ICEPair.self)
        waiter = promise
        agent?.setRemote(remote.credentials, candidates: remote.candidates)
        connectTimeout?.cancel()
        let me = NIOLoopBound(self, eventLoop: channel.eventLoop)
        connectTimeout = channel.eventLoop.scheduleTask(in: .nanoseconds(timeout.nanoseconds)) {
            me.value.waiter?.fail(ICEEndpointError.timedOut(timeout))
            me.value.waiter = nil
        }
        drive()
        return promise.futureResult
    }

    func sendData(_ bytes: [UInt8]) throws(ICEEndpointError) {
        guard let pair = agent?.selected, agent?.state != .failed else { throw .notConnected }
        write(bytes, to: pair.remote.address)
        flush()
    }

    // MARK: input

    func received(_ bytes: [UInt8], from source: TransportAddress) {
        guard !closed, var agent else { return }
        let now = Self.now()
        if let outputs = agent.receive(bytes, from: source, base: 0, now: now) {
            self.agent = agent
            perform(outputs)
            drive()
            return
        }
        if var g = gathering, source == g.server, Message.isSTUN(bytes), let m = try? Message(decoding: bytes), g.transaction.receive(m) {
            if case .xorMappedAddress(let mapped)? = try? m.value(.xorMappedAddress), mapped != local {
                self.agent?.addLocal(.serverReflexive(mapped, baseAddress: local, base: 0))
            }
            finishGathering()
            drive()
            return
        }
        // Application data: only from the selected pair's remote (consent is per pair).
        guard let pair = agent.selected, source == pair.remote.address, !Message.isSTUN(bytes) else { return }
        incoming.yield(bytes)
    }

    // MARK: time and output

    private func drive() {
        guard !closed, var agent else { return }
        let now = Self.now()
        if var g = gathering {
            switch g.transaction.timerFired(now: now) {
            case .send(let bytes, _): write(bytes, to: g.server); gathering = g
            case .timedOut: finishGathering()
            case .wait, .none: gathering = g
            }
        }
        let outputs = agent.poll(now: now)
        self.agent = agent
        perform(outputs)
        flush()
        var wake = agent.nextWakeup
        if let g = gathering, g.transaction.state == .waiting, wake == nil || g.transaction.deadline < wake! { wake = g.transaction.deadline }
        schedule(wake)
    }

    private func schedule(_ at: Timestamp?) {
        guard let at else { timer?.cancel(); timer = nil; timerAt = nil; return }
        if let timerAt, timerAt == at { return }
        timer?.cancel()
        timerAt = at
        let now = Self.now()
        let delay = at > now ? Int64(clamping: at.nanoseconds - now.nanoseconds) : 0
        let me = NIOLoopBound(self, eventLoop: channel.eventLoop)
        timer = channel.eventLoop.scheduleTask(in: .nanoseconds(delay)) {
            me.value.timerAt = nil
            me.value.drive()
        }
    }

    private func perform(_ outputs: [ICEOutput]) {
        for o in outputs {
            switch o {
            case .send(let bytes, _, let to):
                write(bytes, to: to)
            case .event(let e):
                events.yield(e)
                switch e {
                case .selected(let pair):
                    waiter?.succeed(pair); waiter = nil; connectTimeout?.cancel()
                case .failed(let why):
                    waiter?.fail(ICEEndpointError.failed(why)); waiter = nil; connectTimeout?.cancel()
                case .consentLost, .roleChanged:
                    break
                }
            }
        }
    }

    private func write(_ bytes: [UInt8], to address: TransportAddress) {
        let envelope = AddressedEnvelope(remoteAddress: SocketAddress(address), data: channel.allocator.buffer(bytes: bytes))
        channel.write(envelope, promise: nil)
    }

    func flush() { channel.flush() }

    func shutDown() {
        guard !closed else { return }
        closed = true
        timer?.cancel()
        connectTimeout?.cancel()
        waiter?.fail(ICEEndpointError.closed); waiter = nil
        gatheredPromise?.succeed(()); gatheredPromise = nil
        incoming.finish()
        events.finish()
    }
}

final class ICEDatagramHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    let engine: ICEEngine

    init(engine: ICEEngine) { self.engine = engine }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let envelope = unwrapInboundIn(data)
        guard let source = TransportAddress(envelope.remoteAddress) else { return }
        engine.received(Array(envelope.data.readableBytesView), from: source)
    }

    func channelReadComplete(context: ChannelHandlerContext) { engine.flush() }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // ICMP port unreachable on an unconnected UDP socket is not fatal: the check times out.
    }

    func channelInactive(context: ChannelHandlerContext) {
        engine.shutDown()
        context.fireChannelInactive()
    }
}
