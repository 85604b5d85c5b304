import STUN
import TusaBase

/// The transport of a TURN client's connection to the server.
public enum TURNTransport: UInt8, Hashable, Sendable, CustomStringConvertible {
    case udp, tcp, tls

    /// Whether the transport is a byte stream (ChannelData is padded to 4 bytes on it).
    public var isStream: Bool { self != .udp }
    public var description: String {
        switch self {
        case .udp: "udp"
        case .tcp: "tcp"
        case .tls: "tls"
        }
    }
}

/// The 5-tuple that names an allocation (RFC 8656 §2): the client's address,
/// the server address it reached, and the transport.
public struct FiveTuple: Hashable, Sendable, CustomStringConvertible {
    public var client: TransportAddress
    public var server: TransportAddress
    public var transport: TURNTransport

    public init(client: TransportAddress, server: TransportAddress, transport: TURNTransport) {
        self.client = client
        self.server = server
        self.transport = transport
    }

    public var description: String { "\(transport) \(client) -> \(server)" }
}

/// Long-term and REST-API credentials a TURN server accepts.
public struct TURNCredentials: Hashable, Sendable {
    struct User: Hashable, Sendable {
        var md5: IntegrityKey
        /// Nil when the user was given as a precomputed MD5 key (coturn's `0x…` form).
        var sha256: IntegrityKey?
    }

    public let realm: String
    var users: [String: User] = [:]
    var userhashes: [[UInt8]: String] = [:]
    /// coturn `--static-auth-secret` values; any of them may sign a REST username.
    public var restSecrets: [String] = []

    public init(realm: String) {
        self.realm = realm
    }

    public var isEmpty: Bool { users.isEmpty && restSecrets.isEmpty }
    public var userCount: Int { users.count }

    /// Adds a user with a plain password.
    public mutating func addUser(_ name: String, password: String) throws(STUNError) {
        let md5 = try IntegrityKey.longTerm(username: name, realm: realm, password: password, algorithm: .md5)
        let sha = try IntegrityKey.longTerm(username: name, realm: realm, password: password, algorithm: .sha256)
        users[name] = User(md5: md5, sha256: sha)
        userhashes[try IntegrityKey.userhash(username: name, realm: realm)] = name
    }

    /// Adds a user from coturn's `name:0xHEX` form: the MD5 key itself, in hex.
    public mutating func addUser(_ name: String, md5KeyHex: String) throws(STUNError) {
        let hex = Array(md5KeyHex.utf8)
        guard hex.count == 32 else { throw STUNError(.badCredentials, "user \(name): a 0x key must be 32 hex digits") }
        var key: [UInt8] = []
        for i in stride(from: 0, to: 32, by: 2) {
            guard let a = StatelessNonce.hexValue(hex[i] | 0x20), let b = StatelessNonce.hexValue(hex[i + 1] | 0x20) else {
                throw STUNError(.badCredentials, "user \(name): the key is not hex")
            }
            key.append(a << 4 | b)
        }
        users[name] = User(md5: IntegrityKey(bytes: key), sha256: nil)
        userhashes[try IntegrityKey.userhash(username: name, realm: realm)] = name
    }

    /// Parses a coturn `-u` / `user=` value: `name:password` or `name:0xMD5KEY`.
    public mutating func addUser(spec: String) throws(STUNError) {
        guard let colon = spec.firstIndex(of: ":"), colon != spec.startIndex else {
            throw STUNError(.badCredentials, "user '\(spec)' is not NAME:PASSWORD")
        }
        let name = String(spec[..<colon])
        let secret = String(spec[spec.index(after: colon)...])
        guard !secret.isEmpty else { throw STUNError(.badCredentials, "user '\(name)' has an empty password") }
        do {
            if secret.hasPrefix("0x") && secret.count == 34 {
                try addUser(name, md5KeyHex: String(secret.dropFirst(2)))
            } else {
                try addUser(name, password: secret)
            }
        } catch  where !error.message.hasPrefix("user ") {
            throw STUNError(error.code, "user '\(name)': \(error.message)")
        }
    }

