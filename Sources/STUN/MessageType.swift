/// The class of a STUN message (RFC 8489 §5).
public enum MessageClass: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    case request = 0
    case indication = 1
    case successResponse = 2
    case errorResponse = 3

    public var description: String {
        switch self {
        case .request: "request"
        case .indication: "indication"
        case .successResponse: "success response"
        case .errorResponse: "error response"
        }
    }
}

/// A STUN method: a 12-bit number (RFC 8489 §5, RFC 8656, RFC 6062).
public struct Method: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt16
    /// Methods are 12 bits; larger values are masked.
    public init(rawValue: UInt16) { self.rawValue = rawValue & 0x0FFF }

    public static let binding = Method(rawValue: 0x001)
    public static let allocate = Method(rawValue: 0x003)
    public static let refresh = Method(rawValue: 0x004)
    public static let send = Method(rawValue: 0x006)
    public static let data = Method(rawValue: 0x007)
    public static let createPermission = Method(rawValue: 0x008)
    public static let channelBind = Method(rawValue: 0x009)
    public static let connect = Method(rawValue: 0x00A)
    public static let connectionBind = Method(rawValue: 0x00B)
    public static let connectionAttempt = Method(rawValue: 0x00C)

    public var description: String {
        switch self {
        case .binding: "Binding"
        case .allocate: "Allocate"
        case .refresh: "Refresh"
        case .send: "Send"
        case .data: "Data"
        case .createPermission: "CreatePermission"
        case .channelBind: "ChannelBind"
        case .connect: "Connect"
        case .connectionBind: "ConnectionBind"
        case .connectionAttempt: "ConnectionAttempt"
        default: "Method(0x\(String(rawValue, radix: 16)))"
        }
    }
}

/// Method and class together, as packed into the 14-bit message type field.
public struct MessageType: Hashable, Sendable, CustomStringConvertible {
    public var method: Method
    public var messageClass: MessageClass

    public init(method: Method, class messageClass: MessageClass) {
        self.method = method
        self.messageClass = messageClass
    }

    /// Unpacks the 16-bit type field (the two top bits must already be known zero).
    public init(rawValue v: UInt16) {
        let m = (v & 0x000F) | ((v & 0x00E0) >> 1) | ((v & 0x3E00) >> 2)
        let c = ((v & 0x0010) >> 4) | ((v & 0x0100) >> 7)
        self.method = Method(rawValue: m)
        self.messageClass = MessageClass(rawValue: UInt8(c)) ?? .request
    }

    /// The 16-bit type field.
    public var rawValue: UInt16 {
        let m = method.rawValue
        let c = UInt16(messageClass.rawValue)
        return (m & 0x000F) | ((m & 0x0070) << 1) | ((m & 0x0F80) << 2) | ((c & 1) << 4) | ((c & 2) << 7)
    }

    public static let bindingRequest = MessageType(method: .binding, class: .request)
    public static let bindingSuccess = MessageType(method: .binding, class: .successResponse)
    public static let bindingError = MessageType(method: .binding, class: .errorResponse)
    public static let bindingIndication = MessageType(method: .binding, class: .indication)

    public var description: String { "\(method) \(messageClass)" }
}
