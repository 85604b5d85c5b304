import Foundation
import ICE
import Logging
import Rendezvous
import STUN
import Secure
import Synchronization
import TURN
import Transport
import TusaBase
import Voice

/// The report at the end of a call (and, live, its status line).
public struct CallReport: Sendable, Codable, Equatable {
    public var peer: String
    public var role: String
    /// "direct" or "relayed".
    public var path: String
    public var remoteAddress: String
    public var codec: String
    public var frameMilliseconds: Int
    public var dialToFirstAudioMilliseconds: Double?
    public var durationSeconds: Double
    public var packetsSent: Int
    public var packetsReceived: Int
    public var lossPercent: Double
    public var remoteLossPercent: Double
    public var jitterMilliseconds: Double
    public var roundTripMilliseconds: Double?
    /// How long packets waited in the jitter buffer, on average over the call…
    public var jitterBufferDelayMilliseconds: Double
    /// …and over the last 50 packets played, a second of 20 ms frames (what the live status line shows).
    public var jitterBufferDelayNowMilliseconds: Double = 0
    public var framesConcealed: Int
    public var framesRecoveredByFEC: Int
    public var estimatedMOS: Double
    public var ended: CallEnd
    public var addressChanges: Int
    /// The ICE pair's candidate types, e.g. "host -> host", "relay -> srflx".
    public var candidatePair: String?
    /// From dialing (or the offer's arrival) to the selected ICE pair.
    public var connectMilliseconds: Double?
    /// ICE restarts during the call (after a move, a NAT rebinding, a relay restart).
    public var iceRestarts = 0
    /// The encoder's bitrate at the end (lowered from the configured one under heavy loss).
    public var sendBitrate = 0
    /// Previous frames each packet carried again at the end (redundant audio, sized by the peer's reports).
    public var sendRedundancy = 0
    /// Frames whose packet was lost, played from the copy a later packet carried.
    public var framesRecoveredByRedundancy = 0
    /// Why our audio input or output failed during the call (nil when it did not).
    public var audioError: String?
    /// The live capture and playback devices, when the call used them (``LiveCapture``, ``LivePlayback``).
    public var captureDevice: LiveAudioStatistics?
    public var playbackDevice: LiveAudioStatistics?

    public var statusLine: String {
        let rtt = roundTripMilliseconds.map { String(format: "%.0f ms", $0) } ?? "-"
        return String(
            format: "%@ %@ | rtt %@ | loss %.1f%% | jitter %.0f ms | buffer %.0f ms | MOS %.2f | sent %d recv %d",
            path, remoteAddress, rtt, lossPercent, jitterMilliseconds, jitterBufferDelayNowMilliseconds, estimatedMOS,
            packetsSent, packetsReceived)
    }

    public var humanReadable: String {
        var lines = [
            "call with \(peer) (\(role)) ended: \(ended.rawValue)",
            "  path: \(path) via \(remoteAddress)\(candidatePair.map { " (\($0))" } ?? "")\(addressChanges > 0 ? ", address changed \(addressChanges)×" : "")",
            "  codec: \(codec) \(frameMilliseconds) ms",
        ]
        if let c = connectMilliseconds { lines.append(String(format: "  connected (ICE) in %.0f ms", c)) }
        if let d = dialToFirstAudioMilliseconds { lines.append(String(format: "  dial to first audio: %.0f ms", d)) }
        lines.append(
            String(format: "  duration %.1f s, sent %d, received %d packets", durationSeconds, packetsSent, packetsReceived))
        lines.append(
            "  sending at \(sendBitrate / 1000) kb/s"
                + (sendRedundancy > 0 ? " with the previous \(sendRedundancy) frame\(sendRedundancy > 1 ? "s" : "") again" : ""))
        lines.append(
            String(
                format: "  loss %.1f%% (peer saw %.1f%%), jitter %.0f ms, rtt %@, buffer %.0f ms",
                lossPercent, remoteLossPercent, jitterMilliseconds,
                roundTripMilliseconds.map { String(format: "%.1f ms", $0) } ?? "-", jitterBufferDelayMilliseconds))
        lines.append(
            "  concealed \(framesConcealed) frames, \(framesRecoveredByFEC) rebuilt by FEC"
                + (framesRecoveredByRedundancy > 0 ? ", \(framesRecoveredByRedundancy) from redundant audio" : ""))
        if iceRestarts > 0 { lines.append("  ICE restarted \(iceRestarts)×") }
        if let audioError { lines.append("  audio error: \(audioError)") }
        lines += LiveAudioStatistics.reportLines(capture: captureDevice, playback: playbackDevice)
        lines.append(String(format: "  estimated MOS (E-model): %.2f", estimatedMOS))
        return lines.joined(separator: "\n")
    }
}

