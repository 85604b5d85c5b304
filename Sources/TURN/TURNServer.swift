import STUN
import TusaBase

/// Relay sockets, as the driver provides them. The core calls these
/// synchronously while handling an Allocate: binding a UDP socket is immediate,
/// so the driver binds it here and starts reading from it afterwards.
public protocol TURNRelayPorts: AnyObject {
    /// Whether relays of this address family (0x01 IPv4, 0x02 IPv6) can be opened at all.
    func serves(family: UInt8) -> Bool
    /// Opens a relay socket of `family`; with `even`, on an even port; with
    /// `reserveNext`, also holds port+1 and returns it. Nil when no port is free.
    func openRelay(family: UInt8, even: Bool, reserveNext: Bool, dontFragment: Bool) -> (
        relay: TransportAddress, reserved: TransportAddress?
    )?
    /// Turns a held port (from `reserveNext`) into a relay socket.
    func openReserved(_ address: TransportAddress, dontFragment: Bool) -> Bool
    /// Tells the driver which allocation a relay socket now serves.
    func attach(_ relay: TransportAddress, to allocation: TURNAllocation)
    /// Closes a relay socket, or releases a held port.
    func closeRelay(_ address: TransportAddress)
}

/// Why the TURN core dropped a packet without answering.
public enum TURNDropReason: Int, Hashable, Sendable, CaseIterable, CustomStringConvertible {
    case malformed, badFingerprint, notARequest, noAllocation, noChannel, noPermission, peerFamily
    case bandwidth, challengeRateLimited, amplification, unknownIndication
    /// Drivers: the relay socket is not (or no longer) open.
    case noRelaySocket
    /// Drivers: the socket toward the client or peer cannot take more now.
    case backpressure
    /// A peer datagram too large to fit a Data indication.
    case tooLarge
    /// A peer address that is one of the server's listening sockets (TURN inside TURN) or the allocation's own relay.
    case ownAddress

    public var description: String {
        switch self {
        case .malformed: "malformed"
        case .badFingerprint: "bad_fingerprint"
        case .notARequest: "not_a_request"
        case .noAllocation: "no_allocation"
        case .noChannel: "no_channel"
        case .noPermission: "no_permission"
        case .peerFamily: "peer_family"
        case .bandwidth: "bandwidth"
        case .challengeRateLimited: "challenge_rate_limited"
        case .amplification: "amplification"
        case .unknownIndication: "unknown_indication"
        case .noRelaySocket: "no_relay_socket"
        case .backpressure: "backpressure"
        case .tooLarge: "too_large"
        case .ownAddress: "own_address"
        }
    }
}

/// Counters a TURN server keeps (exported as metrics by the service).
public struct TURNStatistics: Sendable {
    public var allocationsActive = 0
    public var allocationsCreated = 0
    public var allocationsExpired = 0
    public var allocationsDeleted = 0
    public var permissionsExpired = 0
    public var channelsExpired = 0
    public var packetsToPeer = 0
    public var bytesToPeer = 0
    public var packetsToClient = 0
    public var bytesToClient = 0
    /// 401 answers to requests that carried credentials which did not check out.
    public var authFailures = 0
    /// 401/438 challenges sent.
    public var challenges = 0
    /// Error responses sent, by code.
    public var errors: [Int: Int] = [:]
    public var drops = [Int](repeating: 0, count: TURNDropReason.allCases.count)

    public init() {}

    public func dropped(_ reason: TURNDropReason) -> Int { drops[reason.rawValue] }
    public var totalDrops: Int { drops.reduce(0, +) }
}

/// What happens to a packet from a client.
public enum TURNClientOutcome {
    /// Send these bytes back to the client on its 5-tuple.
    case reply([UInt8])
    /// Send the input's bytes in `payload` from the allocation's relay to `peer`.
    case relay(TURNAllocation, to: TransportAddress, payload: Range<Int>)
    /// Nothing to send.
    case drop(TURNDropReason)
}

/// What happens to a datagram from a peer, arriving on a relay socket.
public enum TURNPeerOutcome {
    /// Send a ChannelData header for `channel` and the payload to the client
    /// (on streams, padded to a multiple of 4).
    case channel(UInt16, to: FiveTuple)
    /// Send this Data indication to the client.
    case indication([UInt8], to: FiveTuple)
    case drop(TURNDropReason)
}

/// Things worth a log line.
public enum TURNEvent: Sendable {
    case allocated(FiveTuple, username: String, relays: [TransportAddress], lifetime: UInt32)
    case deleted(FiveTuple, relays: [TransportAddress], reason: String, packetsToPeer: Int, packetsToClient: Int)
    case authFailed(FiveTuple, username: String)
}

