import STUN
import TusaBase

/// Why a TURN client operation failed.
public enum TURNClientError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The server refused the credentials (401 to a request that carried
    /// them), or its challenge could not be met (wrong realm, no usable
    /// password algorithm, a downgraded offer).
    case authenticationFailed(String)
    /// 437: the 5-tuple has another allocation (Allocate) or none (Refresh,
    /// CreatePermission, ChannelBind).
    case allocationMismatch(Method)
    /// 486: the server allows this user no more allocations.
    case quotaReached
    /// Any other error response: the method and the server's code and reason.
    case errorResponse(Method, ErrorCodeValue)
    /// No response in time: the transaction's retransmissions ran out.
    case timeout(Method)
    /// A response the client cannot use (a success without the attributes it must carry).
    case badResponse(String)
    /// The operation needs an allocation and there is none (yet, or any more).
    case notAllocated
    /// Data for a peer whose IP address has no permission (create one first).
    case noPermission(IPAddress)
    /// All 4096 channel numbers (0x4000–0x4FFF) have been used.
    case channelsExhausted
    /// The caller asked for something impossible (empty credentials, a payload too large, …).
    case invalidArgument(String)
    /// The client was closed, or deallocated, while the operation waited.
    case closed
    /// The network refused, or the connection to the server broke (drivers
    /// only): what failed, and the socket's error where there was one.
    case transport(String, ErrorCause?)

    public var description: String {
        switch self {
        case .authenticationFailed(let why): "authentication failed: \(why)"
        case .allocationMismatch(let method): "\(method) failed: 437 allocation mismatch"
        case .quotaReached: "Allocate failed: 486 allocation quota reached"
        case .errorResponse(let method, let error): "\(method) failed: \(error.code) \(error.reason)"
        case .timeout(let method): "no response to \(method) (timed out)"
        case .badResponse(let why): "bad response: \(why)"
        case .notAllocated: "no allocation"
        case .noPermission(let ip): "no permission for \(ip)"
        case .channelsExhausted: "no channel numbers left"
        case .invalidArgument(let why): why
        case .closed: "client closed"
        case .transport(let what, nil): what
        case .transport(let what, let cause?): "\(what): \(cause)"
        }
    }
}

/// A relayed transport address granted by a TURN server.
public struct TURNClientAllocation: Hashable, Sendable {
    /// XOR-RELAYED-ADDRESS: where peers send to reach this client. A dual-stack
    /// allocation (RFC 8656 ADDITIONAL-ADDRESS-FAMILY) has a second one in ``additionalRelayed``.
    public var relayed: TransportAddress
    public var additionalRelayed: [TransportAddress]
    /// XOR-MAPPED-ADDRESS: this client's address as the server sees it (server-reflexive).
    public var mapped: TransportAddress?
    /// The lifetime the server granted in its last Allocate or Refresh answer.
    public var lifetime: Duration
    /// When the allocation ends unless refreshed.
    public var expiresAt: Timestamp

    public init(
        relayed: TransportAddress, additionalRelayed: [TransportAddress] = [], mapped: TransportAddress?,
        lifetime: Duration, expiresAt: Timestamp
    ) {
        self.relayed = relayed
        self.additionalRelayed = additionalRelayed
        self.mapped = mapped
        self.lifetime = lifetime
        self.expiresAt = expiresAt
    }
}

extension TURNClient {
    /// Names one operation the application started (allocate, permission,
    /// channel, deallocate); its outcome event carries the same ID.
    public struct OperationID: Hashable, Sendable, CustomStringConvertible {
        public let rawValue: UInt64
        public init(rawValue: UInt64) { self.rawValue = rawValue }
        public var description: String { "#\(rawValue)" }
    }

    /// Application data from a peer, unwrapped from ChannelData or a Data indication.
    public struct Datagram: Hashable, Sendable {
        public var peer: TransportAddress
        public var payload: [UInt8]
        /// The channel it came on; nil for a Data indication.
        public var channel: UInt16?

        public init(peer: TransportAddress, payload: [UInt8], channel: UInt16? = nil) {
            self.peer = peer
            self.payload = payload
            self.channel = channel
        }
    }

