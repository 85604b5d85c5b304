import Logging
import NIOConcurrencyHelpers
import NIOCore
import Party
import Rendezvous
import Secure
import TusaBase

/// Why a party connection or request failed.
public enum PartyConnectionError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The secure session with the relay could not be made.
    case transport(SecureTransportError)
    /// The relay refused the request.
    case refused(PartyErrorCode, String)
    /// Already joining or in a room.
    case busy
    /// The connection is closed, or the room ended while waiting.
    case closed
    /// The relay did not answer in time.
    case timeout

    public var description: String {
        switch self {
        case .transport(.timeout), .transport(.handshakeFailed):
            // A relay drops a handshake made for another key without a word, as it drops
            // any stranger's: from here the two look alike.
            "cannot reach the relay's party service: no answer to the handshake (is the relay there, with --party-port, and is the relay key its own?)"
        case .transport(let e): "cannot reach the relay's party service: \(e)"
        case .refused(let code, let detail): "the relay refused (\(code.rawValue)): \(detail)"
        case .busy: "already joining or in a room"
        case .closed: "the party connection is closed"
        case .timeout: "the relay did not answer in time"
        }
    }
}

/// How a member reaches the relay's party service.
public enum PartyTransport: String, Sendable, CaseIterable {
    /// UDP, and TCP (RFC 4571) when UDP has not answered within a moment:
    /// both are tried, as happy eyeballs does, so a blocked network connects
    /// nearly as fast as an open one; over TCP, UDP is tried again now and then
    /// and taken back when it answers.
    case auto
    case udp
    case tcp
    /// TCP inside TLS (RFC 4571 framing within), for networks that pass only TLS,
    /// typically to port 443 (the relay's `--party-tls-port`). The relay is proven
    /// by its Noise key, as over UDP, so its certificate is not checked.
    case tls
}

/// What a create or join returns: the room as the relay described it.
public struct PartyJoined: Hashable, Sendable {
    public var room: String
    public var name: String
    public var me: MemberID
    /// Every member, this one included.
    public var roster: [RosterEntry]
}

/// A member's connection to a relay's parties: one Noise IK session with the
/// relay's identity on a UDP socket (``SecureUDPEndpoint``), and the
/// ``PartyMember`` core on the endpoint's event loop (``CoreHost``). Control
/// messages and voice frames ride the session as `PartyHop.payloadType` packets.
///
/// `events` yields what the core reports: opened voice frames (`.audio`),
/// roster changes, keys, the end of the room.
///
/// When the core reports the session lost (`.connectionLost`: the relay went
/// silent or restarted), the connection handshakes with the relay again, retrying
/// with backoff, and the core rejoins its room (`.rejoined`) with its keys. Given
/// a ``Locator`` (a directory's `locate`), it asks before each try where the room
/// is now: when the directory has placed it on another relay (its own died or
/// drained), the member moves there and rejoins with the same ticket and keys.
public final class PartyConnection: Sendable {
    /// The relay this member is with now (another after a move).
    public var relay: TransportAddress { place.withLockedValue { $0.address } }
    public var relayKey: PublicKey { place.withLockedValue { $0.key } }
    private let place: NIOLockedValueBox<(address: TransportAddress, key: PublicKey)>
    public let identity: PublicKey
    public let events: AsyncStream<PartyMemberEvent>
    private let endpoint: SecureUDPEndpoint
    private let driver: NIOLoopBound<PartyDriver>

    private init(
        place: NIOLockedValueBox<(address: TransportAddress, key: PublicKey)>, identity: PublicKey,
        events: AsyncStream<PartyMemberEvent>, endpoint: SecureUDPEndpoint, driver: NIOLoopBound<PartyDriver>
    ) {
        self.place = place
        self.identity = identity
        self.events = events
        self.endpoint = endpoint
        self.driver = driver
    }

    /// Called on the connection's event loop for each voice frame opened, in place
    /// of an `.audio` event (a voice engine's jitter buffers want arrival times
    /// taken as the packet arrives, not when a task gets round to it). The format is
    /// how the speaker said it encodes (nil: it did not say).
    public typealias AudioHandler = @Sendable (MemberID, PartyFrameHeader, [UInt8], PartyAudioFormat?) -> Void

