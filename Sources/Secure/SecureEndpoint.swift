import CSodium
import TusaBase

/// A peer of a `SecureEndpoint`.
public struct PeerID: Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int
    /// The peer whose id is `rawValue` (as ``rawValue`` gave it): a driver that names
    /// its own records after peers finds them again. An endpoint never reuses an id; one
    /// it does not hold is an unknown peer to it.
    public init(rawValue: Int) { self.rawValue = rawValue }
    public var description: String { "peer\(rawValue)" }
}

/// Something the driver must do or learn after a call into the endpoint: the
/// endpoint's `SansIOCore.Action`, drained with `pollAction()`.
public enum SecureOutput: Sendable, Equatable {
    /// Send these bytes to this address (handshake messages, keepalives, reports).
    case send([UInt8], to: TransportAddress)
    case event(SecureEvent)
}

public enum SecureEvent: Sendable, Equatable {
    /// Keys are in place both ways: media can flow. `rekey` is false the first time.
    case established(PeerID, key: PublicKey, rekey: Bool)
    /// A handshake we started got no valid answer within `handshakeTimeout`.
    case handshakeFailed(PeerID)
    /// The peer's address changed (its newest authenticated packet came from `to`).
    case peerMoved(PeerID, from: TransportAddress, to: TransportAddress)
    /// Nothing authenticated came from the peer for `peerTimeout`; its keys are gone.
    case peerGone(PeerID)
    /// An authenticated control report.
    case control(PeerID, ControlReport)
    /// A key-log line (only with `keyLog` on): `TUSA_MEDIA_KEY <ssrc hex> <key hex>`.
    case keyLog(String)
}

/// Why a handshake message was dropped.
public enum HandshakeDropReason: String, Sendable, CaseIterable {
    case malformed, badMAC, cookieRequired, rateLimited, unknownPeer
    case replayedInitiation, unexpected, authenticationFailed
    /// The initiation claims an SSRC that a peer with a session holds (its media would go astray).
    case ssrcInUse
}

/// The result of `receive` for one datagram.
public enum SecureReceive: Equatable, Sendable {
    /// An authenticated media packet: its RTP header and where its plaintext
    /// payload now lies in the buffer that was passed in (decrypted in place).
    case media(PeerID, RTPHeader, payload: Range<Int>)
    /// A handshake or control message was handled: drain `pollAction()`.
    case handled
    case dropped(PacketDropReason)
    case droppedHandshake(HandshakeDropReason)
}

/// Why a media packet could not be sealed.
public enum SecureSendError: Error, Equatable, Sendable {
    case unknownPeer
    /// No confirmed, unexpired keys yet (or any more): a handshake is under way.
    case notEstablished
    /// The peer has no known address yet.
    case noAddress
    case bufferTooSmall(needed: Int)
}

/// Counters for metrics and tests.
public struct SecureStatistics: Sendable, Equatable {
    public var dropped: [PacketDropReason: UInt64] = [:]
    public var handshakeDrops: [HandshakeDropReason: UInt64] = [:]
    public var handshakesCompleted: UInt64 = 0
    public var cookieRepliesSent: UInt64 = 0
    public var mediaSealed: UInt64 = 0
    public var mediaOpened: UInt64 = 0
    public var roams: UInt64 = 0
    /// Peers made for unknown keys' initiations and forgotten again (no session, or gone).
    public var peersForgotten: UInt64 = 0
}

/// The sans-IO secure transport for any number of peers on one socket: Noise IK
/// handshakes (`HandshakeWire`), media sealed as RTP (`MediaCipher`), encrypted
/// control reports, rekeying with overlapping keys, a replay window, roaming,
/// keepalives and dead-peer detection. It takes bytes, addresses and times and
/// returns what to send; the driver owns the socket and the clock.
///
/// It is a `SansIOCore`: requests go in with `handle(_:now:)`, timers run in
/// `handleTimeout(now:)` at `nextDeadline`, and what to send or report comes out
/// of `pollAction()`. The hot paths are calls of their own — `receive(_:from:now:)`
/// opens a datagram in place, `sealMedia(to:…into:now:)` seals into the caller's
/// buffer, `sendControl(_:to:now:)` says why it cannot send — and whatever they
/// leave to do comes out of `pollAction()` too.
///
/// Sequence numbers continue across rekeys (one RTP stream per SSRC), so one
/// replay window covers every epoch; each key's nonces are the extended
/// sequence numbers sent under it. Media carries no key id: the receiver tries
/// the keys it holds, newest first (at most three exist during an overlap).
///
/// Confined to one thread. The properties a sealed media packet touches, here and
/// in its `PeerState` and `Keypair`, are `@exclusivity(unchecked)`: a party relay
/// seals a copy per member per frame, and the run-time checks were about 1 % of its
/// CPU. None of them is passed `inout` to a call that touches it again.
public final class SecureEndpoint {
    public let identity: Identity
    public let configuration: SecureConfiguration
    /// The configuration's key lifetimes to the nanosecond, for the checks made on every
    /// packet sealed (Duration's arithmetic is a call into the runtime each time).
    private let lifetimes: KeyLifetimes
    @exclusivity(unchecked) public private(set) var statistics = SecureStatistics()

