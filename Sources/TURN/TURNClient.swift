import STUN
import TusaBase

/// A TURN client (RFC 8656) as a sans-IO state machine: one allocation on one
/// server, its permissions and channels, kept alive on an injected clock.
///
/// The driver owns the socket and the clock (the ``SansIOCore`` contract). It
/// calls the operations (``allocate(now:)``, ``refresh(now:)``,
/// ``createPermission(for:now:)``, ``bindChannel(to:now:)``,
/// ``deallocate(now:)``), feeds every datagram or stream frame from the
/// server as ``Input/received(_:)`` (or, on its hot
/// path, to ``receive(_:now:)``, which returns a peer's data at once), and
/// calls ``handleTimeout(now:)`` at ``nextDeadline``. After each call it
/// drains ``pollAction()``: messages for the server, events, and data from
/// peers. Application data goes out through ``wrap(_:for:)`` (ChannelData or
/// a Send indication).
///
/// Authentication follows RFC 8489 §9.2: the first Allocate goes without
/// credentials; the 401 challenge's REALM and NONCE (and PASSWORD-ALGORITHMS,
/// when the nonce cookie announces them) give the long-term key; a 438 brings
/// a fresh nonce and the request is sent again. Every response to a request
/// that carried credentials must carry a MESSAGE-INTEGRITY (or
/// -SHA256) valid under that request's key, except the 401 and 438 challenges;
/// anything else is dropped as if never received (``ignoredResponses``).
///
/// Timing: the allocation is refreshed at its lifetime minus 60 s (half the
/// lifetime when that is 120 s or less); permissions every
/// ``Configuration/permissionRefreshInterval`` (240 s; they last 300 s) and
/// channels every ``Configuration/channelRefreshInterval`` (480 s; they last
/// 600 s) for as long as the allocation lives. A refresh that times out is
/// retried while the thing it refreshes has not yet expired.
public struct TURNClient: Sendable {
    public let configuration: Configuration

    /// Where the client is in an allocation's life.
    public enum Phase: Hashable, Sendable {
        /// No allocation (never asked for, or the last attempt failed).
        case idle
        case allocating
        case allocated
        /// A Refresh with LIFETIME 0 is on its way.
        case deallocating
        /// Deallocated or lost; this client is done.
        case closed
    }

    public private(set) var phase: Phase = .idle
    /// The current allocation, while ``phase`` is `.allocated`.
    public private(set) var allocation: TURNClientAllocation?
    /// Responses dropped because their integrity was missing or wrong.
    public private(set) var ignoredResponses = 0

    /// The OpaqueString-prepared username, as sent in USERNAME.
    private let username: String
    private var auth: TURNClientAuth?
    private var pending: [Pending] = []
    /// What the driver is to do, in order (``pollAction()``).
    var actions: [Action] = []
    private var nextOperation: UInt64 = 1
    private var allocationRefreshAt: Timestamp?
    private var permissions: [IPAddress: Permission] = [:]
    private var channels: [TransportAddress: Channel] = [:]
    private var channelPeers: [UInt16: TransportAddress] = [:]
    private var nextChannel: UInt16 = ChannelNumber.validRange.lowerBound

    /// What a request is for; the same purpose is sent again with fresh
    /// credentials after a 401 or 438.
    enum Purpose: Hashable, Sendable {
        case allocate(dontFragment: Bool)
        case refresh(lifetime: UInt32?)
        case createPermission([IPAddress])
        case channelBind(ChannelNumber, TransportAddress)

        var method: Method {
            switch self {
            case .allocate: .allocate
            case .refresh: .refresh
            case .createPermission: .createPermission
            case .channelBind: .channelBind
            }
        }

        var isDeallocation: Bool { self == .refresh(lifetime: 0) }
    }

    struct Pending: Sendable {
        var purpose: Purpose
        /// The application's operation; nil for the client's own refreshes.
        var operation: OperationID?
        var transaction: ClientTransaction
        var wakeAt: Timestamp
        /// The key the request was signed with; nil when it went without credentials.
        var key: IntegrityKey?
        var staleNonces: Int
    }

