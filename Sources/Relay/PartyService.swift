import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL
import Party
import Rendezvous
import STUN
import Secure
import ServiceLifecycle
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Parties on the relay: members' Noise IK sessions with the relay's identity on
/// one UDP socket (a ``SecureUDPEndpoint`` that accepts any key), and the
/// ``PartyServer`` core on the same event loop, hosted by a ``CoreHost``. Every
/// party packet (voice frame, control message, acknowledgement) travels as the
/// payload of a secure media packet of payload type `PartyHop.payloadType`.
///
/// A swift-service-lifecycle `Service`, run beside ``RelayService`` by
/// `tusa relay --party-port`. On a graceful shutdown of a relay that reports to a
/// directory (``ticketSecret``), it drains: every member is told to move (the
/// directory, told first by the ``DirectoryReporter`` that runs after it, places
/// the rooms elsewhere), and it goes once no member has been heard for a second,
/// or after ``drainDeadline``.
public final class PartyService: Service, Sendable {
    public let address: TransportAddress
    public let identity: Identity
    public let configuration: PartyServer.Configuration
    /// Where the hop-by-hop sessions' media keys are logged (for the operator's
    /// `tusa interop decrypt`, which then finds only end-to-end sealed frames).
    public let keyLogPath: String?
    /// TCP ports members whose UDP is blocked connect to (RFC 4571 framing): nil
    /// stands for the UDP port's own number, 0 for any free port.
    public let streamPorts: [UInt16?]
    /// TLS ports members whose network passes only TLS connect to (e.g. 443), with
    /// the certificate they are shown.
    public let tls: TLSStreams?
    /// TCP and TLS connections open at once, in all and from one source, over
    /// every stream port (`tusa relay --max-tcp-connections[-per-ip]`).
    public let streamLimits: ConnectionAdmission.Limits
    /// The directory's relay secret when the relay reports to one: room tickets are
    /// keyed from it, so that any relay of the directory takes a moved room back
    /// (``RoomTicketAuthority/init(directorySecret:incarnation:)``); nil: from the identity.
    public let ticketSecret: String?
    /// The longest a drain waits for members to move away.
    public let drainDeadline: Duration
    /// While it says memory is short, new rooms and joins are refused.
    private let memory: MemoryGuard?
    private let logger: Logger
    private let bound = BoundResult<TransportAddress>()
    private let boundStreams = BoundResult<[TransportAddress]>()
    private let statisticsBox = NIOLockedValueBox(PartyServer.Statistics())
    private let roomsBox = NIOLockedValueBox((rooms: 0, members: 0))
    /// The rooms' core once running, on its loop (what ``roomListings(since:)`` reads).
    private let running = NIOLockedValueBox<(rooms: NIOLoopBound<PartyRooms>, loop: any EventLoop)?>(nil)

    public init(
        address: TransportAddress, identity: Identity, configuration: PartyServer.Configuration = .init(),
        keyLogPath: String? = nil, streamPorts: [UInt16?] = [nil], tls: TLSStreams? = nil,
        streamLimits: ConnectionAdmission.Limits = .init(total: 4096, perSource: 1000), ticketSecret: String? = nil,
        drainDeadline: Duration = .seconds(10), memory: MemoryGuard? = nil, logger: Logger
    ) {
        self.tls = tls
        self.streamLimits = streamLimits
        self.ticketSecret = ticketSecret
        self.drainDeadline = drainDeadline
        self.memory = memory
        self.keyLogPath = keyLogPath
        self.streamPorts = streamPorts
        self.address = address
        self.identity = identity
        self.configuration = configuration
        self.logger = logger
    }