/// Which candidates a call offers (WebRTC's iceTransportPolicy).
public enum CandidatePolicy: String, Sendable, CaseIterable {
    /// Host, server-reflexive and relayed: direct when the NATs allow.
    case all
    /// Only the relay's: the peer never learns our addresses.
    case relay
}

/// One side of a call: signaling through a registered rendezvous connection, the
/// secure session on a UDP endpoint, the voice session on its real-time clock.
/// The call's decisions are a ``CallController``'s; this drives it: it awaits
/// events (the rendezvous, the endpoint, the voice session, the controller's
/// deadline) and performs the controller's actions.
public final class CallAgent: Sendable {
    public struct Options: Sendable {
        public var codec = CodecConfiguration()
        /// How long to wait for an answer, or for an offer.
        public var ringTimeout: Duration = .seconds(30)
        /// Hang up after this long (nil: when the input ends, or the peer hangs up).
        public var maximumDuration: Duration?
        /// Offer loopback candidates (calls between two processes of one machine).
        public var includeLoopback = true
        public var echoCancellation = false
        /// Impair outgoing media (the project's own loss/jitter layer).
        public var impairment: Impairment?
        public var candidatePolicy = CandidatePolicy.all
        /// Learn a server-reflexive candidate here when the rendezvous gave no TURN
        /// credentials (with them, the relay's allocation tells the mapped address).
        public var stunServer: TransportAddress?
        /// How long connectivity checks may take before the call fails.
        public var connectTimeout: Duration = .seconds(10)
        /// Restart ICE (through the rendezvous) when nothing came from the peer for this long.
        public var restartAfterSilence: Duration = .seconds(2)
        /// How often this machine's addresses are looked at: when they change (a new
        /// network, a lost one) ICE restarts at once with the new candidates. Nil: never.
        public var networkCheckInterval: Duration? = .seconds(1)
        /// Called about once a second with the live report.
        public var onStatus: (@Sendable (CallReport) -> Void)?
        public init() {}

        /// The controller's timing.
        var control: CallController.Configuration {
            var c = CallController.Configuration()
            c.restartAfterSilence = restartAfterSilence
            c.networkCheckInterval = networkCheckInterval
            c.maximumDuration = maximumDuration
            if candidatePolicy != .all {
                // Relay-only: this machine's address is never told nor probed from; the
                // ICE restart's fresh allocation brings the path back instead.
                c.probeAfterSilence = nil
                c.probesReachablePeer = false
            }
            return c
        }
    }

    /// The secure layer for calls: receiver reports every 2 s (the encoder's loss hint
    /// and the RTT follow within seconds); after 4 s of silence a new handshake is
    /// tried; a peer silent for 30 s has vanished, ICE consent's limit (RFC 7675): a
    /// peer that stops for less (a process frozen for 10 s, a laptop that slept, a
    /// network outage) comes back to the same call.
    static var secure: SecureConfiguration {
        var c = SecureConfiguration()
        c.reportInterval = .seconds(2)
        c.rehandshakeAfterSilence = .seconds(4)  // a peer that moved and lost its keys' path
        c.peerTimeout = .seconds(30)
        return c
    }

    /// The rendezvous connection; replaced when the connection drops mid-call (a
    /// relay restart), so that ICE restarts can be signalled.
    private struct Link {
        var connection: RendezvousConnection
        /// Counts registrations: a closed connection's end is news only for the current one.
        var generation = 0
        /// Whether the current connection closed (and nobody registered again yet).
        var closed = false
        /// Connections made here after the first (closed when the call ends).
        var reconnected: [RendezvousConnection] = []
        /// The tasks passing each connection's payloads on to `events`.
        var listeners: [Task<Void, Never>] = []
    }
    private let link: Mutex<Link>
    private var rendezvous: RendezvousConnection { link.withLock { $0.connection } }
    /// Everything the agent awaits, in arrival order.
    private let events: AsyncStream<CallEvent>
    private let feed: AsyncStream<CallEvent>.Continuation
    private let identity: Identity
    private let options: Options
    private let logger: Logger
    /// ``hangUp()`` was called (kept for a call that is still being set up).
    private let hungUp = Mutex(false)

    public init(
        rendezvous: RendezvousConnection, identity: Identity, options: Options = .init(),
        logger: Logger = Logger(label: "tusa.call")
    ) {
        self.identity = identity
        self.options = options
        self.logger = logger
        (events, feed) = AsyncStream<CallEvent>.makeStream()
        link = Mutex(Link(connection: rendezvous))
        listen(to: rendezvous, generation: 0)
    }

