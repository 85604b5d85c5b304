import TusaBase

/// A peer of a `SecureEndpoint`.
public struct PeerID: Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int
    public var description: String { "peer\(rawValue)" }
}

/// Something the driver must do or learn after a call into the endpoint.
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
}

/// The result of `receive` for one datagram.
public enum SecureReceive: Equatable, Sendable {
    /// An authenticated media packet: its RTP header and where its plaintext
    /// payload now lies in the buffer that was passed in (decrypted in place).
    case media(PeerID, RTPHeader, payload: Range<Int>)
    /// A handshake or control message was handled: drain `outputs()`.
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
}

/// The sans-IO secure transport for any number of peers on one socket: Noise IK
/// handshakes (`HandshakeWire`), media sealed as RTP (`MediaCipher`), encrypted
/// control reports, rekeying with overlapping keys, a replay window, roaming,
/// keepalives and dead-peer detection. It takes bytes, addresses and times and
/// returns what to send; the driver owns the socket and the clock and calls
/// `poll(now:)` at `nextDeadline`.
///
/// Sequence numbers continue across rekeys (one RTP stream per SSRC), so one
/// replay window covers every epoch; each key's nonces are the extended
/// sequence numbers sent under it. Media carries no key id: the receiver tries
/// the keys it holds, newest first (at most three exist during an overlap).
public final class SecureEndpoint {
    public let identity: Identity
    public private(set) var configuration: SecureConfiguration
    public private(set) var statistics = SecureStatistics()

