import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL
import STUN
import ServiceLifecycle
import TURN
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The STUN Binding service on UDP and TCP, as a ServiceLifecycle `Service`.
///
/// `run()` binds every listen address (UDP and TCP, IPv4 and IPv6), answers
/// Binding requests with the sans-IO ``BindingServer`` until graceful shutdown
/// or cancellation, then closes every socket and returns. With an
/// ``Configuration/alternateAddress`` it binds the four UDP sockets RFC 5780
/// behaviour discovery needs (primary and alternate IP × primary and alternate
/// port) on the first listen address of the alternate's family.
///
/// Callers learn the real addresses (port 0 binds an ephemeral port) from
/// ``boundSockets()``.
public final class RelayService: Service, Sendable {
    public struct Configuration: Hashable, Sendable {
        /// Where to listen. A port of 0 binds an ephemeral port; TCP then tries
        /// the port UDP got first.
        public var listenAddresses: [TransportAddress]
        /// The alternate IP and port for RFC 5780 (both must differ from the
        /// primary's). Needs UDP and a specific listen address of its family.
        public var alternateAddress: TransportAddress?
        /// A SOFTWARE attribute for responses; none by default.
        public var software: String?
        public var udp: Bool
        public var tcp: Bool
        /// Event-loop threads. With more than one, each UDP address gets one
        /// socket per thread (SO_REUSEPORT) and the kernel spreads the load.
        public var threads: Int
        /// A TCP connection that sends nothing for this long is closed.
        public var tcpIdleTimeout: TimeAmount
        /// TCP and TLS connections open at once, at most; more are closed on accept.
        public var maxTCPConnections = 10_000
        /// TCP and TLS connections open at once from one IP address, at most
        /// (so that one host's idle connections cannot take every slot); more
        /// are closed on accept. High enough for an office or a carrier NAT.
        public var maxTCPConnectionsPerSource = 1_000
        /// Send a read burst's answers to one client as UDP GSO writes (when the
        /// kernel supports it). Turn off for a NIC without TX checksum offload
        /// or an IPsec path, where Linux refuses GSO writes.
        public var gso: Bool
        /// How long a TURN lane lets datagrams gather once its sockets turn
        /// readable, before it reads them all in one drain (zero: at once).
        /// Voice arrives as one datagram per flow every 20 ms, so without a
        /// window every datagram costs a wake-up of its own; 200 µs adds at most
        /// that to a packet's trip through the relay and lets a busy relay read
        /// and send in batches.
        public var batchWindow: TimeAmount
        /// TURN (RFC 8656) on the primary UDP and the TCP sockets; nil serves STUN only.
        public var turn: TURNServerConfiguration?
        /// Where relay sockets are bound; nil derives it from the listen addresses.
        public var relayPlan: RelayAddressPlan?
        /// STUN/TURN over TLS (RFC 8656 §3.1) on a second port of every listen address.
        public var tls: TLSSettings?

        /// 200 µs: see ``batchWindow``.
        public static let defaultBatchWindow = TimeAmount.microseconds(200)

        /// `0.0.0.0:3478` and `[::]:3478`.
        public static let defaultListenAddresses = [
            TransportAddress(ip: .v4(0), port: 3478), TransportAddress(ip: .v6(high: 0, low: 0), port: 3478),
        ]

        public init(
            listenAddresses: [TransportAddress] = Configuration.defaultListenAddresses,
            alternateAddress: TransportAddress? = nil, software: String? = nil, udp: Bool = true, tcp: Bool = true,
            threads: Int = 1, tcpIdleTimeout: TimeAmount = .seconds(30), gso: Bool = true,
            batchWindow: TimeAmount = Configuration.defaultBatchWindow,
            turn: TURNServerConfiguration? = nil, relayPlan: RelayAddressPlan? = nil
        ) {
            self.batchWindow = batchWindow
            self.turn = turn
            self.relayPlan = relayPlan
            self.listenAddresses = listenAddresses
            self.alternateAddress = alternateAddress
            self.software = software
            self.udp = udp
            self.tcp = tcp
            self.threads = threads
            self.tcpIdleTimeout = tcpIdleTimeout
            self.gso = gso
        }

        /// The listen address the RFC 5780 sockets are built on: the first of the alternate's family.
        var behaviorDiscoveryPrimaryIndex: Int? {
            guard let alternate = alternateAddress else { return nil }
            return listenAddresses.firstIndex { $0.ip.isIPv4 == alternate.ip.isIPv4 }
        }

