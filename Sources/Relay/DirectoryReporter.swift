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
/// With parties, it lists its rooms too (``RelayRooms``): all of them on each new
/// connection, then what opened, changed and closed, with each report.
/// On shutdown it reports itself draining (no new work) before it goes.
/// A swift-service-lifecycle `Service`.
public final class DirectoryReporter: Service, Sendable {
    /// The directory's nodes (one for a directory alone).
    public let directories: [TransportAddress]
    public let interval: Duration
    private let secret: String
    private let identity: PrivateKey
    private let load: @Sendable (_ seconds: Double) async -> RelayLoad
    /// The rooms changed since those known (id to revision), and those closed.
    public typealias RoomListings =
        @Sendable (_ known: [String: UInt64]) async -> (
            changed: [(listing: PartyListing, revision: UInt64)], closed: [String]
        )
    private let rooms: RoomListings?
    private let logger: Logger
    private let reports = NIOLockedValueBox(0)

    /// `load` is asked for the relay's figures over the last `seconds`; `rooms`, when
    /// the relay hosts parties, for its rooms (``PartyService/roomListings(since:)``).
    public init(
        directories: [TransportAddress], secret: String, identity: PrivateKey, interval: Duration = .seconds(2),
        logger: Logger, rooms: RoomListings? = nil, load: @escaping @Sendable (_ seconds: Double) async -> RelayLoad
    ) {
        self.rooms = rooms
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
            // The rooms this connection has heard of, by revision (none: the first list is all of them).
            var known: [String: UInt64]? = nil
            while !Task.isCancelled && !Task.isShuttingDownGracefully && !connection.isClosed {
                do {
                    try await connection.report(await load(seconds), secret: secret)
                    reports.withLockedValue { $0 += 1 }
                    if let rooms { known = try await listRooms(rooms, known: known, on: connection) }
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
            if case .refused(.badProof, let detail)? = await connection.refusal() {
                // Not this relay's to mend by trying again at once: said each time, tried
                // again at `refusedRetry` (the directory's secret may be changed meanwhile).
                logger.error(
                    "the directory \(connection.server) refused this relay: \(detail) (a directory takes relays only with --relay-secret, and --directory-secret must be the same); trying again in \(Self.refusedRetry)"
                )
                try? await cancelWhenGracefulShutdown { try await Task.sleep(for: Self.refusedRetry) }
                continue
            }
            logger.warning("lost the directory \(connection.server); connecting again")
        }
    }

    /// How long a relay the directory refused (its secret) waits before it tries again.
    static let refusedRetry: Duration = .seconds(30)

    /// What changed in the rooms since `known`, told; returns what the directory knows now.
    private func listRooms(_ rooms: RoomListings, known: [String: UInt64]?, on connection: RendezvousConnection)
        async throws -> [String: UInt64]
    {
        let (reports, now) = await Self.changes(of: rooms, since: known)
        for report in reports { try await connection.report(report, secret: secret) }
        return now
    }

    /// The reports that tell what changed in the rooms since `known` (all of them when
    /// nil, the last report `complete`; none when nothing changed), and what is known after them.
    public static func changes(of rooms: RoomListings, since known: [String: UInt64]?) async -> (
        [RelayRooms], known: [String: UInt64]
    ) {
        var now = known ?? [:]
        let (changed, closed) = await rooms(now)
        guard known == nil || !changed.isEmpty || !closed.isEmpty else { return ([], now) }
        for (listing, revision) in changed { now[listing.room] = revision }
        for room in closed { now[room] = nil }
        return (RelayRooms.reports(open: changed.map(\.listing), closed: closed, complete: known == nil), now)
    }

    /// This process's CPU time so far (user and system), in seconds.
    public static func cpuSeconds() -> Double {
        var usage = rusage()
        guard getrusage(RUSAGE_SELF.rawValue, &usage) == 0 else { return 0 }
        func seconds(_ t: timeval) -> Double { Double(t.tv_sec) + Double(t.tv_usec) / 1e6 }
        return seconds(usage.ru_utime) + seconds(usage.ru_stime)
    }
}
