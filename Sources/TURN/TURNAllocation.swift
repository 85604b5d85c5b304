import STUN
import TusaBase

/// One TURN allocation (RFC 8656 §2.2): a relayed transport address (two with
/// ADDITIONAL-ADDRESS-FAMILY), its client's 5-tuple, credentials, lifetime,
/// permissions and channels. Owned by ``TURNServer``; drivers keep a reference
/// to it per relay socket so the hot path needs no lookup.
public final class TURNAllocation {
    public let tuple: FiveTuple
    public let username: String
    /// The relayed transport addresses as bound (IPv4 and/or IPv6).
    public let relays: [TransportAddress]

    /// The relayed address that sends to `peer`: the one of the peer's family (an
    /// allocation with ADDITIONAL-ADDRESS-FAMILY has one of each), else the first.
    public func relay(toward peer: TransportAddress) -> TransportAddress? {
        relays.first { $0.ip.family == peer.ip.family } ?? relays.first
    }
    /// Whether the client asked for DONT-FRAGMENT.
    public let dontFragment: Bool
    @exclusivity(unchecked) public internal(set) var expiry: Timestamp
    /// False once deleted or expired: drivers drop what arrives after that.
    @exclusivity(unchecked) public internal(set) var isAlive = true

    let key: IntegrityKey?
    let allocateTransaction: TransactionID
    let allocateResponse: [UInt8]

    @exclusivity(unchecked) var permissions: [IPAddress: Timestamp] = [:] {
        didSet { lastChannel = nil }
    }
    @exclusivity(unchecked) var channels: [UInt16: (peer: TransportAddress, expiry: Timestamp)] = [:] {
        didSet { lastChannel = nil }
    }
    @exclusivity(unchecked) var channelByPeer: [TransportAddress: UInt16] = [:] {
        didSet { lastChannel = nil }
    }
    /// The channel a relayed packet last went through, with when it stops being
    /// usable (its binding's or its peer's permission's expiry, whichever comes
    /// first): voice uses one channel for hours, and this spares the hot path the
    /// lookups of the channel and the permission. Forgotten whenever a channel or
    /// a permission is added, refreshed or removed.
    @exclusivity(unchecked) var lastChannel: (number: UInt16, peer: TransportAddress, until: Timestamp)?
    /// For the driver: what it keeps per allocation for its hot path (a relay
    /// keeps its relay socket here), so that a relayed packet needs no lookup of
    /// its own. The core never reads it, and clears it when the allocation is
    /// deleted; a driver that sets it clears it too when the relay closes
    /// (``TURNRelayPorts/closeRelay(_:)``).
    @exclusivity(unchecked) public var driverContext: AnyObject?
    /// Bandwidth budgets, one per direction.
    @exclusivity(unchecked) var toPeerBucket: TokenBucket?
    @exclusivity(unchecked) var toClientBucket: TokenBucket?

    @exclusivity(unchecked) public internal(set) var packetsToPeer = 0
    @exclusivity(unchecked) public internal(set) var bytesToPeer = 0
    @exclusivity(unchecked) public internal(set) var packetsToClient = 0
    @exclusivity(unchecked) public internal(set) var bytesToClient = 0

    init(
        tuple: FiveTuple, username: String, relays: [TransportAddress], dontFragment: Bool, expiry: Timestamp,
        key: IntegrityKey?, allocateTransaction: TransactionID, allocateResponse: [UInt8], bandwidth: Int, now: Timestamp
    ) {
        self.tuple = tuple
        self.username = username
        self.relays = relays
        self.dontFragment = dontFragment
        self.expiry = expiry
        self.key = key
        self.allocateTransaction = allocateTransaction
        self.allocateResponse = allocateResponse
        let bucket = bandwidth > 0 ? TokenBucket(rate: Double(bandwidth), burst: Double(bandwidth), now: now) : nil
        self.toPeerBucket = bucket
        self.toClientBucket = bucket
    }

    /// Whether the allocation has a relay of this address family.
    public func serves(family: UInt8) -> Bool { relays.contains { $0.ip.family == family } }

    public var permissionCount: Int { permissions.count }
    public var channelCount: Int { channels.count }

    func hasPermission(_ ip: IPAddress, now: Timestamp) -> Bool {
        guard let t = permissionExpiry(ip) else { return false }
        return t > now
    }

    /// The expiry of the permission that covers `ip`, if any.
    func permissionExpiry(_ ip: IPAddress) -> Timestamp? {
        if let t = permissions[ip] { return t }
        // An IPv4-mapped peer is the same peer as its IPv4 address.
        if let v4 = ip.embeddedIPv4 { return permissions[v4] }
        return nil
    }

    /// The peer of channel `number` when the channel and the peer's permission
    /// are both in force at `now`: `.noChannel` or `.noPermission` otherwise.
    func peer(ofChannel number: UInt16, now: Timestamp) -> ChannelPeer {
        if let last = lastChannel, last.number == number, last.until > now { return .peer(last.peer) }
        guard let binding = channels[number], binding.expiry > now else { return .refused(.noChannel) }
        guard let permitted = permissionExpiry(binding.peer.ip), permitted > now else { return .refused(.noPermission) }
        lastChannel = (number, binding.peer, min(binding.expiry, permitted))
        return .peer(binding.peer)
    }

    enum ChannelPeer {
        case peer(TransportAddress)
        case refused(TURNDropReason)
    }

    /// Whether the last channel used is `peer`'s and in force at `now`, with its
    /// permission: then `peer` is permitted and that channel is its own.
    func lastChannel(of peer: TransportAddress, now: Timestamp) -> UInt16? {
        guard let last = lastChannel, last.peer == peer, last.until > now else { return nil }
        return last.number
    }

    /// Remembers `peer`'s channel, if it has one in force, as the last used.
    func noteChannel(of peer: TransportAddress, now: Timestamp) -> UInt16? {
        guard let number = channelByPeer[peer], let binding = channels[number], binding.expiry > now,
            let permitted = permissionExpiry(peer.ip), permitted > now
        else { return nil }
        lastChannel = (number, peer, min(binding.expiry, permitted))
        return number
    }

    /// Removes what has expired; returns how many permissions and channels went.
    func sweep(now: Timestamp) -> (permissions: Int, channels: Int) {
        let p = permissions.count
        if permissions.values.contains(where: { $0 <= now }) { permissions = permissions.filter { $0.value > now } }
        var c = 0
        for (number, binding) in channels where binding.expiry <= now {
            channels[number] = nil
            channelByPeer[binding.peer] = nil
            c += 1
        }
        return (p - permissions.count, c)
    }

    func admit(_ bytes: Int, toPeer: Bool, now: Timestamp) -> Bool {
        if toPeer {
            guard var b = toPeerBucket else { return true }
            defer { toPeerBucket = b }
            return b.take(Double(bytes), now: now)
        } else {
            guard var b = toClientBucket else { return true }
            defer { toClientBucket = b }
            return b.take(Double(bytes), now: now)
        }
    }
}