        /// Throws when the configuration cannot be served, saying why.
        public func validate() throws(RelayServiceError) {
            guard !listenAddresses.isEmpty else { throw .invalid("no listen address given") }
            guard udp || tcp else { throw .invalid("both UDP and TCP are disabled: nothing to serve") }
            guard threads >= 1 else { throw .invalid("thread count must be at least 1, not \(threads)") }
            guard tcpIdleTimeout > .zero else { throw .invalid("TCP idle timeout must be positive") }
            guard maxTCPConnections >= 1, maxTCPConnectionsPerSource >= 1 else {
                throw .invalid("TCP connection limits must be at least 1")
            }
            for (i, address) in listenAddresses.enumerated() where listenAddresses[..<i].contains(address) {
                throw .invalid("listen address \(address) is given twice")
            }
            if let tls {
                guard tcp else { throw .invalid("TLS needs TCP, which is disabled") }
                if tls.port != 0, listenAddresses.contains(where: { $0.port == tls.port }) {
                    throw .invalid("the TLS port \(tls.port) is also a listen port")
                }
            }
            if let turn {
                if !turn.anonymous && turn.credentials.isEmpty {
                    throw .invalid("TURN needs users or an auth secret (or anonymous access, asked for explicitly)")
                }
                if let plan = relayPlan {
                    guard plan.minPort <= plan.maxPort, plan.minPort > 0 else {
                        throw .invalid("relay port range \(plan.minPort)-\(plan.maxPort) is empty")
                    }
                    guard !plan.ips.isEmpty, !plan.ips.contains(where: \.isUnspecified) else {
                        throw .invalid("relay IPs must be specific addresses")
                    }
                }
            }
            guard let alternate = alternateAddress else { return }
            let family = alternate.ip.isIPv4 ? "IPv4" : "IPv6"
            guard udp else { throw .invalid("alternate address \(alternate) needs UDP, which is disabled") }
            guard let index = behaviorDiscoveryPrimaryIndex else {
                throw .invalid("alternate address \(alternate) is \(family) but no \(family) listen address is given")
            }
            let primary = listenAddresses[index]
            guard !primary.ip.isUnspecified else {
                throw .invalid(
                    "alternate address \(alternate) needs a specific primary \(family) listen address, not \(primary)")
            }
            guard !alternate.ip.isUnspecified else {
                throw .invalid("alternate address \(alternate) must be a specific IP address")
            }
            guard alternate.ip != primary.ip else {
                throw .invalid("alternate address \(alternate) has the same IP as the primary \(primary)")
            }
            guard alternate.port == 0 || alternate.port != primary.port else {
                throw .invalid("alternate address \(alternate) has the same port as the primary \(primary)")
            }
        }
    }

    public let configuration: Configuration
    private let memory: MemoryGuard?
    private let logger: Logger
    private let totals = StatisticsBox()
    private let bound = BoundResult<[BoundSocket]>()
    private let started = NIOLockedValueBox(false)
    private let turnLanes = NIOLockedValueBox<TURNLanes?>(nil)
    private let relayPorts = NIOLockedValueBox<RelayPortPool?>(nil)
    private let tlsContext = NIOLockedValueBox<NIOSSLContext?>(nil)
    /// The TCP and TLS listeners' connection limits, shared by every listener of the service.
    private let tcpAdmission: ConnectionAdmission
    private let finalTURN = NIOLockedValueBox(TURNStatistics())

    /// Relay ports held now and ports in the range (summed over address
    /// families); nil without TURN or before it starts.
    public var relayPortUsage: (held: Int, capacity: Int)? { relayPorts.withLockedValue { $0 }?.usage }

    /// The TURN counters of every event loop added up (while serving), or the
    /// final ones once `run()` has returned.
    public func turnStatistics() async -> TURNStatistics {
        guard let lanes = turnLanes.withLockedValue({ $0 }) else { return finalTURN.withLockedValue { $0 } }
        var total = TURNStatistics()
        for lane in lanes.all {
            if let s = try? await lane.eventLoop.submit({ lane.value.core.statistics }).get() { total.merge(s) }
        }
        return total
    }

    /// `memory`, when given, has TURN allocations refused (508) while memory is short.
    public init(configuration: Configuration, memory: MemoryGuard? = nil, logger: Logger) {
        self.configuration = configuration
        self.memory = memory
        tcpAdmission = ConnectionAdmission(
            limits: .init(total: configuration.maxTCPConnections, perSource: configuration.maxTCPConnectionsPerSource))
        self.logger = logger
    }