    deinit {
        for task in link.withLock({ $0.listeners }) { task.cancel() }
        feed.finish()
    }

    /// Hangs up (the user's Ctrl-C): a call under way ends as when the input ends,
    /// the peer told and the report made; one still ringing or being answered stops
    /// with ``CallError/hungUp``, the peer told too when an offer had gone.
    public func hangUp() {
        hungUp.withLock { $0 = true }
        feed.yield(.hangUp)
    }

    /// ICE for calls: checks paced at 20 ms (two candidates a side is the common
    /// case), and a valid pair nominated after 100 ms when a better one is still out.
    static var ice: ICEConfiguration {
        var c = ICEConfiguration()
        c.ta = .milliseconds(20)
        c.nominationDelay = .milliseconds(100)
        return c
    }

    /// The driver's clock: the monotonic one media arrivals are stamped with.
    private static func now() -> Timestamp { Timestamp(nanoseconds: UInt64(max(0, monotonicNanoseconds()))) }

    /// Calls `peer`: offer, answer, connectivity checks, handshake on the selected
    /// pair, voice until the input ends (then hangs up), the peer hangs up or
    /// vanishes, or the time limit.
    public func call(_ peer: PublicKey, source: AudioSource?, sink: AudioSink?) async throws -> CallReport {
        let dialed = monotonicNanoseconds()
        let router = MediaRouter()
        var inbox = events.makeAsyncIterator()
        let endpoint = try await SecureUDPEndpoint.bind(
            identity: identity, configuration: Self.secure, mediaHandler: router.handler, logger: logger)
        return try await closing(endpoint) {
            let callID = UUID().uuidString
            let local = try await startICE(endpoint, role: .controlling)
            // Hung up before the offer went: nobody is to be told.
            if hungUp.withLock({ $0 }) { throw CallError.hungUp }
            let offer = CallMessage(kind: .offer, call: callID, path: .init(local), codec: .init(options.codec))
            try await rendezvous.send(offer.encoded(), to: peer)
            let answer: CallMessage
            do {
                answer = try await waitFor(
                    call: callID, from: peer, kinds: [.answer, .reject], timeout: options.ringTimeout, inbox: &inbox)
            } catch CallError.hungUp {
                try? await rendezvous.send(CallMessage(kind: .hangup, call: callID).encoded(), to: peer)
                throw CallError.hungUp
            }
            if answer.kind == .reject { throw CallError.rejected(answer.reason ?? "no reason given") }
            guard let remote = answer.path?.iceDescription, !remote.candidates.isEmpty else {
                throw CallError.noPath("the answer has no usable candidate")
            }
            let pair = try await connectICE(endpoint, to: remote)
            let connected = monotonicNanoseconds()
            let peerID: PeerID
            do throws(SecureTransportError) {
                peerID = try await endpoint.connect(to: peer, at: pair.remote.address, timeout: .seconds(5))
            } catch {
                throw CallError.handshakeFailed(pair, error)
            }
            try await endpoint.followICE(peerID)
            return try await run(
                role: .caller, peer: peer, peerID: peerID, callID: callID, endpoint: endpoint, router: router,
                codec: options.codec, source: source, sink: sink, dialed: dialed, pair: pair, connected: connected,
                inbox: &inbox)
        }
    }

