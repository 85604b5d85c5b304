/// Why a capture file could not be read.
///
/// Every failure of ``Capture/read(path:)`` is reported as a `CaptureError`; the reader
/// never traps on malformed input. Problems confined to one packet (a fragment, a
/// malformed header, a snapshot-length cut) are not errors: they are listed in
/// ``Capture/skipped`` and reading continues.
public struct CaptureError: Error, CustomStringConvertible, Sendable, Equatable {
    /// The kind of failure.
    public enum Code: Sendable, Hashable {
        /// No file exists at the path.
        case fileNotFound
        /// The file exists but cannot be opened (a directory, missing permission).
        case unreadable
        /// The file is neither pcap nor pcapng.
        case notACapture
        /// The capture's link-layer header type is not one the reader decodes.
        case unsupportedLinkType
        /// The file ends in the middle of a header or record.
        case truncated
        /// libpcap rejected the file's structure for another reason.
        case malformed
    }

    /// The kind of failure.
    public var code: Code
    /// The path that was being read.
    public var path: String
    /// When reading failed after the file header: the 1-based number of the record being read
    /// (one more than the number of complete frames before it). pcapng files may also hold
    /// non-packet blocks, so the incomplete block is not necessarily a packet.
    public var frame: Int?
    /// A human-readable explanation of what was wrong.
    public var message: String

    /// Creates an error; `message` should say what was wrong in the file.
    public init(code: Code, path: String, frame: Int? = nil, message: String) {
        self.code = code
        self.path = path
        self.frame = frame
        self.message = message
    }

    /// `"<path>: <message>"`; the message says at which frame reading stopped, when it did.
    public var description: String {
        "\(path): \(message)"
    }
}