/// The TURN server (RFC 8656 over UDP/TCP, UDP relays) as a sans-IO core: the
/// driver hands it packets with the time and performs what it returns; relay
/// sockets are opened through ``TURNRelayPorts``. Confine one instance to one
/// thread (the service runs one per event loop).
///
/// It is a ``SansIOCore`` (inputs through `handle`, actions out of `pollAction()`,
/// `handleTimeout(now:)` at `nextDeadline`); a relay's hot path calls
/// ``handleClient(_:from:now:)`` and ``handlePeer(_:from:allocation:now:)``
/// directly, which return what to do at once without copying the payload, and
/// drains `pollAction()` for the events (allocations made and deleted, failed
/// authentications) that any call may leave.
///
/// The properties those two calls touch, here and in ``TURNAllocation``, are
/// `@exclusivity(unchecked)`: the run-time exclusivity check was about 3 % of a
/// relayed packet's CPU. The core is confined to one thread, and none of them is
/// passed `inout` to a call that touches it again.
public final class TURNServer {
    public let configuration: TURNServerConfiguration
    let nonces: StatelessNonce
    let ports: any TURNRelayPorts
    @exclusivity(unchecked) public internal(set) var statistics = TURNStatistics()
    /// What the driver is to do, in order (``pollAction()``).
    @exclusivity(unchecked) var actions: [Action] = []
    /// When ``handleTimeout(now:)`` last swept.
    var lastSweep: Timestamp?
    /// Unix time (seconds) at `Timestamp.zero`, by which REST usernames' expiry
    /// times are judged: the configuration's at first, then the driver's whenever it
    /// reads the system clock again. The server's own clock is monotonic, but
    /// credentials are stamped on the wall clock of whoever issued them, which
    /// follows the system clock when it is stepped (as coturn reads `time()` for each).
    public var unixTimeAtZero: UInt64

    @exclusivity(unchecked) var allocations: [FiveTuple: TURNAllocation] = [:]
    var byRelay: [TransportAddress: TURNAllocation] = [:]
    var perUser: [String: Int] = [:]
    var reservations: [UInt64: (address: TransportAddress, expiry: Timestamp, owner: String)] = [:]
    var challengeLimiter: SourceLimiter

    /// Attributes this server understands in requests and indications.
    static let known: Set<AttributeType> = [
        .username, .realm, .nonce, .userhash, .messageIntegrity, .messageIntegritySHA256, .passwordAlgorithm,
        .passwordAlgorithms, .fingerprint, .lifetime, .requestedTransport, .requestedAddressFamily,
        .additionalAddressFamily, .evenPort, .reservationToken, .dontFragment, .xorPeerAddress, .channelNumber, .data,
    ]

    public init(configuration: TURNServerConfiguration, relayPorts: any TURNRelayPorts) {
        self.configuration = configuration
        self.nonces = StatelessNonce(secret: configuration.nonceSecret, lifetime: configuration.nonceLifetime)
        self.ports = relayPorts
        self.challengeLimiter = SourceLimiter(rate: configuration.challengeRate, burst: configuration.challengeBurst)
        self.unixTimeAtZero = configuration.unixTimeAtZero
    }

    public var allocationCount: Int { allocations.count }

    /// Whether a packet that starts with these two bytes (big-endian) is for
    /// TURN: ChannelData, or STUN of any method but Binding (which drivers
    /// answer on their stateless fast path).
    public static func isTURN(leadingBytes type: UInt16) -> Bool {
        let first = UInt8(truncatingIfNeeded: type >> 8)
        if first & 0xC0 == 0x40 { return true }
        return first & 0xC0 == 0 && type & 0x3EEF != 0x0001
    }

    /// The allocation of a 5-tuple, if any.
    public func allocation(for tuple: FiveTuple) -> TURNAllocation? { allocations[tuple] }

    /// The allocation a relay address serves, if any.
    public func allocation(relay: TransportAddress) -> TURNAllocation? { byRelay[relay] }

    // MARK: - From clients

