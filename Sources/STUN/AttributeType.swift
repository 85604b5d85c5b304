/// A STUN attribute type (IANA "STUN Attributes" registry).
///
/// Types below 0x8000 are comprehension-required: a receiver that does not know
/// one must reject the request with 420 (Unknown Attribute).
public struct AttributeType: RawRepresentable, Hashable, Sendable, Comparable, CustomStringConvertible {
    public let rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }

    public var isComprehensionRequired: Bool { rawValue < 0x8000 }

    public static func < (a: AttributeType, b: AttributeType) -> Bool { a.rawValue < b.rawValue }

    // RFC 8489
    public static let mappedAddress = AttributeType(rawValue: 0x0001)
    public static let username = AttributeType(rawValue: 0x0006)
    public static let messageIntegrity = AttributeType(rawValue: 0x0008)
    public static let errorCode = AttributeType(rawValue: 0x0009)
    public static let unknownAttributes = AttributeType(rawValue: 0x000A)
    public static let realm = AttributeType(rawValue: 0x0014)
    public static let nonce = AttributeType(rawValue: 0x0015)
    public static let messageIntegritySHA256 = AttributeType(rawValue: 0x001C)
    public static let passwordAlgorithm = AttributeType(rawValue: 0x001D)
    public static let userhash = AttributeType(rawValue: 0x001E)
    public static let xorMappedAddress = AttributeType(rawValue: 0x0020)
    public static let passwordAlgorithms = AttributeType(rawValue: 0x8002)
    public static let alternateDomain = AttributeType(rawValue: 0x8003)
    public static let software = AttributeType(rawValue: 0x8022)
    public static let alternateServer = AttributeType(rawValue: 0x8023)
    public static let fingerprint = AttributeType(rawValue: 0x8028)
    // RFC 3489 (deprecated; recognised so they can be refused by name)
    public static let responseAddress = AttributeType(rawValue: 0x0002)
    public static let sourceAddress = AttributeType(rawValue: 0x0004)
    public static let changedAddress = AttributeType(rawValue: 0x0005)
    public static let password = AttributeType(rawValue: 0x0007)
    public static let reflectedFrom = AttributeType(rawValue: 0x000B)
    // RFC 8656 (TURN)
    public static let channelNumber = AttributeType(rawValue: 0x000C)
    public static let lifetime = AttributeType(rawValue: 0x000D)
    public static let xorPeerAddress = AttributeType(rawValue: 0x0012)
    public static let data = AttributeType(rawValue: 0x0013)
    public static let xorRelayedAddress = AttributeType(rawValue: 0x0016)
    public static let requestedAddressFamily = AttributeType(rawValue: 0x0017)
    public static let evenPort = AttributeType(rawValue: 0x0018)
    public static let requestedTransport = AttributeType(rawValue: 0x0019)
    public static let dontFragment = AttributeType(rawValue: 0x001A)
    public static let reservationToken = AttributeType(rawValue: 0x0022)
    public static let additionalAddressFamily = AttributeType(rawValue: 0x8000)
    public static let addressErrorCode = AttributeType(rawValue: 0x8001)
    public static let icmp = AttributeType(rawValue: 0x8004)
    // RFC 7635
    public static let accessToken = AttributeType(rawValue: 0x001B)
    // RFC 8445 (ICE)
    public static let priority = AttributeType(rawValue: 0x0024)
    public static let useCandidate = AttributeType(rawValue: 0x0025)
    public static let iceControlled = AttributeType(rawValue: 0x8029)
    public static let iceControlling = AttributeType(rawValue: 0x802A)
    // RFC 5780 (NAT behaviour discovery)
    public static let changeRequest = AttributeType(rawValue: 0x0003)
    public static let padding = AttributeType(rawValue: 0x0026)
    public static let responsePort = AttributeType(rawValue: 0x0027)
    public static let responseOrigin = AttributeType(rawValue: 0x802B)
    public static let otherAddress = AttributeType(rawValue: 0x802C)
    // RFC 6062 (TURN TCP)
    public static let connectionID = AttributeType(rawValue: 0x002A)

    static let names: [UInt16: String] = [
        0x0001: "MAPPED-ADDRESS", 0x0002: "RESPONSE-ADDRESS", 0x0003: "CHANGE-REQUEST",
        0x0004: "SOURCE-ADDRESS", 0x0005: "CHANGED-ADDRESS", 0x0006: "USERNAME",
        0x0007: "PASSWORD", 0x0008: "MESSAGE-INTEGRITY", 0x0009: "ERROR-CODE",
        0x000A: "UNKNOWN-ATTRIBUTES", 0x000B: "REFLECTED-FROM", 0x000C: "CHANNEL-NUMBER",
        0x000D: "LIFETIME", 0x0012: "XOR-PEER-ADDRESS", 0x0013: "DATA", 0x0014: "REALM",
        0x0015: "NONCE", 0x0016: "XOR-RELAYED-ADDRESS", 0x0017: "REQUESTED-ADDRESS-FAMILY",
        0x0018: "EVEN-PORT", 0x0019: "REQUESTED-TRANSPORT", 0x001A: "DONT-FRAGMENT",
        0x001B: "ACCESS-TOKEN", 0x001C: "MESSAGE-INTEGRITY-SHA256", 0x001D: "PASSWORD-ALGORITHM",
        0x001E: "USERHASH", 0x0020: "XOR-MAPPED-ADDRESS", 0x0022: "RESERVATION-TOKEN",
        0x0024: "PRIORITY", 0x0025: "USE-CANDIDATE", 0x0026: "PADDING", 0x0027: "RESPONSE-PORT",
        0x002A: "CONNECTION-ID", 0x8000: "ADDITIONAL-ADDRESS-FAMILY", 0x8001: "ADDRESS-ERROR-CODE",
        0x8002: "PASSWORD-ALGORITHMS", 0x8003: "ALTERNATE-DOMAIN", 0x8004: "ICMP",
        0x8022: "SOFTWARE", 0x8023: "ALTERNATE-SERVER", 0x8028: "FINGERPRINT",
        0x8029: "ICE-CONTROLLED", 0x802A: "ICE-CONTROLLING", 0x802B: "RESPONSE-ORIGIN",
        0x802C: "OTHER-ADDRESS",
    ]

    /// Whether this library has a typed value for the attribute.
    public var isKnown: Bool { Self.names[rawValue] != nil }

    public var description: String {
        Self.names[rawValue] ?? "0x" + String(rawValue, radix: 16, uppercase: true)
    }
}
