import STUN
import TusaBase

/// Requests: authentication (RFC 8489 §9.2) and the RFC 8656 methods.
extension TURNServer {
    /// Who sent an authenticated request, and how to sign the answer.
    struct Auth {
        var username: String
        var key: IntegrityKey?
        /// Answer with MESSAGE-INTEGRITY-SHA256 (the request used it).
        var sha256: Bool
    }

    /// How a request is answered: integrity, FINGERPRINT, and whether the
    /// answer is unauthenticated (then it may not outgrow the request).
    struct Reply {
        var request: Message
        var size: Int
        var auth: Auth?
        var fingerprint: Bool { request.attribute(.fingerprint) != nil }

        /// An answer of `messageClass` to the request: same method and transaction.
        func answer(_ messageClass: MessageClass, _ attributes: [Attribute] = []) -> Message {
            Message(
                type: MessageType(method: request.type.method, class: messageClass), transactionID: request.transactionID,
                attributes: attributes)
        }
    }

    func request(_ m: Message, size: Int, from tuple: FiveTuple, now: Timestamp) -> TURNClientOutcome {
        var reply = Reply(request: m, size: size, auth: nil)
        let unknown = m.unknownComprehensionRequired(known: Self.known)
        if !unknown.isEmpty {
            return error(420, nil, reply, [.unknownAttributes(unknown)])
        }
        switch m.type.method {
        case .allocate, .refresh, .createPermission, .channelBind: break
        default: return error(400, "Unknown method", reply)
        }
        switch authenticate(m, size: size, from: tuple, now: now) {
        case .failed(let outcome): return outcome
        case .ok(let auth): reply.auth = auth
        }
        if m.type.method == .allocate { return allocate(m, reply, tuple: tuple, now: now) }
        guard let a = allocations[tuple], a.expiry > now else { return error(437, nil, reply) }
        guard a.username == reply.auth?.username else { return error(441, nil, reply) }
        switch m.type.method {
        case .refresh: return refresh(m, reply, a, now: now)
        case .createPermission: return createPermission(m, reply, a, now: now)
        default: return channelBind(m, reply, a, now: now)
        }
    }

    // MARK: - Authentication

    private func authenticate(_ m: Message, size: Int, from tuple: FiveTuple, now: Timestamp) -> AuthResult {
        if configuration.anonymous { return .ok(Auth(username: "", key: nil, sha256: false)) }
        let reply = Reply(request: m, size: size, auth: nil)
        let hasMI = m.attribute(.messageIntegrity) != nil
        let hasMI256 = m.attribute(.messageIntegritySHA256) != nil
        guard hasMI || hasMI256 else { return .failed(challenge(401, reply, tuple, now)) }
        guard case .realm(let realm)? = try? m.value(.realm), case .nonce(let nonce)? = try? m.value(.nonce) else {
            return .failed(error(400, "Missing REALM or NONCE", reply))
        }
        switch nonces.check(nonce, for: tuple.client, now: now) {
        case .fresh: break
        case .stale, .invalid: return .failed(challenge(438, reply, tuple, now))
        }
        guard realm == configuration.realm else { return .failed(challenge(401, reply, tuple, now)) }

        // PASSWORD-ALGORITHM must come with the PASSWORD-ALGORITHMS we offered (RFC 8489 §9.2.4).
        var algorithm = PasswordAlgorithm.md5
        let chosen = try? m.value(.passwordAlgorithm)
        let offered = try? m.value(.passwordAlgorithms)
        switch (chosen, offered) {
        case (nil, nil): break
        case (.passwordAlgorithm(let a)?, .passwordAlgorithms(let list)?)
        where list == [.md5, .sha256] && (a == .md5 || a == .sha256):
            algorithm = a
        default: return .failed(error(400, "Bad PASSWORD-ALGORITHM", reply))
        }

        let username: String
        if case .username(let name)? = try? m.value(.username) {
            username = name
        } else if case .userhash(let hash)? = try? m.value(.userhash),
            let name = configuration.credentials.username(forUserhash: hash)
        {
            username = name
        } else if m.attribute(.userhash) != nil {
            return .failed(authFailed(reply, tuple, "(userhash)", now))
        } else {
            return .failed(error(400, "Missing USERNAME", reply))
        }
        let keys = configuration.credentials.keys(for: username, algorithm: algorithm, unixNow: unixNow(now))
        for key in keys {
            let check = hasMI256 ? m.checkMessageIntegritySHA256(key: key) : m.checkMessageIntegrity(key: key)
            if check == .valid { return .ok(Auth(username: username, key: key, sha256: hasMI256)) }
        }
        return .failed(authFailed(reply, tuple, username, now))
    }