    @exclusivity(unchecked) private var peers: [PeerID: PeerState] = [:]
    private var peerByKey: [PublicKey: PeerID] = [:]
    private var peerBySSRC: [UInt32: PeerID] = [:]
    private var pendingByIndex: [UInt32: PeerID] = [:]
    private var nextPeerID = 0
    @exclusivity(unchecked) private var outbox = ActionQueue<SecureOutput>()
    private var cookies: CookieChecker
    private var handshakeBudget: TokenBucket
    private var perSource: SourceLimiter
    private let ownMAC1Key: [UInt8]
    private var lastTimeout: Timestamp?
    /// Peers by when their timers are due, so a wake runs the peers due and no others.
    private var timers = TimerQueue()
    /// Peers whose deadlines may have come earlier since they were queued
    /// (`timersChanged`): queued again before the next look at the queue.
    private var changedTimers: [PeerState] = []
    /// Every random byte the endpoint draws: ephemeral keys, sender indices,
    /// SSRCs, initial sequence numbers, cookie secrets and nonces.
    private var random: any SecureRandom

    /// - Parameter random: the source of every random byte (libsodium's by default;
    ///   tests pass a ``SeededRandom`` for runs that repeat byte for byte).
    public init(
        identity: Identity, configuration: SecureConfiguration = .init(), random: any SecureRandom = SystemRandom(),
        now: Timestamp
    ) {
        Sodium.ensureInitialized()
        self.identity = identity
        self.configuration = configuration
        lifetimes = KeyLifetimes(configuration)
        var random = random
        cookies = CookieChecker(responder: identity.publicKey, now: now, random: &random)
        self.random = random
        handshakeBudget = TokenBucket(rate: configuration.handshakeRate, burst: configuration.handshakeBurst, now: now)
        perSource = SourceLimiter(rate: configuration.handshakeRatePerSource, burst: configuration.handshakeRatePerSource * 2)
        ownMAC1Key = MAC.mac1Key(for: identity.publicKey)
    }

    // MARK: Peers

    /// Adds (or finds) the peer with static key `key`, optionally at `address`.
    @discardableResult
    public func addPeer(_ key: PublicKey, address: TransportAddress? = nil) -> PeerID {
        if let id = peerByKey[key] {
            if let address, let p = peers[id], p.address == nil { p.address = address }
            return id
        }
        let id = PeerID(rawValue: nextPeerID)
        nextPeerID += 1
        // RFC 3550: a random SSRC and a random initial sequence number.
        let ssrc = random.nonZeroUInt32()
        let sequence = UInt64(UInt16(truncatingIfNeeded: random.uint32()))
        let p = PeerState(
            id: id, key: key, address: address, localSSRC: ssrc, firstSequence: sequence, configuration: configuration)
        peers[id] = p
        peerByKey[key] = id
        return id
    }

    /// Forgets a peer: its keys are zeroed.
    public func removePeer(_ id: PeerID) {
        guard let p = peers.removeValue(forKey: id) else { return }
        peerByKey[p.key] = nil
        // (Only its own entry: another peer may hold that SSRC now.)
        if let r = p.remoteSSRC, peerBySSRC[r] == id { peerBySSRC[r] = nil }
        abandonInitiation(p)
        p.keys.retireAll()
    }

    public func peer(for key: PublicKey) -> PeerID? { peerByKey[key] }
    /// A peer's whole state (tests look at its handshake state and key slots).
    func state(of id: PeerID) -> PeerState? { peers[id] }
    public func key(of id: PeerID) -> PublicKey? { peers[id]?.key }
    public func address(of id: PeerID) -> TransportAddress? { peers[id]?.address }
    public func isEstablished(_ id: PeerID) -> Bool { peers[id]?.sendKeys(now: nil, lifetimes) != nil }
    /// The SSRC our media to `id` carries, and the one its media to us carries.
    public func ssrcs(of id: PeerID) -> (local: UInt32, remote: UInt32?)? {
        peers[id].map { ($0.localSSRC, $0.remoteSSRC) }
    }

    /// The round-trip time from the latest report that echoed one of ours.
    public func roundTripTime(of id: PeerID) -> Duration? { peers[id]?.reports.roundTrip }
    /// What we received from the peer so far.
    public func reception(of id: PeerID) -> ReceptionStatistics? { peers[id]?.reports.reception }
    /// The latest report the peer sent us (its view of our media).
    public func lastReport(from id: PeerID) -> ControlReport? { peers[id]?.reports.lastPeerReport?.report }

    /// Points a peer at a new address (e.g. after ICE picks a path).
    public func setAddress(_ address: TransportAddress, of id: PeerID) { peers[id]?.address = address }

    /// Starts a handshake with `id` (the initiation goes to its address).
    private func connect(_ id: PeerID, now: Timestamp) {
        guard let p = peers[id], p.handshake.initiation == nil else { return }
        startHandshake(p, now: now, rekey: p.hasKeys)
    }

    /// Whether `pollAction()` has anything (cheap: for drivers that drain only then).
    public var hasOutputs: Bool { !outbox.isEmpty }

    // MARK: Sending media

    /// Seals one media frame for `id` as RTP into `out`: header (12 bytes,
    /// SSRC and sequence number from the session) ‖ ciphertext ‖ 16-byte tag.
    /// Returns the length and where to send it. No allocation.
    public func sealMedia(
        to id: PeerID, payloadType: UInt8, marker: Bool = false, timestamp: UInt32,
        payload: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer, now: Timestamp
    ) throws -> (length: Int, to: TransportAddress) {
        guard let p = peers[id] else { throw SecureSendError.unknownPeer }
        return try sealMedia(
            for: p, payloadType: payloadType, marker: marker, timestamp: timestamp, payload: payload, into: out, now: now)
    }

