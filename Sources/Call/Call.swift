import Foundation
import Logging
import Rendezvous
import STUN
import Secure
import Transport
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

    public var statusLine: String {
        let rtt = roundTripMilliseconds.map { String(format: "%.0f ms", $0) } ?? "-"
        return String(format: "%@ %@ | rtt %@ | loss %.1f%% | jitter %.0f ms | buffer %.0f ms | MOS %.2f | sent %d recv %d",
                      path, remoteAddress, rtt, lossPercent, jitterMilliseconds, jitterBufferDelayMilliseconds, estimatedMOS,
                      packetsSent, packetsReceived)
    }

    public var humanReadable: String {
        var lines = [
            "call with \(peer) (\(role)) ended: \(ended.rawValue)",
            "  path: \(path) via \(remoteAddress)\(addressChanges > 0 ? " (address changed \(addressChanges)×)" : "")",
            "  codec: \(codec) \(frameMilliseconds) ms",
        ]
        if let d = dialToFirstAudioMilliseconds { lines.append(String(format: "  dial to first audio: %.0f ms", d)) }
        lines.append(String(format: "  duration %.1f s, sent %d, received %d packets", durationSeconds, packetsSent, packetsReceived))
        lines.append(String(format: "  loss %.1f%% (peer saw %.1f%%), jitter %.0f ms, rtt %@, buffer %.0f ms",
                            lossPercent, remoteLossPercent, jitterMilliseconds,
                            roundTripMilliseconds.map { String(format: "%.1f ms", $0) } ?? "-", jitterBufferDelayMilliseconds))
        lines.append("  concealed \(framesConcealed) frames, \(framesRecoveredByFEC) rebuilt by FEC")
        lines.append(String(format: "  estimated MOS (E-model): %.2f", estimatedMOS))
        return lines.joined(separator: "\n")
    }
}

/// Host candidates (RFC 8839 `candidate:` values) for a socket bound to `port` on all addresses.
public func hostCandidates(port: UInt16, includeLoopback: Bool) -> [String] {
    var result: [String] = []
    var list: UnsafeMutablePointer<ifaddrs>?
    guard getifaddrs(&list) == 0 else { return ["candidate:1 1 udp 2130706431 127.0.0.1 \(port) typ host"] }
    defer { freeifaddrs(list) }
    var seen = Set<String>()
    var p = list
    var localPreference: UInt32 = 65535
    while let entry = p {
        defer { p = entry.pointee.ifa_next }
        guard let sa = entry.pointee.ifa_addr, sa.pointee.sa_family == sa_family_t(AF_INET) else { continue }
        let ip = sa.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt32(bigEndian: $0.pointee.sin_addr.s_addr) }
        let text = "\(ip >> 24).\(ip >> 16 & 0xFF).\(ip >> 8 & 0xFF).\(ip & 0xFF)"
        let loopback = ip >> 24 == 127
        guard includeLoopback || !loopback, seen.insert(text).inserted else { continue }
        let priority = (126 << 24) | (localPreference << 8) | 255
        result.append("candidate:\(result.count + 1) 1 udp \(priority) \(text) \(port) typ host")
        localPreference = max(1, localPreference - 1)
    }
    return result
}

