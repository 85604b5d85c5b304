/// An error raised while decoding, validating or authenticating STUN data.
///
/// Every malformed input maps to one of these: the ``code`` says what kind of
/// problem it was, the ``message`` says what exactly was wrong with the input.
public struct STUNError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The kind of problem.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        public init(_ name: String) { self.name = name }
        public var description: String { name }

        /// Fewer bytes than the structure needs.
        public static let truncated = Code("truncated")
        /// The two most significant bits of a STUN message were not zero.
        public static let notSTUN = Code("notSTUN")
        /// A message without the RFC 5389 magic cookie: classic RFC 3489 STUN.
        public static let classicSTUN = Code("classicSTUN")
        /// The header's length field disagrees with the bytes given.
        public static let badLength = Code("badLength")
        /// An attribute's header or value is malformed.
        public static let badAttribute = Code("badAttribute")
        /// A value outside what the protocol allows.
        public static let invalidValue = Code("invalidValue")
        /// A ChannelData frame is malformed.
        public static let badChannelData = Code("badChannelData")
        /// A byte stream cannot be cut into STUN or ChannelData frames.
        public static let badStream = Code("badStream")
        /// Credentials could not be prepared (OpaqueString profile).
        public static let badCredentials = Code("badCredentials")
        /// A message exceeds a configured size limit.
        public static let tooLarge = Code("tooLarge")
    }

    public let code: Code
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code): \(message)" }

    @inline(never)
    static func truncated(_ what: String, need: Int, have: Int) -> STUNError {
        STUNError(.truncated, "\(what) needs \(need) bytes, only \(have) present")
    }

    @inline(never)
    static func badAttribute(_ type: AttributeType, _ why: String) -> STUNError {
        STUNError(.badAttribute, "\(type): \(why)")
    }
}