    /// Where room `room` is hosted now, asked of a directory when the relay went
    /// silent, and now and then while in the room (nil: no answer; the member keeps
    /// the relay it knows). `follow`: asked by a member that still hears its relay,
    /// which is to follow a room that moved but never to move it (``RoomLocator``).
    public typealias Locator = @Sendable (_ room: String, _ follow: Bool) async -> (address: TransportAddress, key: PublicKey)?

    /// Opens the secure session with the relay at `relay`, whose static key is `relayKey`.
    ///
    /// - Parameter keyLogPath: append the session's media keys and every party
    ///   sender key this member uses or is handed to this file (mode 0600), for
    ///   `tusa interop decrypt`; when nil, `TUSA_KEYLOG` names the file. Off when neither is set.
    /// - Parameter transport: UDP, TCP, TLS, or UDP and TCP raced (``PartyTransport/auto``).
    /// - Parameter locate: asked where the room is before each try to get back to it,
    ///   and every `locateEvery` while in a room: a room the directory now places on
    ///   another relay (two of its nodes moved it at once, each somewhere else, and
    ///   have since agreed) is followed there, so that one room stays one room.
    public static func connect(
        to relay: TransportAddress, relayKey: PublicKey, identity: Identity, host: String? = nil,
        transport: PartyTransport = .auto, configuration: PartyMember.Configuration = .init(),
        timeout: Duration = .seconds(5), keyLogPath: String? = nil, audio: AudioHandler? = nil, locate: Locator? = nil,
        locateEvery: Duration = .seconds(20), logger: Logger = Logger(label: "tusa.party")
    ) async throws(PartyConnectionError) -> PartyConnection {
        let endpoint: SecureUDPEndpoint
        let peer: PeerID
        let keyLogPath = KeyLogFile.path(keyLogPath)
        var configuration = configuration
        var keyLog: KeyLogFile?
        do {
            if let keyLogPath {
                keyLog = try KeyLogFile(path: keyLogPath)
                configuration.keyLog = true
            }
            endpoint = try await SecureUDPEndpoint.bind(
                host: host ?? (relay.ip.isIPv4 ? "0.0.0.0" : "::"), identity: identity, keyLogPath: keyLogPath, logger: logger)
        } catch { throw .transport(error) }
        do {
            peer = try await handshake(
                endpoint: endpoint, relay: relay, relayKey: relayKey, transport: transport, timeout: timeout, fresh: false)
        } catch {
            await endpoint.close()
            throw .transport(error)
        }
        let (events, yield) = AsyncStream.makeStream(of: PartyMemberEvent.self, bufferingPolicy: .bufferingNewest(4096))
        let loop = endpoint.eventLoop
        let place = NIOLockedValueBox((address: relay, key: relayKey))
        let (memberConfiguration, memberKeyLog) = (configuration, keyLog)
        let driver: NIOLoopBound<PartyDriver>
        do {
            driver = try await loop.submit {
                NIOLoopBound(
                    PartyDriver(
                        core: PartyMember(identity: identity.privateKey, configuration: memberConfiguration), endpoint: endpoint,
                        peer: peer, place: place, loop: loop, yield: yield, audio: audio, keyLog: memberKeyLog,
                        probeUDP: transport == .auto, logger: logger),
                    eventLoop: loop)
            }.get()
        } catch {
            await endpoint.close()
            throw .closed
        }
        await endpoint.setMediaHandler { from, header, payload in
            guard from == driver.value.peer, header.payloadType == PartyHop.payloadType else { return }
            driver.value.received(Array(payload))
        }
        let lost: @Sendable () -> Void = {
            Task {
                await Self.reconnect(endpoint: endpoint, place: place, transport: transport, driver: driver, locate: locate)
            }
        }
        try? await loop.submit { driver.value.onLost = lost }.get()
        // (Not over TLS: the directory names relays' UDP addresses, no way to another relay's TLS port.)
        if let locate, transport != .tls {
            let watch = Task {
                await Self.followRoom(place: place, driver: driver, loop: loop, locate: locate, every: locateEvery)
            }
            try? await loop.submit { driver.value.roomWatch = watch }.get()
        }
        // The session's end (the relay gone for good) ends the room.
        Task {
            for await event in endpoint.events {
                if case .session(.peerGone(let gone)) = event {
                    loop.execute { if gone == driver.value.peer { driver.value.disconnected() } }
                }
            }
            loop.execute { driver.value.disconnected() }
        }
        return PartyConnection(place: place, identity: identity.publicKey, events: events, endpoint: endpoint, driver: driver)
    }