    /// The sockets once they are all bound, in bind order, one per address
    /// (reuse-port siblings are not repeated). Throws the bind error if
    /// binding failed, or `CancellationError` if the caller is cancelled first.
    public func boundSockets() async throws -> [BoundSocket] {
        try await bound.wait()
    }

    /// What has been answered and dropped so far (each event loop adds its
    /// counts after every read batch); complete once `run()` has returned.
    public var statistics: BindingStatistics { totals.snapshot }

    public func run() async throws {
        let first = started.withLockedValue { started in
            defer { started = true }
            return !started
        }
        guard first else { throw RelayServiceError(.alreadyRunning, "the binding service runs only once") }

        let group = MultiThreadedEventLoopGroup(numberOfThreads: max(1, configuration.threads))
        let channels: [any Channel]
        do {
            try configuration.validate()
            if let tls = configuration.tls {
                tlsContext.withLockedValue { $0 = nil }
                try loadTLS(tls)
            }
            turnLanes.withLockedValue { $0 = nil }
            if let turn = configuration.turn {
                let plan = configuration.relayPlan ?? RelayAddressPlan.derived(from: configuration.listenAddresses)
                // Relay sockets are bound per allocation: an address this machine does not
                // have would fail every Allocate (508) with nothing said. Tried once here.
                for ip in plan.ips {
                    do throws(UDPSocketError) {
                        close(try bindUDPSocket(TransportAddress(ip: ip, port: 0)))
                    } catch {
                        throw RelayServiceError(
                            .bindFailed,
                            "cannot bind relay sockets on \(ip): \(String(cString: strerror(error.errno))) (--relay-ip must be an address of this machine)"
                        )
                    }
                }
                var lanes: [NIOLoopBound<TURNLane>] = []
                let gso = configuration.gso
                let window = configuration.batchWindow
                let ports = RelayPortPool(plan: plan)
                relayPorts.withLockedValue { $0 = ports }
                for loop in group.makeIterator() {
                    let logger = self.logger
                    let memory = self.memory
                    lanes.append(
                        try await loop.submit {
                            let lane = TURNLane(
                                loop: loop, configuration: turn, plan: plan, logger: logger, gso: gso, batchWindow: window,
                                ports: ports, memory: memory)
                            lane.start()
                            return NIOLoopBound(lane, eventLoop: loop)
                        }.get())
                }
                turnLanes.withLockedValue { $0 = TURNLanes(lanes) }
                logger.info(
                    "TURN relay",
                    metadata: [
                        "realm": "\(turn.realm)", "relay-ips": "\(plan.ips.map(\.description))",
                        "ports": "\(plan.minPort)-\(plan.maxPort)", "anonymous": "\(turn.anonymous)",
                    ])
            }
            let (sockets, bound) = try await bindAll(on: group)
            channels = bound
            self.bound.resolve(.success(sockets))
        } catch {
            self.bound.resolve(.failure(error))
            await stopTURNLanes()
            try? await group.shutdownGracefully()
            throw error
        }

        // Serve until shutdown. A socket that closes on its own (an
        // unrecoverable socket error) fails the whole service, so that the
        // process exits and its supervisor restarts it, rather than half-serve.
        let stopping = NIOLockedValueBox(false)
        let lost: (any Channel)? = await withTaskCancellationOrGracefulShutdownHandler {
            await withTaskGroup(of: (any Channel)?.self) { tasks in
                for channel in channels {
                    tasks.addTask {
                        try? await channel.closeFuture.get()
                        return stopping.withLockedValue { $0 } ? nil : channel
                    }
                }
                var lost: (any Channel)?
                for await closed in tasks {
                    if let closed, lost == nil {
                        lost = closed
                        for channel in channels { channel.close(promise: nil) }
                    }
                }
                return lost
            }
        } onCancelOrGracefulShutdown: {
            stopping.withLockedValue { $0 = true }
            for channel in channels { channel.close(promise: nil) }
        }
        // Frees every allocation and its relay socket, then closes the TCP
        // connections still open; their handlers add their counts as they go.
        await stopTURNLanes()
        try? await group.shutdownGracefully()
        let statistics = totals.snapshot
        if let lost {
            let what = lost.localAddress.map { "\($0)" } ?? "a socket"
            logger.error("socket closed unexpectedly; stopping the service", metadata: ["socket": "\(what)"])
            throw RelayServiceError(.socketClosed, "\(what) closed unexpectedly (a socket error); the service stopped")
        }
        logger.info("STUN binding service stopped", metadata: statistics.metadata)
    }