    /// The bound address once `run()` has bound it (the real port for port 0).
    public func boundAddress() async throws -> TransportAddress { try await bound.wait() }
    /// The TCP addresses members can reach the parties on when UDP is blocked
    /// (the TCP ports', then the TLS ports').
    public func boundStreamAddresses() async throws -> [TransportAddress] { try await boundStreams.wait() }
    /// Those of them that take plain TCP (``streamPorts``, in order).
    public func boundTCPAddresses() async throws -> [TransportAddress] {
        Array(try await boundStreams.wait().prefix(streamPorts.count))
    }
    /// Those of them that take TLS (``tls``'s ports, in order).
    public func boundTLSAddresses() async throws -> [TransportAddress] {
        Array(try await boundStreams.wait().dropFirst(streamPorts.count))
    }

    /// The core's counters, as of the last read burst (or packet outside one).
    public var statistics: PartyServer.Statistics { statisticsBox.withLockedValue { $0 } }
    /// Rooms open now.
    public var roomCount: Int { roomsBox.withLockedValue { $0.rooms } }
    /// Members in them now.
    public var memberCount: Int { roomsBox.withLockedValue { $0.members } }

    /// The rooms as a directory lists them: those opened or changed since `known`
    /// (room id to ``PartyServer/Room/revision``, as returned last time) with their
    /// revisions now, and those in `known` that closed. Nothing before the service runs.
    public func roomListings(since known: [String: UInt64]) async -> (
        changed: [(listing: PartyListing, revision: UInt64)], closed: [String]
    ) {
        guard let (rooms, loop) = running.withLockedValue({ $0 }) else { return ([], []) }
        return (try? await loop.submit { rooms.value.listings(since: known) }.get()) ?? ([], [])
    }

    public func run() async throws {
        var secure = SecureConfiguration()
        secure.acceptUnknownPeers = true
        // Thousands of members' reports and keepalives: run together, at most 20 wakes a second.
        secure.timerSlack = .milliseconds(50)
        let endpoint: SecureUDPEndpoint
        let streams: [TransportAddress]
        let sendSocket: Int32
        // TLS members' connections on a thread of their own: a flood of handshakes (a
        // millisecond of CPU each) then waits its turn beside the media loop instead of
        // holding it up.
        // Shut down once the endpoint has closed every connection on it.
        let handshakes = tls.map { _ in MultiThreadedEventLoopGroup(numberOfThreads: 1) }
        let stopHandshakes = { () async in try? await handshakes?.shutdownGracefully() }
        do { (endpoint, streams, sendSocket) = try await bindSockets(secure, streamLoop: handshakes?.next()) } catch {
            bound.resolve(.failure(error))
            boundStreams.resolve(.failure(error))
            await stopHandshakes()
            throw error
        }
        let loop = endpoint.eventLoop
        let logger = self.logger
        let configuration = self.configuration
        // Keyed by the identity: with the same identity file, a restarted relay takes its rooms' members back;
        // by the directory's secret: so does any relay of the directory.
        let incarnation = UInt64.random(in: .min ... .max)
        let tickets =
            ticketSecret.map { RoomTicketAuthority(directorySecret: $0, incarnation: incarnation) }
            ?? RoomTicketAuthority(identity: identity.privateKey, incarnation: incarnation)
        let rooms: NIOLoopBound<PartyRooms>
        do {
            rooms = try await loop.submit { [statisticsBox, roomsBox] in
                PartyRooms.make(
                    core: PartyServer(configuration: configuration, tickets: tickets), endpoint: endpoint,
                    sendSocket: sendSocket, loop: loop, logger: logger, statistics: statisticsBox, roomCount: roomsBox)
            }.get()
        } catch {
            bound.resolve(.failure(error))
            boundStreams.resolve(.failure(error))
            await endpoint.close()
            close(sendSocket)
            await stopHandshakes()
            throw error
        }
        // Sessions on the loop, as they happen: a member's first packet may come right
        // behind the handshake that opened its session.
        await endpoint.setSessionHandler { event in
            switch event {
            // Every handshake: a member the room core dropped (silent too long) comes back by one.
            case .established(let peer, let key, _): rooms.value.opened(peer, key: key)
            case .peerGone(let peer): rooms.value.closed(peer)
            default: break
            }
        }
        await endpoint.setReadBurstEndHandler { rooms.value.readBurstEnded() }
        await endpoint.setMediaHandler { peer, header, payload in
            guard header.payloadType == PartyHop.payloadType else { return }
            rooms.value.received(peer, Array(payload))
        }
        logger.info(
            "serving parties",
            metadata: [
                "address": "udp \(endpoint.localAddress)",
                "tcp": "\(streams.prefix(streamPorts.count).map(\.description))",
                "tls": "\(streams.dropFirst(streamPorts.count).map(\.description))",
                "key": "\(identity.publicKey)",
            ])
        let observer = memory?.observe { short in loop.execute { rooms.value.memoryShort(short) } }
        running.withLockedValue { $0 = (rooms, loop) }
        bound.resolve(.success(endpoint.localAddress))
        boundStreams.resolve(.success(streams))
        await withDiscardingTaskGroup { group in
            // (The events stream must be read: what the handler saw also queues there.)
            group.addTask { for await _ in endpoint.events {} }
            try? await gracefulShutdown()
            if ticketSecret != nil { await drain(rooms, on: loop) }
            if let memory, let observer { memory.stopObserving(observer) }
            await endpoint.close()
            await stopHandshakes()
        }
        running.withLockedValue { $0 = nil }
        try? await loop.submit { rooms.value.stop() }.get()
    }
    /// Tells every member to move, then waits until none has been heard for a second (they have gone
    /// to the relay the directory placed their rooms on) or the deadline passes.
    private func drain(_ rooms: NIOLoopBound<PartyRooms>, on loop: any EventLoop) async {
        guard let told = try? await loop.submit({ rooms.value.drain() }).get(), told > 0 else { return }
        logger.info("draining: members told to move", metadata: ["members": "\(told)"])
        let started = ContinuousClock.now
        while started.duration(to: .now) < drainDeadline {
            try? await Task.sleep(for: .milliseconds(100))
            guard let quiet = try? await loop.submit({ rooms.value.quietFor }).get() else { break }
            if quiet >= .seconds(1) { break }
        }
        logger.info("drained", metadata: ["after": "\(started.duration(to: .now))"])
    }