    /// Handles a STUN message or ChannelData frame from a client. `bytes` is one
    /// datagram, or one frame cut from a stream.
    public func handleClient(_ bytes: UnsafeRawBufferPointer, from tuple: FiveTuple, now: Timestamp) -> TURNClientOutcome {
        guard let first = bytes.first else { return drop(.malformed) }
        if first & 0xC0 == 0x40 { return channelData(bytes, from: tuple, now: now) }
        guard first & 0xC0 == 0 else { return drop(.malformed) }
        let wire = [UInt8](bytes)
        let message: Message
        do { message = try Message(decoding: wire) } catch { return drop(.malformed) }
        if message.checkFingerprint() == .invalid { return drop(.badFingerprint) }
        switch message.type.messageClass {
        case .request: return request(message, size: wire.count, from: tuple, now: now)
        case .indication: return indication(message, from: tuple, now: now)
        default: return drop(.notARequest)
        }
    }

    /// Convenience for tests and tools: the same on an array.
    public func handleClient(_ bytes: [UInt8], from tuple: FiveTuple, now: Timestamp) -> TURNClientOutcome {
        bytes.withUnsafeBytes { handleClient($0, from: tuple, now: now) }
    }

    private func channelData(_ bytes: UnsafeRawBufferPointer, from tuple: FiveTuple, now: Timestamp) -> TURNClientOutcome {
        guard bytes.count >= 4 else { return drop(.malformed) }
        let number = UInt16(bytes[0]) << 8 | UInt16(bytes[1])
        let length = Int(UInt16(bytes[2]) << 8 | UInt16(bytes[3]))
        guard bytes.count >= 4 + length else { return drop(.malformed) }
        guard let a = allocations[tuple], a.expiry > now else { return drop(.noAllocation) }
        let peer: TransportAddress
        switch a.peer(ofChannel: number, now: now) {
        case .peer(let p): peer = p
        case .refused(let reason): return drop(reason)
        }
        guard a.admit(length, toPeer: true, now: now) else { return drop(.bandwidth) }
        count(a, toPeer: length)
        return .relay(a, to: peer, payload: 4..<(4 + length))
    }

    private func indication(_ m: Message, from tuple: FiveTuple, now: Timestamp) -> TURNClientOutcome {
        guard m.type.method == .send else { return drop(.unknownIndication) }
        guard let a = allocations[tuple], a.expiry > now else { return drop(.noAllocation) }
        guard m.unknownComprehensionRequired(known: Self.known).isEmpty,
            case .xorPeerAddress(let peer)? = try? m.value(.xorPeerAddress),
            let index = m.effectiveAttributes.firstIndex(where: { $0.type == .data }),
            let offset = m.wireOffset(of: index)
        else { return drop(.malformed) }
        guard a.serves(family: peer.ip.family) else { return drop(.peerFamily) }
        guard a.hasPermission(peer.ip, now: now) else { return drop(.noPermission) }
        guard !isOwn(peer, from: a) else { return drop(.ownAddress) }
        let length = m.attributes[index].value.count
        guard a.admit(length, toPeer: true, now: now) else { return drop(.bandwidth) }
        count(a, toPeer: length)
        return .relay(a, to: peer, payload: (offset + 4)..<(offset + 4 + length))
    }

    private func count(_ a: TURNAllocation, toPeer length: Int) {
        a.packetsToPeer += 1
        a.bytesToPeer += length
        statistics.packetsToPeer += 1
        statistics.bytesToPeer += length
    }

    // MARK: - From peers

    /// Handles a datagram from `peer` that arrived on one of `allocation`'s relays.
    public func handlePeer(
        _ payload: UnsafeRawBufferPointer, from peer: TransportAddress, allocation a: TURNAllocation, now: Timestamp
    ) -> TURNPeerOutcome {
        guard a.isAlive, a.expiry > now else { return drop(.noAllocation) }
        // Voice comes back through the channel it went out on: its peer, channel
        // and permission are the allocation's last used, with no lookup. A channel
        // in force implies its peer's permission.
        let channel = a.lastChannel(of: peer, now: now) ?? a.noteChannel(of: peer, now: now)
        guard channel != nil || a.hasPermission(peer.ip, now: now) else { return drop(.noPermission) }
        guard a.admit(payload.count, toPeer: false, now: now) else { return drop(.bandwidth) }
        a.packetsToClient += 1
        a.bytesToClient += payload.count
        statistics.packetsToClient += 1
        statistics.bytesToClient += payload.count
        if let number = channel {
            return .channel(number, to: a.tuple)
        }
        // XOR-PEER-ADDRESS (≤ 24 bytes) and the DATA header must fit the 16-bit length.
        guard payload.count <= 65_535 - 32 else { return drop(.tooLarge) }
        var m = Message(type: MessageType(method: .data, class: .indication))
        m.append(.xorPeerAddress(peer))
        m.append(.data([UInt8](payload)))
        return .indication(m.encode(), to: a.tuple)
    }