    private var peers: [PeerID: PeerState] = [:]
    private var peerByKey: [PublicKey: PeerID] = [:]
    private var peerBySSRC: [UInt32: PeerID] = [:]
    private var pendingByIndex: [UInt32: PeerID] = [:]
    private var nextPeerID = 0
    private var outbox: [SecureOutput] = []
    private var cookies: CookieChecker
    private var handshakeBudget: TokenBucket
    private var perSource: SourceLimiter
    private let ownMAC1Key: [UInt8]
    private var lastPoll: Timestamp?
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
        if let r = p.remoteSSRC { peerBySSRC[r] = nil }
        if let h = p.pending { pendingByIndex[h.localIndex] = nil }
        p.retireAll()
    }

    public func peer(for key: PublicKey) -> PeerID? { peerByKey[key] }
    public func key(of id: PeerID) -> PublicKey? { peers[id]?.key }
    public func address(of id: PeerID) -> TransportAddress? { peers[id]?.address }
    public func isEstablished(_ id: PeerID) -> Bool { peers[id]?.sendKeys(now: nil, configuration) != nil }
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
    public func connect(_ id: PeerID, now: Timestamp) {
        guard let p = peers[id], p.pending == nil else { return }
        startHandshake(p, now: now, rekey: p.hasKeys)
    }

    /// Whether `outputs()` has anything (cheap: for drivers that drain only then).
    public var hasOutputs: Bool { !outbox.isEmpty }

    /// What to send and what happened since the last call.
    public func outputs() -> [SecureOutput] {
        defer { outbox.removeAll(keepingCapacity: true) }
        return outbox
    }

    // MARK: Sending media

    /// Seals one media frame for `id` as RTP into `out`: header (12 bytes,
    /// SSRC and sequence number from the session) ‖ ciphertext ‖ 16-byte tag.
    /// Returns the length and where to send it. No allocation.
    public func sealMedia(
        to id: PeerID, payloadType: UInt8, marker: Bool = false, timestamp: UInt32,
        payload: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer, now: Timestamp
    ) throws -> (length: Int, to: TransportAddress) {
        guard let p = peers[id] else { throw SecureSendError.unknownPeer }
        guard let address = p.address else { throw SecureSendError.noAddress }
        guard let keys = p.sendKeys(now: now, configuration) else {
            if p.pending == nil { startHandshake(p, now: now, rekey: p.hasKeys) }
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

    /// Seals a control report for `id` and queues it in `outputs()`.
    public func sendControl(_ report: ControlReport, to id: PeerID, now: Timestamp) throws {
        guard let p = peers[id] else { throw SecureSendError.unknownPeer }
        guard let address = p.address else { throw SecureSendError.noAddress }
        guard let keys = p.sendKeys(now: now, configuration) else { throw SecureSendError.notEstablished }
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
    public func receive(_ datagram: UnsafeMutableRawBufferPointer, from source: TransportAddress, now: Timestamp) -> SecureReceive {
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

    private func receiveMedia(_ packet: UnsafeMutableRawBufferPointer, from source: TransportAddress, now: Timestamp) -> SecureReceive {
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
        let last = p.keypairs.lastIndex { $0.usable(now: now, configuration) }
        for (i, keys) in p.keypairs.enumerated() where keys.usable(now: now, configuration) {
            // `try?` flattens: nil when the key does not authenticate it (or cannot be used).
            if let range = try? keys.receive.openMediaIfAuthentic(
                packet: packet, headerLength: header.headerLength, extendedSequence: ext, verifyFirst: i != last)
            {
                p.replay.accept(ext)
                if p.highestReceived.map({ ext > $0 }) ?? true { p.highestReceived = ext }
                keys.lowestReceived = min(keys.lowestReceived ?? ext, ext)
                p.reports.record(extendedSequence: ext, rtpTimestamp: header.timestamp, arrival: now)
                authenticated(p, keys: keys, from: source, newest: ext == p.highestReceived, now: now)
                statistics.mediaOpened += 1
                return .media(id, header, payload: range)
            }
        }
        return drop(.authenticationFailed)
    }

    private func receiveControl(_ packet: UnsafeMutableRawBufferPointer, from source: TransportAddress, now: Timestamp) -> SecureReceive {
        let ssrc: UInt32, index: UInt32
        do { (ssrc, index) = try ControlPacket.peek(UnsafeRawBufferPointer(packet)) } catch let e as SecureError {
            return drop(PacketDropReason(e))
        } catch { return drop(.malformed) }
        guard let id = peerBySSRC[ssrc], let p = peers[id] else { return drop(.unknownSession) }
        switch p.controlReplay.check(UInt64(index)) {
        case .fresh: break
        case .replayed: return drop(.replayed)
        case .tooOld: return drop(.tooOld)
        }
        let last = p.keypairs.lastIndex { $0.usable(now: now, configuration) }
        for (i, keys) in p.keypairs.enumerated() where keys.usable(now: now, configuration) {
            guard (try? keys.receive.decryptControlIfAuthentic(packet: packet, verifyFirst: i != last)) != nil,
                let report = try? MediaCipher.decodeControlBody(packet)
            else { continue }
            p.controlReplay.accept(UInt64(index))
            authenticated(p, keys: keys, from: source, newest: true, now: now)
            // The peer's first report gets one at once: it echoes the peer's timestamp.
            if report.kind == .report, p.reports.peerReported(report, now: now, canAnswer: p.current != nil) {
                try? sendControl(p.reports.makeReport(now: now), to: p.id, now: now)
            }
            if report.kind != .keepalive { outbox.append(.event(.control(id, report))) }
            return .handled
        }
        return drop(.authenticationFailed)
    }

    /// After a packet authenticated under `keys`: confirm them, follow the peer's address, note liveness.
    private func authenticated(_ p: PeerState, keys: Keypair, from source: TransportAddress, newest: Bool, now: Timestamp) {
        p.lastReceived = now
        if !keys.confirmed {
            keys.confirmed = true
            promote(p, keys: keys, now: now)
            outbox.append(.event(.established(p.id, key: p.key, rekey: p.everEstablished)))
            p.everEstablished = true
            p.reports.sessionStarted(now: now)
        }
        if newest { roam(p, to: source, now: now) }
    }

    /// The one roaming rule, for every authenticated packet (media, control,
    /// handshake initiation and response): the peer's address follows its
    /// newest authenticated packet, at most once per `roamInterval`; each move
    /// is counted in `statistics.roams` and reported as `peerMoved`. A peer's
    /// first address is not a move.
    private func roam(_ p: PeerState, to source: TransportAddress, now: Timestamp) {
        guard source != p.address else { return }
        guard let old = p.address else {
            p.address = source
            return
        }
        if let last = p.lastRoam, now - last < configuration.roamInterval { return }
        p.address = source
        p.lastRoam = now
        statistics.roams += 1
        outbox.append(.event(.peerMoved(p.id, from: old, to: source)))
    }

    /// `keys` became the keys to send with: older ones linger, then retire.
    private func promote(_ p: PeerState, keys: Keypair, now: Timestamp) {
        p.current = keys
        for other in p.keypairs where other !== keys && other.retireAt == nil && other.createdAt <= keys.createdAt {
            other.retireAt = now + configuration.previousKeysLinger
        }
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
        let id: PeerID
        if let known = peerByKey[initiatorKey] {
            id = known
        } else if configuration.acceptUnknownPeers {
            id = addPeer(initiatorKey)
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
        if let mine = p.pending, initiatorKey.bytes.lexicographicallyPrecedes(identity.publicKey.bytes) {
            pendingByIndex[mine.localIndex] = nil
            p.pending = nil
        }
        install(p, Keypair(keys: keys, initiator: false, now: now), logging: keys)
        roam(p, to: source, now: now)
        p.lastReceived = now
        outbox.append(.send(response, to: source))
        return .handled
    }

    private func receiveResponse(_ m: [UInt8], from source: TransportAddress, now: Timestamp) -> SecureReceive {
        guard m.count == HandshakeWire.responseLength, m[1] == 0, m[2] == 0, m[3] == 0 else { return dropHandshake(.malformed) }
        guard MAC.equal(m[HandshakeWire.responseMAC1], MAC.mac(m[..<HandshakeWire.responseMAC1.lowerBound], key: ownMAC1Key)) else {
            return dropHandshake(.badMAC)
        }
        let receiverIndex = m.readUInt32(at: 8)
        guard let id = pendingByIndex[receiverIndex], let p = peers[id], let pending = p.pending, pending.localIndex == receiverIndex else {
            return dropHandshake(.unexpected)
        }
        let payload: [UInt8]
        let keys: NoiseTransportKeys
        do {
            payload = try pending.noise.readMessage(Array(m[HandshakeWire.responseNoise]))
            keys = try pending.noise.split()
        } catch { return dropHandshake(.authenticationFailed) }
        guard payload.count == 4 else { return dropHandshake(.malformed) }
        pendingByIndex[receiverIndex] = nil
        p.pending = nil
        setRemoteSSRC(p, payload.readUInt32(at: 0))
        let keypair = Keypair(keys: keys, initiator: true, now: now)
        keypair.confirmed = true
        install(p, keypair, logging: keys)
        promote(p, keys: keypair, now: now)
        statistics.handshakesCompleted += 1
        p.lastReceived = now
        roam(p, to: source, now: now)
        outbox.append(.event(.established(p.id, key: p.key, rekey: p.everEstablished)))
        p.everEstablished = true
        p.reports.sessionStarted(now: now)
        // Confirm the keys to the responder at once (it may not send before).
        try? sendControl(ControlReport(kind: .keepalive), to: id, now: now)
        return .handled
    }

    private func receiveCookieReply(_ m: [UInt8], now: Timestamp) -> SecureReceive {
        guard m.count == HandshakeWire.cookieReplyLength else { return dropHandshake(.malformed) }
        let index = m.readUInt32(at: 4)
        guard let id = pendingByIndex[index], let p = peers[id], let pending = p.pending else { return dropHandshake(.unexpected) }
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
        if let old = p.pending { pendingByIndex[old.localIndex] = nil }
        p.pending = nil
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
            m.replaceSubrange(HandshakeWire.initiationMAC2, with: MAC.mac(m[..<HandshakeWire.initiationMAC2.lowerBound], key: cookie))
        }
        p.pending = PendingHandshake(
            noise: noise, localIndex: index, firstAttempt: firstAttempt ?? now, lastSent: now, lastMAC1: mac1, rekey: rekey,
            cookieRetry: cookieRetry)
        pendingByIndex[index] = p.id
        outbox.append(.send(m, to: address))
    }

    private func install(_ p: PeerState, _ keys: Keypair, logging raw: NoiseTransportKeys) {
        p.keypairs.insert(keys, at: 0)
        while p.keypairs.count > 3, let oldest = p.keypairs.last { retire(p, oldest) }
        if configuration.keyLog, let remote = p.remoteSSRC {
            outbox.append(.event(.keyLog(KeyLog.line(ssrc: p.localSSRC, key: raw.send))))
            outbox.append(.event(.keyLog(KeyLog.line(ssrc: remote, key: raw.receive))))
        }
    }

    private func retire(_ p: PeerState, _ keys: Keypair) {
        keys.retire()
        p.keypairs.removeAll { $0 === keys }
        if p.current === keys { p.current = nil }
        // Packets below the oldest sequence the remaining keys opened belong to retired keys.
        if let floor = p.keypairs.compactMap(\.lowestReceived).min() {
            p.retiredBelow = max(p.retiredBelow ?? floor, floor)
        }
    }

    private func maybeRekey(_ p: PeerState, keys: Keypair, now: Timestamp) {
        guard p.pending == nil else { return }
        let age = now - keys.createdAt
        let due = keys.sentPackets >= configuration.rekeyAfterPackets
            || (keys.initiator && age >= configuration.rekeyAfter)
            || (!keys.initiator && age >= configuration.rekeyAfter + configuration.handshakeTimeout)
        if due { startHandshake(p, now: now, rekey: true) }
    }

    // MARK: Timers

    /// Runs every timer due at `now`; drain `outputs()` afterwards.
    public func poll(now: Timestamp) {
        lastPoll = now
        for p in peers.values.sorted(by: { $0.id.rawValue < $1.id.rawValue }) {
            for keys in p.keypairs {
                if let at = keys.retireAt, at <= now { retire(p, keys) }
                else if now - keys.createdAt >= configuration.rejectAfter { retire(p, keys) }
            }
            if let h = p.pending, now - h.lastSent >= configuration.handshakeRetry {
                if now - h.firstAttempt >= configuration.handshakeTimeout {
                    pendingByIndex[h.localIndex] = nil
                    p.pending = nil
                    outbox.append(.event(.handshakeFailed(p.id)))
                } else {
                    startHandshake(p, now: now, rekey: h.rekey, firstAttempt: h.firstAttempt)
                }
            }
            guard p.everEstablished else { continue }
            let silent = now - (p.lastReceived ?? now)
            if silent >= configuration.peerTimeout {
                outbox.append(.event(.peerGone(p.id)))
                if let h = p.pending { pendingByIndex[h.localIndex] = nil }
                p.pending = nil
                p.retireAll()
                p.everEstablished = false
                continue
            }
            if silent >= configuration.rehandshakeAfterSilence, p.pending == nil {
                startHandshake(p, now: now, rekey: true)
            }
            if let keys = p.current {
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
    }

    /// When `poll` must run next, or nil when nothing is scheduled.
    public var nextDeadline: Timestamp? {
        var best: Timestamp?
        func consider(_ t: Timestamp) { best = best.map { min($0, t) } ?? t }
        for p in peers.values {
            for keys in p.keypairs {
                if let at = keys.retireAt { consider(at) }
                consider(keys.createdAt + configuration.rejectAfter)
            }
            if let h = p.pending { consider(h.lastSent + configuration.handshakeRetry) }
            guard p.everEstablished, let last = p.lastReceived else { continue }
            consider(last + configuration.peerTimeout)
            if p.pending == nil { consider(last + configuration.rehandshakeAfterSilence) }
            if let keys = p.current {
                if let due = p.reports.nextReportAt { consider(due) }
                consider(max(p.lastSent ?? .zero, p.lastKeepaliveAttempt ?? .zero) + configuration.keepaliveInterval)
                if p.pending == nil {
                    consider(keys.createdAt + configuration.rekeyAfter + (keys.initiator ? .zero : configuration.handshakeTimeout))
                }
            }
        }
        // Never ask to be woken again at the instant just polled (no busy loop
        // even if a timer could not make progress).
        if let b = best, let last = lastPoll { return max(b, last + .milliseconds(1)) }
        return best
    }
}

/// One handshake's keys, both directions.
final class Keypair {
    let send: MediaCipher
    let receive: MediaCipher
    let createdAt: Timestamp
    /// Whether we initiated the handshake that made these keys.
    let initiator: Bool
    /// An initiator's keys are confirmed at once; a responder's by the first packet opened with them.
    var confirmed = false
    var sentPackets: UInt64 = 0
    var lowestReceived: UInt64?
    var retireAt: Timestamp?

    init(keys: NoiseTransportKeys, initiator: Bool, now: Timestamp) {
        send = MediaCipher(key: keys.send)
        receive = MediaCipher(key: keys.receive)
        createdAt = now
        self.initiator = initiator
    }

    func usable(now: Timestamp, _ c: SecureConfiguration) -> Bool { now - createdAt < c.rejectAfter }

    func retire() {
        send.retire()
        receive.retire()
    }
}

struct PendingHandshake {
    let noise: NoiseHandshake
    let localIndex: UInt32
    let firstAttempt: Timestamp
    let lastSent: Timestamp
    let lastMAC1: [UInt8]
    let rekey: Bool
    /// This attempt was sent at once on a cookie reply (the next one waits for the retry timer).
    let cookieRetry: Bool
}

final class PeerState {
    let id: PeerID
    let key: PublicKey
    var address: TransportAddress?
    var lastRoam: Timestamp?
    var lastTimestamp: TAI64N?
    var pending: PendingHandshake?
    var cookie: ([UInt8], Timestamp)?
    /// Newest first, at most three.
    var keypairs: [Keypair] = []
    /// The keys media is sealed with.
    var current: Keypair?
    var everEstablished = false

    let localSSRC: UInt32
    var remoteSSRC: UInt32?
    var nextSequence: UInt64
    var nextControlIndex: UInt32 = 0
    var replay = ReplayWindow()
    var controlReplay = ReplayWindow()
    var highestReceived: UInt64?
    var retiredBelow: UInt64?
    var lastSent: Timestamp?
    var lastReceived: Timestamp?
    var lastKeepaliveAttempt: Timestamp?
    /// Receiver reports: reception statistics, the round trip, the loss hint.
    var reports: ReceiverReports

    init(
        id: PeerID, key: PublicKey, address: TransportAddress?, localSSRC: UInt32, firstSequence: UInt64,
        configuration c: SecureConfiguration
    ) {
        reports = ReceiverReports(clockRate: c.mediaClockRate, interval: c.reportInterval, firstReportAfter: c.firstReportAfter)
        self.id = id
        self.key = key
        self.address = address
        self.localSSRC = localSSRC
        nextSequence = firstSequence
    }

    var hasKeys: Bool { !keypairs.isEmpty }

    /// The keys to seal with: the current ones if confirmed and not expired.
    func sendKeys(now: Timestamp?, _ c: SecureConfiguration) -> Keypair? {
        guard let k = current, k.confirmed else { return nil }
        if let now, !k.usable(now: now, c) { return nil }
        return k
    }

    func retireAll() {
        for k in keypairs { k.retire() }
        keypairs.removeAll()
        current = nil
    }
}
