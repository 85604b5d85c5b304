/// Every failure the voice engine reports. Nothing that comes from a packet, a
/// file or a device traps: it becomes one of these, and the caller's state is
/// left as it was.
public enum VoiceError: Error, Equatable, Sendable, CustomStringConvertible {
    /// A configuration value out of range (the message names the field and the range).
    case invalidConfiguration(String)
    /// A codec or DSP library call failed; `code` is the library's own error code.
    case library(String, code: Int32)
    /// A packet the decoder cannot use (empty, oversized, corrupt).
    case invalidPacket(String)
    /// An output buffer shorter than the frame it must hold.
    case bufferTooSmall(needed: Int, available: Int)
    /// A file that cannot be opened, read, written or parsed.
    case file(path: String, reason: String)
    /// An audio device that cannot be opened or used.
    case device(String)
    /// Something this build or machine does not provide.
    case unavailable(String)

    public var description: String {
        switch self {
        case .invalidConfiguration(let m): return "invalid configuration: \(m)"
        case .library(let m, let code): return "\(m) (error \(code))"
        case .invalidPacket(let m): return "invalid packet: \(m)"
        case .bufferTooSmall(let needed, let available):
            return "buffer too small: \(needed) samples needed, \(available) available"
        case .file(let path, let reason): return "\(path): \(reason)"
        case .device(let m): return "audio device: \(m)"
        case .unavailable(let m): return "unavailable: \(m)"
        }
    }
}