    /// One media payload sealed for each of `ids` in turn into `out`, as
    /// ``sealMedia(to:payloadType:marker:timestamp:payload:into:now:)`` seals it for
    /// one; each copy goes to `sealed` before the next overwrites it: its length and
    /// where it goes, or the error that call would have thrown. A party relay's copies
    /// of one frame: each peer's state is looked up once, and fetched into the cache
    /// while the copy before it is encrypted. `sealed` must not call into the endpoint.
    public func sealMedia(
        toEach ids: [PeerID], payloadType: UInt8, timestamp: UInt32, payload: UnsafeRawBufferPointer,
        into out: UnsafeMutableRawBufferPointer, now: Timestamp,
        _ sealed: (Result<(length: Int, to: TransportAddress), any Error>) -> Void
    ) {
        // The peers, unretained (the table holds them, and nothing here removes one):
        // a reference counted now would wait for each peer's state to arrive in turn.
        // The array is kept from call to call, and taken out while in use (a call from
        // `sealed`, which must not happen, would then not pull it from under this one).
        var resolved = fanOut
        fanOut = []
        resolved.removeAll(keepingCapacity: true)
        defer {
            resolved.removeAll(keepingCapacity: true)
            fanOut = resolved
        }
        for id in ids {
            if let i = peers.index(forKey: id) {
                let p = Unmanaged.passUnretained(peers.values[i])
                tusa_prefetch(p.toOpaque())
                resolved.append(p)
            } else {
                resolved.append(nil)
            }
        }
        for k in resolved.indices {
            if k + 1 < resolved.count, let next = resolved[k + 1] { next._withUnsafeGuaranteedRef { $0.prefetchSendKeys() } }
            guard let p = resolved[k] else {
                sealed(.failure(SecureSendError.unknownPeer))
                continue
            }
            do {
                let copy = try p._withUnsafeGuaranteedRef { p in
                    try sealMedia(
                        for: p, payloadType: payloadType, marker: false, timestamp: timestamp, payload: payload, into: out,
                        now: now)
                }
                sealed(.success(copy))
            } catch {
                sealed(.failure(error))
            }
        }
    }

    /// What ``sealMedia(toEach:payloadType:timestamp:payload:into:now:_:)`` resolved, while it runs.
    @exclusivity(unchecked) private var fanOut: [Unmanaged<PeerState>?] = []

    private func sealMedia(
        for p: PeerState, payloadType: UInt8, marker: Bool, timestamp: UInt32,
        payload: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer, now: Timestamp
    ) throws -> (length: Int, to: TransportAddress) {
        guard let address = p.address else { throw SecureSendError.noAddress }
        guard let keys = p.sendKeys(now: now, lifetimes) else {
            if p.handshake.initiation == nil { startHandshake(p, now: now, rekey: p.hasKeys) }
            throw SecureSendError.notEstablished
        }
        let needed = 12 + payload.count + 16
        guard out.count >= needed else { throw SecureSendError.bufferTooSmall(needed: needed) }
        let seq = p.nextSequence
        let header = RTPHeader(
            marker: marker, payloadType: payloadType, sequenceNumber: UInt16(truncatingIfNeeded: seq),
            timestamp: timestamp, ssrc: p.localSSRC)
        let n = try keys.send.sealMedia(header: header, payload: payload, extendedSequence: seq, into: out)
        p.nextSequence &+= 1
        keys.sentPackets += 1
        p.lastSent = now
        statistics.mediaSealed += 1
        maybeRekey(p, keys: keys, now: now)
        return (n, address)
    }

    /// Seals a control report for `id` and queues it for `pollAction()`; throws
    /// when it cannot (`handle(.sendControl(_:to:), now:)` drops it then).
    ///
    /// - Parameter at: send it there instead of the peer's address, which
    ///   stays as it is: a probe of an address the peer said it is reachable
    ///   at (its media then moves there by the roaming rule, when the peer's
    ///   authenticated packets come from it).
    public func sendControl(_ report: ControlReport, to id: PeerID, at: TransportAddress? = nil, now: Timestamp) throws {
        guard let p = peers[id] else { throw SecureSendError.unknownPeer }
        guard let address = at ?? p.address else { throw SecureSendError.noAddress }
        guard let keys = p.sendKeys(now: now, lifetimes) else { throw SecureSendError.notEstablished }
        // Keepalives and byes carry no report: version 1, which every peer reads; a
        // report goes in the version the peer's own reports came in.
        var report = report
        report.version = report.kind == .report ? p.peerReportVersion : 1
        var buffer = [UInt8](repeating: 0, count: ControlPacket.length)
        let n = try buffer.withUnsafeMutableBytes {
            try keys.send.sealControl(report, ssrc: p.localSSRC, index: p.nextControlIndex, into: $0)
        }
        p.nextControlIndex &+= 1
        p.lastSent = now
        outbox.append(.send(Array(buffer[..<n]), to: address))
    }

    // MARK: Receiving

    /// Handles one datagram whose first byte is a handshake type (4...15) or
    /// RTP/RTCP (128...191). Media is decrypted in place in `datagram`.
    public func receive(_ datagram: UnsafeMutableRawBufferPointer, from source: TransportAddress, now: Timestamp) -> SecureReceive
    {
        guard let first = datagram.first else { return drop(.truncated) }
        if HandshakeWire.isHandshake(firstByte: first) {
            return receiveHandshake(Array(datagram), from: source, now: now)
        }
        switch SecurePacketKind.classify(UnsafeRawBufferPointer(datagram)) {
        case .control: return receiveControl(datagram, from: source, now: now)
        case .media: return receiveMedia(datagram, from: source, now: now)
        case .other: return drop(datagram.count < 2 ? .truncated : .malformed)
        }
    }