    /// Waits for an offer (from anyone, or from `only`), answers it and runs the call.
    public func answer(only: PublicKey? = nil, source: AudioSource?, sink: AudioSink?) async throws -> CallReport {
        var inbox = events.makeAsyncIterator()
        var alarm = Alarm(feed: feed)
        defer { alarm.cancel() }
        let deadline = Self.now() + options.ringTimeout
        var rejoin = Rejoin()
        while true {
            if hungUp.withLock({ $0 }) { throw CallError.hungUp }
            await rejoinIfDue(&rejoin)
            alarm.set(min(deadline, rejoin.at ?? deadline), now: Self.now())
            guard let event = await inbox.next() else { throw CallError.timedOut("no call within \(options.ringTimeout)") }
            let from: PublicKey
            let bytes: [UInt8]
            switch event {
            case .signal(let f, let payload):
                from = f
                bytes = payload
            case .wake:
                alarm.rang()
                if Self.now() >= deadline { throw CallError.timedOut("no call within \(options.ringTimeout)") }
                continue
            case .rendezvousClosed(let generation):
                if closed(generation) {
                    if let taken = await registeredElsewhere() { throw taken }
                    rejoin.dropped(now: Self.now())
                }
                continue
            case .hangUp: throw CallError.hungUp
            case .endpoint, .sourceEnded, .sinkFailed, .recordingStopped, .reflexive: continue
            }
            guard let offer = try? CallMessage(decoding: bytes), offer.kind == .offer else { continue }
            if let only, only != from {
                // Not ignored: the caller would ring until its timeout.
                let refusal = CallMessage(kind: .reject, call: offer.call, reason: "not taking calls from this key now")
                try? await rendezvous.send(refusal.encoded(), to: from)
                continue
            }
            alarm.cancel()
            let dialed = monotonicNanoseconds()
            // Whatever stops the set-up is sent to the caller as a refusal (it does not wait for an answer).
            let codec: CodecConfiguration
            let remote: ICEDescription
            let endpoint: SecureUDPEndpoint
            let local: ICEDescription
            let router = MediaRouter()
            do {
                codec = try offer.codec?.configuration() ?? options.codec
                guard let r = offer.path?.iceDescription, !r.candidates.isEmpty else {
                    throw CallError.noPath("the offer has no usable candidate")
                }
                remote = r
                endpoint = try await SecureUDPEndpoint.bind(
                    identity: identity, configuration: Self.secure, mediaHandler: router.handler, logger: logger)
                do {
                    _ = try await endpoint.addPeer(from)
                    local = try await startICE(endpoint, role: .controlled)
                } catch {
                    await endpoint.close()
                    throw error
                }
            } catch {
                try? await rendezvous.send(CallMessage(kind: .reject, call: offer.call, reason: "\(error)").encoded(), to: from)
                throw error
            }
            return try await closing(endpoint) {
                // Checks (and the relay's permissions for the caller) start while the answer travels.
                async let checks = connectICE(endpoint, to: remote)
                let reply = CallMessage(kind: .answer, call: offer.call, path: .init(local), codec: offer.codec)
                try await rendezvous.send(reply.encoded(), to: from)
                let pair = try await checks
                let connected = monotonicNanoseconds()
                let peerID: PeerID
                do throws(SecureTransportError) { peerID = try await endpoint.waitForPeer(from, timeout: .seconds(10)) } catch {
                    throw CallError.handshakeMissing(pair, error)
                }
                try await endpoint.followICE(peerID)
                return try await run(
                    role: .callee, peer: from, peerID: peerID, callID: offer.call, endpoint: endpoint, router: router,
                    codec: codec, source: source, sink: sink, dialed: dialed, pair: pair, connected: connected,
                    inbox: &inbox)
            }
        }
    }

    /// Runs `body`, then closes the endpoint (awaited) however it ended.
    private func closing<T>(_ endpoint: SecureUDPEndpoint, _ body: () async throws -> T) async throws -> T {
        let result: T
        do { result = try await body() } catch {
            await endpoint.close()
            throw error
        }
        await endpoint.close()
        return result
    }

    /// Gathers (host addresses, the relay's allocation and mapped address) and
    /// starts the ICE agent on the endpoint's socket.
    private func startICE(_ endpoint: SecureUDPEndpoint, role: ICERole) async throws -> ICEDescription {
        let candidates = try await gather(endpoint, again: false)
        let stun = options.candidatePolicy == .all && rendezvous.turn == nil ? options.stunServer : nil
        do throws(SecureTransportError) {
            return try await endpoint.startICE(role: role, candidates: candidates, stunServer: stun, configuration: Self.ice)
        } catch {
            throw CallError.ice(error)
        }
    }

