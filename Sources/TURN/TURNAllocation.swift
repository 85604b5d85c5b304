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

    @exclusivity(unchecked) var permissions: [IPAddress: Timestamp] = [:]
    @exclusivity(unchecked) var channels: [UInt16: (peer: TransportAddress, expiry: Timestamp)] = [:]
    @exclusivity(unchecked) var channelByPeer: [TransportAddress: UInt16] = [:]
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
        if let t = permissions[ip] { return t > now }
        // An IPv4-mapped peer is the same peer as its IPv4 address.
        if let v4 = ip.embeddedIPv4, let t = permissions[v4] { return t > now }
        return false
    }

    func channel(for peer: TransportAddress, now: Timestamp) -> UInt16? {
        guard let number = channelByPeer[peer], let binding = channels[number], binding.expiry > now else { return nil }
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