/// The address of a `candidate:` value (UDP candidates only), in the order given.
public func candidateAddresses(_ candidates: [String]) -> [TransportAddress] {
    candidates.compactMap { line in
        let f = line.split(separator: " ")
        guard f.count >= 8, f[2].lowercased() == "udp", let port = UInt16(f[5]), let ip = IPAddress(String(f[4])), f[6] == "typ" else { return nil }
        return TransportAddress(ip: ip, port: port)
    }
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

    private let rendezvous: RendezvousConnection
    private let inbox: Mailbox<(from: PublicKey, payload: [UInt8])>
    private let identity: Identity
    private let options: Options
    private let logger: Logger

    public init(rendezvous: RendezvousConnection, identity: Identity, options: Options = .init(), logger: Logger = Logger(label: "tusa.call")) {
        self.rendezvous = rendezvous; self.identity = identity; self.options = options; self.logger = logger
        inbox = Mailbox(rendezvous.incoming)
    }

    /// Calls `peer`: offer, answer, handshake, voice until the input ends (then hangs up),
    /// the peer hangs up or vanishes, or the time limit.
    public func call(_ peer: PublicKey, source: AudioSource?, sink: AudioSink?) async throws -> CallReport {
        let dialed = monotonicNanoseconds()
        let router = MediaRouter()
        let endpoint = try await SecureUDPEndpoint.bind(identity: identity, configuration: Self.secure, mediaHandler: router.handler, logger: logger)
        defer { Task { await endpoint.close() } }
        let callID = UUID().uuidString
        let offer = CallMessage(kind: .offer, call: callID, path: path(for: endpoint), codec: .init(options.codec))
        try await rendezvous.send(offer.encoded(), to: peer)
        let answer = try await waitFor(call: callID, from: peer, kinds: [.answer, .reject], timeout: options.ringTimeout)
        if answer.kind == .reject { throw CallError.rejected(answer.reason ?? "no reason given") }
        let addresses = candidateAddresses(answer.path?.candidates ?? [])
        guard !addresses.isEmpty else { throw CallError.noPath("the answer has no usable candidate") }
        var peerID: PeerID?
        var lastError = ""
        for address in addresses {
            do { peerID = try await endpoint.connect(to: peer, at: address, timeout: .seconds(5)); break } catch { lastError = "\(address): \(error)" }
        }
        guard let peerID else { throw CallError.noPath("no candidate answered the handshake (\(lastError))") }
        return try await run(role: "caller", peer: peer, peerID: peerID, callID: callID, endpoint: endpoint, router: router,
                             codec: options.codec, source: source, sink: sink, dialed: dialed)
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
            let codec: CodecConfiguration
            do { codec = try offer.codec?.configuration() ?? options.codec } catch {
                try? await rendezvous.send(CallMessage(kind: .reject, call: offer.call, reason: "\(error)").encoded(), to: from)
                throw error
            }
            let router = MediaRouter()
            let endpoint = try await SecureUDPEndpoint.bind(identity: identity, configuration: Self.secure, mediaHandler: router.handler, logger: logger)
            defer { Task { await endpoint.close() } }
            _ = try await endpoint.addPeer(from)
            let reply = CallMessage(kind: .answer, call: offer.call, path: path(for: endpoint), codec: offer.codec)
            try await rendezvous.send(reply.encoded(), to: from)
            let peerID: PeerID
            do { peerID = try await endpoint.waitForPeer(from, timeout: .seconds(10)) } catch {
                throw CallError.noPath("the caller's handshake did not arrive: \(error)")
            }
            return try await run(role: "callee", peer: from, peerID: peerID, callID: offer.call, endpoint: endpoint, router: router,
                                 codec: codec, source: source, sink: sink, dialed: dialed)
        }
    }

    private func path(for endpoint: SecureUDPEndpoint) -> CallMessage.Path {
        var bytes = [UInt8](repeating: 0, count: 18)
        bytes.withUnsafeMutableBytes { Sodium.randomBytes($0) }
        let token = Data(bytes).base64EncodedString().replacingOccurrences(of: "/", with: "_")
        return CallMessage.Path(ufrag: String(token.prefix(8)), password: String(token.dropFirst(8)),
                                candidates: hostCandidates(port: endpoint.localAddress.port, includeLoopback: options.includeLoopback))
    }

    private func run(role: String, peer: PublicKey, peerID: PeerID, callID: String, endpoint: SecureUDPEndpoint, router: MediaRouter,
                     codec: CodecConfiguration, source: AudioSource?, sink: AudioSink?, dialed: Int64) async throws -> CallReport {
        let session = try VoiceSession(endpoint: endpoint, peer: peerID, codec: codec, router: router, source: source, sink: sink,
                                       echoCancellation: options.echoCancellation)
        if let impairment = options.impairment {
            await endpoint.impairMedia(impairment.decider(frameMilliseconds: codec.frameDuration.milliseconds))
        }
        let started = monotonicNanoseconds()
        session.start()
        var remote = (try? await endpoint.describe(peerID))??.address.map { "\($0)" } ?? "?"
        var moves = 0
        var ended = CallEnd.localHangup
        let limit = options.maximumDuration.map { ContinuousClock.now + $0 }
        var lastStatus = ContinuousClock.now
        let events = Mailbox(endpoint.events)
        loop: while true {
            // Signaling (hang-up) and endpoint events, polled every 50 ms.
            while let (from, bytes) = inbox.take() {
                if from == peer, let m = try? CallMessage(decoding: bytes), m.call == callID, m.kind == .hangup {
                    ended = .remoteHangup; break loop
                }
            }
            while let event = events.take() {
                switch event {
                case .session(.control(let id, let report)) where id == peerID: session.handle(report: report)
                case .session(.peerGone(let id)) where id == peerID: ended = .peerVanished; break loop
                case .session(.peerMoved(let id, _, let to)) where id == peerID: moves += 1; remote = "\(to)"
                default: break
                }
            }
            session.setRoundTrip(await endpoint.roundTripTime(of: peerID))
            if session.statistics.sourceEnded { ended = .localHangup; break loop }
            if let limit, ContinuousClock.now >= limit { ended = .timeLimit; break loop }
            if let onStatus = options.onStatus, ContinuousClock.now - lastStatus >= .seconds(1) {
                lastStatus = ContinuousClock.now
                onStatus(report(session, role: role, peer: peer, remote: remote, codec: codec, dialed: dialed, firstAudio: session.firstPlayedNanoseconds,
                                started: started, ended: .localHangup, moves: moves))
            }
            try? await Task.sleep(for: .milliseconds(50))
        }
        if ended != .remoteHangup && ended != .peerVanished {
            try? await rendezvous.send(CallMessage(kind: .hangup, call: callID).encoded(), to: peer)
        }
        await session.stop()
        return report(session, role: role, peer: peer, remote: remote, codec: codec, dialed: dialed, firstAudio: session.firstPlayedNanoseconds,
                      started: started, ended: ended, moves: moves)
    }

    private func report(_ session: VoiceSession, role: String, peer: PublicKey, remote: String, codec: CodecConfiguration,
                        dialed: Int64, firstAudio: Int64?, started: Int64, ended: CallEnd, moves: Int) -> CallReport {
        let s = session.statistics
        let p = s.playout
        let lost = p.lostPackets   // missing at their turn: lost on the way or too late
        let expected = max(1, p.packetsPlayed + lost)
        return CallReport(
            peer: Fingerprint.digits(of: peer), role: role, path: "direct", remoteAddress: remote,
            codec: "\(codec.kind.rawValue) \(codec.sampleRate / 1000) kHz \(codec.bitrate / 1000) kb/s", frameMilliseconds: codec.frameDuration.milliseconds,
            dialToFirstAudioMilliseconds: firstAudio.map { Double($0 - dialed) / 1e6 },
            durationSeconds: Double(monotonicNanoseconds() - started) / 1e9,
            packetsSent: s.packetsSent, packetsReceived: s.packetsReceived,
            lossPercent: 100 * Double(lost) / Double(expected), remoteLossPercent: s.remoteLossPercent,
            jitterMilliseconds: s.remoteJitterMilliseconds, roundTripMilliseconds: s.roundTripMilliseconds,
            jitterBufferDelayMilliseconds: p.delayMeanMilliseconds, framesConcealed: p.framesConcealed,
            framesRecoveredByFEC: p.framesRecoveredByFEC, estimatedMOS: s.estimatedMOS(frameMilliseconds: codec.frameDuration.milliseconds),
            ended: ended, addressChanges: moves)
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
    private var task: Task<Void, Never>?

    init(_ stream: AsyncStream<T>) {
        task = Task { [weak self] in
            for await item in stream { self?.put(item) }
        }
    }

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
