/// Why bytes from the rendezvous are not a call message this build can take.
public enum CallMessageError: Error, Equatable, Sendable, CustomStringConvertible {
    case malformed(String)
    case unsupported(String)

    public var description: String {
        switch self {
        case .malformed(let s): "malformed call message: \(s)"
        case .unsupported(let s): "unsupported: \(s)"
        }
    }
}