    struct Permission: Sendable {
        var installed = false
        var refreshAt: Timestamp?
        var expiresAt: Timestamp?
    }

    struct Channel: Sendable {
        var number: ChannelNumber
        var bound = false
        var refreshAt: Timestamp?
        var expiresAt: Timestamp?
    }

    /// How long a permission lasts on the server (RFC 8656 §9).
    public static let permissionLifetime = Duration.seconds(300)
    /// How long a channel binding lasts on the server (RFC 8656 §12).
    public static let channelLifetime = Duration.seconds(600)
    /// REQUESTED-TRANSPORT's value for a UDP relay.
    public static let udpProtocol: UInt8 = 17

    /// - Throws: ``TURNClientError/invalidArgument(_:)`` for a username or
    ///   password that OpaqueString refuses (empty, control characters) or a
    ///   username of 509 bytes or more.
    public init(configuration: Configuration) throws(TURNClientError) {
        let username: String
        do {
            username = try OpaqueString.prepare(configuration.username)
            _ = try OpaqueString.prepare(configuration.password)
        } catch {
            throw .invalidArgument("bad credentials: \(error.message)")
        }
        guard username.utf8.count < 509 else {
            throw .invalidArgument("the username has \(username.utf8.count) bytes; it must be fewer than 509")
        }
        guard configuration.lifetime != 0 else {
            throw .invalidArgument("a LIFETIME of 0 would ask for no allocation at all")
        }
        self.configuration = configuration
        self.username = username
    }

    // MARK: operations

    /// Asks for an allocation. The outcome is ``Event/allocated(_:_:)`` or ``Event/failed(_:_:)``.
    ///
    /// - Throws: ``TURNClientError/invalidArgument(_:)`` when an allocation
    ///   exists or is being made, ``TURNClientError/closed`` after deallocation.
    public mutating func allocate(now: Timestamp) throws(TURNClientError) -> OperationID {
        switch phase {
        case .idle: break
        case .allocating, .allocated, .deallocating: throw .invalidArgument("an allocation already exists or is under way")
        case .closed: throw .closed
        }
        phase = .allocating
        let id = newOperation()
        start(.allocate(dontFragment: configuration.dontFragment), operation: id, now: now)
        return id
    }

    /// Installs (or refreshes) permissions for peers' IP addresses (ports do
    /// not matter to permissions). The outcome is ``Event/permissionsCreated(_:_:)``
    /// or ``Event/failed(_:_:)``. Permissions are then refreshed on their own.
    public mutating func createPermission(for peers: [IPAddress], now: Timestamp) throws(TURNClientError) -> OperationID {
        guard phase == .allocated else { throw phase == .closed ? .closed : .notAllocated }
        var ips: [IPAddress] = []
        for ip in peers where !ips.contains(ip) { ips.append(ip) }
        guard !ips.isEmpty else { throw .invalidArgument("no peer addresses given") }
        for ip in ips where permissions[ip] == nil { permissions[ip] = Permission() }
        let id = newOperation()
        start(.createPermission(ips), operation: id, now: now)
        return id
    }

    /// Binds a channel to a peer (which also installs a permission for its
    /// IP address). Until the server confirms, data to the peer goes in Send
    /// indications. The outcome is ``Event/channelBound(_:_:peer:)`` or
    /// ``Event/failed(_:_:)``. Binding again refreshes the same channel.
    public mutating func bindChannel(to peer: TransportAddress, now: Timestamp) throws(TURNClientError) -> OperationID {
        guard phase == .allocated else { throw phase == .closed ? .closed : .notAllocated }
        let number: ChannelNumber
        if let existing = channels[peer] {
            number = existing.number
        } else {
            guard let n = ChannelNumber(rawValue: nextChannel) else { throw .channelsExhausted }
            number = n
            nextChannel += 1
            channels[peer] = Channel(number: n)
            channelPeers[n.rawValue] = peer
        }
        if permissions[peer.ip] == nil { permissions[peer.ip] = Permission() }
        let id = newOperation()
        start(.channelBind(number, peer), operation: id, now: now)
        return id
    }

