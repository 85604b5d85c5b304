/// A lower layer's error kept inside a higher layer's, so that a caller can
/// still ask what it was (`cause.error as? IOError`) while the outer error stays
/// `Equatable` and `Hashable` and prints as one line.
///
/// Two causes are equal when their errors are of the same type and print the
/// same: errors need not be `Equatable`, and the outer error's equality is for
/// tests and deduplication, not identity.
public struct ErrorCause: Error, Hashable, Sendable, CustomStringConvertible {
    /// The error as it was thrown.
    public let error: any Error

    /// Keeps `error`; a cause of a cause is flattened to the error itself.
    public init(_ error: any Error) {
        self.error = (error as? ErrorCause)?.error ?? error
    }

    public var description: String { String(describing: error) }

    public static func == (a: ErrorCause, b: ErrorCause) -> Bool {
        type(of: a.error) == type(of: b.error) && a.description == b.description
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(ObjectIdentifier(type(of: error)))
        hasher.combine(description)
    }
}