    /// What happened, for the driver to pass on (``TURNClient/pollEvent()``).
    public enum Event: Hashable, Sendable {
        /// ``TURNClient/allocate(now:)`` succeeded.
        case allocated(OperationID, TURNClientAllocation)
        /// ``TURNClient/refresh(now:)`` succeeded: the server still holds the
        /// allocation, which now lasts until its `expiresAt`.
        case confirmed(OperationID, TURNClientAllocation)
        /// ``TURNClient/createPermission(for:now:)`` succeeded.
        case permissionsCreated(OperationID, [IPAddress])
        /// ``TURNClient/bindChannel(to:now:)`` succeeded.
        case channelBound(OperationID, ChannelNumber, peer: TransportAddress)
        /// ``TURNClient/deallocate(now:)`` finished (the server confirmed, or there was nothing to release).
        case deallocated(OperationID)
        /// An operation failed.
        case failed(OperationID, TURNClientError)
        /// The allocation was refreshed (on the client's own, or asked by
        /// ``TURNClient/refresh(now:)``); it now lasts until `expiresAt`.
        case refreshed(lifetime: Duration, expiresAt: Timestamp)
        /// The allocation is gone: a refresh failed or it expired. Nothing more can be relayed.
        case allocationLost(TURNClientError)
        /// A permission could not be refreshed and is gone.
        case permissionLost(IPAddress, TURNClientError)
        /// A channel binding could not be refreshed and is gone (data to the peer falls back to Send indications while its permission lasts).
        case channelLost(ChannelNumber, peer: TransportAddress, TURNClientError)

        /// The application's operation this event ends, if any.
        public var operation: OperationID? {
            switch self {
            case .allocated(let id, _), .confirmed(let id, _), .permissionsCreated(let id, _), .channelBound(let id, _, _),
                .deallocated(let id), .failed(let id, _):
                id
            case .refreshed, .allocationLost, .permissionLost, .channelLost: nil
            }
        }
    }

    /// Settings of one client.
    public struct Configuration: Hashable, Sendable {
        /// Long-term credentials (RFC 8489 §9.2).
        public var username: String
        public var password: String
        /// The realm the server must name; nil accepts whatever its challenge says.
        public var realm: String?
        /// UDP (`.unreliable`, retransmissions) or TCP/TLS (`.reliable`: one
        /// transmission, and ChannelData padded to four bytes as streams need).
        public var reliability: ClientTransaction.Reliability
        /// LIFETIME asked for in Allocate and Refresh, in seconds; nil leaves it to the server (600 s by default).
        public var lifetime: UInt32?
        /// REQUESTED-ADDRESS-FAMILY: 0x01 IPv4, 0x02 IPv6; nil for the server's default (IPv4).
        public var addressFamily: UInt8?
        /// Ask for DONT-FRAGMENT in Allocate (retried without it if the server answers 420).
        public var dontFragment: Bool
        /// A SOFTWARE attribute for requests.
        public var software: String?
        /// Append FINGERPRINT to requests and Send indications.
        public var fingerprint: Bool
        /// How often a permission is refreshed (it lasts 300 s on the server).
        public var permissionRefreshInterval: Duration
        /// How often a channel binding is refreshed (it lasts 600 s on the server).
        public var channelRefreshInterval: Duration
        /// How many 438 (Stale Nonce) answers one operation may take in a row.
        public var staleNonceRetries: Int

        public init(
            username: String, password: String, realm: String? = nil,
            reliability: ClientTransaction.Reliability = .unreliable(), lifetime: UInt32? = 600,
            addressFamily: UInt8? = nil, dontFragment: Bool = false, software: String? = nil,
            fingerprint: Bool = true, permissionRefreshInterval: Duration = .seconds(240),
            channelRefreshInterval: Duration = .seconds(480), staleNonceRetries: Int = 3
        ) {
            self.username = username
            self.password = password
            self.realm = realm
            self.reliability = reliability
            self.lifetime = lifetime
            self.addressFamily = addressFamily
            self.dontFragment = dontFragment
            self.software = software
            self.fingerprint = fingerprint
            self.permissionRefreshInterval = permissionRefreshInterval
            self.channelRefreshInterval = channelRefreshInterval
            self.staleNonceRetries = staleNonceRetries
        }

        /// Whether the transport is a byte stream (ChannelData is then padded).
        public var isStream: Bool {
            if case .reliable = reliability { true } else { false }
        }
    }
}
