import Foundation
import ICE
import Logging
import Rendezvous
import STUN
import Secure
import TURN
import Transport
import TusaBase
import Voice

/// How a call ended, for the report and the exit code.
public enum CallEnd: String, Sendable, Codable {
    /// We hung up (our input ended, or the user stopped us).
    case localHangup = "local-hangup"
    /// The peer sent a hang-up.
    case remoteHangup = "remote-hangup"
    /// Nothing authenticated came from the peer for the secure layer's timeout.
    case peerVanished = "peer-vanished"
    /// The time limit (`--duration`) ran out.
    case timeLimit = "time-limit"
    /// Our audio input or output failed (the report's `audioError` says how).
    case audioFailed = "audio-error"
}

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
    public var jitterBufferDelayMilliseconds: Double
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
    /// Why our audio input or output failed during the call (nil when it did not).
    public var audioError: String?

    public var statusLine: String {
        let rtt = roundTripMilliseconds.map { String(format: "%.0f ms", $0) } ?? "-"
        return String(format: "%@ %@ | rtt %@ | loss %.1f%% | jitter %.0f ms | buffer %.0f ms | MOS %.2f | sent %d recv %d",
                      path, remoteAddress, rtt, lossPercent, jitterMilliseconds, jitterBufferDelayMilliseconds, estimatedMOS,
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
        lines.append(String(format: "  duration %.1f s, sent %d, received %d packets", durationSeconds, packetsSent, packetsReceived))
        lines.append("  sending at \(sendBitrate / 1000) kb/s")
        lines.append(String(format: "  loss %.1f%% (peer saw %.1f%%), jitter %.0f ms, rtt %@, buffer %.0f ms",
                            lossPercent, remoteLossPercent, jitterMilliseconds,
                            roundTripMilliseconds.map { String(format: "%.1f ms", $0) } ?? "-", jitterBufferDelayMilliseconds))
        lines.append("  concealed \(framesConcealed) frames, \(framesRecoveredByFEC) rebuilt by FEC")
        if iceRestarts > 0 { lines.append("  ICE restarted \(iceRestarts)×") }
        if let audioError { lines.append("  audio error: \(audioError)") }
        lines.append(String(format: "  estimated MOS (E-model): %.2f", estimatedMOS))
        return lines.joined(separator: "\n")
    }
}

