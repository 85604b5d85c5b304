import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Loopback port numbers for servers a test starts on a number it chose, above all
/// those it stops and starts again on the same number. A port the kernel picked and
/// released lies in its ephemeral range, where every socket bound to port 0 (other
/// tests running beside) and every relay allocation (pools at 49152–65535) may take
/// it in between; these are drawn below both, where nothing takes a port unasked.
public enum QuietPort {
    /// A number free now on 127.0.0.1 for UDP and for TCP, outside the kernel's
    /// ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`) and the relay
    /// pools where that leaves room (``quietRange``). Never one within
    /// ``spacing`` of a number drawn before in this process: a test binds its number
    /// a while after drawing it (another test could draw it meanwhile), and servers
    /// take the next ones too (coturn its alternate port, the listening port + 1).
    public static func draw() -> UInt16 {
        for _ in 0..<400 {
            let port = UInt16.random(in: quietRange)
            guard isFree(port), claim(port) else { continue }
            return port
        }
        // Nothing quiet is free: a number free now for both UDP and TCP, anywhere.
        for _ in 0..<400 {
            let port = UInt16.random(in: 10_000...65_000)
            guard isFree(port), claim(port) else { continue }
            return port
        }
        return (try? BoundTCPPort().port) ?? UInt16.random(in: 20_000..<30_000)
    }

    /// Where numbers are drawn: below the kernel's ephemeral range when it leaves
    /// room there (from 20000), else between its top and the relay pools (49152),
    /// else (a range that spans nearly everything) 20000–49151, checked one by one.
    static let quietRange: ClosedRange<UInt16> = {
        let (low, high) = ephemeralRange()
        let floor: UInt16 = 20_000
        let pools: UInt16 = 49_152
        if low > floor + 1_000 { return floor...(low - 1) }
        if high < pools - 1_000 { return max(high + 1, floor)...(pools - 1) }
        return floor...(pools - 1)
    }()

    /// How far apart two numbers drawn in one process are.
    public static let spacing = 4
    private static let drawn = Mutex<Set<UInt16>>([])

    /// Takes `port` for this process's tests, unless one drawn before lies within ``spacing``.
    private static func claim(_ port: UInt16) -> Bool {
        drawn.withLock { drawn in
            let near = (Int(port) - spacing)...(Int(port) + spacing)
            guard !near.contains(where: { $0 >= 0 && $0 <= Int(UInt16.max) && drawn.contains(UInt16($0)) }) else {
                return false
            }
            drawn.insert(port)
            return true
        }
    }

    /// Whether `port` on 127.0.0.1 can be bound now, for UDP and for TCP.
    public static func isFree(_ port: UInt16, ip: UInt32 = 0x7F00_0001) -> Bool {
        [Int32(SOCK_DGRAM.rawValue), Int32(SOCK_STREAM.rawValue)].allSatisfy { canBind(type: $0, ip: ip, port: port) }
    }

    private static func canBind(type: Int32, ip: UInt32, port: UInt16) -> Bool {
        let fd = socket(AF_INET, type, 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = ip.bigEndian
        address.sin_port = port.bigEndian
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }

    /// The kernel's ephemeral range (Linux's default 32768–60999 when unreadable).
    private static func ephemeralRange() -> (UInt16, UInt16) {
        let fallback: (UInt16, UInt16) = (32_768, 60_999)
        let fd = open("/proc/sys/net/ipv4/ip_local_port_range", O_RDONLY)
        guard fd >= 0 else { return fallback }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 64)
        let count = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count > 0 else { return fallback }
        let text = String(decoding: bytes.prefix(count), as: UTF8.self)
        let numbers = text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).compactMap { UInt16($0) }
        guard numbers.count == 2, numbers[0] >= 1_024, numbers[0] <= numbers[1] else { return fallback }
        return (numbers[0], numbers[1])
    }
}
