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
/// every 2 s. On shutdown it reports itself draining (no new work) before it goes.
/// A swift-service-lifecycle `Service`.
public final class DirectoryReporter: Service, Sendable {
    public let directory: TransportAddress
    public let interval: Duration
    private let secret: String
    private let identity: PrivateKey
    private let load: @Sendable (_ seconds: Double) async -> RelayLoad
    private let logger: Logger
    private let reports = NIOLockedValueBox(0)

    /// `load` is asked for the relay's figures over the last `seconds`.
    public init(
        directory: TransportAddress, secret: String, identity: PrivateKey, interval: Duration = .seconds(2),
        logger: Logger, load: @escaping @Sendable (_ seconds: Double) async -> RelayLoad
    ) {
        self.directory = directory
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
        var connected = false
        var saidDown = false
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            let connection: RendezvousConnection
            do {
                connection = try await RendezvousConnection.connect(to: directory, identity: identity, timeout: .seconds(5))
            } catch {
                if !saidDown {
                    logger.warning("directory \(directory) unreachable, trying every \(interval): \(error)")
                    saidDown = true
                }
                try? await Task.sleep(for: interval)
                continue
            }
            if !connected || saidDown { logger.info("reporting load to the directory", metadata: ["directory": "\(directory)"]) }
            connected = true
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
            logger.warning("lost the directory \(directory); connecting again")
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