    /// Our candidates: this machine's addresses, and with the rendezvous' TURN grant
    /// an allocation (relayed) and the address the relay saw (server-reflexive).
    /// `again`: a restart. The allocation is kept when the relay still holds it
    /// for this socket (the peer keeps reaching the same relayed address), else
    /// made afresh (after a NAT rebinding the relay sees another 5-tuple; a
    /// restarted relay has forgotten it).
    private func gather(_ endpoint: SecureUDPEndpoint, again: Bool) async throws -> [ICELocalCandidate] {
        var candidates: [ICELocalCandidate] = []
        if options.candidatePolicy == .all {
            candidates = NetworkInterfaces.addresses(.ipv4, includeLoopback: options.includeLoopback).enumerated().map { i, ip in
                .host(
                    TransportAddress(ip: ip, port: endpoint.localAddress.port), base: ICEBase.socket,
                    localPreference: UInt32(65535 - i))
            }
        }
        var relayProblem: RelayProblem?
        if let grant = rendezvous.turn {
            let configuration = TURNClient.Configuration(username: grant.username, password: grant.password)
            let servers = Self.turnServers(grant)
            if servers.isEmpty { relayProblem = .noUsableURI(grant.uris) }
            // UDP first; TURN over TCP where UDP is blocked (the relay still talks UDP to the peer).
            var first = !again
            for (server, transport) in servers {
                do {
                    let timeout: Duration = transport == .udp ? .milliseconds(1500) : .seconds(5)
                    let allocation =
                        first
                        ? try await endpoint.useRelay(server, over: transport, configuration: configuration, timeout: timeout)
                        : try await endpoint.renewRelay(server, over: transport, configuration: configuration, timeout: timeout)
                    candidates.append(.relayed(allocation.relayed, mapped: allocation.mapped, base: ICEBase.relay))
                    // (Over TCP the mapped address is the TCP connection's: no UDP candidate.)
                    if transport == .udp, options.candidatePolicy == .all, let mapped = allocation.mapped,
                        !candidates.contains(where: { $0.candidate.address == mapped })
                    {
                        candidates.append(.serverReflexive(mapped, baseAddress: endpoint.localAddress, base: ICEBase.socket))
                    }
                    relayProblem = nil
                    break
                } catch {
                    first = false
                    relayProblem = .allocationFailed(server, transport, ErrorCause(error))
                    logger.warning(
                        "no relayed candidate",
                        metadata: ["server": "\(server)", "transport": "\(transport.rawValue)", "error": "\(error)"])
                }
            }
        } else {
            relayProblem = .noCredentials
        }
        if options.candidatePolicy == .relay && !candidates.contains(where: { $0.candidate.type == .relay }) {
            throw CallError.noRelay(relayProblem ?? .noCredentials)
        }
        return candidates
    }

    /// Passes `connection`'s payloads on to `events`, then its end.
    private func listen(to connection: RendezvousConnection, generation: Int) {
        let feed = feed
        let task = Task {
            for await (from, payload) in connection.incoming { feed.yield(.signal(from: from, payload: payload)) }
            feed.yield(.rendezvousClosed(generation: generation))
        }
        link.withLock { $0.listeners.append(task) }
    }

    /// A connection closed: news when it is the current one. True then.
    @discardableResult
    private func closed(_ generation: Int) -> Bool {
        link.withLock { link in
            guard generation == link.generation else { return false }
            link.closed = true
            return true
        }
    }

    /// The rendezvous closed our connection because another registered our key (the
    /// same identity started elsewhere): calls go there now; not taken back.
    private func registeredElsewhere() async -> CallError? {
        guard case .refused(.replaced, _)? = await rendezvous.refusal() else { return nil }
        return .failed("this identity registered again elsewhere (another tusa with the same key?): calls go there now")
    }

    /// Waiting for a call or an answer, the rendezvous connection dropped (its relay
    /// restarted, or its directory node died): register again once it is due (the next
    /// of the servers first), and a second later while none takes us.
    private func rejoinIfDue(_ rejoin: inout Rejoin) async {
        guard let due = rejoin.at, Self.now() >= due else { return }
        do {
            try await reconnect(replacing: false)
            rejoin.at = nil
            rejoin.last = Self.now()
        } catch {
            rejoin.at = Self.now() + .seconds(1)
        }
    }

    /// When a waiting agent registers again: at once after a drop, but a second later
    /// when the last registration lasted less than that (a server that takes it and
    /// closes it at once is not asked in a loop).
    private struct Rejoin {
        var at: Timestamp?
        var last: Timestamp?

        mutating func dropped(now: Timestamp) {
            at = last.map { now - $0 < .seconds(1) } == true ? now + .seconds(1) : now
        }
    }

    /// A new registration at the rendezvous after the connection dropped (a relay
    /// restart, or a directory node gone: the next of its servers is tried first),
    /// or (`replacing`) after our addresses changed, when the old connection may
    /// be dead without knowing it; the server drops the old registration.
    private func reconnect(replacing: Bool) async throws(RendezvousConnectionError) {
        let old = rendezvous
        let c: RendezvousConnection
        do { c = try await old.connectAgain(identity: identity.privateKey, timeout: .seconds(2)) } catch {
            logger.info("the rendezvous is still unreachable", metadata: ["error": "\(error)"])
            throw error as? RendezvousConnectionError ?? .closed(ErrorCause(error))
        }
        let generation = link.withLock { link in
            link.generation += 1
            link.connection = c
            link.closed = false
            link.reconnected.append(c)
            return link.generation
        }
        listen(to: c, generation: generation)
        if replacing { await old.close() }
        logger.info("registered again at the rendezvous", metadata: ["server": "\(c.server)"])
    }

