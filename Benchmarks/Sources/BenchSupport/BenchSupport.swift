#if canImport(Glibc)
    import CMultiMsg
    import Glibc
#else
    #error("The benchmark tools use Linux socket calls (sendmmsg/recvmmsg) and build on Linux only.")
#endif

// MARK: - Errors and output

/// Prints `message` to standard error and exits with status 2 (usage or setup error).
public func fail(_ message: String) -> Never {
    printError(message)
    exit(2)
}

public func printError(_ message: String) {
    let line = message + "\n"
    var bytes = Array(line.utf8)
    _ = bytes.withUnsafeMutableBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
}

/// The current `errno` as text, for error messages.
public func errnoText() -> String {
    String(cString: strerror(errno))
}

// MARK: - Clock

/// Monotonic time in seconds.
@inline(__always)
public func monotonicSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) * 1e-9
}

/// Monotonic time in nanoseconds.
@inline(__always)
public func nowNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

// MARK: - Addresses

/// A parsed IPv4 or IPv6 socket address.
public struct SocketAddress: Sendable, CustomStringConvertible {
    public var storage: sockaddr_storage
    public var length: socklen_t
    public var family: Int32
    public let description: String

    /// True for 127.0.0.0/8 and ::1, the only destinations the benchmarks may send to.
    public var isLoopback: Bool {
        var copy = storage
        return withUnsafeBytes(of: &copy) { raw -> Bool in
            if family == AF_INET {
                let sin = raw.load(as: sockaddr_in.self)
                // s_addr is in network byte order: the first octet is the lowest byte in memory.
                return withUnsafeBytes(of: sin.sin_addr.s_addr) { $0[0] == 127 }
            } else {
                let sin6 = raw.load(as: sockaddr_in6.self)
                return withUnsafeBytes(of: sin6.sin6_addr) { bytes in
                    bytes.prefix(15).allSatisfy { $0 == 0 } && bytes[15] == 1
                }
            }
        }
    }

    /// Parses `HOST:PORT`, `[V6]:PORT` or `localhost:PORT` (numeric addresses only, no DNS).
    public static func parse(_ text: String) -> SocketAddress? {
        var host: Substring
        var portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { return nil }
            host = text[text.index(after: text.startIndex)..<close]
            let rest = text[text.index(after: close)...]
            guard rest.hasPrefix(":") else { return nil }
            portText = rest.dropFirst()
        } else {
            guard let colon = text.lastIndex(of: ":") else { return nil }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
            if host.contains(":") { return nil }  // bare IPv6 must be bracketed
        }
        guard let port = UInt16(portText), port != 0 else { return nil }
        if host == "localhost" { host = "127.0.0.1" }

        var storage = sockaddr_storage()
        var sin = sockaddr_in()
        if inet_pton(AF_INET, String(host), &sin.sin_addr) == 1 {
            sin.sin_family = sa_family_t(AF_INET)
            sin.sin_port = port.bigEndian
            withUnsafeMutableBytes(of: &storage) { raw in
                raw.storeBytes(of: sin, as: sockaddr_in.self)
            }
            return SocketAddress(
                storage: storage, length: socklen_t(MemoryLayout<sockaddr_in>.size),
                family: AF_INET, description: "\(host):\(port)")
        }
        var sin6 = sockaddr_in6()
        if inet_pton(AF_INET6, String(host), &sin6.sin6_addr) == 1 {
            sin6.sin6_family = sa_family_t(AF_INET6)
            sin6.sin6_port = port.bigEndian
            withUnsafeMutableBytes(of: &storage) { raw in
                raw.storeBytes(of: sin6, as: sockaddr_in6.self)
            }
            return SocketAddress(
                storage: storage, length: socklen_t(MemoryLayout<sockaddr_in6>.size),
                family: AF_INET6, description: "[\(host)]:\(port)")
        }
        return nil
    }

    /// Calls `body` with the address as a `sockaddr` pointer and its length.
    public func withSockaddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
        var copy = storage
        return withUnsafePointer(to: &copy) { ptr in
            ptr.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, length) }
        }
    }
}

/// Creates a UDP socket of the address's family.
public func udpSocket(family: Int32, nonBlocking: Bool) -> Int32 {
    var type = Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
    if nonBlocking { type |= Int32(SOCK_NONBLOCK.rawValue) }
    let fd = socket(family, type, 0)
    if fd < 0 { fail("socket: \(errnoText())") }
    return fd
}

/// recvmmsg slots, set up once: `count` buffers of `size` bytes in one block, an
/// iovec and an mmsghdr for each.
public func makeReceiveSlots(count: Int, size: Int)
    -> (buffers: UnsafeMutableRawPointer, iov: UnsafeMutablePointer<iovec>, msgs: UnsafeMutablePointer<bench_mmsghdr>)
{
    let buffers = UnsafeMutableRawPointer.allocate(byteCount: count * size, alignment: 16)
    let iov = UnsafeMutablePointer<iovec>.allocate(capacity: count)
    let msgs = UnsafeMutablePointer<bench_mmsghdr>.allocate(capacity: count)
    for i in 0..<count {
        iov[i] = iovec(iov_base: buffers + i * size, iov_len: size)
        var m = bench_mmsghdr()
        m.msg_hdr.msg_iov = iov + i
        m.msg_hdr.msg_iovlen = 1
        msgs[i] = m
    }
    return (buffers, iov, msgs)
}

