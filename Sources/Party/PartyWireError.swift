/// Why bytes from the network are not a party frame or message.
public enum PartyWireError: Error, Hashable, Sendable, CustomStringConvertible {
    case truncated(String)
    case unknownType(UInt8)
    case malformed(String)

    public var description: String {
        switch self {
        case .truncated(let what): "truncated \(what)"
        case .unknownType(let t): "unknown party frame type \(t)"
        case .malformed(let why): "malformed party message: \(why)"
        }
    }
}