    public func handlePeer(_ payload: [UInt8], from peer: TransportAddress, allocation: TURNAllocation, now: Timestamp)
        -> TURNPeerOutcome
    {
        payload.withUnsafeBytes { handlePeer($0, from: peer, allocation: allocation, now: now) }
    }

    // MARK: - Time and connections

    /// Frees every expired allocation, permission, channel and reservation.
    /// Call about once a second.
    public func expire(now: Timestamp) {
        for (tuple, a) in allocations {
            if a.expiry <= now {
                delete(tuple, reason: "expired", now: now)
                statistics.allocationsExpired += 1
            } else {
                let gone = a.sweep(now: now)
                statistics.permissionsExpired += gone.permissions
                statistics.channelsExpired += gone.channels
            }
        }
        for (token, r) in reservations where r.expiry <= now {
            reservations[token] = nil
            release(reservationOf: r.owner)
            ports.closeRelay(r.address)
        }
    }

    /// Counts a drop the driver decided on (no relay socket, backpressure).
    public func recordDrop(_ reason: TURNDropReason) {
        statistics.drops[reason.rawValue] += 1
    }

    /// A relay socket could not be opened after all: the allocation it served goes.
    public func relayFailed(_ relay: TransportAddress, now: Timestamp) {
        if let a = byRelay[relay] { delete(a.tuple, reason: "relay socket failed", now: now) }
    }

    /// Server endpoints (listening sockets) a peer may not be: relaying to
    /// them would nest TURN in TURN and hide the real client. An unspecified
    /// IP matches any address of its family on that port.
    @exclusivity(unchecked) public var ownEndpoints: Set<TransportAddress> = []

    /// Whether a peer transport address is the server itself: a listening socket
    /// (TURN inside TURN), or the allocation's own relay. Another allocation's
    /// relay is a peer like any other: two clients that both must use this
    /// server (symmetric NATs on both sides, relay-only policies) meet relay to relay.
    func isOwn(_ peer: TransportAddress, from a: TURNAllocation) -> Bool {
        if a.relays.contains(peer) || ownEndpoints.contains(peer) { return true }
        for e in ownEndpoints where e.port == peer.port && e.ip.isUnspecified && e.ip.family == peer.ip.family {
            return true
        }
        return false
    }

    /// A client's TCP/TLS connection closed: its allocation goes with it (RFC 8656 §3.1).
    public func connectionClosed(_ tuple: FiveTuple, now: Timestamp) {
        if allocations[tuple] != nil { delete(tuple, reason: "connection closed", now: now) }
    }

    /// Deletes every allocation (shutdown).
    public func deleteAll(now: Timestamp) {
        for tuple in Array(allocations.keys) { delete(tuple, reason: "shutdown", now: now) }
        for (_, r) in reservations {
            release(reservationOf: r.owner)
            ports.closeRelay(r.address)
        }
        reservations = [:]
    }

    func delete(_ tuple: FiveTuple, reason: String, now: Timestamp) {
        guard let a = allocations.removeValue(forKey: tuple) else { return }
        a.isAlive = false
        // Whatever the driver does with its relays, the allocation keeps nothing alive.
        a.driverContext = nil
        a.lastChannel = nil
        for r in a.relays {
            byRelay[r] = nil
            ports.closeRelay(r)
        }
        release(reservationOf: a.username)
        statistics.allocationsActive = allocations.count
        if reason != "expired" { statistics.allocationsDeleted += 1 }
        report(
            .deleted(tuple, relays: a.relays, reason: reason, packetsToPeer: a.packetsToPeer, packetsToClient: a.packetsToClient))
    }

    /// One fewer allocation or held port for a user's quota.
    func release(reservationOf user: String) {
        if let n = perUser[user] { perUser[user] = n > 1 ? n - 1 : nil }
    }

    func drop<T>(_ reason: TURNDropReason) -> T where T: DropConvertible {
        statistics.drops[reason.rawValue] += 1
        return T.dropped(reason)
    }

    var unixNow: (Timestamp) -> UInt64 {
        let base = unixTimeAtZero
        return { base + $0.nanoseconds / 1_000_000_000 }
    }
}

protocol DropConvertible { static func dropped(_ reason: TURNDropReason) -> Self }
extension TURNClientOutcome: DropConvertible { static func dropped(_ r: TURNDropReason) -> Self { .drop(r) } }
extension TURNPeerOutcome: DropConvertible { static func dropped(_ r: TURNDropReason) -> Self { .drop(r) } }