/// This machine's IPv4 addresses (host candidates), best first: loopback, when
/// included, last (it reaches only this machine). ``NetworkInterfaces/addresses(_:includeLoopback:)``.
public func hostAddresses(includeLoopback: Bool) -> [IPAddress] {
    NetworkInterfaces.addresses(.ipv4, includeLoopback: includeLoopback)
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
public final class CallAgent: @unchecked Sendable {
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
    }

    /// The secure layer for calls: receiver reports every 2 s (the encoder's loss hint
    /// and the RTT follow within seconds), a peer silent for 10 s has vanished (media
    /// flows every frame in a call, so that is not a pause); after 4 s of silence a new
    /// handshake is tried first.
    static var secure: SecureConfiguration {
        var c = SecureConfiguration()
        c.reportInterval = .seconds(2)
        c.rehandshakeAfterSilence = .seconds(4)   // a peer that moved and lost its keys' path
        c.peerTimeout = .seconds(10)
        return c
    }

    /// The rendezvous connection and what came through it; replaced when the
    /// connection drops mid-call (a relay restart), so that ICE restarts can be signalled.
    private struct Link {
        var connection: RendezvousConnection
        var inbox: Mailbox<(from: PublicKey, payload: [UInt8])>
    }
    private let lock = NSLock()
    private var link: Link
    /// Connections made here after the first (closed when the call ends).
    private var reconnected: [RendezvousConnection] = []
    private var rendezvous: RendezvousConnection { lock.withLock { link.connection } }
    private var inbox: Mailbox<(from: PublicKey, payload: [UInt8])> { lock.withLock { link.inbox } }
    private let identity: Identity
    private let options: Options
    private let logger: Logger

    public init(rendezvous: RendezvousConnection, identity: Identity, options: Options = .init(), logger: Logger = Logger(label: "tusa.call")) {
        self.identity = identity; self.options = options; self.logger = logger
        link = Link(connection: rendezvous, inbox: Mailbox(rendezvous.incoming))
    }

    /// ICE for calls: checks paced at 20 ms (two candidates a side is the common
    /// case), and a valid pair nominated after 100 ms when a better one is still out.
    static var ice: ICEConfiguration {
        var c = ICEConfiguration()
        c.ta = .milliseconds(20)
        c.nominationDelay = .milliseconds(100)
        return c
    }

    /// Calls `peer`: offer, answer, connectivity checks, handshake on the selected
    /// pair, voice until the input ends (then hangs up), the peer hangs up or
    /// vanishes, or the time limit.
    public func call(_ peer: PublicKey, source: AudioSource?, sink: AudioSink?) async throws -> CallReport {
        let dialed = monotonicNanoseconds()
        let router = MediaRouter()
        let endpoint = try await SecureUDPEndpoint.bind(identity: identity, configuration: Self.secure, mediaHandler: router.handler, logger: logger)
        defer { Task { await endpoint.close() } }
        let callID = UUID().uuidString
        let local = try await startICE(endpoint, role: .controlling)
        let offer = CallMessage(kind: .offer, call: callID, path: .init(local), codec: .init(options.codec))
        try await rendezvous.send(offer.encoded(), to: peer)
        let answer = try await waitFor(call: callID, from: peer, kinds: [.answer, .reject], timeout: options.ringTimeout)
        if answer.kind == .reject { throw CallError.rejected(answer.reason ?? "no reason given") }
        guard let remote = answer.path?.iceDescription, !remote.candidates.isEmpty else {
            throw CallError.noPath("the answer has no usable candidate")
        }
        let pair = try await connectICE(endpoint, to: remote)
        let connected = monotonicNanoseconds()
        let peerID: PeerID
        do { peerID = try await endpoint.connect(to: peer, at: pair.remote.address, timeout: .seconds(5)) } catch {
            throw CallError.noPath("the handshake on \(pair) failed: \(error)")
        }
        try await endpoint.followICE(peerID)
        return try await run(role: "caller", peer: peer, peerID: peerID, callID: callID, endpoint: endpoint, router: router,
                             codec: options.codec, source: source, sink: sink, dialed: dialed, pair: pair, connected: connected)
    }

    /// Waits for an offer (from anyone, or from `only`), answers it and runs the call.
    public func answer(only: PublicKey? = nil, source: AudioSource?, sink: AudioSink?) async throws -> CallReport {
        let deadline = ContinuousClock.now + options.ringTimeout
        while true {
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero, let (from, bytes) = await inbox.next(within: remaining) else {
                throw CallError.timedOut("no call within \(options.ringTimeout)")
            }
            guard only == nil || only == from, let offer = try? CallMessage(decoding: bytes), offer.kind == .offer else { continue }
            let dialed = monotonicNanoseconds()
            // Whatever stops the set-up is sent to the caller as a refusal (it does not wait for an answer).
            let codec: CodecConfiguration, remote: ICEDescription, endpoint: SecureUDPEndpoint, local: ICEDescription
            let router = MediaRouter()
            do {
                codec = try offer.codec?.configuration() ?? options.codec
                guard let r = offer.path?.iceDescription, !r.candidates.isEmpty else { throw CallError.noPath("the offer has no usable candidate") }
                remote = r
                endpoint = try await SecureUDPEndpoint.bind(identity: identity, configuration: Self.secure, mediaHandler: router.handler, logger: logger)
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
            defer { Task { await endpoint.close() } }
            // Checks (and the relay's permissions for the caller) start while the answer travels.
            async let checks = connectICE(endpoint, to: remote)
            let reply = CallMessage(kind: .answer, call: offer.call, path: .init(local), codec: offer.codec)
            try await rendezvous.send(reply.encoded(), to: from)
            let pair = try await checks
            let connected = monotonicNanoseconds()
            let peerID: PeerID
            do { peerID = try await endpoint.waitForPeer(from, timeout: .seconds(10)) } catch {
                throw CallError.noPath("the caller's handshake did not arrive on \(pair): \(error)")
            }
            try await endpoint.followICE(peerID)
            return try await run(role: "callee", peer: from, peerID: peerID, callID: offer.call, endpoint: endpoint, router: router,
                                 codec: codec, source: source, sink: sink, dialed: dialed, pair: pair, connected: connected)
        }
    }

    /// Gathers (host addresses, the relay's allocation and mapped address) and
    /// starts the ICE agent on the endpoint's socket.
    private func startICE(_ endpoint: SecureUDPEndpoint, role: ICERole) async throws -> ICEDescription {
        let candidates = try await gather(endpoint, again: false)
        let stun = options.candidatePolicy == .all && rendezvous.turn == nil ? options.stunServer : nil
        do {
            return try await endpoint.startICE(role: role, candidates: candidates, stunServer: stun, configuration: Self.ice)
        } catch {
            throw CallError.noPath("\(error)")
        }
    }

    /// Our candidates: this machine's addresses, and with the rendezvous' TURN grant
    /// an allocation (relayed) and the address the relay saw (server-reflexive).
    /// `again`: a restart, with a fresh allocation (the old one may be unreachable
    /// from where we are now, or gone with a restarted relay).
    private func gather(_ endpoint: SecureUDPEndpoint, again: Bool) async throws -> [ICELocalCandidate] {
        var candidates: [ICELocalCandidate] = []
        if options.candidatePolicy == .all {
            candidates = hostAddresses(includeLoopback: options.includeLoopback).enumerated().map { i, ip in
                .host(TransportAddress(ip: ip, port: endpoint.localAddress.port), base: ICEBase.socket, localPreference: UInt32(65535 - i))
            }
        }
        var relayProblem: String?
        if let grant = rendezvous.turn {
            let configuration = TURNClient.Configuration(username: grant.username, password: grant.password)
            let servers = Self.turnServers(grant)
            if servers.isEmpty { relayProblem = "no TURN URI among \(grant.uris)" }
            // UDP first; TURN over TCP where UDP is blocked (the relay still talks UDP to the peer).
            var first = !again
            for (server, transport) in servers {
                do {
                    let timeout: Duration = transport == .udp ? .milliseconds(1500) : .seconds(5)
                    let allocation = first ? try await endpoint.useRelay(server, over: transport, configuration: configuration, timeout: timeout)
                                           : try await endpoint.replaceRelay(server, over: transport, configuration: configuration, timeout: timeout)
                    candidates.append(.relayed(allocation.relayed, mapped: allocation.mapped, base: ICEBase.relay))
                    // (Over TCP the mapped address is the TCP connection's: no UDP candidate.)
                    if transport == .udp, options.candidatePolicy == .all, let mapped = allocation.mapped,
                       !candidates.contains(where: { $0.candidate.address == mapped }) {
                        candidates.append(.serverReflexive(mapped, baseAddress: endpoint.localAddress, base: ICEBase.socket))
                    }
                    relayProblem = nil
                    break
                } catch {
                    first = false
                    relayProblem = "\(transport.rawValue) \(server): \(error)"
                    logger.warning("no relayed candidate", metadata: ["server": "\(server)", "transport": "\(transport.rawValue)", "error": "\(error)"])
                }
            }
        } else {
            relayProblem = "the rendezvous gave no TURN credentials (tusa relay --static-auth-secret)"
        }
        if options.candidatePolicy == .relay && !candidates.contains(where: { $0.candidate.type == .relay }) {
            throw CallError.noPath("relay-only, but no relay: \(relayProblem ?? "?")")
        }
        return candidates
    }

    /// A new registration at the rendezvous after the connection dropped (a relay
    /// restart), or (`replacing`) after our addresses changed, when the old
    /// connection may be dead without knowing it; the server drops the old registration.
    private func reconnect(replacing: Bool = false) async {
        let old = rendezvous, server = old.server
        do {
            let c = try await RendezvousConnection.connect(to: server, identity: identity.privateKey, timeout: .seconds(2))
            lock.withLock {
                link = Link(connection: c, inbox: Mailbox(c.incoming))
                reconnected.append(c)
            }
            if replacing { await old.close() }
            logger.info("registered again at the rendezvous", metadata: ["server": "\(server)"])
        } catch {
            logger.info("the rendezvous is still unreachable", metadata: ["error": "\(error)"])
        }
    }

    /// An ICE restart's checks against the peer's new description, in the background.
    private func recheck(_ endpoint: SecureUDPEndpoint, _ theirs: ICEDescription) {
        let timeout = options.connectTimeout, logger = logger
        Task {
            do { try await endpoint.connectICE(to: theirs, timeout: timeout) } catch {
                logger.warning("ICE restart found no pair", metadata: ["error": "\(error)"])
            }
        }
    }

    /// An ICE restart's local half: gather again, new credentials, and the new
    /// description sent to the peer as `kind` (a restart, or the answer to one).
    /// False when there was nothing to signal.
    private func restartICE(_ endpoint: SecureUDPEndpoint, signal kind: CallMessage.Kind, call: String, to peer: PublicKey) async -> Bool {
        let ours: ICEDescription
        do {
            let candidates = try await gather(endpoint, again: true)
            guard !candidates.isEmpty else { return false }
            ours = try await endpoint.restartICE(candidates: candidates)
        } catch {
            logger.warning("ICE restart failed", metadata: ["error": "\(error)"])
            return false
        }
        try? await rendezvous.send(CallMessage(kind: kind, call: call, path: .init(ours)).encoded(), to: peer)
        return true
    }

    private func connectICE(_ endpoint: SecureUDPEndpoint, to remote: ICEDescription) async throws -> ICEPair {
        do { return try await endpoint.connectICE(to: remote, timeout: options.connectTimeout) } catch {
            throw CallError.noPath("\(error)")
        }
    }

    /// The TURN servers of a grant's URIs (`turn:HOST:PORT?transport=udp|tcp`), UDP first.
    static func turnServers(_ grant: TURNGrant) -> [(TransportAddress, TURNClientConnection.TransportProtocol)] {
        var udp: [(TransportAddress, TURNClientConnection.TransportProtocol)] = [], tcp = udp
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

    private func run(role: String, peer: PublicKey, peerID: PeerID, callID: String, endpoint: SecureUDPEndpoint, router: MediaRouter,
                     codec: CodecConfiguration, source: AudioSource?, sink: AudioSink?, dialed: Int64,
                     pair: ICEPair, connected: Int64) async throws -> CallReport {
        let session = try VoiceSession(endpoint: endpoint, peer: peerID, codec: codec, router: router, source: source, sink: sink,
                                       echoCancellation: options.echoCancellation)
        if let impairment = options.impairment {
            await endpoint.impairMedia(impairment.decider(frameMilliseconds: codec.frameDuration.milliseconds))
        }
        let started = monotonicNanoseconds()
        session.start()
        var remote = (try? await endpoint.describe(peerID))??.address.map { "\($0)" } ?? "?"
        var path = Path(pair: pair, connected: Double(connected - dialed) / 1e6)
        var moves = 0
        var ended = CallEnd.localHangup
        let limit = options.maximumDuration.map { ContinuousClock.now + $0 }
        var lastStatus = ContinuousClock.now
        let events = Mailbox(endpoint.events)
        // Restart ICE when the peer falls silent (we moved, its NAT rebound us, the
        // relay restarted): the path is found again through the rendezvous.
        var heard = (packets: 0, at: ContinuousClock.now)
        var lastRestart: ContinuousClock.Instant?
        var lastReconnect: ContinuousClock.Instant?
        var restarts = 0
        // ICE lost the peer's consent (RFC 7675): the endpoint sends nothing on the pair; restart now.
        var consentLost = false
        // This machine's addresses changed (we moved): restart now, with the new candidates.
        var addresses = Set(hostAddresses(includeLoopback: options.includeLoopback))
        var lastAddressCheck = ContinuousClock.now
        var networkChanged = false
        defer {
            let made = lock.withLock { reconnected }
            Task { for c in made { await c.close() } }
        }
        loop: while true {
            if inbox.finished, lastReconnect.map({ ContinuousClock.now - $0 >= .seconds(1) }) ?? true {
                lastReconnect = ContinuousClock.now
                await reconnect()
            }
            // Signaling (hang-up, ICE restarts) and endpoint events, polled every 50 ms.
            while let (from, bytes) = inbox.take() {
                guard from == peer, let m = try? CallMessage(decoding: bytes), m.call == callID else { continue }
                switch m.kind {
                case .hangup:
                    ended = .remoteHangup; break loop
                case .restart:
                    // Both sides restarting at once: the controlling side's restart wins.
                    if role == "caller", let lastRestart, ContinuousClock.now - lastRestart < .seconds(1) { continue }
                    guard let theirs = m.path?.iceDescription, await restartICE(endpoint, signal: .restartAnswer, call: callID, to: peer) else { continue }
                    lastRestart = ContinuousClock.now
                    restarts += 1
                    recheck(endpoint, theirs)
                case .restartAnswer:
                    guard let theirs = m.path?.iceDescription else { continue }
                    recheck(endpoint, theirs)
                default:
                    break
                }
            }
            let received = session.statistics.packetsReceived
            if received != heard.packets { heard = (received, ContinuousClock.now) }
            if let every = options.networkCheckInterval, ContinuousClock.now - lastAddressCheck >= every {
                lastAddressCheck = ContinuousClock.now
                let current = Set(hostAddresses(includeLoopback: options.includeLoopback))
                if current != addresses {
                    logger.info("this machine's addresses changed", metadata: [
                        "gone": "\(addresses.subtracting(current).map { "\($0)" }.sorted())",
                        "new": "\(current.subtracting(addresses).map { "\($0)" }.sorted())"])
                    addresses = current
                    networkChanged = true
                }
            }
            if consentLost || networkChanged || ContinuousClock.now - heard.at >= options.restartAfterSilence,
               lastRestart.map({ ContinuousClock.now - $0 >= options.restartAfterSilence * 2 }) ?? true {
                lastRestart = ContinuousClock.now
                let why = networkChanged ? "our addresses changed" : consentLost ? "the peer withdrew its consent" : "the peer fell silent"
                logger.info("\(why): ICE restart", metadata: ["restart": "\(restarts + 1)"])
                consentLost = false
                // (Our old connection to the rendezvous may have gone with our old address.)
                if networkChanged { await reconnect(replacing: true) }
                networkChanged = false
                if await restartICE(endpoint, signal: .restart, call: callID, to: peer) { restarts += 1 }
            }
            while let event = events.take() {
                switch event {
                case .session(.control(let id, let report)) where id == peerID: session.handle(report: report)
                case .session(.peerGone(let id)) where id == peerID: ended = .peerVanished; break loop
                case .session(.peerMoved(let id, _, let to)) where id == peerID: moves += 1; remote = "\(to)"
                case .ice(.selected(let p)):
                    logger.info("ICE selected a pair", metadata: ["pair": "\(p)"])
                    path = Path(pair: p, connected: path.connected); remote = "\(p.remote.address)"
                    consentLost = false
                case .ice(.consentLost(let p)):
                    logger.warning("ICE lost the peer's consent: nothing more is sent on the pair", metadata: ["pair": "\(p)"])
                    consentLost = true
                default: break
                }
            }
            session.setRoundTrip(await endpoint.roundTripTime(of: peerID))
            let voice = session.statistics   // (one snapshot: a failing source also ends)
            if voice.audioError != nil { ended = .audioFailed; break loop }
            if voice.sourceEnded { ended = .localHangup; break loop }
            if let limit, ContinuousClock.now >= limit { ended = .timeLimit; break loop }
            if let onStatus = options.onStatus, ContinuousClock.now - lastStatus >= .seconds(1) {
                lastStatus = ContinuousClock.now
                onStatus(report(session, role: role, peer: peer, path: path, remote: remote, codec: codec, dialed: dialed,
                                firstAudio: session.firstPlayedNanoseconds, started: started, ended: .localHangup, moves: moves, restarts: restarts))
            }
            try? await Task.sleep(for: .milliseconds(50))
        }
        if ended != .remoteHangup && ended != .peerVanished {
            try? await rendezvous.send(CallMessage(kind: .hangup, call: callID).encoded(), to: peer)
        }
        await session.stop()
        return report(session, role: role, peer: peer, path: path, remote: remote, codec: codec, dialed: dialed,
                      firstAudio: session.firstPlayedNanoseconds, started: started, ended: ended, moves: moves, restarts: restarts)
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

    private func report(_ session: VoiceSession, role: String, peer: PublicKey, path: Path, remote: String, codec: CodecConfiguration,
                        dialed: Int64, firstAudio: Int64?, started: Int64, ended: CallEnd, moves: Int, restarts: Int) -> CallReport {
        let s = session.statistics
        let p = s.playout
        let lost = p.lostPackets   // missing at their turn: lost on the way or too late
        let expected = max(1, p.packetsPlayed + lost)
        return CallReport(
            peer: Fingerprint.digits(of: peer), role: role, path: path.relayed ? "relayed" : "direct", remoteAddress: remote,
            codec: "\(codec.kind.rawValue) \(codec.sampleRate / 1000) kHz \(codec.bitrate / 1000) kb/s", frameMilliseconds: codec.frameDuration.milliseconds,
            dialToFirstAudioMilliseconds: firstAudio.map { Double($0 - dialed) / 1e6 },
            durationSeconds: Double(monotonicNanoseconds() - started) / 1e9,
            packetsSent: s.packetsSent, packetsReceived: s.packetsReceived,
            lossPercent: 100 * Double(lost) / Double(expected), remoteLossPercent: s.remoteLossPercent,
            jitterMilliseconds: s.remoteJitterMilliseconds, roundTripMilliseconds: s.roundTripMilliseconds,
            jitterBufferDelayMilliseconds: p.delayMeanMilliseconds, framesConcealed: p.framesConcealed,
            framesRecoveredByFEC: p.framesRecoveredByFEC, estimatedMOS: s.estimatedMOS(frameMilliseconds: codec.frameDuration.milliseconds),
            ended: ended, addressChanges: moves, candidatePair: path.types, connectMilliseconds: path.connected, iceRestarts: restarts,
            sendBitrate: s.encoderBitrate, audioError: s.audioError)
    }

    private func waitFor(call: String, from peer: PublicKey, kinds: Set<CallMessage.Kind>, timeout: Duration,
                         ) async throws -> CallMessage {
        let deadline = ContinuousClock.now + timeout
        while true {
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero, let (from, bytes) = await inbox.next(within: remaining) else {
                throw CallError.timedOut("no answer within \(timeout)")
            }
            guard from == peer, let m = try? CallMessage(decoding: bytes), m.call == call, kinds.contains(m.kind) else { continue }
            return m
        }
    }
}

/// A stream's elements, collected by a task, taken without consuming the stream
/// from a racing task (cancelling an AsyncStream's consumer would end the stream).
final class Mailbox<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [T] = []
    private var ended = false
    private var task: Task<Void, Never>?

    init(_ stream: AsyncStream<T>) {
        task = Task { [weak self] in
            for await item in stream { self?.put(item) }
            self?.lock.withLock { self?.ended = true }
        }
    }

    /// The stream ended (and everything it had was taken).
    var finished: Bool { lock.withLock { ended && items.isEmpty } }

    deinit { task?.cancel() }

    private func put(_ item: T) { lock.withLock { items.append(item) } }

    func take() -> T? { lock.withLock { items.isEmpty ? nil : items.removeFirst() } }

    /// The next element within `timeout`, or nil.
    func next(within timeout: Duration) async -> T? {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let item = take() { return item }
            if ContinuousClock.now >= deadline { return nil }
            try? await Task.sleep(for: .milliseconds(5))
        }
    }
}