    /// Handshakes with the relay until a session is up again (or the member no
    /// longer wants one: it left, or gave up rejoining), then lets the core rejoin.
    /// Before each try, `locate` (when given) says where the room is now: another
    /// relay than the one known is where the member goes. A relay that told the
    /// member to move (it is draining) is not tried again for ``drainGrace`` (the
    /// directory may not have heard yet that it drains: it is asked again, after a
    /// pause); after that it is, as any other (it may have restarted).
    private static func reconnect(
        endpoint: SecureUDPEndpoint, place: NIOLockedValueBox<(address: TransportAddress, key: PublicKey)>,
        transport: PartyTransport, driver: NIOLoopBound<PartyDriver>, locate: Locator?
    ) async {
        let loop = endpoint.eventLoop
        var pause = Duration.milliseconds(100)
        let draining = (try? await loop.submit({ driver.value.takeToldToMove() }).get()) == true
        let leaving = draining ? place.withLockedValue { $0.key } : nil
        let told = ContinuousClock.now
        while (try? await loop.submit({ driver.value.wantsSession }).get()) == true {
            var (relay, relayKey) = place.withLockedValue { $0 }
            // Over TLS the directory's answer (the relay's UDP address) is no way to the
            // same relay: its TLS port, as given, is kept; another relay is tried as named.
            if let locate, let room = try? await loop.submit({ driver.value.read(\.rejoining) }).get(),
                let found = await locate(room, false), transport != .tls || found.key != relayKey
            {
                (relay, relayKey) = found
            }
            if relayKey == leaving, told.duration(to: .now) < drainGrace {
                try? await Task.sleep(for: pause)
                pause = min(pause * 2, .seconds(1))
                continue
            }
            do {
                // Two handshake attempts' worth: the core sends the second after a second.
                let peer = try await handshake(
                    endpoint: endpoint, relay: relay, relayKey: relayKey, transport: transport,
                    timeout: .milliseconds(2100), fresh: true)
                await switchRelay(endpoint: endpoint, place: place, driver: driver, to: peer, at: relay, key: relayKey)
                loop.execute { driver.value.reconnected() }
                return
            } catch {
                if error == .closed { break }
                try? await Task.sleep(for: pause)
                pause = min(pause * 2, .seconds(2))
            }
        }
        loop.execute { driver.value.reconnectEnded() }
    }

    /// Every `interval` (at least a second) in a directory's room, asks where the room is; when the answer is another
    /// relay, the core leaves this relay's session for it (``PartyMember/Input/relocate``:
    /// the reconnection asks again and goes there). Ends with the driver.
    private static func followRoom(
        place: NIOLockedValueBox<(address: TransportAddress, key: PublicKey)>, driver: NIOLoopBound<PartyDriver>,
        loop: any EventLoop, locate: Locator, every interval: Duration
    ) async {
        while !Task.isCancelled {
            try? await Task.sleep(for: max(interval, .seconds(1)))
            guard !Task.isCancelled else { break }
            let asked: String?
            do { asked = try await loop.submit({ driver.value.read(\.room) }).get() } catch { break }
            // Only a directory's rooms (their ids carry their relay's tag): another
            // rendezvous knows nothing of a room it did not place.
            guard let room = asked, RoomHome.tag(ofRoom: room) != nil, let found = await locate(room, true), !Task.isCancelled
            else { continue }
            if found.key != place.withLockedValue({ $0.key }) {
                loop.execute { driver.value.handle(.relocate) }
            }
        }
    }

    /// Makes the session with `key` at `relay` (`peer`) the member's relay, if it is
    /// another relay than the one it had: the one left behind is forgotten (it no
    /// longer ends the room, nor is it tried again).
    private static func switchRelay(
        endpoint: SecureUDPEndpoint, place: NIOLockedValueBox<(address: TransportAddress, key: PublicKey)>,
        driver: NIOLoopBound<PartyDriver>, to peer: PeerID, at relay: TransportAddress, key: PublicKey
    ) async {
        let moved = place.withLockedValue { known in
            defer { known = (relay, key) }
            return known.key != key
        }
        guard moved, let left = try? await endpoint.eventLoop.submit({ driver.value.moved(to: peer) }).get() else {
            return
        }
        await endpoint.removePeer(left)
    }

