import Foundation
import Logging
import NIOConcurrencyHelpers
import Rendezvous
import Secure
import ServiceLifecycle
import Transport
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// `tusa relay --directory HOST:PORT --directory-secret S`: the relay registers
/// with a directory under its identity and reports its load every 2 s, so that the
/// directory sends peers and rooms to it by load; a lost connection is made again
/// every 2 s, at the next of the directory's nodes first (when it has several).
/// On shutdown it reports itself draining (no new work) before it goes.
/// A swift-service-lifecycle `Service`.
public final class DirectoryReporter: Service, Sendable {
    /// The directory's nodes (one for a directory alone).
    public let directories: [TransportAddress]
    public let interval: Duration
    private let secret: String
    private let identity: PrivateKey
    private let load: @Sendable (_ seconds: Double) async -> RelayLoad
    private let logger: Logger
    private let reports = NIOLockedValueBox(0)

    /// `load` is asked for the relay's figures over the last `seconds`.
    public init(
        directories: [TransportAddress], secret: String, identity: PrivateKey, interval: Duration = .seconds(2),
        logger: Logger, load: @escaping @Sendable (_ seconds: Double) async -> RelayLoad
    ) {
        self.directories = directories
        self.secret = secret
        self.identity = identity
        self.interval = interval
        self.logger = logger
        self.load = load
    }

    /// Reports sent so far.
    public var reportsSent: Int { reports.withLockedValue { $0 } }

    public func run() async throws {
        let seconds = Double(interval.components.seconds) + Double(interval.components.attoseconds) / 1e18
        var saidDown = false
        var last: RendezvousConnection?
        let named = directories.map(\.description).joined(separator: ",")
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            let connection: RendezvousConnection
            do {
                connection =
                    if let last {
                        try await last.connectAgain(identity: identity, timeout: .seconds(5))
                    } else {
                        try await RendezvousConnection.connect(toAnyOf: directories, identity: identity, timeout: .seconds(5))
                    }
                last = connection
            } catch {
                if !saidDown {
                    logger.warning("directory \(named) unreachable, trying every \(interval): \(error)")
                    saidDown = true
                }
                try? await Task.sleep(for: interval)
                continue
            }
            // Each connection says where it reports (after a loss, maybe another node).
            logger.info("reporting load to the directory", metadata: ["directory": "\(connection.server)"])
            saidDown = false
            while !Task.isCancelled && !Task.isShuttingDownGracefully && !connection.isClosed {
                do {
                    try await connection.report(await load(seconds), secret: secret)
                    reports.withLockedValue { $0 += 1 }
                } catch {
                    break
                }
                try? await Task.sleep(for: interval)
            }
            if Task.isCancelled || Task.isShuttingDownGracefully {
                var last = await load(seconds)
                last.draining = true
                try? await connection.report(last, secret: secret)
                await connection.close()
                return
            }
            await connection.close()
            logger.warning("lost the directory \(connection.server); connecting again")
        }
    }

    /// This process's CPU time so far (user and system), in seconds.
    public static func cpuSeconds() -> Double {
        var usage = rusage()
        guard getrusage(RUSAGE_SELF.rawValue, &usage) == 0 else { return 0 }
        func seconds(_ t: timeval) -> Double { Double(t.tv_sec) + Double(t.tv_usec) / 1e6 }
        return seconds(usage.ru_utime) + seconds(usage.ru_stime)
    }
}