    /// Refreshes the allocation now, as the client does on its own before it
    /// ends: to learn whether the server still holds it (after a pause, a
    /// network change, a server restart) before giving it up for a new one.
    /// The outcome is ``Event/confirmed(_:_:)`` or ``Event/failed(_:_:)``; a
    /// 437 (the server has no allocation for this 5-tuple) also loses the
    /// allocation (``Event/allocationLost(_:)``), as an own refresh would.
    public mutating func refresh(now: Timestamp) throws(TURNClientError) -> OperationID {
        guard phase == .allocated else { throw phase == .closed ? .closed : .notAllocated }
        let id = newOperation()
        start(.refresh(lifetime: configuration.lifetime), operation: id, now: now)
        return id
    }

    /// Releases the allocation (a Refresh with LIFETIME 0). Operations still
    /// waiting fail with ``TURNClientError/closed``. The outcome is
    /// ``Event/deallocated(_:)`` (also when the server no longer knew the
    /// allocation, 437) or ``Event/failed(_:_:)``; either way the client is
    /// then closed.
    @discardableResult
    public mutating func deallocate(now: Timestamp) -> OperationID {
        let id = newOperation()
        let hadAllocation = phase == .allocated
        for p in pending { fail(p, .closed, now: now) }
        pending.removeAll()
        forgetPermissionsAndChannels()
        allocationRefreshAt = nil
        guard hadAllocation else {
            phase = .closed
            allocation = nil
            actions.append(.event(.deallocated(id)))
            return id
        }
        phase = .deallocating
        start(.refresh(lifetime: 0), operation: id, now: now)
        return id
    }

    /// Wraps application data for a peer: ChannelData when a channel is bound
    /// to it (padded on streams), otherwise a Send indication. Send the
    /// result to the server.
    ///
    /// - Throws: ``TURNClientError/notAllocated``; ``TURNClientError/noPermission(_:)``
    ///   when no permission for the peer's IP was asked for (the server would
    ///   drop the data); ``TURNClientError/invalidArgument(_:)`` for more than
    ///   65,535 bytes.
    public func wrap(_ payload: [UInt8], for peer: TransportAddress) throws(TURNClientError) -> [UInt8] {
        guard phase == .allocated else { throw .notAllocated }
        guard permissions[peer.ip] != nil else { throw .noPermission(peer.ip) }
        if let channel = channels[peer], channel.bound {
            guard payload.count <= 65_535 else { throw .invalidArgument("\(payload.count) bytes do not fit in ChannelData") }
            return ChannelData(channel: channel.number.rawValue, data: payload).encode(padded: configuration.isStream)
        }
        // 20 header + 12 (IPv4) or 24 (IPv6) XOR-PEER-ADDRESS + 4 DATA header + 8 FINGERPRINT.
        guard payload.count <= 65_535 - 56 else {
            throw .invalidArgument("\(payload.count) bytes do not fit in a Send indication")
        }
        let indication = Message(
            type: MessageType(method: .send, class: .indication),
            attributes: [.xorPeerAddress(peer), .data(payload)])
        return indication.encode(fingerprint: configuration.fingerprint)
    }

    /// The channel bound to a peer, once the server has confirmed it.
    public func channel(for peer: TransportAddress) -> ChannelNumber? {
        guard let c = channels[peer], c.bound else { return nil }
        return c.number
    }

    /// Whether a permission for the IP address is installed (confirmed by the server).
    public func hasPermission(for ip: IPAddress) -> Bool {
        permissions[ip]?.installed ?? false
    }

    // MARK: input