    /// Moves to the party service at `relay` (static key `relayKey`) before joining
    /// a room there: a room found on another relay than the one connected to
    /// (`tusa party watch --join`). Only outside a room (``PartyConnectionError/busy`` in one).
    public func move(
        to relay: TransportAddress, relayKey: PublicKey, transport: PartyTransport = .auto, timeout: Duration = .seconds(5)
    )
        async throws(PartyConnectionError)
    {
        guard relayKey != self.relayKey else { return }
        let driver = self.driver
        let idle =
            (try? await endpoint.eventLoop.submit {
                driver.value.read { member in
                    switch member.phase {
                    case .idle, .ended: true
                    default: false
                    }
                }
            }.get()) ?? false
        guard idle else { throw .busy }
        let peer: PeerID
        do {
            peer = try await Self.handshake(
                endpoint: endpoint, relay: relay, relayKey: relayKey, transport: transport, timeout: timeout, fresh: false)
        } catch { throw .transport(error) }
        await Self.switchRelay(endpoint: endpoint, place: place, driver: driver, to: peer, at: relay, key: relayKey)
    }

    /// How long a relay that told the member to move is passed over (see ``reconnect``).
    static let drainGrace: Duration = .seconds(3)

    /// How long UDP has to answer the handshake before TCP joins the race.
    static let udpHeadStart: Duration = .milliseconds(250)

    /// A handshake with the relay over the transport asked for: over UDP; over a
    /// stream; or over UDP first and, when it has not answered within
    /// ``udpHeadStart``, over a stream too (a late UDP answer still wins: the
    /// endpoint moves back to UDP). `fresh`: keys already in place do not count.
    private static func handshake(
        endpoint: SecureUDPEndpoint, relay: TransportAddress, relayKey: PublicKey, transport: PartyTransport,
        timeout: Duration, fresh: Bool
    ) async throws(SecureTransportError) -> PeerID {
        func wait(_ limit: Duration) async throws(SecureTransportError) -> PeerID {
            fresh
                ? try await endpoint.reconnect(to: relayKey, at: relay, timeout: limit)
                : try await endpoint.connect(to: relayKey, at: relay, timeout: limit)
        }
        switch transport {
        case .udp:
            return try await wait(timeout)
        case .tcp, .tls:
            if !(await endpoint.usesStream(to: relay)) {
                try await endpoint.useStream(to: relay, tls: transport == .tls, timeout: timeout)
            }
            return try await wait(timeout)
        case .auto:
            if await endpoint.usesStream(to: relay) { return try await wait(timeout) }
            do {
                return try await wait(min(udpHeadStart, timeout))
            } catch .timeout {
                // UDP is slow or blocked: the same handshake over TCP, now.
                try await endpoint.useStream(to: relay, timeout: timeout)
                let peer = try await endpoint.addPeer(relayKey, at: relay)
                await endpoint.restartHandshake(with: peer)
                return try await endpoint.connect(to: relayKey, at: relay, timeout: max(.milliseconds(1), timeout - udpHeadStart))
            }
        }
    }

    /// Creates a room named `name` and joins it.
    public func create(name: String, maxMembers: Int? = nil, invite: [PublicKey] = []) async throws(PartyConnectionError)
        -> PartyJoined
    {
        // Each key once (in the order given): what is counted is what is sent.
        var seen = Set<PublicKey>()
        let keys = invite.filter { seen.insert($0).inserted }
        guard keys.count <= PartyControl.maximumInvited else {
            throw .refused(
                .malformed,
                "a room's invite list holds at most \(PartyControl.maximumInvited) keys, not \(keys.count): leave it empty for a room open to anyone with its id"
            )
        }
        return try await join(.create(name: name, maxMembers: maxMembers, invite: keys))
    }

    /// Joins the room `room`.
    public func join(_ room: String) async throws(PartyConnectionError) -> PartyJoined {
        try await join(.join(room: room))
    }

    private func join(_ input: PartyMember.Input) async throws(PartyConnectionError) -> PartyJoined {
        let driver = self.driver
        let future: EventLoopFuture<PartyJoined>
        do {
            future = try await endpoint.eventLoop.submit { driver.value.join(input) }.get()
        } catch { throw .closed }
        do { return try await future.get() } catch let e as PartyConnectionError { throw e } catch { throw .closed }
    }

    /// Who is in `room`, without joining it: nil when there is no such room or
    /// this key may not join it (the relay shows a room to its invited only).
    public func describe(_ room: String, timeout: Duration = .seconds(5)) async throws(PartyConnectionError) -> RoomDescription? {
        let driver = self.driver
        let future: EventLoopFuture<RoomDescription?>
        do {
            future = try await endpoint.eventLoop.submit { driver.value.describe(room, timeout: timeout) }.get()
        } catch { throw .closed }
        do { return try await future.get() } catch let e as PartyConnectionError { throw e } catch { throw .closed }
    }