public func setSocketBuffer(_ fd: Int32, option: Int32, bytes: Int32) {
    var value = bytes
    _ = setsockopt(fd, SOL_SOCKET, option, &value, socklen_t(MemoryLayout<Int32>.size))
}

// MARK: - STUN constants

public enum STUNWire {
    public static let headerLength = 20
    public static let magicCookie: UInt32 = 0x2112_A442
    public static let bindingRequest: UInt16 = 0x0001
    public static let bindingSuccess: UInt16 = 0x0101
}

@inline(__always)
public func loadBE16(_ p: UnsafeMutableRawPointer, _ offset: Int) -> UInt16 {
    UInt16(p.load(fromByteOffset: offset, as: UInt8.self)) << 8
        | UInt16(p.load(fromByteOffset: offset + 1, as: UInt8.self))
}

@inline(__always)
public func loadBE32(_ p: UnsafeMutableRawPointer, _ offset: Int) -> UInt32 {
    UInt32(bigEndian: p.loadUnaligned(fromByteOffset: offset, as: UInt32.self))
}

@inline(__always)
public func storeBE16(_ p: UnsafeMutableRawPointer, _ offset: Int, _ value: UInt16) {
    p.storeBytes(of: value.bigEndian, toByteOffset: offset, as: UInt16.self)
}

@inline(__always)
public func storeBE32(_ p: UnsafeMutableRawPointer, _ offset: Int, _ value: UInt32) {
    p.storeBytes(of: value.bigEndian, toByteOffset: offset, as: UInt32.self)
}

// MARK: - Arguments

/// Minimal `--name value` / `--name=value` / `--flag` parser.
public struct Arguments {
    private var values: [String: String] = [:]
    private var flags: Set<String> = []
    private let known: Set<String>
    private let knownFlags: Set<String>

    /// `options` take a value, `flagNames` do not. Unknown names are a usage error.
    public init(_ argv: [String], options: [String], flagNames: [String] = [], usage: String) {
        known = Set(options)
        knownFlags = Set(flagNames)
        var i = 0
        while i < argv.count {
            let arg = argv[i]
            if arg == "-h" || arg == "--help" {
                print(usage)
                exit(0)
            }
            guard arg.hasPrefix("--") else { fail("unexpected argument '\(arg)'\n\(usage)") }
            var name = String(arg.dropFirst(2))
            var value: String?
            if let eq = name.firstIndex(of: "=") {
                value = String(name[name.index(after: eq)...])
                name = String(name[..<eq])
            }
            if knownFlags.contains(name) {
                guard value == nil else { fail("--\(name) takes no value") }
                flags.insert(name)
            } else if known.contains(name) {
                if value == nil {
                    i += 1
                    guard i < argv.count else { fail("--\(name) needs a value") }
                    value = argv[i]
                }
                values[name] = value
            } else {
                fail("unknown option --\(name)\n\(usage)")
            }
            i += 1
        }
    }

    public func has(_ flag: String) -> Bool { flags.contains(flag) }

    public func string(_ name: String) -> String? { values[name] }

    public func int(_ name: String, default def: Int, range: ClosedRange<Int>) -> Int {
        guard let text = values[name] else { return def }
        guard let v = Int(text), range.contains(v) else {
            fail("--\(name) must be an integer in \(range.lowerBound)...\(range.upperBound)")
        }
        return v
    }

    public func double(_ name: String, default def: Double, range: ClosedRange<Double>) -> Double {
        guard let text = values[name] else { return def }
        guard let v = Double(text), range.contains(v) else {
            fail("--\(name) must be a number in \(range.lowerBound)...\(range.upperBound)")
        }
        return v
    }
}

// MARK: - Addresses, text and /proc readings shared by the load generators

public func parseV4(_ text: String) -> (ip: UInt32, port: UInt16)? {
    guard let colon = text.lastIndex(of: ":"), let port = UInt16(text[text.index(after: colon)...]), port != 0
    else { return nil }
    var host = String(text[..<colon])
    if host == "localhost" { host = "127.0.0.1" }
    var addr = in_addr()
    guard inet_pton(AF_INET, host, &addr) == 1 else { return nil }
    return (UInt32(bigEndian: addr.s_addr), port)
}

public func ipText(_ ip: UInt32) -> String { "\(ip >> 24).\(ip >> 16 & 255).\(ip >> 8 & 255).\(ip & 255)" }