    /// Takes one datagram (UDP) or one frame (a ``StreamFramer`` cut from
    /// TCP) from the server. Returns the application data it carried, if it
    /// was ChannelData on a known channel or a Data indication from a peer
    /// with a permission; responses advance the requests and leave events.
    /// Anything malformed or unexpected is dropped.
    public mutating func receive(_ bytes: [UInt8], now: Timestamp) -> Datagram? {
        switch PacketKind.classify(bytes) {
        case .channelData:
            guard let frame = try? ChannelData(decoding: bytes), let peer = channelPeers[frame.channel],
                phase == .allocated || phase == .deallocating
            else { return nil }
            return Datagram(peer: peer, payload: frame.data, channel: frame.channel)
        case .stun:
            guard let message = try? Message(decoding: bytes) else { return nil }
            if message.attribute(.fingerprint) != nil && message.checkFingerprint() != .valid { return nil }
            switch message.type.messageClass {
            case .indication:
                return dataIndication(message)
            case .successResponse, .errorResponse:
                response(message, now: now)
                return nil
            case .request:
                return nil
            }
        default:
            return nil
        }
    }

    private func dataIndication(_ m: Message) -> Datagram? {
        guard m.type.method == .data, phase == .allocated || phase == .deallocating,
            case .xorPeerAddress(let peer)? = try? m.value(.xorPeerAddress),
            case .data(let payload)? = try? m.value(.data),
            permissions[peer.ip] != nil
        else { return nil }
        return Datagram(peer: peer, payload: payload)
    }

    /// Advances the clock: retransmits, times requests out, starts refreshes.
    public mutating func handleTimeout(now: Timestamp) {
        var index = 0
        while index < pending.count {
            guard pending[index].wakeAt <= now else {
                index += 1
                continue
            }
            pending[index].transaction.handleTimeout(now: now)
            while let action = pending[index].transaction.pollAction() {
                if case .send(let bytes) = action { actions.append(.transmit(bytes)) }
            }
            if let wakeAt = pending[index].transaction.nextDeadline {
                pending[index].wakeAt = wakeAt
                index += 1
            } else {
                let p = pending.remove(at: index)
                fail(p, .timeout(p.purpose.method), now: now)
            }
        }
        guard phase == .allocated, let allocation else { return }
        if now >= allocation.expiresAt {
            lose(.timeout(.refresh))
            return
        }
        if let at = allocationRefreshAt, at <= now {
            allocationRefreshAt = nil
            start(.refresh(lifetime: configuration.lifetime), operation: nil, now: now)
        }
        var due: [IPAddress] = []
        for (ip, p) in permissions where p.installed {
            if let at = p.refreshAt, at <= now { due.append(ip) }
        }
        if !due.isEmpty {
            due.sort { $0.bytes.lexicographicallyPrecedes($1.bytes) }
            for ip in due { permissions[ip]?.refreshAt = nil }
            start(.createPermission(due), operation: nil, now: now)
        }
        for (peer, c) in channels.sorted(by: { $0.value.number.rawValue < $1.value.number.rawValue }) where c.bound {
            if let at = c.refreshAt, at <= now {
                channels[peer]?.refreshAt = nil
                start(.channelBind(c.number, peer), operation: nil, now: now)
            }
        }
    }

    /// When ``handleTimeout(now:)`` must next be called; nil when nothing is scheduled.
    public var nextDeadline: Timestamp? {
        var next: Timestamp?
        func consider(_ t: Timestamp?) {
            guard let t else { return }
            if next.map({ t < $0 }) ?? true { next = t }
        }
        for p in pending { consider(p.wakeAt) }
        if phase == .allocated {
            consider(allocationRefreshAt)
            consider(allocation?.expiresAt)
            for p in permissions.values where p.installed { consider(p.refreshAt) }
            for c in channels.values where c.bound { consider(c.refreshAt) }
        }
        return next
    }

    // MARK: output

    /// The next thing for the driver to do, in order; nil when nothing is left.
    public mutating func pollAction() -> Action? {
        actions.isEmpty ? nil : actions.removeFirst()
    }

    // MARK: requests

    private mutating func newOperation() -> OperationID {
        defer { nextOperation += 1 }
        return OperationID(rawValue: nextOperation)
    }