    /// Leaves the room (the connection stays open for another).
    public func leave() { perform(.leave) }
    /// Removes a member (the creator only; the relay refuses others).
    public func kick(_ member: MemberID) { perform(.kick(member)) }
    /// Closes the room for everyone (the creator only).
    public func closeRoom() { perform(.close) }
    public func mute(_ muted: Bool) { perform(.mute(muted)) }

    private func perform(_ input: PartyMember.Input) {
        let driver = self.driver
        endpoint.eventLoop.execute { driver.value.handle(input) }
    }

    /// Seals one voice frame and sends it to the room (dropped when not in a
    /// room, muted or without a key yet).
    public func send(_ audio: [UInt8], timestamp: UInt32, level: AudioLevel) {
        let driver = self.driver
        endpoint.eventLoop.execute { driver.value.send(audio, timestamp: timestamp, level: level) }
    }

    /// Impairs this member's outgoing datagrams to the relay from now on, as
    /// `SecureUDPEndpoint.impairMedia` does (tests and demos: the CI kernel has no netem).
    public func impairMedia(_ decide: @escaping @Sendable () -> Duration?) async {
        await endpoint.impairMedia(decide)
    }

    /// The member core's state, read on its loop (for status lines and tests).
    public func read<T: Sendable>(_ body: @escaping @Sendable (PartyMember) -> T) async throws(PartyConnectionError) -> T {
        let driver = self.driver
        do { return try await endpoint.eventLoop.submit { driver.value.read(body) }.get() } catch { throw .closed }
    }

    /// Whether the session with the relay runs over a TCP connection now (UDP did
    /// not pass, or TCP or TLS was asked for).
    public var overTCP: Bool {
        get async { await endpoint.usesStream(to: relay) }
    }

    /// The secure endpoint's local address (where the relay sees this member come from, before NAT).
    public var localAddress: TransportAddress { endpoint.localAddress }

    /// Leaves the room, if in one, and closes the session.
    public func close() async {
        let driver = self.driver
        try? await endpoint.eventLoop.submit { driver.value.handle(.leave) }.get()
        await endpoint.close()
        try? await endpoint.eventLoop.submit { driver.value.stop() }.get()
    }
}

/// The member core, its host and the caller waiting for a join, on the endpoint's loop.
final class PartyDriver {
    private var host: CoreHost<PartyMember>!
    private let endpoint: SecureUDPEndpoint
    /// The relay's session (another after a move).
    private(set) var peer: PeerID
    private let yield: AsyncStream<PartyMemberEvent>.Continuation
    private var joining: EventLoopPromise<PartyJoined>?
    private let loop: any EventLoop
    private let audio: PartyConnection.AudioHandler?
    private let keyLog: KeyLogFile?
    private let logger: Logger
    /// The relay the member is with (its connection's, changed by a move).
    private let place: NIOLockedValueBox<(address: TransportAddress, key: PublicKey)>
    private var probing: Scheduled<Void>?
    /// Starts the reconnection (set once the connection is made).
    var onLost: (@Sendable () -> Void)?
    /// Asks the directory where the room is, now and then (with a locator).
    var roomWatch: Task<Void, Never>?
    private var reconnecting = false
    /// The relay told the member to move (it drains): see ``takeToldToMove()``.
    private var toldToMove = false
    /// Callers waiting for a room's description, by room.
    private var describing: [String: [EventLoopPromise<RoomDescription?>]] = [:]

    init(
        core: PartyMember, endpoint: SecureUDPEndpoint, peer: PeerID,
        place: NIOLockedValueBox<(address: TransportAddress, key: PublicKey)>, loop: any EventLoop,
        yield: AsyncStream<PartyMemberEvent>.Continuation, audio: PartyConnection.AudioHandler?, keyLog: KeyLogFile?,
        probeUDP: Bool, logger: Logger
    ) {
        self.audio = audio
        self.keyLog = keyLog
        self.logger = logger
        self.place = place
        self.endpoint = endpoint
        self.peer = peer
        self.yield = yield
        self.loop = loop
        host = CoreHost(core, on: loop) { [unowned self] action in perform(action) }
        if probeUDP { scheduleProbe() }
    }