    /// Asks the STUN server (or the relay: it answers Binding too) what our
    /// socket's address is now, in the background; the answer comes back as
    /// ``CallEvent/reflexive(_:)``.
    private func learnReflexiveAddress(_ endpoint: SecureUDPEndpoint) {
        let server =
            options.stunServer ?? rendezvous.turn.flatMap { grant in Self.turnServers(grant).first { $0.1 == .udp }?.0 }
        guard let server else {
            feed.yield(.reflexive(nil))
            return
        }
        let feed = feed
        Task {
            let address = try? await endpoint.reflexiveAddress(from: server, timeout: .milliseconds(500))
            feed.yield(.reflexive(address))
        }
    }

    /// An ICE restart's checks against the peer's new description, in the background.
    private func recheck(_ endpoint: SecureUDPEndpoint, _ theirs: ICEDescription) {
        let timeout = options.connectTimeout
        let logger = logger
        Task {
            do { try await endpoint.connectICE(to: theirs, timeout: timeout) } catch {
                logger.warning("ICE restart found no pair", metadata: ["error": "\(error)"])
            }
        }
    }

    /// An ICE restart's local half: gather again, new credentials. Nil when there
    /// was nothing to signal.
    private func restartICE(_ endpoint: SecureUDPEndpoint) async -> ICEDescription? {
        do {
            let candidates = try await gather(endpoint, again: true)
            guard !candidates.isEmpty else { return nil }
            return try await endpoint.restartICE(candidates: candidates)
        } catch {
            logger.warning("ICE restart failed", metadata: ["error": "\(error)"])
            return nil
        }
    }

    private func connectICE(_ endpoint: SecureUDPEndpoint, to remote: ICEDescription) async throws(CallError) -> ICEPair {
        do throws(SecureTransportError) {
            return try await endpoint.connectICE(to: remote, timeout: options.connectTimeout)
        } catch {
            throw .ice(error)
        }
    }

    /// The TURN servers of a grant's URIs (`turn:HOST:PORT?transport=udp|tcp`), UDP first.
    static func turnServers(_ grant: TURNGrant) -> [(TransportAddress, TURNClientConnection.TransportProtocol)] {
        var udp: [(TransportAddress, TURNClientConnection.TransportProtocol)] = []
        var tcp = udp
        for text in grant.uris {
            // turns: (TLS) is not spoken here; host names are not resolved.
            guard let uri = try? TURNURI(parsing: text), uri.scheme == .turn, let address = uri.address else { continue }
            switch uri.transport ?? .udp {
            case .udp: udp.append((address, .udp))
            case .tcp: tcp.append((address, .tcp))
            }
        }
        return Array((udp + tcp).prefix(4))
    }

