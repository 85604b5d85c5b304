import Foundation
import NIOCore
import STUN
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

struct TestSocketError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
    static func failed(_ call: String) -> Self { Self("\(call): \(String(cString: strerror(errno)))") }
}

/// A blocking BSD socket for tests; every read waits with poll() and a timeout.
final class TestSocket: @unchecked Sendable {
    let fd: Int32
    let localAddress: TransportAddress

    private init(fd: Int32) throws {
        self.fd = fd
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let ok = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) == 0 }
        }
        guard ok, let local = transportAddress(storage) else {
            close(fd)
            throw TestSocketError.failed("getsockname")
        }
        self.localAddress = local
    }

    deinit { close(fd) }

    static func udp(bindingTo ip: IPAddress, port: UInt16 = 0) throws -> TestSocket {
        let fd = socket(ip.isIPv4 ? AF_INET : AF_INET6, Int32(SOCK_DGRAM.rawValue), 0)
        guard fd >= 0 else { throw TestSocketError.failed("socket") }
        let bound = withSockaddr(TransportAddress(ip: ip, port: port)) { bind(fd, $0, $1) == 0 }
        guard bound else {
            let error = TestSocketError.failed("bind")
            close(fd)
            throw error
        }
        return try TestSocket(fd: fd)
    }

    /// Whether a TCP listener could take `address` now (bound and listening with
    /// SO_REUSEADDR, as a server's listener is, then closed).
    static func tcpListenerCouldBind(_ address: TransportAddress) -> Bool {
        let fd = socket(address.ip.isIPv4 ? AF_INET : AF_INET6, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        return withSockaddr(address) { bind(fd, $0, $1) == 0 } && listen(fd, 1) == 0
    }

    /// A TCP connection to `server`, from `source` (any port) when given.
    static func tcp(connectingTo server: TransportAddress, from source: IPAddress? = nil) throws -> TestSocket {
        let fd = socket(server.ip.isIPv4 ? AF_INET : AF_INET6, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestSocketError.failed("socket") }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        if let source {
            guard withSockaddr(TransportAddress(ip: source, port: 0), { bind(fd, $0, $1) == 0 }) else {
                close(fd)
                throw TestSocketError.failed("bind")
            }
        }
        var timeout = timeval(tv_sec: 2, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let connected = withSockaddr(server) { connect(fd, $0, $1) == 0 }
        guard connected else {
            let error = TestSocketError.failed("connect")
            close(fd)
            throw error
        }
        return try TestSocket(fd: fd)
    }

    func sendDatagram(_ bytes: [UInt8], to destination: TransportAddress) throws {
        let sent = withSockaddr(destination) { address, length in
            bytes.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, 0, address, length) }
        }
        guard sent == bytes.count else { throw TestSocketError.failed("sendto") }
    }

    /// A datagram and where it came from, or nil after `timeout` seconds.
    func receive(timeout: Double, capacity: Int = 2048) throws -> ([UInt8], TransportAddress)? {
        guard wait(timeout: timeout) else { return nil }
        var buffer = [UInt8](repeating: 0, count: capacity)
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let count = buffer.withUnsafeMutableBytes { bytes in
            withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    recvfrom(fd, bytes.baseAddress, bytes.count, 0, $0, &length)
                }
            }
        }
        guard count >= 0, let from = transportAddress(storage) else { throw TestSocketError.failed("recvfrom") }
        return (Array(buffer.prefix(count)), from)
    }

    /// Sends a request and waits up to 2 s for the answer (retrying once: UDP).
    func exchange(_ request: [UInt8], with server: TransportAddress) throws -> ([UInt8], TransportAddress) {
        for _ in 0..<2 {
            try sendDatagram(request, to: server)
            if let answer = try receive(timeout: 1) { return answer }
        }
        throw TestSocketError("no answer from \(server)")
    }

    func sendAll(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard sent > 0 else { throw TestSocketError.failed("send") }
            offset += sent
        }
    }

    /// One rendezvous frame (2-byte length, body) off the stream, nil on EOF or after `timeout` seconds.
    func readLengthPrefixed(timeout: Double) throws -> [UInt8]? {
        let deadline = DispatchTime.now().uptimeNanoseconds + UInt64(timeout * 1e9)
        guard let header = try read(exactly: 2, deadline: deadline) else { return nil }
        return try read(exactly: Int(header[0]) << 8 | Int(header[1]), deadline: deadline)
    }

    /// One STUN message off the stream, nil on EOF or after `timeout` seconds.
    func readFrame(timeout: Double) throws -> [UInt8]? {
        let deadline = DispatchTime.now().uptimeNanoseconds + UInt64(timeout * 1e9)
        guard let header = try read(exactly: 20, deadline: deadline) else { return nil }
        let length = Int(header[2]) << 8 | Int(header[3])
        guard let body = try read(exactly: length, deadline: deadline) else { return nil }
        return header + body
    }

    private func read(exactly count: Int, deadline: UInt64) throws -> [UInt8]? {
        var out: [UInt8] = []
        while out.count < count {
            let now = DispatchTime.now().uptimeNanoseconds
            guard now < deadline, wait(timeout: Double(deadline - now) / 1e9) else { return nil }
            var chunk = [UInt8](repeating: 0, count: count - out.count)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { return nil }
            out += chunk.prefix(n)
        }
        return out
    }

    /// True once the peer closes (EOF or reset) within `timeout` seconds.
    func waitForClose(timeout: Double) -> Bool {
        let deadline = DispatchTime.now().uptimeNanoseconds + UInt64(timeout * 1e9)
        var scratch = [UInt8](repeating: 0, count: 4096)
        while true {
            let now = DispatchTime.now().uptimeNanoseconds
            guard now < deadline, wait(timeout: Double(deadline - now) / 1e9) else { return false }
            let n = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return true }
        }
    }

    private func wait(timeout: Double) -> Bool {
        var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&descriptor, 1, Int32(max(1, timeout * 1000))) > 0
    }
}

func withSockaddr<T>(_ address: TransportAddress, _ body: (UnsafePointer<sockaddr>, socklen_t) -> T) -> T {
    SocketAddress(address).withSockAddr { body($0, socklen_t($1)) }
}

func transportAddress(_ storage: sockaddr_storage) -> TransportAddress? {
    withUnsafeBytes(of: storage) { raw in
        switch Int32(storage.ss_family) {
        case AF_INET:
            let address = raw.load(as: sockaddr_in.self)
            return TransportAddress(
                ip: .v4(UInt32(bigEndian: address.sin_addr.s_addr)), port: UInt16(bigEndian: address.sin_port))
        case AF_INET6:
            let address = raw.load(as: sockaddr_in6.self)
            let bytes = withUnsafeBytes(of: address.sin6_addr) { Array($0) }
            guard let ip = IPAddress(bytes: bytes) else { return nil }
            return TransportAddress(ip: ip, port: UInt16(bigEndian: address.sin6_port))
        default:
            return nil
        }
    }
}

extension TestSocket {
    /// Everything the peer sends until it closes, or nil after `timeout` seconds.
    func readToEnd(timeout: Double) -> [UInt8]? {
        let deadline = DispatchTime.now().uptimeNanoseconds + UInt64(timeout * 1e9)
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16_384)
        while true {
            let now = DispatchTime.now().uptimeNanoseconds
            guard now < deadline else { return nil }
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, Int32(max(1, Double(deadline - now) / 1e6))) > 0 else { return nil }
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return out }
            out += chunk.prefix(n)
        }
    }
}
