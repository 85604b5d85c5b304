import Logging
import NIOCore
import NIOPosix
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A TCP listening socket made here (and handed to NIO with `withBoundSocket`) for
/// the relay's listeners (TCP and TLS, rendezvous, metrics, party streams), so
/// that they can refuse what they cannot accept.
///
/// Out of descriptors (`ulimit -n`, the system's file table), `accept` fails and
/// the connection stays queued; NIO's listener, asked to read, reads again at
/// every wake-up, and the loop spins on `accept` for as long as the queue is full
/// (its `AcceptBackoffHandler` cannot stop that: the pending read stays set). The
/// handler here does what libuv and nginx do: it keeps one descriptor spare,
/// and on such a failure gives it up, accepts each waiting connection and closes
/// it at once (the client sees a close, not a silent queue), then takes the spare
/// again, and says so once a minute, naming the limit.
enum TCPListenerSocket {
    /// A non-blocking, close-on-exec TCP socket bound to `address` and listening
    /// (`SO_REUSEADDR`; an IPv6 one v6-only).
    static func listen(_ address: TransportAddress, backlog: Int32) throws(IOError) -> Int32 {
        let fd = socket(
            address.ip.isIPv4 ? AF_INET : AF_INET6,
            Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw IOError(errnoCode: errno, reason: "socket") }
        var one: Int32 = 1
        let size = socklen_t(MemoryLayout<Int32>.size)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, size)
        if !address.ip.isIPv4 { setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &one, size) }
        let bound = SocketAddress(address).withSockAddr { bind(fd, $0, socklen_t($1)) == 0 }
        guard bound, Glibc.listen(fd, backlog) == 0 else {
            let error = IOError(errnoCode: errno, reason: bound ? "listen" : "bind")
            close(fd)
            throw error
        }
        return fd
    }
}

/// On the listening channel: refuses the connections waiting when `accept` fails
/// for want of descriptors (see ``TCPListenerSocket``).
final class AcceptShortageHandler: ChannelInboundHandler {
    typealias InboundIn = Any

    private let fd: Int32
    private let listener: String
    private let logger: Logger
    private var spare: Int32
    private var lastSaid: NIODeadline?
    private var refused = 0

    init(listening fd: Int32, listener: String, logger: Logger) {
        self.fd = fd
        self.listener = listener
        self.logger = logger
        spare = open("/dev/null", O_RDONLY | O_CLOEXEC)
    }

    deinit { if spare >= 0 { close(spare) } }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard let io = error as? IOError, [EMFILE, ENFILE, ENOBUFS, ENOMEM].contains(io.errnoCode) else {
            context.fireErrorCaught(error)
            return
        }
        if spare >= 0 {
            close(spare)
            spare = -1
        }
        while true {
            let accepted = accept(fd, nil, nil)  // (non-blocking: the listener is)
            guard accepted >= 0 else { break }
            close(accepted)
            refused += 1
        }
        spare = open("/dev/null", O_RDONLY | O_CLOEXEC)
        let now = NIODeadline.now()
        if lastSaid.map({ now - $0 >= .seconds(60) }) ?? true {
            lastSaid = now
            logger.error(
                "cannot accept connections: \(ResourceShortage.describe(errno: io.errnoCode)); closing them as they come",
                metadata: ["listener": "\(listener)", "closed": "\(refused)"])
        }
    }
}

extension ServerBootstrap {
    /// Listens on `address` (a socket of ``TCPListenerSocket``'s, `backlog` deep)
    /// with the refusal of connections it cannot accept; `listener` names it in the log.
    public func listen(
        on address: TransportAddress, backlog: Int32 = 256, listener: String, logger: Logger
    ) async throws -> any Channel {
        let fd = try TCPListenerSocket.listen(address, backlog: backlog)
        return try await serverChannelInitializer { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHandler(
                    AcceptShortageHandler(listening: fd, listener: listener, logger: logger))
            }
        }
        .withBoundSocket(fd).get()
    }
}

/// What running out of a resource means, for an operator: the limit and how to raise it.
public enum ResourceShortage {
    public static func describe(errno code: Int32) -> String {
        switch code {
        case EMFILE:
            var limit = rlimit()
            let n = getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 ? " \(limit.rlim_cur)" : ""
            return
                "too many open files (the process's limit, ulimit -n\(n), is reached; raise it, e.g. LimitNOFILE= in a systemd unit)"
        case ENFILE: return "the system's open file table is full (fs.file-max)"
        case ENOBUFS, ENOMEM: return "out of memory for sockets"
        default: return String(cString: strerror(code))
        }
    }
}