    /// `[UInt8]` convenience for tests: on success the array holds the plaintext at `payload`.
    public func receive(_ datagram: inout [UInt8], from source: TransportAddress, now: Timestamp) -> SecureReceive {
        datagram.withUnsafeMutableBytes { receive($0, from: source, now: now) }
    }

    private func drop(_ reason: PacketDropReason) -> SecureReceive {
        statistics.dropped[reason, default: 0] += 1
        return .dropped(reason)
    }

    private func dropHandshake(_ reason: HandshakeDropReason) -> SecureReceive {
        statistics.handshakeDrops[reason, default: 0] += 1
        return .droppedHandshake(reason)
    }

    private func receiveMedia(_ packet: UnsafeMutableRawBufferPointer, from source: TransportAddress, now: Timestamp)
        -> SecureReceive
    {
        let header: RTPHeader
        do { header = try RTPHeader.parse(UnsafeRawBufferPointer(packet)) } catch { return drop(.malformed) }
        guard packet.count >= header.headerLength + 16 else { return drop(.truncated) }
        guard let id = peerBySSRC[header.ssrc], let p = peers[id] else { return drop(.unknownSession) }
        let ext = ExtendedSequence.estimate(header.sequenceNumber, highest: p.highestReceived)
        switch p.replay.check(ext) {
        case .fresh: break
        case .replayed: return drop(.replayed)
        case .tooOld: return drop(.tooOld)
        }
        if let floor = p.retiredBelow, ext < floor { return drop(.wrongEpoch) }
        // Newest first; all but the last usable key are verified before opening in place.
        let last = p.keys.lastUsable(now: now, lifetimes)
        func openWith(_ keys: Keypair?) -> SecureReceive? {
            guard let keys, keys.usable(now: now, lifetimes),
                // `try?` flattens: nil when the key does not authenticate it (or cannot be used).
                let range = try? keys.receive.openMediaIfAuthentic(
                    packet: packet, headerLength: header.headerLength, extendedSequence: ext, verifyFirst: keys !== last)
            else { return nil }
            p.replay.accept(ext)
            if p.highestReceived.map({ ext > $0 }) ?? true { p.highestReceived = ext }
            keys.lowestReceived = min(keys.lowestReceived ?? ext, ext)
            p.reports.record(extendedSequence: ext, rtpTimestamp: header.timestamp, arrival: now)
            authenticated(p, keys: keys, from: source, newest: ext == p.highestReceived, now: now)
            statistics.mediaOpened += 1
            return .media(id, header, payload: range)
        }
        return openWith(p.keys.next) ?? openWith(p.keys.current) ?? openWith(p.keys.previous) ?? drop(.authenticationFailed)
    }

    private func receiveControl(_ packet: UnsafeMutableRawBufferPointer, from source: TransportAddress, now: Timestamp)
        -> SecureReceive
    {
        let ssrc: UInt32
        let index: UInt32
        do { (ssrc, index) = try ControlPacket.peek(UnsafeRawBufferPointer(packet)) } catch let e as SecureError {
            return drop(PacketDropReason(e))
        } catch { return drop(.malformed) }
        guard let id = peerBySSRC[ssrc], let p = peers[id] else { return drop(.unknownSession) }
        switch p.controlReplay.check(UInt64(index)) {
        case .fresh: break
        case .replayed: return drop(.replayed)
        case .tooOld: return drop(.tooOld)
        }
        let last = p.keys.lastUsable(now: now, lifetimes)
        for keys in p.keys.all where keys.usable(now: now, lifetimes) {
            guard (try? keys.receive.decryptControlIfAuthentic(packet: packet, verifyFirst: keys !== last)) != nil,
                let report = try? MediaCipher.decodeControlBody(packet)
            else { continue }
            p.controlReplay.accept(UInt64(index))
            if report.kind == .report { p.peerReportVersion = report.version }
            authenticated(p, keys: keys, from: source, newest: true, now: now)
            // The peer's first report gets one at once: it echoes the peer's timestamp.
            if report.kind == .report, p.reports.peerReported(report, now: now, canAnswer: p.keys.current != nil) {
                try? sendControl(p.reports.makeReport(now: now), to: p.id, now: now)
            }
            if report.kind != .keepalive { outbox.append(.event(.control(id, report))) }
            timersChanged(p)
            return .handled
        }
        return drop(.authenticationFailed)
    }

    /// After a packet authenticated under `keys`: confirm them, follow the peer's address, note liveness.
    private func authenticated(_ p: PeerState, keys: Keypair, from source: TransportAddress, newest: Bool, now: Timestamp) {
        p.lastReceived = now
        if !keys.confirmed {
            // The initiator's first packet under the keys we answered with: they seal from now on.
            keys.confirmed = true
            if case .responseCreated = p.handshake { p.handshake = .zeroed }
            makeCurrent(p, keys, now: now)
            outbox.append(.event(.established(p.id, key: p.key, rekey: p.everEstablished)))
            p.everEstablished = true
            p.reports.sessionStarted(now: now)
            timersChanged(p)
        }
        if newest { roam(p, to: source, now: now) }
    }