public func withSockaddr<R>(_ ip: UInt32, _ port: UInt16, _ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
    var sin = sockaddr_in()
    sin.sin_family = sa_family_t(AF_INET)
    sin.sin_port = port.bigEndian
    sin.sin_addr.s_addr = ip.bigEndian
    return withUnsafePointer(to: &sin) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
}

public func localPort(_ fd: Int32) -> UInt16 {
    var sin = sockaddr_in()
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &sin) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
    }
    return UInt16(bigEndian: sin.sin_port)
}

public func fmt(_ x: Double, _ digits: Int = 3) -> String {
    guard x.isFinite else { return "0" }
    var scale = 1.0
    for _ in 0..<digits { scale *= 10 }
    let v = (abs(x) * scale).rounded()
    let whole = Int(v / scale)
    var text = String(whole)
    if digits > 0 {
        let frac = String(Int(v) - whole * Int(scale))
        text += "." + String(repeating: "0", count: digits - frac.count) + frac
    }
    return (x < 0 && v > 0 ? "-" : "") + text
}

public func readText(_ path: String) -> String? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var out: [UInt8] = []
    var buf = [UInt8](repeating: 0, count: 8192)
    while true {
        let n = read(fd, &buf, buf.count)
        if n <= 0 { break }
        out += buf[0..<n]
    }
    return String(decoding: out, as: UTF8.self)
}

public let clockTicks = Double(sysconf(Int32(_SC_CLK_TCK)))

/// utime+stime of a process (all threads), seconds.
public func processCPU(_ pid: Int32) -> Double? {
    guard let text = readText("/proc/\(pid)/stat"), let close = text.lastIndex(of: ")") else { return nil }
    let fields = text[text.index(after: close)...].split(separator: " ")
    // After the command: state is field 3, utime 14, stime 15 (1-based) -> indices 11, 12 here.
    guard fields.count > 12, let u = Double(fields[11]), let s = Double(fields[12]) else { return nil }
    return (u + s) / clockTicks
}

/// Machine-wide UDP counters from /proc/net/snmp.
public struct UDPCounters {
    public var inErrors = 0, rcvbufErrors = 0, sndbufErrors = 0, noPorts = 0

    public init(inErrors: Int = 0, rcvbufErrors: Int = 0, sndbufErrors: Int = 0, noPorts: Int = 0) {
        self.inErrors = inErrors
        self.rcvbufErrors = rcvbufErrors
        self.sndbufErrors = sndbufErrors
        self.noPorts = noPorts
    }

    public static func read() -> UDPCounters {
        var c = UDPCounters()
        guard let text = readText("/proc/net/snmp") else { return c }
        let lines = text.split(separator: "\n").filter { $0.hasPrefix("Udp:") }
        guard lines.count >= 2 else { return c }
        let names = lines[0].split(separator: " ").dropFirst().map(String.init)
        let values = lines[1].split(separator: " ").dropFirst().map { Int($0) ?? 0 }
        var table: [String: Int] = [:]
        for (k, v) in zip(names, values) { table[k] = v }
        c.inErrors = table["InErrors"] ?? 0
        c.rcvbufErrors = table["RcvbufErrors"] ?? 0
        c.sndbufErrors = table["SndbufErrors"] ?? 0
        c.noPorts = table["NoPorts"] ?? 0
        return c
    }
}

public func selfCPU() -> Double {
    var u = rusage()
    getrusage(RUSAGE_SELF.rawValue, &u)
    return Double(u.ru_utime.tv_sec) + Double(u.ru_utime.tv_usec) * 1e-6
        + Double(u.ru_stime.tv_sec) + Double(u.ru_stime.tv_usec) * 1e-6
}

public func sockaddrIn(_ ip: UInt32, _ port: UInt16) -> sockaddr_in {
    var sin = sockaddr_in()
    sin.sin_family = sa_family_t(AF_INET)
    sin.sin_port = port.bigEndian
    sin.sin_addr.s_addr = ip.bigEndian
    return sin
}

public func parseNet(_ text: String) -> UInt32? {
    let parts = text.split(separator: ".")
    guard parts.count == 2, let a = UInt8(parts[0]), let b = UInt8(parts[1]), a == 127 else { return nil }
    return UInt32(a) << 24 | UInt32(b) << 16
}

/// A non-blocking UDP socket bound to ip:port (port 0: any).
public func boundSocket(_ ip: UInt32, _ port: UInt16 = 0, buffer: Int32? = nil) -> Int32 {
    let fd = udpSocket(family: AF_INET, nonBlocking: true)
    if let buffer {
        setSocketBuffer(fd, option: SO_RCVBUF, bytes: buffer)
        setSocketBuffer(fd, option: SO_SNDBUF, bytes: buffer)
    }
    if withSockaddr(ip, port, { bind(fd, $0, $1) }) != 0 {
        fail(
            "bind \(ipText(ip)):\(port): \(errnoText())"
                + (errno == EMFILE ? " (raise ulimit -n)" : ""))
    }
    return fd
}