    /// Builds, signs and sends a request for `purpose`.
    private mutating func start(_ purpose: Purpose, operation: OperationID?, staleNonces: Int = 0, now: Timestamp) {
        var attributes: [Attribute] = []
        if let software = configuration.software { attributes.append(.software(software)) }
        switch purpose {
        case .allocate(let dontFragment):
            attributes.append(.requestedTransport(Self.udpProtocol))
            if let family = configuration.addressFamily { attributes.append(.requestedAddressFamily(family)) }
            if let lifetime = configuration.lifetime { attributes.append(.lifetime(lifetime)) }
            if dontFragment { attributes.append(.dontFragment) }
        case .refresh(let lifetime):
            if let lifetime { attributes.append(.lifetime(lifetime)) }
        case .createPermission(let ips):
            for ip in ips { attributes.append(.xorPeerAddress(TransportAddress(ip: ip, port: 0))) }
        case .channelBind(let number, let peer):
            attributes.append(.channelNumber(number.rawValue))
            attributes.append(.xorPeerAddress(peer))
        }
        if let auth { attributes += auth.attributes(username: username) }
        let message = Message(type: MessageType(method: purpose.method, class: .request), attributes: attributes)
        let bytes = message.encode(
            integrity: auth?.key, integritySHA256: auth?.signsWithSHA256 == true ? auth?.key : nil,
            fingerprint: configuration.fingerprint)
        var transaction = ClientTransaction(
            transactionID: message.transactionID, request: bytes, reliability: configuration.reliability)
        transaction.handle(.start, now: now)
        guard case .send(let first)? = transaction.pollAction(), let wakeAt = transaction.nextDeadline else { return }
        actions.append(.transmit(first))
        pending.append(
            Pending(
                purpose: purpose, operation: operation, transaction: transaction, wakeAt: wakeAt, key: auth?.key,
                staleNonces: staleNonces))
    }

    private mutating func response(_ message: Message, now: Timestamp) {
        guard let index = pending.firstIndex(where: { $0.transaction.transactionID == message.transactionID }) else { return }
        let p = pending[index]
        let code: Int?
        if message.type.messageClass == .errorResponse {
            guard case .errorCode(let e)? = try? message.value(.errorCode) else {
                ignoredResponses += 1
                return
            }
            code = e.code
        } else {
            code = nil
        }
        // The challenges are unauthenticated by nature; everything else that
        // answers a signed request must be signed with the same key.
        let isChallenge = code == ErrorCodeValue.unauthenticated || code == ErrorCodeValue.staleNonce
        if let key = p.key, !isChallenge, !message.isAuthenticated(by: key) {
            ignoredResponses += 1
            return
        }
        guard message.type.method == p.purpose.method, pending[index].transaction.receive(message) else { return }
        pending.remove(at: index)
        if message.type.messageClass == .successResponse {
            succeed(p, message, now: now)
        } else {
            errorResponse(p, message, now: now)
        }
    }

    /// Takes a 401/438 challenge's REALM and NONCE and sends the request again.
    private mutating func retry(_ p: Pending, meeting challenge: Message, staleNonces: Int, now: Timestamp) {
        do {
            auth = try TURNClientAuth.meet(challenge, previous: auth, username: username, configuration: configuration)
        } catch {
            fail(p, error, now: now)
            return
        }
        start(p.purpose, operation: p.operation, staleNonces: staleNonces, now: now)
    }