    /// The one roaming rule, for every authenticated packet (media, control,
    /// handshake initiation and response): the peer's address follows its
    /// newest authenticated packet, at most once per `roamInterval` (a fresh
    /// initiation moves it at once); each move is counted in `statistics.roams`
    /// and reported as `peerMoved`. A peer's first address is not a move.
    private func roam(_ p: PeerState, to source: TransportAddress, now: Timestamp, fresh: Bool = false) {
        guard source != p.address else { return }
        guard let old = p.address else {
            p.address = source
            return
        }
        if !fresh, let last = p.lastRoam, now - last < configuration.roamInterval { return }
        p.address = source
        p.lastRoam = now
        statistics.roams += 1
        outbox.append(.event(.peerMoved(p.id, from: old, to: source)))
    }

    /// `keys` seal from now on: the current keys become `previous` and linger
    /// for `previousKeysLinger`, the previous ones retire; keys still waiting in
    /// `next` from an older handshake linger too.
    private func makeCurrent(_ p: PeerState, _ keys: Keypair, now: Timestamp) {
        let linger = now + configuration.previousKeysLinger
        if p.keys.next === keys { p.keys.next = nil }
        if let old = p.keys.current, old !== keys {
            if let oldest = p.keys.previous { retire(p, oldest) }
            old.retireAt = old.retireAt ?? linger
            p.keys.previous = old
        }
        p.keys.current = keys
        if let waiting = p.keys.next, waiting.retireAt == nil, waiting.createdAt <= keys.createdAt { waiting.retireAt = linger }
    }

    // MARK: Handshake

    private func receiveHandshake(_ message: [UInt8], from source: TransportAddress, now: Timestamp) -> SecureReceive {
        switch message[0] {
        case HandshakeWire.initiation: return receiveInitiation(message, from: source, now: now)
        case HandshakeWire.response: return receiveResponse(message, from: source, now: now)
        case HandshakeWire.cookieReply: return receiveCookieReply(message, now: now)
        default: return dropHandshake(.malformed)
        }
    }

    private func receiveInitiation(_ m: [UInt8], from source: TransportAddress, now: Timestamp) -> SecureReceive {
        guard m.count == HandshakeWire.initiationLength, m[1] == 0, m[2] == 0, m[3] == 0 else { return dropHandshake(.malformed) }
        let mac1 = m[HandshakeWire.initiationMAC1]
        guard MAC.equal(mac1, MAC.mac(m[..<HandshakeWire.initiationMAC1.lowerBound], key: ownMAC1Key)) else {
            return dropHandshake(.badMAC)
        }
        let senderIndex = m.readUInt32(at: 4)
        if !handshakeBudget.take(1, now: now) {
            // Under load: only initiations proving their source address get work.
            guard cookies.mac2Valid(m, mac2: HandshakeWire.initiationMAC2, from: source, now: now, random: &random) else {
                let reply = cookies.reply(receiverIndex: senderIndex, mac1: mac1, to: source, now: now, random: &random)
                outbox.append(.send(reply, to: source))
                statistics.cookieRepliesSent += 1
                return dropHandshake(.cookieRequired)
            }
            guard perSource.allow(source.ip, now: now) else { return dropHandshake(.rateLimited) }
        }
        let noise: NoiseHandshake
        let payload: [UInt8]
        do {
            noise = try NoiseHandshake(
                pattern: .IK, hash: .blake2b, initiator: false, prologue: HandshakeWire.prologue,
                localStatic: identity.privateKey, remoteStatic: nil)
            payload = try noise.readMessage(Array(m[HandshakeWire.initiationNoise]))
        } catch { return dropHandshake(.authenticationFailed) }
        guard payload.count == 16, let stamp = TAI64N(bytes: payload[0..<12]), let initiatorKey = noise.remoteStaticKey else {
            return dropHandshake(.malformed)
        }
        let remoteSSRC = payload.readUInt32(at: 12)
        // Media finds its peer by SSRC: an initiation (anyone may make one with a key of
        // their own) may not take the SSRC of a peer in session, whose packets would
        // then go astray until it shook hands again.
        if let holder = peerBySSRC[remoteSSRC], let other = peers[holder], other.key != initiatorKey, other.everEstablished {
            return dropHandshake(.ssrcInUse)
        }
        let id: PeerID
        if let known = peerByKey[initiatorKey] {
            id = known
        } else if configuration.acceptUnknownPeers {
            id = addPeer(initiatorKey)
            peers[id]?.addedByInitiation = true
        } else {
            return dropHandshake(.unknownPeer)
        }
        guard let p = peers[id] else { return dropHandshake(.unknownPeer) }
        if let last = p.lastTimestamp, stamp <= last { return dropHandshake(.replayedInitiation) }

        // Answer: message 2 carries our SSRC.
        var responsePayload: [UInt8] = []
        responsePayload.appendUInt32(p.localSSRC)
        let localIndex = freshIndex()
        let keys: NoiseTransportKeys
        var response = [UInt8](repeating: 0, count: HandshakeWire.responseLength)
        noise.useEphemeral(random.privateKey())
        do {
            let m2 = try noise.writeMessage(payload: responsePayload)
            guard m2.count == HandshakeWire.responseNoise.count else { return dropHandshake(.malformed) }
            response.replaceSubrange(HandshakeWire.responseNoise, with: m2)
            keys = try noise.split()
        } catch { return dropHandshake(.authenticationFailed) }
        response[0] = HandshakeWire.response
        response.writeUInt32(localIndex, at: 4)
        response.writeUInt32(senderIndex, at: 8)
        let mac = MAC.mac(response[..<HandshakeWire.responseMAC1.lowerBound], key: MAC.mac1Key(for: initiatorKey))
        response.replaceSubrange(HandshakeWire.responseMAC1, with: mac)

        p.lastTimestamp = stamp
        setRemoteSSRC(p, remoteSSRC)
        // A simultaneous initiation of ours loses to theirs when their key sorts lower (both sides agree).
        if p.handshake.initiation != nil, initiatorKey.bytes.lexicographicallyPrecedes(identity.publicKey.bytes) {
            abandonInitiation(p)
        }
        installNext(p, Keypair(keys: keys, initiator: false, now: now), logging: keys)
        if p.handshake.initiation == nil { p.handshake = .responseCreated }
        // A fresh initiation (its timestamp newer than any before) says where the peer is now:
        // no wait for the roaming interval (a client restarted on another port is answered at once).
        roam(p, to: source, now: now, fresh: true)
        p.lastReceived = now
        outbox.append(.send(response, to: source))
        timersChanged(p)
        return .handled
    }

