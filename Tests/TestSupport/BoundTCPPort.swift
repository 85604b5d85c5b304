#if canImport(Glibc)
    import Glibc
#endif

/// A TCP socket bound to a loopback port the kernel picks, never listening: while it
/// is open, nothing can accept on that port and nobody else can take it (a connect
/// there is refused); closed, the port is free again.
public final class BoundTCPPort {
    public let port: UInt16
    private var fd: Int32

    public init() throws(BoundTCPPortError) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw BoundTCPPortError(description: "socket: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { p in
                bind(fd, p, length) == 0 && getsockname(fd, p, &length) == 0
            }
        }
        guard bound else {
            let cause = errno
            Glibc.close(fd)
            throw BoundTCPPortError(description: "bind: errno \(cause)")
        }
        self.fd = fd
        port = UInt16(bigEndian: address.sin_port)
    }

    /// Releases the port (also on deinit).
    public func close() {
        guard fd >= 0 else { return }
        Glibc.close(fd)
        fd = -1
    }

    deinit { close() }
}

public struct BoundTCPPortError: Error, CustomStringConvertible {
    public let description: String
}