    /// The established call: hosts a ``CallController`` until it ends the call.
    private func run(
        role: CallRole, peer: PublicKey, peerID: PeerID, callID: String, endpoint: SecureUDPEndpoint, router: MediaRouter,
        codec: CodecConfiguration, source: AudioSource?, sink: AudioSink?, dialed: Int64,
        pair: ICEPair, connected: Int64, inbox: inout AsyncStream<CallEvent>.Iterator
    ) async throws -> CallReport {
        let session = try VoiceSession(
            endpoint: endpoint, peer: peerID, codec: codec, router: router, source: source, sink: sink,
            echoCancellation: options.echoCancellation)
        let feed = feed
        session.onSourceEnded = { feed.yield(.sourceEnded) }
        session.onSinkFailed = { ends in feed.yield(ends ? .sinkFailed : .recordingStopped) }
        if let impairment = options.impairment {
            await endpoint.impairMedia(impairment.decider(frameMilliseconds: codec.frameDuration.milliseconds))
        }
        let started = monotonicNanoseconds()
        session.start()
        var remote = (try? await endpoint.describe(peerID))??.address.map { "\($0)" } ?? "?"
        var path = Path(pair: pair, connected: Double(connected - dialed) / 1e6)
        var moves = 0
        let roleName = role.rawValue
        var controller = CallController(
            role: role, peer: peer, call: callID, configuration: options.control,
            localAddresses: Set(NetworkInterfaces.addresses(.ipv4, includeLoopback: options.includeLoopback)), now: Self.now())
        if link.withLock({ $0.closed }) { controller.handle(.rendezvousLost, now: Self.now()) }
        // Hung up while the call was being set up: it ends at once, the peer told.
        if hungUp.withLock({ $0 }) { controller.handle(.hangUp, now: Self.now()) }
        let endpointEvents = Task {
            for await event in endpoint.events { feed.yield(.endpoint(event)) }
        }
        var alarm = Alarm(feed: feed)
        var heard: Timestamp?
        var ended: CallEnd?
        /// Tells the controller when the peer's media last arrived (its silence rule).
        func hear(_ controller: inout CallController) {
            guard let ns = router.lastArrival else { return }
            let at = Timestamp(nanoseconds: UInt64(max(0, ns)))
            guard heard != at else { return }
            heard = at
            controller.handle(.mediaArrived(at: at), now: Self.now())
        }
        while ended == nil {
            // Everything the controller asked for, in order; what an action learns goes back in at once.
            while ended == nil, let action = controller.pollAction() {
                switch action {
                case .send(let message) where message.kind == .reachable:
                    // Best effort, never waited for: the rendezvous connection may
                    // have died with the path (a move), and a restart must not wait behind it.
                    let connection = rendezvous
                    Task { try? await connection.send(message.encoded(), to: peer) }
                case .send(let message):
                    do { try await rendezvous.send(message.encoded(), to: peer) } catch {
                        controller.handle(.sendFailed(message), now: Self.now())
                    }
                case .restartICE(let why):
                    if why != .peerRestarted {
                        logger.info("\(why): ICE restart", metadata: ["restart": "\(controller.iceRestarts + 1)"])
                    }
                    if let ours = await restartICE(endpoint) {
                        controller.handle(.iceRestarted(.init(ours)), now: Self.now())
                    } else {
                        controller.handle(.iceRestartFailed, now: Self.now())
                    }
                case .checkICE(let theirs):
                    recheck(endpoint, theirs.iceDescription)
                case .learnReflexiveAddress:
                    learnReflexiveAddress(endpoint)
                case .probe(let address):
                    logger.info("the peer says it is reachable here: probing", metadata: ["address": "\(address)"])
                    try? await endpoint.probe(peerID, at: address)
                case .rejoinRendezvous(let replacing):
                    do {
                        try await reconnect(replacing: replacing)
                        controller.handle(.rendezvousRejoined, now: Self.now())
                    } catch {
                        controller.handle(.rejoinFailed, now: Self.now())
                    }
                case .lookAtLocalAddresses:
                    let current = Set(NetworkInterfaces.addresses(.ipv4, includeLoopback: options.includeLoopback))
                    let before = controller.localAddresses
                    if current != before {
                        logger.info(
                            "this machine's addresses changed",
                            metadata: [
                                "gone": "\(before.subtracting(current).map { "\($0)" }.sorted())",
                                "new": "\(current.subtracting(before).map { "\($0)" }.sorted())",
                            ])
                    }
                    controller.handle(.localAddresses(current), now: Self.now())
                case .report:
                    session.setRoundTrip(await endpoint.roundTripTime(of: peerID))
                    if let onStatus = options.onStatus {
                        onStatus(
                            report(
                                session, role: roleName, peer: peer, path: path, remote: remote, codec: codec, dialed: dialed,
                                firstAudio: session.firstPlayedNanoseconds, started: started, ended: .localHangup, moves: moves,
                                restarts: controller.iceRestarts))
                    }
                case .end(let reason):
                    ended = reason
                }
            }
            if ended != nil { break }
            alarm.set(controller.nextDeadline, now: Self.now())
            guard let event = await inbox.next() else { break }
            switch event {
            case .wake:
                alarm.rang()
                hear(&controller)
                controller.handleTimeout(now: Self.now())
            case .signal(let from, let payload):
                guard let message = try? CallMessage(decoding: payload) else { continue }
                hear(&controller)
                controller.handle(.signal(message, from: from), now: Self.now())
            case .reflexive(let address):
                controller.handle(.reflexiveAddress(address), now: Self.now())
            case .rendezvousClosed(let generation):
                if closed(generation) { controller.handle(.rendezvousLost, now: Self.now()) }
            case .sourceEnded, .sinkFailed:
                // (One snapshot: a source that failed also ended.)
                controller.handle(session.statistics.audioError != nil ? .audioFailed : .hangUp, now: Self.now())
            case .hangUp:
                controller.handle(.hangUp, now: Self.now())
            case .recordingStopped:
                logger.error(
                    "the recording stopped; the call goes on", metadata: ["error": "\(session.statistics.audioError ?? "?")"])
            case .endpoint(let event):
                switch event {
                case .session(.control(let id, let report)) where id == peerID: session.handle(report: report)
                case .session(.peerGone(let id)) where id == peerID: controller.handle(.peerGone, now: Self.now())
                case .session(.peerMoved(let id, _, let to)) where id == peerID:
                    moves += 1
                    remote = "\(to)"
                case .ice(.selected(let p)):
                    logger.info("ICE selected a pair", metadata: ["pair": "\(p)"])
                    path = Path(pair: p, connected: path.connected)
                    remote = "\(p.remote.address)"
                    controller.handle(.iceSelected, now: Self.now())
                case .ice(.consentLost(let p)):
                    logger.warning("ICE lost the peer's consent: nothing more is sent on the pair", metadata: ["pair": "\(p)"])
                    controller.handle(.iceConsentLost, now: Self.now())
                default: break
                }
            }
        }
        alarm.cancel()
        endpointEvents.cancel()
        session.setRoundTrip(await endpoint.roundTripTime(of: peerID))
        await session.stop()
        let made = link.withLock { $0.reconnected }
        for c in made { await c.close() }
        return report(
            session, role: roleName, peer: peer, path: path, remote: remote, codec: codec, dialed: dialed,
            firstAudio: session.firstPlayedNanoseconds, started: started, ended: ended ?? .localHangup, moves: moves,
            restarts: controller.iceRestarts)
    }