    /// Stops every TURN lane (allocations, relay sockets, poller threads) before
    /// the event loops go, and keeps their final counters.
    private func stopTURNLanes() async {
        guard
            let lanes = turnLanes.withLockedValue({ lanes in
                defer { lanes = nil }
                return lanes
            })
        else { return }
        for lane in lanes.all {
            let statistics = try? await lane.eventLoop.submit {
                lane.value.stop()
                return lane.value.core.statistics
            }.get()
            if let statistics { finalTURN.withLockedValue { $0.merge(statistics) } }
        }
    }

    // MARK: binding

    private func bindAll(on group: MultiThreadedEventLoopGroup) async throws -> ([BoundSocket], [any Channel]) {
        let loops = Array(group.makeIterator())
        var sockets: [BoundSocket] = []
        var channels: [any Channel] = []
        let rfc5780Index = configuration.behaviorDiscoveryPrimaryIndex

        for (index, listen) in configuration.listenAddresses.enumerated() {
            var udpPort: UInt16?
            if configuration.udp {
                let alternate = index == rfc5780Index ? configuration.alternateAddress : nil
                let server = try await bindUDPServer(listen, alternate: alternate, on: loops)
                for socket in server.sockets { log(socket) }
                sockets += server.sockets
                channels += server.channels
                udpPort = server.sockets.first?.address.port
            }
            if configuration.tcp {
                let server: (channel: any Channel, address: TransportAddress)
                if listen.port == 0, let udpPort {
                    // Same port number as UDP when it is free, like a fixed-port server.
                    do {
                        server = try await bindTCP(TransportAddress(ip: listen.ip, port: udpPort), group: group)
                    } catch {
                        server = try await bindTCP(listen, group: group)
                    }
                } else {
                    server = try await bindTCP(listen, group: group)
                }
                channels.append(server.channel)
                sockets.append(BoundSocket(kind: .tcp, address: server.address))
                log(sockets[sockets.count - 1])
            }
            if let tls = configuration.tls, let context = tlsContext.withLockedValue({ $0 }) {
                let server = try await bindTCP(TransportAddress(ip: listen.ip, port: tls.port), group: group, tls: context)
                channels.append(server.channel)
                sockets.append(BoundSocket(kind: .tls, address: server.address))
                log(sockets[sockets.count - 1])
            }
        }
        return (sockets, channels)
    }

    /// Binds the UDP sockets of one listen address, and with `alternate` the
    /// other three RFC 5780 addresses (ports of 0 resolved as they are bound),
    /// then starts answering on all of them.
    private func bindUDPServer(
        _ listen: TransportAddress, alternate: TransportAddress?, on loops: [any EventLoop]
    ) async throws -> (sockets: [BoundSocket], channels: [any Channel]) {
        // A relaying service's primary sockets are read by their TURN lanes.
        let turn = turnLanes.withLockedValue { $0 }
        let primary = try await bindUDP(listen, on: loops, laneRead: turn != nil)
        let core: BindingServer
        let lanesByOrigin: [BindingServer.Origin: [any Channel]]
        let sockets: [BoundSocket]
        if let alternate {
            let otherPort = try await bindUDP(TransportAddress(ip: listen.ip, port: alternate.port), on: loops)
            let otherIP = try await bindUDP(TransportAddress(ip: alternate.ip, port: primary.address.port), on: loops)
            let otherBoth = try await bindUDP(
                TransportAddress(ip: alternate.ip, port: otherPort.address.port), on: loops)
            core = BindingServer(
                configuration: .init(
                    primary: primary.address, alternate: otherBoth.address, software: configuration.software))
            lanesByOrigin = [
                .primary: primary.lanes,
                BindingServer.Origin(alternateIP: false, alternatePort: true): otherPort.lanes,
                BindingServer.Origin(alternateIP: true, alternatePort: false): otherIP.lanes,
                BindingServer.Origin(alternateIP: true, alternatePort: true): otherBoth.lanes,
            ]
            sockets = BindingServer.Origin.all.map { origin in
                BoundSocket(kind: .udp, address: core.address(of: origin) ?? primary.address, origin: origin)
            }
        } else {
            core = BindingServer(configuration: .init(primary: primary.address, software: configuration.software))
            lanesByOrigin = [.primary: primary.lanes]
            sockets = [BoundSocket(kind: .udp, address: primary.address)]
        }

        let routes = UDPRoutes(channels: lanesByOrigin)
        var channels: [any Channel] = []
        for origin in BindingServer.Origin.all {
            for (lane, channel) in (lanesByOrigin[origin] ?? []).enumerated() {
                if origin == .primary, let turn, lane < primary.descriptors.count {
                    try await startLaneReading(
                        channel, fd: primary.descriptors[lane], address: primary.address, core: core, routes: routes, lane: lane,
                        turn: turn)
                } else {
                    try await startServing(channel, core: core, origin: origin, routes: routes, lane: lane)
                }
                channels.append(channel)
            }
        }
        return (sockets, channels)
    }