    private mutating func errorResponse(_ p: Pending, _ message: Message, now: Timestamp) {
        guard case .errorCode(let error)? = try? message.value(.errorCode) else { return }
        switch error.code {
        case ErrorCodeValue.unauthenticated:
            guard p.key == nil else {
                // Credentials were sent and refused.
                fail(
                    p,
                    .authenticationFailed(
                        "\(error.code) \(error.reason) for user '\(username)'" + (auth.map { " in realm '\($0.realm)'" } ?? "")),
                    now: now)
                return
            }
            retry(p, meeting: message, staleNonces: p.staleNonces, now: now)
        case ErrorCodeValue.staleNonce:
            guard p.staleNonces < configuration.staleNonceRetries else {
                fail(p, .authenticationFailed("\(p.staleNonces + 1) stale nonces in a row"), now: now)
                return
            }
            retry(p, meeting: message, staleNonces: p.staleNonces + 1, now: now)
        case ErrorCodeValue.unknownAttribute:
            if case .allocate(dontFragment: true) = p.purpose,
                case .unknownAttributes(let types)? = try? message.value(.unknownAttributes),
                types.contains(.dontFragment)
            {
                // RFC 8656 §7.1: the server cannot honour DONT-FRAGMENT; do without.
                start(.allocate(dontFragment: false), operation: p.operation, staleNonces: p.staleNonces, now: now)
                return
            }
            fail(p, .errorResponse(p.purpose.method, error), now: now)
        case ErrorCodeValue.allocationMismatch:
            fail(p, .allocationMismatch(p.purpose.method), now: now)
        case ErrorCodeValue.allocationQuotaReached:
            fail(p, .quotaReached, now: now)
        default:
            fail(p, .errorResponse(p.purpose.method, error), now: now)
        }
    }

    private mutating func succeed(_ p: Pending, _ message: Message, now: Timestamp) {
        switch p.purpose {
        case .allocate:
            guard phase == .allocating else { return }
            var relayed: [TransportAddress] = []
            for raw in message.effectiveAttributes where raw.type == .xorRelayedAddress {
                if case .xorRelayedAddress(let a)? = try? Attribute(raw, transactionID: message.transactionID) {
                    relayed.append(a)
                }
            }
            guard let first = relayed.first else {
                fail(p, .badResponse("Allocate success without XOR-RELAYED-ADDRESS"), now: now)
                return
            }
            var mapped: TransportAddress?
            if case .xorMappedAddress(let a)? = try? message.value(.xorMappedAddress) { mapped = a }
            var seconds = configuration.lifetime ?? 600
            if case .lifetime(let l)? = try? message.value(.lifetime) { seconds = l }
            guard seconds > 0 else {
                fail(p, .badResponse("Allocate success with LIFETIME 0"), now: now)
                return
            }
            let lifetime = Duration.seconds(Int64(seconds))
            let granted = TURNClientAllocation(
                relayed: first, additionalRelayed: Array(relayed.dropFirst()), mapped: mapped,
                lifetime: lifetime, expiresAt: now + lifetime)
            allocation = granted
            phase = .allocated
            allocationRefreshAt = now + Self.refreshDelay(lifetime: lifetime)
            if let op = p.operation { actions.append(.event(.allocated(op, granted))) }
        case .refresh(let requested):
            if requested == 0 {
                finishDeallocation(p)
                return
            }
            guard phase == .allocated, var current = allocation else { return }
            var seconds = requested ?? 600
            if case .lifetime(let l)? = try? message.value(.lifetime) { seconds = l }
            guard seconds > 0 else {
                if let op = p.operation { actions.append(.event(.failed(op, .badResponse("Refresh success with LIFETIME 0")))) }
                lose(.badResponse("Refresh success with LIFETIME 0"))
                return
            }
            current.lifetime = .seconds(Int64(seconds))
            current.expiresAt = now + current.lifetime
            allocation = current
            allocationRefreshAt = now + Self.refreshDelay(lifetime: current.lifetime)
            actions.append(.event(.refreshed(lifetime: current.lifetime, expiresAt: current.expiresAt)))
            if let op = p.operation { actions.append(.event(.confirmed(op, current))) }
        case .createPermission(let ips):
            guard phase == .allocated else { return }
            for ip in ips { installPermission(ip, now: now) }
            if let op = p.operation { actions.append(.event(.permissionsCreated(op, ips))) }
        case .channelBind(let number, let peer):
            guard phase == .allocated, channels[peer]?.number == number else { return }
            channels[peer]?.bound = true
            channels[peer]?.refreshAt = now + configuration.channelRefreshInterval
            channels[peer]?.expiresAt = now + Self.channelLifetime
            installPermission(peer.ip, now: now)
            if let op = p.operation { actions.append(.event(.channelBound(op, number, peer: peer))) }
        }
    }