    private func receiveResponse(_ m: [UInt8], from source: TransportAddress, now: Timestamp) -> SecureReceive {
        guard m.count == HandshakeWire.responseLength, m[1] == 0, m[2] == 0, m[3] == 0 else { return dropHandshake(.malformed) }
        guard MAC.equal(m[HandshakeWire.responseMAC1], MAC.mac(m[..<HandshakeWire.responseMAC1.lowerBound], key: ownMAC1Key))
        else {
            return dropHandshake(.badMAC)
        }
        let receiverIndex = m.readUInt32(at: 8)
        guard let id = pendingByIndex[receiverIndex], let p = peers[id], let pending = p.handshake.initiation,
            pending.localIndex == receiverIndex
        else {
            return dropHandshake(.unexpected)
        }
        let payload: [UInt8]
        let keys: NoiseTransportKeys
        do {
            payload = try pending.noise.readMessage(Array(m[HandshakeWire.responseNoise]))
            keys = try pending.noise.split()
        } catch { return dropHandshake(.authenticationFailed) }
        guard payload.count == 4 else { return dropHandshake(.malformed) }
        // Response consumed: the keys seal at once (their confirmation is on its way to the responder).
        abandonInitiation(p)
        setRemoteSSRC(p, payload.readUInt32(at: 0))
        let keypair = Keypair(keys: keys, initiator: true, now: now)
        keypair.confirmed = true
        logKeys(p, keys)
        makeCurrent(p, keypair, now: now)
        statistics.handshakesCompleted += 1
        p.lastReceived = now
        roam(p, to: source, now: now)
        outbox.append(.event(.established(p.id, key: p.key, rekey: p.everEstablished)))
        p.everEstablished = true
        p.reports.sessionStarted(now: now)
        // Confirm the keys to the responder at once (it may not send before).
        try? sendControl(ControlReport(kind: .keepalive), to: id, now: now)
        timersChanged(p)
        return .handled
    }

    private func receiveCookieReply(_ m: [UInt8], now: Timestamp) -> SecureReceive {
        // (Its three reserved bytes zero, as an initiation's and a response's must be.)
        guard m.count == HandshakeWire.cookieReplyLength, m[1] == 0, m[2] == 0, m[3] == 0 else {
            return dropHandshake(.malformed)
        }
        let index = m.readUInt32(at: 4)
        guard let id = pendingByIndex[index], let p = peers[id], let pending = p.handshake.initiation else {
            return dropHandshake(.unexpected)
        }
        guard let cookie = CookieChecker.openReply(m, responder: p.key, lastMAC1: pending.lastMAC1) else {
            return dropHandshake(.badMAC)
        }
        p.cookie = (cookie, now)
        // Try again at once with mac2 — once per handshake attempt, so a stream of
        // cookie replies (anyone who sees our mac1 can make one) cannot make us
        // send an initiation (and do its Diffie-Hellman work) per reply.
        guard !pending.cookieRetry else { return .handled }
        startHandshake(p, now: now, rekey: pending.rekey, firstAttempt: pending.firstAttempt, cookieRetry: true)
        return .handled
    }

    private func setRemoteSSRC(_ p: PeerState, _ ssrc: UInt32) {
        if p.remoteSSRC != ssrc {
            if let old = p.remoteSSRC, peerBySSRC[old] == p.id { peerBySSRC[old] = nil }
            // A new SSRC is a new stream (the peer restarted): a fresh replay window.
            p.remoteSSRC = ssrc
            p.replay = ReplayWindow()
            p.controlReplay = ReplayWindow()
            p.highestReceived = nil
            p.retiredBelow = nil
            // What the old stream's keys opened is in the old numbering: no floor for the new one.
            for keys in p.keys.all { keys.lowestReceived = nil }
            p.reports.restartReception()
        }
        peerBySSRC[ssrc] = p.id
    }

    private func freshIndex() -> UInt32 {
        while true {
            let i = random.nonZeroUInt32()
            if pendingByIndex[i] == nil { return i }
        }
    }