    private func log(_ socket: BoundSocket) {
        var metadata: Logger.Metadata = ["transport": "\(socket.kind.rawValue)", "address": "\(socket.address)"]
        if configuration.alternateAddress != nil && socket.kind == .udp { metadata["origin"] = "\(socket.origin)" }
        logger.info("listening", metadata: metadata)
    }

    /// Binds one UDP socket per event loop on `address` (one without
    /// SO_REUSEPORT when there is a single loop, so a port in use is an error).
    /// Reading stays off until ``startServing(_:core:origin:routes:lane:)``.
    /// With `laneRead` the sockets are bound here and handed to NIO, and their
    /// descriptors returned, for ``startLaneReading(_:fd:address:core:routes:lane:turn:)``.
    private func bindUDP(_ address: TransportAddress, on loops: [any EventLoop], laneRead: Bool = false) async throws
        -> (lanes: [any Channel], address: TransportAddress, descriptors: [Int32])
    {
        var lanes: [any Channel] = []
        var descriptors: [Int32] = []
        var target = address
        do {
            for loop in loops {
                if laneRead {
                    let fd = try ListenerSocket.bind(target, reusePort: loops.count > 1, buffer: Int32(Self.socketBufferBytes))
                    // NIO owns the descriptor from here on, failed or not (it closes it on failure).
                    let channel = try await DatagramBootstrap(group: loop).channelOption(.autoRead, value: false)
                        .withBoundSocket(fd).get()
                    lanes.append(channel)
                    descriptors.append(fd)
                    if target.port == 0, let actual = channel.localAddress.flatMap(TransportAddress.init) {
                        target.port = actual.port
                    }
                    continue
                }
                var bootstrap = DatagramBootstrap(group: loop)
                    .channelOption(.autoRead, value: false)
                    .channelOption(.datagramVectorReadMessageCount, value: Self.datagramsPerRead)
                    .channelOption(.socketOption(.so_rcvbuf), value: Self.socketBufferBytes)
                    .channelOption(.socketOption(.so_sndbuf), value: Self.socketBufferBytes)
                    .channelOption(
                        .recvAllocator,
                        value: FixedSizeRecvByteBufferAllocator(capacity: Self.datagramsPerRead * Self.datagramSlotSize))
                if loops.count > 1 { bootstrap = bootstrap.channelOption(Self.reusePort, value: 1) }
                if !target.ip.isIPv4 { bootstrap = bootstrap.channelOption(Self.ipv6Only, value: 1) }
                let channel = try await bootstrap.bind(to: SocketAddress(target)).get()
                lanes.append(channel)
                if target.port == 0, let actual = channel.localAddress.flatMap(TransportAddress.init) {
                    target.port = actual.port
                }
            }
        } catch {
            for channel in lanes { channel.close(promise: nil) }
            throw RelayServiceError.bindFailed("udp", address, error)
        }
        return (lanes, target, descriptors)
    }

    /// Hands a primary socket to the TURN lane of its event loop, which reads it
    /// in its drains (``ListenerSocket``); NIO keeps the channel, reading off.
    private func startLaneReading(
        _ channel: any Channel, fd: Int32, address: TransportAddress, core: BindingServer, routes: UDPRoutes, lane: Int,
        turn: TURNLanes
    ) async throws {
        let totals = self.totals
        try await channel.eventLoop.submit {
            guard let turnLane = turn.current(on: channel.eventLoop) else {
                throw RelayServiceError(.invalidConfiguration, "no TURN lane on the event loop of \(address)")
            }
            guard
                let listener = ListenerSocket(
                    fd: fd, address: address, channel: channel, core: core, routes: routes, laneIndex: lane, totals: totals)
            else {
                throw RelayServiceError.bindFailed(
                    "udp", address, UDPSocketError(address: address, call: "dup", errno: errno))
            }
            turnLane.attach(listener)
        }.get()
    }