    /// UDP, then the same sessions over TCP for members whose UDP is blocked, on the
    /// UDP port's number (members try that number over TCP), then over TLS. With any
    /// free port asked for (0), a number free for UDP but taken for TCP is given back
    /// and another drawn.
    /// The third value is a duplicate of the UDP socket for the members' copies,
    /// written in batches of the relay's own (``PartyRooms``); closed after the endpoint.
    private func bindSockets(
        _ secure: SecureConfiguration, streamLoop: (any EventLoop)?
    ) async throws(RelayServiceError) -> (SecureUDPEndpoint, [TransportAddress], Int32) {
        let context = try tls.map { tls throws(RelayServiceError) in try tls.context() }
        let admission = ConnectionAdmission(limits: streamLimits)
        var attempt = 0
        while true {
            attempt += 1
            let endpoint: SecureUDPEndpoint
            let sendSocket: Int32
            do {
                // The TURN listener's buffers: with the kernel's 208 KiB default, a loop
                // busy for a few milliseconds writing copies dropped members' frames.
                // An IPv6 address takes IPv4 members too, as the socket NIO bound did.
                let fd = try ListenerSocket.bind(
                    address, reusePort: false, buffer: Int32(RelayService.socketBufferBytes), dualStack: true,
                    dontFragment: true)
                sendSocket = fcntl(fd, F_DUPFD_CLOEXEC, 0)
                guard sendSocket >= 0 else {
                    let error = errno
                    close(fd)
                    throw RelayServiceError(
                        .bindFailed, "cannot serve parties on udp \(address): dup: \(String(cString: strerror(error)))")
                }
                do {
                    // The endpoint owns `fd` from here on, failed or not.
                    endpoint = try await SecureUDPEndpoint.bind(
                        host: address.ip.description, port: Int(address.port), identity: identity, configuration: secure,
                        keyLogPath: keyLogPath, boundSocket: fd, logger: logger)
                } catch {
                    close(sendSocket)
                    throw RelayServiceError(.bindFailed, "cannot serve parties on udp \(address): \(error)")
                }
            } catch let error as RelayServiceError {
                throw error
            } catch {
                throw RelayServiceError(.bindFailed, "cannot serve parties on udp \(address): \(error)")
            }
            var streams: [TransportAddress] = []
            do {
                for port in streamPorts {
                    streams.append(
                        try await endpoint.listenForStreams(
                            host: address.ip.description, port: Int(port ?? endpoint.localAddress.port),
                            maxStreams: streamLimits.total, admission: admission))
                }
                if let tls, let context {
                    for port in tls.ports {
                        streams.append(
                            try await endpoint.listenForStreams(
                                host: address.ip.description, port: Int(port), maxStreams: streamLimits.total, tls: context,
                                admission: admission, streamLoop: streamLoop))
                    }
                }
                return (endpoint, streams, sendSocket)
            } catch {
                await endpoint.close()
                close(sendSocket)
                if address.port == 0, attempt < 8, case .bind(_, let cause) = error,
                    (cause.error as? IOError)?.errnoCode == EADDRINUSE
                {
                    continue
                }
                throw RelayServiceError(.bindFailed, "cannot serve parties over TCP or TLS: \(error)")
            }
        }
    }