    private func startHandshake(
        _ p: PeerState, now: Timestamp, rekey: Bool, firstAttempt: Timestamp? = nil, cookieRetry: Bool = false
    ) {
        guard let address = p.address else { return }
        abandonInitiation(p)
        // Without an initiation its rekey and silence deadlines count again, maybe earlier
        // (and stay so when no initiation can be made below).
        timersChanged(p)
        let index = freshIndex()
        var payload = TAI64N(unixNanoseconds: configuration.unixNanosecondsAtZero &+ now.nanoseconds).bytes
        payload.appendUInt32(p.localSSRC)
        var m = [UInt8](repeating: 0, count: HandshakeWire.initiationLength)
        let noise: NoiseHandshake
        do {
            noise = try NoiseHandshake(
                pattern: .IK, hash: .blake2b, initiator: true, prologue: HandshakeWire.prologue,
                localStatic: identity.privateKey, remoteStatic: p.key, localEphemeral: random.privateKey())
            let m1 = try noise.writeMessage(payload: payload)
            guard m1.count == HandshakeWire.initiationNoise.count else { return }
            m.replaceSubrange(HandshakeWire.initiationNoise, with: m1)
        } catch { return }
        m[0] = HandshakeWire.initiation
        m.writeUInt32(index, at: 4)
        let mac1 = MAC.mac(m[..<HandshakeWire.initiationMAC1.lowerBound], key: MAC.mac1Key(for: p.key))
        m.replaceSubrange(HandshakeWire.initiationMAC1, with: mac1)
        if let (cookie, at) = p.cookie, now - at < CookieChecker.secretLifetime {
            m.replaceSubrange(
                HandshakeWire.initiationMAC2, with: MAC.mac(m[..<HandshakeWire.initiationMAC2.lowerBound], key: cookie))
        }
        p.handshake = .initiationCreated(
            Initiation(
                noise: noise, localIndex: index, firstAttempt: firstAttempt ?? now, lastSent: now, lastMAC1: mac1, rekey: rekey,
                cookieRetry: cookieRetry))
        pendingByIndex[index] = p.id
        outbox.append(.send(m, to: address))
        timersChanged(p)
    }

    /// Our initiation, if one is under way, is given up (its index answers nothing any more).
    private func abandonInitiation(_ p: PeerState) {
        guard let mine = p.handshake.initiation else { return }
        pendingByIndex[mine.localIndex] = nil
        p.handshake = .zeroed
    }

    /// The keys of a handshake we answered wait in `next` for the initiator's
    /// first packet; keys that waited there before, never confirmed, retire.
    private func installNext(_ p: PeerState, _ keys: Keypair, logging raw: NoiseTransportKeys) {
        if let unconfirmed = p.keys.next { retire(p, unconfirmed) }
        p.keys.next = keys
        logKeys(p, raw)
    }

    private func logKeys(_ p: PeerState, _ raw: NoiseTransportKeys) {
        if configuration.keyLog, let remote = p.remoteSSRC {
            outbox.append(.event(.keyLog(KeyLog.line(ssrc: p.localSSRC, key: raw.send))))
            outbox.append(.event(.keyLog(KeyLog.line(ssrc: remote, key: raw.receive))))
        }
    }

    private func retire(_ p: PeerState, _ keys: Keypair) {
        keys.retire()
        p.keys.remove(keys)
        // Packets below the oldest sequence the remaining keys opened belong to retired keys.
        if let floor = p.keys.all.compactMap(\.lowestReceived).min() {
            p.retiredBelow = max(p.retiredBelow ?? floor, floor)
        }
    }

    private func maybeRekey(_ p: PeerState, keys: Keypair, now: Timestamp) {
        guard p.handshake.initiation == nil else { return }
        let due =
            keys.sentPackets >= configuration.rekeyAfterPackets
            || keys.age(at: now) >= (keys.initiator ? lifetimes.initiatorRekey : lifetimes.responderRekey)
        if due { startHandshake(p, now: now, rekey: true) }
    }

    // MARK: Timers

    /// Runs every timer due at `now`: key expiry, handshake retries and timeouts,
    /// dead peers, rekeys, receiver reports, keepalives.
    public func handleTimeout(now: Timestamp) {
        lastTimeout = now
        requeueChangedTimers()
        var due: [PeerState] = []
        while let first = timers.first, first.at <= now {
            timers.popFirst()
            guard let p = peers[first.id], p.timerAt == first.at else { continue }  // stale
            p.timerAt = nil
            due.append(p)
        }
        // Peers due at once run in the order they were added (runs repeat exactly).
        due.sort { $0.id.rawValue < $1.id.rawValue }
        for p in due {
            runTimers(p, now: now)
            queueTimers(p)
        }
    }

    /// Everything due for `p` at `now`.
    private func runTimers(_ p: PeerState, now: Timestamp) {
        timerRuns += 1
        for keys in p.keys.all {
            if let at = keys.retireAt, at <= now {
                retire(p, keys)
            } else if now - keys.createdAt >= configuration.rejectAfter {
                retire(p, keys)
            }
        }
        if let h = p.handshake.initiation, now - h.lastSent >= configuration.handshakeRetry {
            if now - h.firstAttempt >= configuration.handshakeTimeout {
                abandonInitiation(p)
                outbox.append(.event(.handshakeFailed(p.id)))
                // Never in session: the next attempt goes under another SSRC, in case the
                // responder refuses this one as another peer's (`ssrcInUse`, which it does
                // not say: a refused initiation gets no answer).
                if !p.everEstablished, p.keys.current == nil { p.localSSRC = random.nonZeroUInt32() }
            } else {
                startHandshake(p, now: now, rekey: h.rekey, firstAttempt: h.firstAttempt)
            }
        }
        guard p.everEstablished else {
            forgetIfIdle(p)
            return
        }
        let silent = now - (p.lastReceived ?? now)
        if silent >= configuration.peerTimeout {
            outbox.append(.event(.peerGone(p.id)))
            abandonInitiation(p)
            p.handshake = .zeroed
            p.keys.retireAll()
            p.everEstablished = false
            forgetIfIdle(p)
            return
        }
        if silent >= configuration.rehandshakeAfterSilence, p.handshake.initiation == nil {
            startHandshake(p, now: now, rekey: true)
        }
        if let keys = p.keys.current {
            maybeRekey(p, keys: keys, now: now)
            if p.reports.isDue(now: now) {
                try? sendControl(p.reports.makeReport(now: now), to: p.id, now: now)
            }
            if now - max(p.lastSent ?? .zero, p.lastKeepaliveAttempt ?? .zero) >= configuration.keepaliveInterval {
                p.lastKeepaliveAttempt = now
                try? sendControl(ControlReport(kind: .keepalive), to: p.id, now: now)
            }
        }
    }