    private func startServing(
        _ channel: any Channel, core: BindingServer, origin: BindingServer.Origin, routes: UDPRoutes, lane: Int
    ) async throws {
        let totals = self.totals
        let logger = self.logger
        let gso = configuration.gso
        try await channel.eventLoop.submit {
            try channel.pipeline.syncOperations.addHandler(
                UDPListenerHandler(
                    core: core, origin: origin, routes: routes, lane: lane, totals: totals, logger: logger, gso: gso))
        }.get()
        try await channel.setOption(.autoRead, value: true).get()
    }

    /// Reads the certificate chain and key once, so that a bad file fails the start.
    private func loadTLS(_ tls: TLSSettings) throws {
        let context = try Self.tlsContext(tls)
        tlsContext.withLockedValue { $0 = context }
    }

    /// Checks what `run()` would refuse before anything starts: the
    /// configuration and, with TLS, that the certificate and key load. A
    /// command calls it first so that a bad file is its only output.
    public static func check(_ configuration: Configuration) throws(RelayServiceError) {
        try configuration.validate()
        if let tls = configuration.tls { _ = try tlsContext(tls) }
    }

    /// A TLS server context from a PEM certificate chain and key (TLS 1.2 or later).
    /// An RSA or ECDSA key (P-256, P-384) signs its handshakes on threads of their own at
    /// a lower priority, not on the connection's event loop (``OffloadedSigningKey``);
    /// other keys on the loop.
    static func tlsContext(_ tls: TLSSettings) throws(RelayServiceError) -> NIOSSLContext {
        do {
            let chain = try NIOSSLCertificate.fromPEMFile(tls.certificateFile)
            let key = try NIOSSLPrivateKey(file: tls.privateKeyFile, format: .pem)
            var config = TLSConfiguration.makeServerConfiguration(
                certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
            config.minimumTLSVersion = .tlsv12
            // With the key itself first: BoringSSL checks that it is the certificate's (it
            // cannot check a key that signs elsewhere).
            let native = try NIOSSLContext(configuration: config)
            guard !OffloadedSigningKey.signOnLoop,
                let offloaded = OffloadedSigningKey.load(key, pool: OffloadedSigningKey.signers)
            else { return native }
            config.privateKey = .privateKey(NIOSSLPrivateKey(customPrivateKey: offloaded))
            config.cipherSuites = OffloadedSigningKey.cipherSuites
            return try NIOSSLContext(configuration: config)
        } catch {
            throw RelayServiceError(
                .invalidConfiguration, "TLS certificate \(tls.certificateFile) or key \(tls.privateKeyFile) unusable: \(error)")
        }
    }

    private func bindTCP(_ address: TransportAddress, group: MultiThreadedEventLoopGroup, tls: NIOSSLContext? = nil) async throws
        -> (channel: any Channel, address: TransportAddress)
    {
        let totals = self.totals
        let logger = self.logger
        let idleTimeout = configuration.tcpIdleTimeout
        let admission = tcpAdmission
        let turn = turnLanes.withLockedValue { $0 }
        // Over TCP there is no RFC 5780 behaviour discovery, so the core needs no addresses.
        let core = BindingServer(configuration: .init(software: configuration.software))
        let bootstrap = ServerBootstrap(group: group)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                if let refusal = admission.admit(channel) {
                    totals.refuseConnection(refusal)
                    return channel.close()
                }
                return channel.eventLoop.makeCompletedFuture {
                    if let tls {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls))
                    }
                    try channel.pipeline.syncOperations.addHandlers([
                        BackPressureHandler(),
                        IdleStateHandler(readTimeout: idleTimeout),
                        TCPListenerHandler(
                            core: core, totals: totals, logger: logger, turn: turn, transport: tls == nil ? .tcp : .tls,
                            frameTimeout: idleTimeout),
                    ])
                }
            }
        let name = tls == nil ? "tcp" : "tls"
        let channel: any Channel
        do {
            channel = try await bootstrap.listen(on: address, listener: "\(name) \(address)", logger: logger)
        } catch {
            throw RelayServiceError.bindFailed(name, address, error)
        }
        return (channel, channel.localAddress.flatMap(TransportAddress.init) ?? address)
    }

    /// Datagrams taken per recvmmsg call, and the room for each.
    static let datagramsPerRead = 64
    /// UDP socket buffers: the kernel's 208 KiB default overflows under bursts
    /// (RcvbufErrors). Linux caps the request at net.core.rmem_max / wmem_max.
    static let socketBufferBytes: SocketOptionValue = 4 << 20
    /// One byte more than the longest request, so that a longer datagram,
    /// cut to this, is still seen as too long (see ``BindingServer/largestRequest``).
    static let datagramSlotSize = BindingServer.largestRequest + 1
    static let ipv6Only = ChannelOptions.Types.SocketOption(level: .ipv6, name: .ipv6_v6only)
    static let reusePort = ChannelOptions.Types.SocketOption(level: .socket, name: NIOBSDSocket.Option(rawValue: SO_REUSEPORT))
}