    /// What the report says of the path: the selected pair and when it was first selected.
    private struct Path {
        var relayed: Bool
        var types: String
        var connected: Double

        init(pair: ICEPair, connected: Double) {
            relayed = pair.isRelayed
            types = "\(pair.local.candidate.type.rawValue) -> \(pair.remote.type.rawValue)"
            self.connected = connected
        }
    }

    private func report(
        _ session: VoiceSession, role: String, peer: PublicKey, path: Path, remote: String, codec: CodecConfiguration,
        dialed: Int64, firstAudio: Int64?, started: Int64, ended: CallEnd, moves: Int, restarts: Int
    ) -> CallReport {
        let s = session.statistics
        let p = s.playout
        let lost = p.lostPackets  // missing at their turn: lost on the way or too late
        let expected = max(1, p.packetsPlayed + lost)
        return CallReport(
            peer: Fingerprint.digits(of: peer), role: role, path: path.relayed ? "relayed" : "direct", remoteAddress: remote,
            codec: "\(codec.kind.rawValue) \(codec.sampleRate / 1000) kHz \(codec.bitrate / 1000) kb/s",
            frameMilliseconds: codec.frameDuration.milliseconds,
            dialToFirstAudioMilliseconds: firstAudio.map { Double($0 - dialed) / 1e6 },
            durationSeconds: Double(monotonicNanoseconds() - started) / 1e9,
            packetsSent: s.packetsSent, packetsReceived: s.packetsReceived,
            lossPercent: 100 * Double(lost) / Double(expected), remoteLossPercent: s.remoteLossPercent,
            jitterMilliseconds: s.remoteJitterMilliseconds, roundTripMilliseconds: s.roundTripMilliseconds,
            jitterBufferDelayMilliseconds: p.delayMeanMilliseconds, jitterBufferDelayNowMilliseconds: p.delayRecentMilliseconds,
            framesConcealed: p.framesConcealed,
            framesRecoveredByFEC: p.framesRecoveredByFEC,
            estimatedMOS: s.estimatedMOS(frameMilliseconds: codec.frameDuration.milliseconds),
            ended: ended, addressChanges: moves, candidatePair: path.types, connectMilliseconds: path.connected,
            iceRestarts: restarts,
            sendBitrate: s.encoderBitrate, sendRedundancy: s.redundancy,
            framesRecoveredByRedundancy: p.framesRecoveredByRedundancy, audioError: s.audioError)
    }

    /// The peer's answer (or refusal) to our offer, awaited among the agent's events.
    private func waitFor(
        call: String, from peer: PublicKey, kinds: Set<CallMessage.Kind>, timeout: Duration,
        inbox: inout AsyncStream<CallEvent>.Iterator
    ) async throws(CallError) -> CallMessage {
        var alarm = Alarm(feed: feed)
        defer { alarm.cancel() }
        let deadline = Self.now() + timeout
        var rejoin = Rejoin()
        while true {
            await rejoinIfDue(&rejoin)
            alarm.set(min(deadline, rejoin.at ?? deadline), now: Self.now())
            guard let event = await inbox.next() else { throw .timedOut("no answer within \(timeout)") }
            switch event {
            case .signal(let from, let bytes):
                guard from == peer, let m = try? CallMessage(decoding: bytes), m.call == call, kinds.contains(m.kind) else {
                    continue
                }
                return m
            case .wake:
                alarm.rang()
                if Self.now() >= deadline { throw .timedOut("no answer within \(timeout)") }
            case .rendezvousClosed(let generation):
                if closed(generation) {
                    if let taken = await registeredElsewhere() { throw taken }
                    rejoin.dropped(now: Self.now())
                }
            case .hangUp:
                throw .hungUp
            case .endpoint, .sourceEnded, .sinkFailed, .recordingStopped, .reflexive:
                continue
            }
        }
    }
}