    /// Over a stream, a ping over UDP every ``probeInterval``: the relay's answer
    /// comes back over UDP when UDP passes again, and the endpoint moves back to it.
    static let probeInterval: Duration = .seconds(15)

    private func scheduleProbe() {
        let engine = endpoint.engineOnLoop
        // (Built and run on the loop: the driver is confined to it.)
        probing = loop.assumeIsolated().scheduleTask(in: .nanoseconds(Self.probeInterval.nanoseconds)) { [unowned self] in
            let relay = place.withLockedValue { $0.address }
            if engine.value.streams[relay] != nil {
                engine.value.probeUDP.insert(relay)
                host.handle(.ping)
            }
            scheduleProbe()
        }
    }

    func handle(_ input: PartyMember.Input) { host.handle(input) }
    func received(_ bytes: [UInt8]) { host.handle(.received(bytes)) }

    /// True while the core waits for a new session to rejoin through.
    var wantsSession: Bool {
        host.read {
            if case .rejoining = $0.phase { return true }
            return false
        }
    }

    /// The member moved to another relay (its room was placed there): returns the session it left.
    func moved(to newPeer: PeerID) -> PeerID {
        defer { peer = newPeer }
        return peer
    }

    /// Whether the relay told the member to move since the last ask.
    func takeToldToMove() -> Bool {
        defer { toldToMove = false }
        return toldToMove
    }

    func reconnected() {
        reconnecting = false
        host.handle(.reconnected)
    }

    func reconnectEnded() { reconnecting = false }

    func describe(_ room: String, timeout: Duration) -> EventLoopFuture<RoomDescription?> {
        let promise = loop.makePromise(of: RoomDescription?.self)
        describing[room, default: []].append(promise)
        host.handle(.describe(room: room))
        loop.scheduleTask(in: .nanoseconds(timeout.nanoseconds)) { promise.fail(PartyConnectionError.timeout) }
        return promise.futureResult
    }

    func disconnected() {
        host.handle(.disconnected)
        joining?.fail(PartyConnectionError.closed)
        joining = nil
    }

    func join(_ input: PartyMember.Input) -> EventLoopFuture<PartyJoined> {
        guard joining == nil, host.read({ $0.room == nil }) else {
            return loop.makeFailedFuture(PartyConnectionError.busy)
        }
        let promise = loop.makePromise(of: PartyJoined.self)
        joining = promise
        host.handle(input)
        return promise.futureResult
    }

    func send(_ audio: [UInt8], timestamp: UInt32, level: AudioLevel) {
        guard let frame = host.with({ core, now in core.seal(audio, timestamp: timestamp, level: level, now: now) }) else {
            return
        }
        endpoint.send(frame, to: peer, payloadType: PartyHop.payloadType, timestamp: timestamp)
    }

    func read<T>(_ body: (PartyMember) -> T) -> T { host.read(body) }

    func stop() {
        probing?.cancel()
        probing = nil
        roomWatch?.cancel()
        roomWatch = nil
        for promise in describing.values.joined() { promise.fail(PartyConnectionError.closed) }
        describing = [:]
        host.stop()
        yield.finish()
    }

    private func perform(_ action: PartyMember.Action) {
        switch action {
        case .send(let bytes):
            endpoint.send(
                bytes, to: peer, payloadType: PartyHop.payloadType, timestamp: PartyFrameHeader.peekTimestamp(bytes) ?? 0)
        case .event(let event):
            switch event {
            case .joined(let room, let name, let me, let roster):
                joining?.succeed(PartyJoined(room: room, name: name, me: me, roster: roster))
                joining = nil
            case .refused(let code, let detail):
                joining?.fail(PartyConnectionError.refused(code, detail))
                joining = nil
            case .ended:
                joining?.fail(PartyConnectionError.closed)
                joining = nil
            case .described(let room, let description):
                for promise in describing.removeValue(forKey: room) ?? [] { promise.succeed(description) }
                return
            case .relayDraining:
                toldToMove = true
            case .connectionLost:
                if !reconnecting, let onLost {
                    reconnecting = true
                    onLost()
                }
            case .keyLog(let line):
                if let failure = keyLog?.append(line) { logger.error("\(failure)") }
                return
            case .audio(let from, let header, let bytes, let format):
                if let audio {
                    audio(from, header, bytes, format)
                    return
                }
            default:
                break
            }
            yield.yield(event)
        }
    }
}