    enum AuthResult {
        case ok(Auth)
        case failed(TURNClientOutcome)
    }

    private func authFailed(_ reply: Reply, _ tuple: FiveTuple, _ username: String, _ now: Timestamp) -> TURNClientOutcome {
        statistics.authFailures += 1
        let outcome = challenge(401, reply, tuple, now)
        // Reported only when answered, so the per-source challenge limit bounds the log too.
        if case .reply = outcome { report(.authFailed(tuple, username: Self.printable(username))) }
        return outcome
    }

    /// A username as a log may show it: control characters escaped, at most 64 characters.
    static func printable(_ s: String) -> String {
        var out = ""
        for scalar in s.unicodeScalars.prefix(64) {
            if scalar.value < 0x20 || scalar.value == 0x7F {
                out += "\\u{\(String(scalar.value, radix: 16))}"
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return s.unicodeScalars.count > 64 ? out + "…" : out
    }

    /// A 401 or 438 with REALM, a fresh NONCE and PASSWORD-ALGORITHMS, kept small:
    /// no SOFTWARE, FINGERPRINT only when the request had one; rate-limited per source.
    private func challenge(_ code: Int, _ reply: Reply, _ tuple: FiveTuple, _ now: Timestamp) -> TURNClientOutcome {
        guard challengeLimiter.allow(tuple.client.ip, now: now) else { return drop(.challengeRateLimited) }
        let e = reply.answer(
            .errorResponse,
            [
                .errorCode(ErrorCodeValue(code: code, reason: ErrorCodeValue.defaultReason(code))),
                .realm(configuration.realm), .nonce(nonces.mint(for: tuple.client, now: now)),
                .passwordAlgorithms([.md5, .sha256]),
            ])
        let bytes = e.encode(fingerprint: reply.fingerprint)
        if configuration.strictAmplification && bytes.count > reply.size { return drop(.amplification) }
        statistics.challenges += 1
        statistics.errors[code, default: 0] += 1
        return .reply(bytes)
    }

    // MARK: - Answers

    func error(_ code: Int, _ reason: String?, _ reply: Reply, _ extra: [Attribute] = []) -> TURNClientOutcome {
        let e = reply.answer(
            .errorResponse, [.errorCode(ErrorCodeValue(code: code, reason: reason ?? ErrorCodeValue.defaultReason(code)))] + extra
        )
        return send(e, reply, code: code)
    }

    func success(_ attributes: [Attribute], _ reply: Reply) -> TURNClientOutcome {
        send(reply.answer(.successResponse, attributes), reply, code: nil)
    }

    /// Signs and encodes an answer. An unauthenticated answer larger than its
    /// request is dropped: the server never amplifies for a stranger.
    private func send(_ m: Message, _ reply: Reply, code: Int?) -> TURNClientOutcome {
        let bytes = encode(m, reply)
        if reply.auth == nil, bytes.count > reply.size { return drop(.amplification) }
        if let code { statistics.errors[code, default: 0] += 1 }
        return .reply(bytes)
    }

    func encode(_ m: Message, _ reply: Reply) -> [UInt8] {
        var m = m
        guard let auth = reply.auth, let key = auth.key else { return m.encode(fingerprint: reply.fingerprint) }
        if let software = configuration.software { m.append(.software(software)) }
        return auth.sha256
            ? m.encode(integritySHA256: key, fingerprint: reply.fingerprint)
            : m.encode(integrity: key, fingerprint: reply.fingerprint)
    }

    // MARK: - Allocate (RFC 8656 §7.2)

    private func allocate(_ m: Message, _ reply: Reply, tuple: FiveTuple, now: Timestamp) -> TURNClientOutcome {
        if let existing = allocations[tuple], existing.expiry <= now {
            delete(tuple, reason: "expired", now: now)
            statistics.allocationsExpired += 1
        }
        if let existing = allocations[tuple] {
            // A retransmitted Allocate gets the same answer; anything else is a mismatch.
            if existing.allocateTransaction == m.transactionID && existing.username == reply.auth?.username {
                return .reply(existing.allocateResponse)
            }
            return error(437, nil, reply)
        }
        let attrs: [Attribute]
        do { attrs = try m.typedAttributes() } catch { return self.error(400, "Malformed attribute", reply) }
        var transport: UInt8?
        var lifetime: UInt32?
        var family: UInt8?
        var additional: UInt8?
        var even: Bool?
        var token: UInt64?
        var dontFragment = false
        for a in attrs {
            switch a {
            case .requestedTransport(let t): transport = transport ?? t
            case .lifetime(let l): lifetime = lifetime ?? l
            case .requestedAddressFamily(let f): family = family ?? f
            case .additionalAddressFamily(let f): additional = additional ?? f
            case .evenPort(let r): even = even ?? r
            case .reservationToken(let t): token = token ?? t
            case .dontFragment: dontFragment = true
            default: break
            }
        }
        guard let transport else { return error(400, "Missing REQUESTED-TRANSPORT", reply) }
        guard transport == 17 else { return error(442, nil, reply) }
        if token != nil && (even != nil || family != nil || additional != nil) {
            return error(400, "RESERVATION-TOKEN with EVEN-PORT or an address family", reply)
        }
        if family != nil && additional != nil { return error(400, "Both address family attributes", reply) }
        if let additional, additional != 0x02 { return error(400, "ADDITIONAL-ADDRESS-FAMILY must be IPv6", reply) }
        if let family, family != 0x01 && family != 0x02 { return error(440, nil, reply) }

        let username = reply.auth?.username ?? ""
        // A port held for the next allocation (EVEN-PORT with R) counts against the quotas as
        // one; redeeming a held port (RESERVATION-TOKEN) turns its slot into the allocation's.
        let taken = token != nil ? 0 : even == true ? 2 : 1
        if configuration.userQuota > 0, perUser[username, default: 0] + taken > configuration.userQuota {
            return error(486, nil, reply)
        }
        if configuration.totalQuota > 0, allocations.count + reservations.count + taken > configuration.totalQuota {
            return error(508, nil, reply)
        }

        var relays: [TransportAddress] = []
        var reserved: UInt64?
        var addressError: ErrorCodeValue?
        if let token {
            guard let r = reservations.removeValue(forKey: token) else {
                return error(508, "Reservation unknown or expired", reply)
            }
            release(reservationOf: r.owner)
            guard r.expiry > now, ports.openReserved(r.address, dontFragment: dontFragment) else {
                ports.closeRelay(r.address)
                return error(508, "Reservation unknown or expired", reply)
            }
            relays.append(r.address)
        } else {
            let primary = family ?? 0x01
            guard ports.serves(family: primary) else { return error(440, nil, reply) }
            guard
                let opened = ports.openRelay(
                    family: primary, even: even != nil, reserveNext: even == true, dontFragment: dontFragment)
            else {
                return error(508, nil, reply)
            }
            relays.append(opened.relay)
            if let next = opened.reserved {
                var t = UInt64.random(in: 1...UInt64.max)
                while reservations[t] != nil { t = UInt64.random(in: 1...UInt64.max) }
                reservations[t] = (next, now + configuration.reservationLifetime, username)
                // A held port counts against the quotas like an allocation.
                perUser[username, default: 0] += 1
                reserved = t
            }
            if additional == 0x02 {
                if ports.serves(family: 0x02),
                    let v6 = ports.openRelay(family: 0x02, even: false, reserveNext: false, dontFragment: dontFragment)
                {
                    relays.append(v6.relay)
                } else {
                    addressError = ErrorCodeValue(code: 440, reason: ErrorCodeValue.defaultReason(440))
                }
            }
        }

        let granted = desiredLifetime(lifetime)
        var answer: [Attribute] = relays.map { .xorRelayedAddress(advertised($0)) }
        answer.append(.lifetime(granted))
        if let reserved { answer.append(.reservationToken(reserved)) }
        if let addressError { answer.append(.addressErrorCode(family: 0x02, addressError)) }
        answer.append(.xorMappedAddress(tuple.client))
        // Authenticated (or anonymous by the operator's choice), so never capped.
        let bytes = encode(reply.answer(.successResponse, answer), reply)

        let a = TURNAllocation(
            tuple: tuple, username: username, relays: relays, dontFragment: dontFragment,
            expiry: now + .seconds(Int64(granted)), key: reply.auth?.key, allocateTransaction: m.transactionID,
            allocateResponse: bytes, bandwidth: configuration.maxBandwidth, now: now)
        allocations[tuple] = a
        for r in relays {
            byRelay[r] = a
            ports.attach(r, to: a)
        }
        perUser[username, default: 0] += 1
        statistics.allocationsCreated += 1
        statistics.allocationsActive = allocations.count
        report(.allocated(tuple, username: username, relays: relays, lifetime: granted))
        return .reply(bytes)
    }

    /// RFC 8656 §7.2/§7.3: min(requested, maximum), but never below the default.
    private func desiredLifetime(_ requested: UInt32?) -> UInt32 {
        max(configuration.defaultLifetime, min(requested ?? configuration.defaultLifetime, configuration.maxLifetime))
    }

    /// The relay address as clients should see it (`--external-ip`).
    private func advertised(_ relay: TransportAddress) -> TransportAddress {
        guard let ip = configuration.externalIP[relay.ip.family] else { return relay }
        return TransportAddress(ip: ip, port: relay.port)
    }

    // MARK: - Refresh (RFC 8656 §7.3)

    private func refresh(_ m: Message, _ reply: Reply, _ a: TURNAllocation, now: Timestamp) -> TURNClientOutcome {
        var requested: UInt32?
        if case .lifetime(let l)? = try? m.value(.lifetime) { requested = l }
        if case .requestedAddressFamily(let f)? = try? m.value(.requestedAddressFamily), !a.serves(family: f) {
            return error(443, nil, reply)
        }
        if requested == 0 {
            delete(a.tuple, reason: "refreshed to 0", now: now)
            return success([.lifetime(0)], reply)
        }
        let granted = desiredLifetime(requested)
        a.expiry = now + .seconds(Int64(granted))
        return success([.lifetime(granted)], reply)
    }

    // MARK: - CreatePermission (RFC 8656 §9.2)

    private func createPermission(_ m: Message, _ reply: Reply, _ a: TURNAllocation, now: Timestamp) -> TURNClientOutcome {
        var peers: [IPAddress] = []
        for raw in m.effectiveAttributes where raw.type == .xorPeerAddress {
            guard case .xorPeerAddress(let p)? = try? Attribute(raw, transactionID: m.transactionID) else {
                return error(400, "Malformed XOR-PEER-ADDRESS", reply)
            }
            peers.append(p.ip)
        }
        guard !peers.isEmpty else { return error(400, "Missing XOR-PEER-ADDRESS", reply) }
        for ip in peers {
            guard a.serves(family: ip.family) else { return error(443, nil, reply) }
            guard configuration.peerFilter.permits(ip) else { return error(403, "Peer address not allowed", reply) }
        }
        let new = Set(peers).filter { a.permissions[$0] == nil }.count
        guard a.permissions.count + new <= configuration.maxPermissionsPerAllocation else {
            return error(508, "Too many permissions", reply)
        }
        let expiry = now + configuration.permissionLifetime
        for ip in peers { a.permissions[ip] = expiry }
        return success([], reply)
    }

    // MARK: - ChannelBind (RFC 8656 §11.2)

    private func channelBind(_ m: Message, _ reply: Reply, _ a: TURNAllocation, now: Timestamp) -> TURNClientOutcome {
        guard case .channelNumber(let number)? = try? m.value(.channelNumber),
            case .xorPeerAddress(let peer)? = try? m.value(.xorPeerAddress)
        else { return error(400, "Missing CHANNEL-NUMBER or XOR-PEER-ADDRESS", reply) }
        guard configuration.channelNumbers.contains(number) else { return error(400, "Channel number out of range", reply) }
        guard a.serves(family: peer.ip.family) else { return error(443, nil, reply) }
        guard configuration.peerFilter.permits(peer.ip), !isOwn(peer, from: a) else {
            return error(403, "Peer address not allowed", reply)
        }
        if a.channels[number] == nil, a.channels.count >= configuration.maxChannelsPerAllocation {
            return error(508, "Too many channels", reply)
        }
        if let bound = a.channels[number], bound.peer != peer, bound.expiry > now {
            return error(400, "Channel bound to another peer", reply)
        }
        if let other = a.channelByPeer[peer], other != number, let b = a.channels[other], b.expiry > now {
            return error(400, "Peer bound to another channel", reply)
        }
        if a.permissions[peer.ip] == nil, a.permissions.count >= configuration.maxPermissionsPerAllocation {
            return error(508, "Too many permissions", reply)
        }
        // A lapsed binding of either side is replaced.
        if let old = a.channels[number], old.peer != peer { a.channelByPeer[old.peer] = nil }
        if let oldNumber = a.channelByPeer[peer], oldNumber != number { a.channels[oldNumber] = nil }
        a.channels[number] = (peer, now + configuration.channelLifetime)
        a.channelByPeer[peer] = number
        a.permissions[peer.ip] = max(a.permissions[peer.ip] ?? now, now + configuration.permissionLifetime)
        return success([], reply)
    }
}