    /// A permission was installed or refreshed (by CreatePermission or ChannelBind).
    private mutating func installPermission(_ ip: IPAddress, now: Timestamp) {
        var permission = permissions[ip] ?? Permission()
        permission.installed = true
        permission.refreshAt = now + configuration.permissionRefreshInterval
        permission.expiresAt = now + Self.permissionLifetime
        permissions[ip] = permission
    }

    /// The allocation is refreshed a minute before it ends, or halfway for
    /// lifetimes of two minutes or less.
    static func refreshDelay(lifetime: Duration) -> Duration {
        lifetime > .seconds(120) ? lifetime - .seconds(60) : lifetime / 2
    }

    private mutating func finishDeallocation(_ p: Pending) {
        phase = .closed
        allocation = nil
        if let op = p.operation { actions.append(.event(.deallocated(op))) }
    }

    /// A request failed (error response, timeout, or the client was closed).
    private mutating func fail(_ p: Pending, _ error: TURNClientError, now: Timestamp) {
        switch p.purpose {
        case .allocate:
            if phase == .allocating { phase = .idle }
            if let op = p.operation { actions.append(.event(.failed(op, error))) }
        case .refresh(let lifetime):
            if lifetime == 0 {
                if case .allocationMismatch = error {
                    // Already gone on the server: deallocated all the same.
                    finishDeallocation(p)
                    return
                }
                phase = .closed
                allocation = nil
                if let op = p.operation { actions.append(.event(.failed(op, error))) }
                return
            }
            if let op = p.operation { actions.append(.event(.failed(op, error))) }
            guard phase == .allocated, error != .closed else { return }
            if case .timeout = error, let expiry = allocation?.expiresAt, now < expiry {
                start(.refresh(lifetime: lifetime), operation: nil, now: now)
                return
            }
            lose(error)
        case .createPermission(let ips):
            if let op = p.operation { actions.append(.event(.failed(op, error))) }
            guard phase == .allocated, error != .closed else { return }
            var retry: [IPAddress] = []
            for ip in ips {
                guard let permission = permissions[ip] else { continue }
                if case .timeout = error, let expiry = permission.expiresAt, now < expiry {
                    retry.append(ip)
                } else if p.operation == nil || !permission.installed {
                    // A failed refresh, or a first attempt: the permission is not there.
                    permissions[ip] = nil
                    if permission.installed { actions.append(.event(.permissionLost(ip, error))) }
                }
            }
            if !retry.isEmpty { start(.createPermission(retry), operation: nil, now: now) }
        case .channelBind(let number, let peer):
            if let op = p.operation { actions.append(.event(.failed(op, error))) }
            guard phase == .allocated, error != .closed, let channel = channels[peer], channel.number == number else { return }
            if case .timeout = error, let expiry = channel.expiresAt, now < expiry {
                start(.channelBind(number, peer), operation: nil, now: now)
                return
            }
            if p.operation == nil || !channel.bound {
                // The number stays used: the server may hold it for a while (RFC 8656 §12).
                channels[peer] = nil
                if channel.bound { actions.append(.event(.channelLost(number, peer: peer, error))) }
                if permissions[peer.ip]?.installed == false { permissions[peer.ip] = nil }
            }
        }
    }

    /// The allocation is gone.
    private mutating func lose(_ error: TURNClientError) {
        phase = .closed
        allocation = nil
        allocationRefreshAt = nil
        forgetPermissionsAndChannels()
        for p in pending {
            if let op = p.operation { actions.append(.event(.failed(op, .notAllocated))) }
        }
        pending.removeAll()
        actions.append(.event(.allocationLost(error)))
    }

    private mutating func forgetPermissionsAndChannels() {
        permissions.removeAll()
        channels.removeAll()
        channelPeers.removeAll()
    }
}