    /// A peer made for an unknown key's initiation goes once it has nothing left: its
    /// handshake never completed and its keys retired, or its session went silent.
    /// (Otherwise anyone could leave a peer behind per fresh key, for the life of the
    /// process.) Coming back is a new initiation, as for any unknown key.
    private func forgetIfIdle(_ p: PeerState) {
        guard p.addedByInitiation, !p.everEstablished, p.handshake.initiation == nil, p.keys.all.isEmpty else { return }
        removePeer(p.id)
        statistics.peersForgotten += 1
    }

    /// `p`'s deadlines may have come earlier: queue it again before the next look at the queue.
    private func timersChanged(_ p: PeerState) {
        guard !p.timersChanged else { return }
        p.timersChanged = true
        changedTimers.append(p)
    }

    /// Queues `p` at its next deadline, unless an entry at that time or earlier is queued already
    /// (a deadline that moved later is found when the earlier entry comes up, and queued again then).
    private func queueTimers(_ p: PeerState) {
        guard let at = p.nextDeadline(configuration) else { return }
        if let queued = p.timerAt, queued <= at { return }
        p.timerAt = at
        timers.push(at, p.id)
    }

    private func requeueChangedTimers() {
        for p in changedTimers {
            p.timersChanged = false
            if peers[p.id] === p { queueTimers(p) }
        }
        changedTimers.removeAll(keepingCapacity: true)
    }

    /// How many times a peer's timers ran (tests: a wake runs the peers due, not all).
    private(set) var timerRuns = 0

    /// Whether the queue holds every peer's deadline: its first live entry is no later
    /// than the earliest deadline a walk of every peer finds (the walk it replaces,
    /// kept for the tests that hold it to this after every step). Earlier is allowed:
    /// a peer queued before its deadline moved later is looked at once more.
    var timerQueueIsComplete: Bool {
        requeueChangedTimers()
        while let first = timers.first, peers[first.id]?.timerAt != first.at { timers.popFirst() }
        guard let scanned = peers.values.compactMap({ $0.nextDeadline(configuration) }).min() else { return true }
        return timers.first.map { $0.at <= scanned } ?? false
    }

    /// When `handleTimeout(now:)` must run next, or nil when nothing is scheduled.
    public var nextDeadline: Timestamp? {
        requeueChangedTimers()
        while let first = timers.first, peers[first.id]?.timerAt != first.at { timers.popFirst() }  // stale
        guard var due = timers.first?.at else { return nil }
        // Never ask to be woken again at the instant just polled (no busy loop
        // even if a timer could not make progress).
        if let last = lastTimeout { due = max(due, last + .milliseconds(1)) }
        // On the slack's grid: deadlines close together are run by one wake.
        let step = UInt64(max(0, configuration.timerSlack.nanoseconds))
        if step > 0 {
            let (slots, rest) = due.nanoseconds.quotientAndRemainder(dividingBy: step)
            let (aligned, overflow) = (slots + (rest > 0 ? 1 : 0)).multipliedReportingOverflow(by: step)
            if !overflow { due = Timestamp(nanoseconds: aligned) }
        }
        return due
    }
}

extension SecureEndpoint: SansIOCore {
    /// What a driver asks of the endpoint outside the hot paths.
    public enum Input: Sendable, Equatable {
        /// Start a handshake with the peer (at its known address); nothing if one is under way.
        case connect(PeerID)
        /// Start a handshake with the peer now, abandoning one under way (its
        /// initiation went where it could not arrive: the path changed).
        case restartHandshake(PeerID)
        /// Seal and send a control report; dropped when it cannot be sent (see `sendControl(_:to:now:)`).
        case sendControl(ControlReport, to: PeerID)
        /// A datagram off the socket. Handshakes and control are handled in full;
        /// media is opened and counted but its payload goes nowhere: drivers hand
        /// media to `receive(_:from:now:)`, which opens it in place.
        case datagram([UInt8], from: TransportAddress)
    }

    public typealias Action = SecureOutput

    public func handle(_ input: Input, now: Timestamp) {
        switch input {
        case .connect(let id):
            connect(id, now: now)
        case .restartHandshake(let id):
            if let p = peers[id] { startHandshake(p, now: now, rekey: p.hasKeys) }
        case .sendControl(let report, let id):
            try? sendControl(report, to: id, now: now)
        case .datagram(var bytes, let source):
            _ = receive(&bytes, from: source, now: now)
        }
    }

    public func pollAction() -> SecureOutput? {
        outbox.popFirst()
    }
}