/// Where the TLS certificate and key are, and the port to serve TLS on.
public struct TLSSettings: Hashable, Sendable {
    /// PEM certificate chain (leaf first).
    public var certificateFile: String
    /// PEM private key.
    public var privateKeyFile: String
    /// The TLS port on every listen address (coturn's default: 5349).
    public var port: UInt16

    public init(certificateFile: String, privateKeyFile: String, port: UInt16 = 5349) {
        self.certificateFile = certificateFile
        self.privateKeyFile = privateKeyFile
        self.port = port
    }
}

/// One socket the service listens on.
public struct BoundSocket: Hashable, Sendable, CustomStringConvertible {
    public enum Kind: String, Hashable, Sendable {
        case udp, tcp, tls
    }

    public var kind: Kind
    /// The local address, with the real port when port 0 was asked for.
    public var address: TransportAddress
    /// Which RFC 5780 server address this is; `.primary` for ordinary listen addresses.
    public var origin: BindingServer.Origin

    public init(kind: Kind, address: TransportAddress, origin: BindingServer.Origin = .primary) {
        self.kind = kind
        self.address = address
        self.origin = origin
    }

    /// `udp 127.0.0.1:3478`, `tcp [::1]:3478`.
    public var description: String { "\(kind.rawValue) \(address)" }
}

/// Why the binding service could not start.
public struct RelayServiceError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        public init(_ name: String) { self.name = name }
        public var description: String { name }

        /// The configuration cannot be served (see ``RelayService/Configuration/validate()``).
        public static let invalidConfiguration = Code("invalidConfiguration")
        /// A socket could not be bound (address in use, not on this host, …).
        public static let bindFailed = Code("bindFailed")
        /// `run()` was called a second time.
        public static let alreadyRunning = Code("alreadyRunning")
        /// A listening socket closed while serving (an unrecoverable socket error).
        public static let socketClosed = Code("socketClosed")
    }

    public var code: Code
    /// One line for a person.
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }

    @inline(never)
    static func invalid(_ message: String) -> Self { Self(.invalidConfiguration, message) }

    @inline(never)
    static func bindFailed(_ transport: String, _ address: TransportAddress, _ error: any Error) -> Self {
        Self(.bindFailed, "cannot listen on \(transport) \(address): \(reason(error))")
    }

    /// `Address already in use` for a socket error, else the error as text.
    static func reason(_ error: any Error) -> String {
        if let io = error as? IOError { return String(cString: strerror(io.errnoCode)) }
        return "\(error)"
    }
}

/// Counts of what the service answered and dropped.
public struct BindingStatistics: Hashable, Sendable, CustomStringConvertible {
    /// Responses sent (success and error responses).
    public var responses = 0
    /// Datagrams and TCP frames that got no answer, by reason.
    public var drops: [BindingServer.DropReason: Int] = [:]
    /// Responses that had no socket to leave from (should stay 0).
    public var unroutable = 0
    /// TCP connections closed because the stream was neither STUN nor ChannelData.
    public var badStreams = 0
    /// TCP connections closed for saying nothing, or for a frame that never completed.
    public var idleTimeouts = 0
    /// TCP/TLS connections closed on accept because ``RelayService/Configuration/maxTCPConnections`` were open.
    public var refusedConnections = 0
    /// Of those, the ones closed because ``RelayService/Configuration/maxTCPConnectionsPerSource`` were open from their IP.
    public var refusedPerSource = 0
    /// UDP GSO writes, and the answers they carried (included in ``responses``).
    public var gsoWrites = 0
    public var gsoSegments = 0

    public init() {}

    public var totalDrops: Int { drops.values.reduce(0, +) }

    /// `responses 12, drops 3 (not-stun 2, malformed 1), tcp closed: 1 bad stream, 0 idle`
    public var description: String {
        let reasons = BindingServer.DropReason.allCases.compactMap { reason in
            drops[reason].flatMap { $0 > 0 ? "\(reason.rawValue) \($0)" : nil }
        }
        var text = "responses \(responses), drops \(totalDrops)"
        if !reasons.isEmpty { text += " (\(reasons.joined(separator: ", ")))" }
        if unroutable > 0 { text += ", unroutable \(unroutable)" }
        if gsoWrites > 0 { text += ", \(gsoSegments) answers in \(gsoWrites) GSO writes" }
        text += ", tcp closed: \(badStreams) bad stream, \(idleTimeouts) idle"
        if refusedConnections > 0 { text += ", \(refusedConnections) refused (limit)" }
        return text
    }

