import NIOCore
import STUN
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

extension TransportAddress {
    /// The IP address and port of a NIO socket address; nil for a Unix domain socket.
    ///
    /// Cheap enough for every datagram: it reads the `sockaddr` fields and formats nothing.
    public init?(_ address: SocketAddress) {
        switch address {
        case .v4(let v4):
            let raw = v4.address
            self.init(ip: .v4(UInt32(bigEndian: raw.sin_addr.s_addr)), port: UInt16(bigEndian: raw.sin_port))
        case .v6(let v6):
            let raw = v6.address
            let (high, low) = withUnsafeBytes(of: raw.sin6_addr) { bytes in
                (
                    UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt64.self)),
                    UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
                )
            }
            self.init(ip: .v6(high: high, low: low), port: UInt16(bigEndian: raw.sin6_port))
        case .unixDomainSocket:
            return nil
        }
    }
}

extension SocketAddress {
    /// The NIO socket address of a STUN transport address.
    ///
    /// The `host` of the result is empty: nothing is formatted, so this is
    /// cheap enough to build a destination per datagram.
    public init(_ address: TransportAddress) {
        switch address.ip {
        case .v4(let ip):
            var raw = sockaddr_in()
            raw.sin_family = sa_family_t(AF_INET)
            raw.sin_port = address.port.bigEndian
            raw.sin_addr.s_addr = ip.bigEndian
            self.init(raw, host: "")
        case .v6(let high, let low):
            var raw = sockaddr_in6()
            raw.sin6_family = sa_family_t(AF_INET6)
            raw.sin6_port = address.port.bigEndian
            withUnsafeMutableBytes(of: &raw.sin6_addr) { bytes in
                bytes.storeBytes(of: high.bigEndian, toByteOffset: 0, as: UInt64.self)
                bytes.storeBytes(of: low.bigEndian, toByteOffset: 8, as: UInt64.self)
            }
            self.init(raw, host: "")
        }
    }
}