    /// Party members over TLS: where, and the certificate they see. Members prove
    /// the relay by its Noise key inside, so any certificate serves (a self-signed
    /// one included); a real one passes middleboxes that look.
    public struct TLSStreams: Hashable, Sendable {
        /// TCP ports taking TLS (0: any free port).
        public var ports: [UInt16]
        /// PEM certificate chain (leaf first).
        public var certificateFile: String
        /// PEM private key of the certificate.
        public var privateKeyFile: String

        public init(ports: [UInt16], certificateFile: String, privateKeyFile: String) {
            self.ports = ports
            self.certificateFile = certificateFile
            self.privateKeyFile = privateKeyFile
        }

        /// The server context; a certificate or key that does not load is a clear error.
        public func context() throws(RelayServiceError) -> NIOSSLContext {
            try RelayService.tlsContext(TLSSettings(certificateFile: certificateFile, privateKeyFile: privateKeyFile))
        }
    }
}

/// The room core and the members' sessions, touched only on the endpoint's loop
/// (what a copy reads is `@exclusivity(unchecked)`, as in `TURNLane`).
final class PartyRooms {
    private var host: CoreHost<PartyServer>!
    private let endpoint: SecureUDPEndpoint
    /// The members' copies, sealed straight into ``scratch`` and queued here, leave with
    /// sendmmsg on the socket's duplicate at the end of the read burst that made them
    /// (or at once, outside one): no buffer, envelope or channel write per copy. Peers
    /// whose path is not the socket (a TCP or TLS stream) go the endpoint's way. No UDP
    /// GSO: two copies to one member in a row would show as one datagram in a capture on
    /// loopback, which `tusa interop decrypt` could not open (and copies to different
    /// members, the usual case, cannot share a GSO write anyway).
    private let outbox = PeerOutbox(gso: false)
    private let socket: RelaySocket
    private let scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_536, alignment: 16)
    /// Copies dropped because the socket's send buffer was full.
    @exclusivity(unchecked) private(set) var sendDrops: UInt64 = 0
    /// Each session's secure peer (a session is named after its peer).
    @exclusivity(unchecked) private var peers: [PartySession: PeerID] = [:]
    private let logger: Logger
    private let statisticsBox: NIOLockedValueBox<PartyServer.Statistics>
    private let roomCountBox: NIOLockedValueBox<(rooms: Int, members: Int)>

    /// Created on `loop`'s behalf; the returned box is used only there.
    static func make(
        core: PartyServer, endpoint: SecureUDPEndpoint, sendSocket: Int32, loop: any EventLoop, logger: Logger,
        statistics: NIOLockedValueBox<PartyServer.Statistics>, roomCount: NIOLockedValueBox<(rooms: Int, members: Int)>
    ) -> NIOLoopBound<PartyRooms> {
        NIOLoopBound(
            PartyRooms(
                core: core, endpoint: endpoint, sendSocket: sendSocket, loop: loop, logger: logger, statistics: statistics,
                roomCount: roomCount),
            eventLoop: loop)
    }

    private init(
        core: PartyServer, endpoint: SecureUDPEndpoint, sendSocket: Int32, loop: any EventLoop, logger: Logger,
        statistics: NIOLockedValueBox<PartyServer.Statistics>, roomCount: NIOLockedValueBox<(rooms: Int, members: Int)>
    ) {
        self.endpoint = endpoint
        self.logger = logger
        statisticsBox = statistics
        roomCountBox = roomCount
        socket = RelaySocket(address: endpoint.localAddress, fd: sendSocket)
        host = CoreHost(core, on: loop) { [unowned self] action in
            perform(action)
        } afterActions: { [unowned self] in
            afterRun()
        }
    }

    /// The copies of a run of actions or of a frame, and what went the endpoint's way,
    /// leave at once, or at the end of the read burst when in one (the burst's copies in
    /// few sendmmsg calls; a frame from a TCP or TLS member comes in no UDP read burst).
    /// The counters are published first, so that a member answered has been counted.
    private func afterRun() {
        endpoint.flushOnLoop()
        guard !endpoint.inReadBurstOnLoop else { return }
        publish()
        if !outbox.isEmpty { sendFlush() }
    }

    /// The core's counters and the rooms' count, to the service's boxes (what metrics and `tusa relay`'s log read).
    private func publish() {
        var (s, n, m) = host.read { ($0.statistics, $0.rooms.count, $0.memberCount) }
        s.copiesDropped = sendDrops
        statisticsBox.withLockedValue { $0 = s }
        roomCountBox.withLockedValue { $0 = (n, m) }
    }

    func opened(_ peer: PeerID, key: PublicKey) {
        peers[Self.session(peer)] = peer
        host.handle(.opened(Self.session(peer), key: key))
    }

    func received(_ peer: PeerID, _ bytes: [UInt8]) {
        let session = Self.session(peer)
        guard peers[session] != nil else { return }
        lastHeard = .now
        guard bytes.first == PartyPacketType.media.rawValue else { return host.handle(.received(session, bytes)) }
        // A voice frame: the core names the members it goes to (what it does with
        // `.received`), and its copies are sealed here, one after the other, straight
        // into the outbox, the clock read once: no action per copy.
        host.with { core, now in core.forward(bytes, from: session, now: now, into: &targets) }
        guard !targets.isEmpty else { return afterRun() }
        targetPeers.removeAll(keepingCapacity: true)
        for target in targets { targetPeers.append(Self.peer(target)) }
        copy(bytes, to: targetPeers)
        // (No action was queued, so the host did not run `afterRun`.)
        afterRun()
    }

    /// The sessions a frame goes to, and their secure peers: kept from frame to frame.
    @exclusivity(unchecked) private var targets: [PartySession] = []
    @exclusivity(unchecked) private var targetPeers: [PeerID] = []
    /// The peer of a control message or acknowledgement (one session's).
    @exclusivity(unchecked) private var onePeer: [PeerID] = []

    /// When a member's packet last came (or the drain began, whichever is later).
    private var lastHeard = ContinuousClock.now

    /// How long no member has been heard.
    var quietFor: Duration { lastHeard.duration(to: .now) }

    /// See ``PartyService/roomListings(since:)``.
    func listings(since known: [String: UInt64]) -> (changed: [(listing: PartyListing, revision: UInt64)], closed: [String]) {
        host.read { core in
            let changed = core.rooms.values.filter { known[$0.id] != $0.revision }.sorted { $0.id < $1.id }.map { room in
                let members = room.members.values.sorted { $0.id < $1.id }.map(\.key)
                return (
                    PartyListing(
                        room: room.id, name: room.name, creator: room.creator, maxMembers: room.maxMembers,
                        members: members, invited: Array(room.invited)),
                    room.revision
                )
            }
            return (changed, known.keys.filter { core.rooms[$0] == nil }.sorted())
        }
    }

    /// Tells every member in a room to move (``PartyServer/Input/draining``); returns how many.
    func drain() -> Int {
        let members = host.read { $0.memberCount }
        // Quiet counts from now: members silent before (muted, or between words) must first hear the news.
        lastHeard = .now
        host.handle(.draining)
        return members
    }

    func closed(_ peer: PeerID) {
        let session = Self.session(peer)
        guard peers.removeValue(forKey: session) != nil else { return }
        host.handle(.closed(session))
    }
    func memoryShort(_ short: Bool) { host.handle(.memoryShort(short)) }

    /// The end of a read burst: the copies it queued leave.
    func readBurstEnded() {
        publish()
        if !outbox.isEmpty { sendFlush() }
    }

    /// After the endpoint closed: the socket's duplicate goes too.
    func stop() {
        host.stop()
        if socket.fd >= 0 {
            close(socket.fd)
            socket.fd = -1
        }
    }

    deinit { scratch.deallocate() }

    private func sendFlush() {
        let dropped = outbox.flush(logger: logger)
        guard dropped > 0 else { return }
        if sendDrops == 0 {
            logger.warning(
                "party copies dropped: the socket's send buffer is full (the relay's CPU cannot keep up)",
                metadata: ["dropped": "\(dropped)"])
        }
        sendDrops += UInt64(dropped)
    }

    private func perform(_ action: PartyServer.Action) {
        switch action {
        case .send(let session, let bytes):
            guard let peer = peers[session] else { return }
            onePeer.removeAll(keepingCapacity: true)
            onePeer.append(peer)
            copy(bytes, to: onePeer)
        case .event(let event):
            switch event {
            case .roomCreated(let id, let name, let creator):
                logger.info("party created", metadata: ["room": "\(id)", "name": "\(name)", "creator": "\(creator)"])
            case .roomRestored(let id, let name, let creator):
                logger.info(
                    "party restored from a member's ticket",
                    metadata: ["room": "\(id)", "name": "\(name)", "creator": "\(creator)"])
            case .memberJoined(let room, let member, let key):
                logger.info("party member joined", metadata: ["room": "\(room)", "member": "\(member)", "key": "\(key)"])
            case .memberLeft(let room, let member, let reason):
                logger.info(
                    "party member left", metadata: ["room": "\(room)", "member": "\(member)", "reason": "\(reason.rawValue)"])
            case .roomClosed(let id):
                logger.info("party closed", metadata: ["room": "\(id)"])
            }
        }
    }

    /// `bytes` sealed for each of `peers` and queued for the socket (or sent the
    /// endpoint's way, for a member on a TCP or TLS stream).
    private func copy(_ bytes: [UInt8], to peers: [PeerID]) {
        // Voice frames keep their RTP timestamp on the hop, so a capture reads as RTP.
        let timestamp = PartyFrameHeader.peekTimestamp(bytes) ?? 0
        _ = endpoint.sealOnLoop(bytes, toEach: peers, payloadType: PartyHop.payloadType, timestamp: timestamp, into: scratch) {
            sealed, to in
            if socket.fd >= 0 { outbox.append(sealed, to: to, on: socket) }
        }
    }

    private static func session(_ peer: PeerID) -> PartySession { PartySession(UInt64(max(0, peer.rawValue))) }
    /// A session's secure peer (it is named after it).
    private static func peer(_ session: PartySession) -> PeerID { PeerID(rawValue: Int(truncatingIfNeeded: session.value)) }
}