    var metadata: Logger.Metadata {
        var metadata: Logger.Metadata = [
            "responses": "\(responses)", "drops": "\(totalDrops)", "tcp-bad-streams": "\(badStreams)",
            "tcp-idle-timeouts": "\(idleTimeouts)",
        ]
        for (reason, count) in drops where count > 0 { metadata["drops-\(reason.rawValue)"] = "\(count)" }
        if unroutable > 0 { metadata["unroutable"] = "\(unroutable)" }
        return metadata
    }
}

// MARK: - Counting without a lock per packet

/// One handler's counts since it last reported; touched only on its event loop.
struct BindingCounters {
    var responses = 0
    var unroutable = 0
    var badStreams = 0
    var idleTimeouts = 0
    var gsoWrites = 0
    var gsoSegments = 0
    /// Indexed like ``reasons``.
    var drops = [Int](repeating: 0, count: Self.reasons.count)

    /// `allCases` builds a new array on every use; this one is built once.
    static let reasons = BindingServer.DropReason.allCases

    mutating func drop(_ reason: BindingServer.DropReason) {
        if let index = Self.reasons.firstIndex(of: reason) { drops[index] += 1 }
    }

    var isZero: Bool {
        responses == 0 && unroutable == 0 && badStreams == 0 && idleTimeouts == 0 && gsoWrites == 0
            && !drops.contains { $0 != 0 }
    }

    /// Zeroes the counts in place (keeps the array's storage).
    mutating func reset() {
        responses = 0
        unroutable = 0
        badStreams = 0
        idleTimeouts = 0
        gsoWrites = 0
        gsoSegments = 0
        for index in drops.indices { drops[index] = 0 }
    }
}

/// The service-wide totals. Handlers add to it once per read batch and when
/// they are removed, never per packet.
final class StatisticsBox: Sendable {
    private let totals = NIOLockedValueBox(BindingStatistics())

    func merge(_ counters: inout BindingCounters) {
        guard !counters.isZero else { return }
        let add = counters
        totals.withLockedValue { totals in
            totals.responses += add.responses
            totals.unroutable += add.unroutable
            totals.badStreams += add.badStreams
            totals.idleTimeouts += add.idleTimeouts
            totals.gsoWrites += add.gsoWrites
            totals.gsoSegments += add.gsoSegments
            for (index, reason) in BindingCounters.reasons.enumerated() where add.drops[index] != 0 {
                totals.drops[reason, default: 0] += add.drops[index]
            }
        }
        counters.reset()
    }

    var snapshot: BindingStatistics { totals.withLockedValue { $0 } }

    func refuseConnection(_ why: ConnectionAdmission.Refusal) {
        totals.withLockedValue {
            $0.refusedConnections += 1
            if why == .perSource { $0.refusedPerSource += 1 }
        }
    }
}

// MARK: - Waiting for the bound addresses

/// Hands one result (the bound sockets, or the bind error) to every caller of
/// ``wait()``, now or later; a waiter can be cancelled.
final class BoundResult<Value: Sendable>: Sendable {
    private typealias Waiter = CheckedContinuation<Value, any Error>

    private struct State {
        var result: Result<Value, any Error>?
        var waiters: [Int: Waiter] = [:]
        var nextID = 0
    }

    private let state = NIOLockedValueBox(State())

    /// The first result wins; later ones are ignored.
    func resolve(_ result: Result<Value, any Error>) {
        let waiters = state.withLockedValue { state -> [Waiter] in
            guard state.result == nil else { return [] }
            state.result = result
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume(with: result) }
    }

    func wait() async throws -> Value {
        let id = state.withLockedValue { state in
            defer { state.nextID += 1 }
            return state.nextID
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (waiter: Waiter) in
                let ready = state.withLockedValue { state -> Result<Value, any Error>? in
                    if let result = state.result { return result }
                    if Task.isCancelled { return .failure(CancellationError()) }
                    state.waiters[id] = waiter
                    return nil
                }
                if let ready { waiter.resume(with: ready) }
            }
        } onCancel: {
            let waiter = state.withLockedValue { $0.waiters.removeValue(forKey: id) }
            waiter?.resume(throwing: CancellationError())
        }
    }
}