    /// The username a USERHASH stands for (static users only).
    func username(forUserhash hash: [UInt8]) -> String? { userhashes[hash] }

    /// The keys that may have signed a request from `username`: the static
    /// user's, or one per REST secret when the username has not expired.
    func keys(for username: String, algorithm: PasswordAlgorithm, unixNow: UInt64) -> [IntegrityKey] {
        if let user = users[username] {
            return [algorithm == .sha256 ? user.sha256 : user.md5].compactMap { $0 }
        }
        guard !restSecrets.isEmpty, let expiry = RESTCredentials.expiry(of: username), expiry >= unixNow else { return [] }
        return restSecrets.compactMap { secret in
            let password = RESTCredentials.password(secret: secret, username: username)
            return try? IntegrityKey.longTerm(username: username, realm: realm, password: password, algorithm: algorithm)
        }
    }
}

/// What a TURN server allows and how long things live. Defaults follow RFC
/// 8656 and coturn where they are safe, and are stricter where coturn's are not.
public struct TURNServerConfiguration: Hashable, Sendable {
    public var realm: String
    /// SOFTWARE in authenticated responses (never in unauthenticated ones, to keep them small).
    public var software: String?
    public var credentials: TURNCredentials
    /// Serve without authentication (only when asked for).
    public var anonymous = false

    /// RFC 8656 §3.2: 10 minutes, at most an hour.
    public var defaultLifetime: UInt32 = 600
    public var maxLifetime: UInt32 = 3600
    public var permissionLifetime: Duration = .seconds(300)
    public var channelLifetime: Duration = .seconds(600)
    /// How long a RESERVATION-TOKEN holds the next port (RFC 8656 §7.2: about 30 s).
    public var reservationLifetime: Duration = .seconds(30)
    public var nonceLifetime: Duration = .seconds(600)
    /// The key of the stateless nonces; random per start unless set (several
    /// server processes behind one address need the same one).
    public var nonceSecret: [UInt8] = StatelessNonce.randomSecret()

    public var peerFilter = PeerFilter()
    /// Allocations one username may hold at once (0: no limit).
    public var userQuota = 1000
    /// Allocations the whole server holds at once (0: no limit).
    public var totalQuota = 100_000
    /// Bytes per second each allocation may relay in each direction (0: no limit).
    public var maxBandwidth = 0
    /// Channel numbers ChannelBind accepts. RFC 8656 allows 0x4000–0x4FFF;
    /// RFC 5766 allowed up to 0x7FFF and clients still pick from there
    /// (coturn's own turnutils_uclient does), so that is the default. On the
    /// server's sockets only TURN arrives, so the wider range costs no demultiplexing.
    public var channelNumbers: ClosedRange<UInt16> = 0x4000...0x7FFF
    /// Channels one allocation may bind.
    public var maxChannelsPerAllocation = 256
    /// Permissions one allocation may hold.
    public var maxPermissionsPerAllocation = 256
    /// 401/438 answers per second one source IP may get, and the burst above
    /// that: enough for a hundred clients behind one NAT starting at once.
    public var challengeRate: Double = 100
    public var challengeBurst: Double = 200
    /// When true, a 401/438 challenge larger than its request is dropped instead
    /// of sent (no amplification at all; breaks clients that send tiny
    /// requests, such as aioice's 36-byte Allocate).
    public var strictAmplification = false

    /// The relay address to advertise per family instead of the bound one
    /// (`--external-ip` for a server behind 1:1 NAT).
    public var externalIP: [UInt8: IPAddress] = [:]
    /// Unix time (seconds) at `Timestamp.zero` of the clock the server is driven
    /// with; REST usernames carry Unix expiry times (``TURNServer/unixTimeAtZero``
    /// follows the system clock from there).
    public var unixTimeAtZero: UInt64 = 0

    public init(realm: String = "tusa", credentials: TURNCredentials? = nil) {
        self.realm = realm
        self.credentials = credentials ?? TURNCredentials(realm: realm)
    }
}
