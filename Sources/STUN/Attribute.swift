import TusaBase

/// An attribute as it appears on the wire: its type and its value bytes (no padding).
///
/// ``Message`` keeps attributes in this form, so that encoding a decoded message
/// reproduces the original bytes; ``Attribute`` gives the typed view.
public struct RawAttribute: Hashable, Sendable {
    public var type: AttributeType
    public var value: [UInt8]

    public init(type: AttributeType, value: [UInt8]) {
        self.type = type
        self.value = value
    }
}

/// The RFC 5780 CHANGE-REQUEST flags.
public struct ChangeRequest: OptionSet, Hashable, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    public static let changeIP = ChangeRequest(rawValue: 0x4)
    public static let changePort = ChangeRequest(rawValue: 0x2)
}

/// An ERROR-CODE or ADDRESS-ERROR-CODE value: a code 300–699 and a reason phrase.
public struct ErrorCodeValue: Hashable, Sendable, CustomStringConvertible {
    public var code: Int
    public var reason: String

    public init(code: Int, reason: String) {
        self.code = code
        self.reason = reason
    }

    public var description: String { "\(code) \(reason)" }

    public static let tryAlternate = 300
    public static let badRequest = 400
    public static let unauthenticated = 401
    public static let forbidden = 403
    public static let unknownAttribute = 420
    public static let allocationMismatch = 437
    public static let staleNonce = 438
    public static let addressFamilyNotSupported = 440
    public static let wrongCredentials = 441
    public static let unsupportedTransportProtocol = 442
    public static let peerAddressFamilyMismatch = 443
    public static let allocationQuotaReached = 486
    public static let serverError = 500
    public static let insufficientCapacity = 508

    /// The reason phrase RFC 8489 and RFC 8656 suggest for a code.
    public static func defaultReason(_ code: Int) -> String {
        switch code {
        case 300: "Try Alternate"
        case 400: "Bad Request"
        case 401: "Unauthenticated"
        case 403: "Forbidden"
        case 420: "Unknown Attribute"
        case 437: "Allocation Mismatch"
        case 438: "Stale Nonce"
        case 440: "Address Family not Supported"
        case 441: "Wrong Credentials"
        case 442: "Unsupported Transport Protocol"
        case 443: "Peer Address Family Mismatch"
        case 486: "Allocation Quota Reached"
        case 500: "Server Error"
        case 508: "Insufficient Capacity"
        default: "Error"
        }
    }
}

/// A PASSWORD-ALGORITHM entry (RFC 8489 §14.11, §18.5).
public struct PasswordAlgorithm: Hashable, Sendable {
    public var number: UInt16
    public var parameters: [UInt8]

    public init(number: UInt16, parameters: [UInt8] = []) {
        self.number = number
        self.parameters = parameters
    }

    public static let md5 = PasswordAlgorithm(number: 0x0001)
    public static let sha256 = PasswordAlgorithm(number: 0x0002)
}

/// The ICMP attribute of RFC 8656 §18.14.
public struct ICMPValue: Hashable, Sendable {
    public var type: UInt8
    public var code: UInt8
    public var errorData: UInt32

    public init(type: UInt8, code: UInt8, errorData: UInt32) {
        self.type = type
        self.code = code
        self.errorData = errorData
    }
}

/// A typed STUN attribute. Every attribute of RFC 8489, RFC 8656, RFC 8445,
/// RFC 5780 and RFC 6062 has a case; RFC 7635's ACCESS-TOKEN and anything
/// unknown pass through as bytes.
public enum Attribute: Hashable, Sendable {
    // Addresses (XOR-ed ones are stored in the clear).
    case mappedAddress(TransportAddress)
    case xorMappedAddress(TransportAddress)
    case xorPeerAddress(TransportAddress)
    case xorRelayedAddress(TransportAddress)
    case alternateServer(TransportAddress)
    case responseOrigin(TransportAddress)
    case otherAddress(TransportAddress)
    /// RFC 3489 legacy address attributes, kept so they can be named and refused.
    case legacyAddress(AttributeType, TransportAddress)
    // Authentication
    case username(String)
    case realm(String)
    case nonce(String)
    case userhash([UInt8])
    case messageIntegrity([UInt8])
    case messageIntegritySHA256([UInt8])
    case passwordAlgorithm(PasswordAlgorithm)
    case passwordAlgorithms([PasswordAlgorithm])
    case fingerprint(UInt32)
    case accessToken([UInt8])
    case legacyPassword([UInt8])
    // Errors and information
    case errorCode(ErrorCodeValue)
    case unknownAttributes([AttributeType])
    case software(String)
    case alternateDomain(String)
    // TURN
    case channelNumber(UInt16)
    case lifetime(UInt32)
    case data([UInt8])
    case requestedAddressFamily(UInt8)
    case additionalAddressFamily(UInt8)
    /// EVEN-PORT with its R bit (reserve the next port too).
    case evenPort(reserveNext: Bool)
    /// REQUESTED-TRANSPORT's protocol number (17 for UDP, 6 for TCP).
    case requestedTransport(UInt8)
    case dontFragment
    case reservationToken(UInt64)
    case addressErrorCode(family: UInt8, ErrorCodeValue)
    case icmp(ICMPValue)
    case connectionID(UInt32)
    // ICE
    case priority(UInt32)
    case useCandidate
    case iceControlled(UInt64)
    case iceControlling(UInt64)
    // RFC 5780
    case changeRequest(ChangeRequest)
    case padding([UInt8])
    case responsePort(UInt16)
    /// Anything else, kept as it arrived.
    case unknown(RawAttribute)

    /// The attribute's type number.
    public var type: AttributeType {
        switch self {
        case .mappedAddress: .mappedAddress
        case .xorMappedAddress: .xorMappedAddress
        case .xorPeerAddress: .xorPeerAddress
        case .xorRelayedAddress: .xorRelayedAddress
        case .alternateServer: .alternateServer
        case .responseOrigin: .responseOrigin
        case .otherAddress: .otherAddress
        case .legacyAddress(let t, _): t
        case .username: .username
        case .realm: .realm
        case .nonce: .nonce
        case .userhash: .userhash
        case .messageIntegrity: .messageIntegrity
        case .messageIntegritySHA256: .messageIntegritySHA256
        case .passwordAlgorithm: .passwordAlgorithm
        case .passwordAlgorithms: .passwordAlgorithms
        case .fingerprint: .fingerprint
        case .accessToken: .accessToken
        case .legacyPassword: .password
        case .errorCode: .errorCode
        case .unknownAttributes: .unknownAttributes
        case .software: .software
        case .alternateDomain: .alternateDomain
        case .channelNumber: .channelNumber
        case .lifetime: .lifetime
        case .data: .data
        case .requestedAddressFamily: .requestedAddressFamily
        case .additionalAddressFamily: .additionalAddressFamily
        case .evenPort: .evenPort
        case .requestedTransport: .requestedTransport
        case .dontFragment: .dontFragment
        case .reservationToken: .reservationToken
        case .addressErrorCode: .addressErrorCode
        case .icmp: .icmp
        case .connectionID: .connectionID
        case .priority: .priority
        case .useCandidate: .useCandidate
        case .iceControlled: .iceControlled
        case .iceControlling: .iceControlling
        case .changeRequest: .changeRequest
        case .padding: .padding
        case .responsePort: .responsePort
        case .unknown(let raw): raw.type
        }
    }
}
