import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Rendezvous
import STUN
import ServiceLifecycle
import Transport
import TusaBase

/// The rendezvous (signaling) over TCP: hosts a ``RendezvousServer`` core on one
/// event loop. A swift-service-lifecycle `Service`, run beside the relay's
/// ``RelayService`` by `tusa relay --rendezvous-port`.
public final class RendezvousService: Service, Sendable {
    public let address: TransportAddress
    public let configuration: RendezvousServerConfiguration
    private let logger: Logger
    private let bound = BoundResult<TransportAddress>()
    private let statisticsBox = NIOLockedValueBox(RendezvousStatistics())

    private let turnURIs: (@Sendable () async throws -> [String])?
    private let admission: ConnectionAdmission
    private let party: (@Sendable () async throws -> PartyGrant)?
    /// While it says memory is short, posts are refused.
    private let memory: MemoryGuard?
    /// Where posts and seen keys are written, and read back at start (a directory's database).
    private let store: (any RendezvousStore)?
    /// The rooms of the relay's own party service, listed to users as a directory's relays list theirs.
    private let rooms: DirectoryReporter.RoomListings?

    /// `turnURIs`, when given, supplies the URIs of TURN grants once known (after the
    /// relay bound its sockets); `configuration.turn` supplies the secret and lifetime.
    /// `party`, when given, supplies where the relay hosts parties once its party
    /// service is bound; registered peers are told. `rooms`, when given, is read every
    /// 2 s for the rooms of that party service (``PartyService/roomListings(since:)``).
    public init(
        address: TransportAddress, configuration: RendezvousServerConfiguration = .init(),
        turnURIs: (@Sendable () async throws -> [String])? = nil,
        party: (@Sendable () async throws -> PartyGrant)? = nil, rooms: DirectoryReporter.RoomListings? = nil,
        memory: MemoryGuard? = nil, store: (any RendezvousStore)? = nil, logger: Logger
    ) {
        self.rooms = rooms
        self.memory = memory
        self.store = store
        self.address = address
        self.configuration = configuration
        admission = ConnectionAdmission(limits: .init(total: .max, perSource: configuration.maximumConnectionsPerSource))
        self.turnURIs = turnURIs
        self.party = party
        self.logger = logger
    }

    /// The bound address once `run()` has bound it (the real port for port 0).
    public func boundAddress() async throws -> TransportAddress { try await bound.wait() }

    /// Connections closed on accept because their IP address had
    /// ``RendezvousServerConfiguration/maximumConnectionsPerSource`` open.
    public var refusedPerSource: Int { admission.refused[.perSource] ?? 0 }

    /// The core's statistics, as of the last event.
    public var statistics: RendezvousStatistics { statisticsBox.withLockedValue { $0 } }

    public func run() async throws {
        var configuration = self.configuration
        if configuration.turn != nil, let turnURIs {
            do { configuration.turn?.uris = try await turnURIs() } catch {
                bound.resolve(.failure(error))
                await store?.close()
                throw error
            }
        }
        if let party {
            do { configuration.party = try await party() } catch {
                bound.resolve(.failure(error))
                await store?.close()
                throw error
            }
        }
        var snapshot: RendezvousSnapshot?
        if let store {
            do {
                snapshot = try await store.load(
                    unixSeconds: Hub.unixSeconds(), postsFor: configuration.mailboxLifetime,
                    seenFor: configuration.rememberFor)
            } catch {
                let failure = RelayServiceError(.invalidConfiguration, "cannot read the directory's database: \(error)")
                bound.resolve(.failure(failure))
                await store.close()
                throw failure
            }
        }
        // A node of several on one database numbers its posts apart and tells the others.
        if let store { configuration.node = await store.node }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let loop = group.next()
        let core = RendezvousServer(configuration: configuration)
        let logger = self.logger
        let writer = store.map {
            RecordWriter(
                store: $0, postsFor: configuration.mailboxLifetime, seenFor: configuration.rememberFor, logger: logger)
        }
        let hub = try await loop.submit { [statisticsBox, snapshot] in
            NIOLoopBound(
                Hub(core: core, loop: loop, writer: writer, restoring: snapshot, logger: logger) { stats in
                    statisticsBox.withLockedValue { $0 = stats }
                },
                eventLoop: loop)
        }.get()
        if let snapshot {
            logger.info(
                "rendezvous: restored from the database",
                metadata: ["posts": "\(snapshot.posts.count)", "keys": "\(snapshot.seen.count)"])
        }
        // What the other nodes on the database say, until shutdown (nothing, alone).
        // A node serves once it knows who is registered at the others (or after 5 s
        // without: it then learns as the database answers).
        let known = BoundResult<Void>()
        let follower = store.map { store in
            Task {
                await store.follow { update in
                    loop.execute {
                        hub.value.cluster(update)
                        if case .resync = update { known.resolve(.success(())) }
                    }
                }
            }
        }
        if configuration.node != 0 {
            let learned = await withTaskGroup(of: Bool.self) { group in
                group.addTask { (try? await known.wait()) != nil }
                group.addTask {
                    try? await Task.sleep(for: .seconds(5))
                    return false
                }
                defer { group.cancelAll() }
                return await group.next() ?? false
            }
            if !learned { logger.warning("rendezvous: serving before the other directory nodes' presence could be read") }
        }
        let channel: any Channel
        do {
            // One event loop: every connection's channel lives on the hub's loop.
            channel = try await ServerBootstrap(group: group)
                .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
                .childChannelOption(.writeBufferWaterMark, value: Hub.writeWaterMark)
                .childChannelInitializer { [admission] channel in
                    // The core caps the total (with an error message); one source's share is capped here.
                    guard admission.admit(channel) == nil else { return channel.close() }
                    return channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(RendezvousConnectionHandler(hub: hub.value))
                    }
                }
                .listen(on: address, listener: "rendezvous \(address)", logger: logger)
        } catch {
            let failure = RelayServiceError(
                .bindFailed, "cannot serve the rendezvous on tcp \(address): \(RelayServiceError.reason(error))")
            bound.resolve(.failure(failure))
            follower?.cancel()
            await follower?.value
            try? await loop.submit { hub.value.closeAll() }.get()
            if let writer { await writer.finish() }
            try? await group.shutdownGracefully()
            await store?.close()
            throw failure
        }
        let local = channel.localAddress.flatMap(TransportAddress.init) ?? address
        logger.info("serving the rendezvous", metadata: ["address": "tcp \(local)"])
        let observer = memory?.observe { short in loop.execute { hub.value.memoryShort(short) } }
        let lister = rooms.map { rooms in
            Task {
                var known: [String: UInt64]? = nil
                while !Task.isCancelled {
                    let (reports, now) = await DirectoryReporter.changes(of: rooms, since: known)
                    known = now
                    for report in reports { loop.execute { hub.value.localRooms(report) } }
                    try? await Task.sleep(for: .seconds(2))
                }
            }
        }
        bound.resolve(.success(local))
        try? await gracefulShutdown()
        lister?.cancel()
        await lister?.value
        if let memory, let observer { memory.stopObserving(observer) }
        try? await channel.close()
        follower?.cancel()
        await follower?.value
        try? await loop.submit { hub.value.closeAll() }.get()
        if let writer { await writer.finish() }
        try? await group.shutdownGracefully()
        await store?.close()
    }
}

/// The core (hosted on its loop by a ``CoreHost``) and the open connections,
/// touched only on `loop`.
final class Hub {
    private var host: CoreHost<RendezvousServer>!
    private var channels: [ConnectionID: any Channel] = [:]
    private var nextID: UInt64 = 1
    private let logger: Logger
    private let publish: (RendezvousStatistics) -> Void
    private let loop: any EventLoop
    /// Writes records to the store, in order; nil without one.
    private let writer: RecordWriter?
    /// Records handed to the writer, and those it has written.
    private var recordsIssued: UInt64 = 0
    private var recordsWritten: UInt64 = 0
    /// Sends and closes that came after a record not yet written, with that record's number.
    private var held: [(after: UInt64, action: RendezvousAction)] = []
    /// What a connection may have queued toward its client before it counts as not
    /// reading and is closed: four times the most a client that reads has waiting at
    /// once (its full mailbox, 64 posts of up to 16 KiB, on registering).
    static let writeWaterMark = ChannelOptions.Types.WriteBufferWaterMark(low: 1024 * 1024, high: 4 * 1024 * 1024)

    init(
        core: RendezvousServer, loop: any EventLoop, writer: RecordWriter? = nil, restoring snapshot: RendezvousSnapshot? = nil,
        logger: Logger, publish: @escaping (RendezvousStatistics) -> Void
    ) {
        self.logger = logger
        self.publish = publish
        self.loop = loop
        self.writer = writer
        host = CoreHost(core, on: loop) { [unowned self] action in
            perform(action)
        } afterActions: { [unowned self] in
            publish(host.read { $0.statistics })
        }
        if let snapshot { host.handle(.restore(snapshot, unixSeconds: Self.unixSeconds())) }
    }

    static func unixSeconds() -> UInt64 { UInt64(max(0, Date().timeIntervalSince1970)) }

    func opened(_ channel: any Channel) -> ConnectionID {
        let id = ConnectionID(nextID)
        nextID += 1
        channels[id] = channel
        host.handle(.accepted(id))
        return id
    }

    func received(_ id: ConnectionID, _ bytes: [UInt8]) {
        host.handle(.received(id, bytes, unixSeconds: Self.unixSeconds()))
    }

    func closed(_ id: ConnectionID) {
        channels[id] = nil
        host.handle(.closed(id))
        publish(host.read { $0.statistics })
    }

    func memoryShort(_ short: Bool) { host.handle(.memoryShort(short)) }

    /// What changed in the rooms of the relay's own party service.
    func localRooms(_ rooms: RelayRooms) { host.handle(.localRooms(rooms, unixSeconds: Self.unixSeconds())) }

    /// What the other directory nodes said.
    func cluster(_ update: RendezvousClusterUpdate) {
        switch update {
        case .event(let event): host.handle(.cluster(event, unixSeconds: Self.unixSeconds()))
        case .resync(let snapshot, let presence):
            host.handle(.clusterResync(snapshot, presence: presence, unixSeconds: Self.unixSeconds()))
        }
    }

    func closeAll() {
        host.stop()
        for channel in channels.values { channel.close(promise: nil) }
    }

    private func perform(_ action: RendezvousAction) {
        if case .record(let record) = action {
            guard let writer else { return }
            recordsIssued += 1
            let number = recordsIssued
            let hub = NIOLoopBound(self, eventLoop: loop)
            writer.write(record) {
                hub.eventLoop.execute { hub.value.written(number) }
            }
            return
        }
        // A post is acknowledged once it is written down, not before.
        if recordsWritten < recordsIssued {
            held.append((recordsIssued, action))
            return
        }
        carryOut(action)
    }

    private func written(_ number: UInt64) {
        recordsWritten = max(recordsWritten, number)
        let ready = held.prefix { $0.after <= recordsWritten }
        held.removeFirst(ready.count)
        for entry in ready { carryOut(entry.action) }
    }

    private func carryOut(_ action: RendezvousAction) {
        switch action {
        case .record:
            break
        case .send(let id, let bytes):
            guard let channel = channels[id] else { return }
            guard channel.isWritable else {
                // Its client does not read what it is sent, which would queue here
                // without end: it goes (a client that comes back gets its mailbox).
                logger.debug("rendezvous: closing a connection that does not read", metadata: ["connection": "\(id)"])
                channel.close(promise: nil)
                return
            }
            channel.writeAndFlush(channel.allocator.buffer(bytes: bytes), promise: nil)
        case .close(let id):
            guard let channel = channels[id] else { return }
            logger.debug("rendezvous: closing", metadata: ["connection": "\(id)"])
            // After what was written for it (the error that says why).
            channel.writeAndFlush(channel.allocator.buffer(capacity: 0)).whenComplete { _ in channel.close(promise: nil) }
        }
    }
}

/// Writes a rendezvous's records to its store in order, a transaction per batch
/// (what arrived while the last one was written), and says when each is written;
/// prunes what is no longer kept once an hour. A write that fails is tried twice
/// more (after 0.1 and 0.5 s); then it is logged (once a minute) and counted as
/// done, the rendezvous going on from memory rather than hold every answer.
final class RecordWriter: Sendable {
    private typealias Entry = (record: RendezvousRecord, done: @Sendable () -> Void)
    private let queue = NIOLockedValueBox<[Entry]>([])
    private let wake: AsyncStream<Void>.Continuation
    private let task: Task<Void, Never>

    init(store: any RendezvousStore, postsFor: Duration, seenFor: Duration, logger: Logger) {
        let (wakes, wake) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        self.wake = wake
        let queue = self.queue
        task = Task {
            var said: ContinuousClock.Instant?
            var pruned = ContinuousClock.now
            for await _ in wakes {
                // Everything waiting goes in one transaction.
                while case let batch = queue.withLockedValue({ q in
                    defer { q.removeAll() }
                    return q
                }), !batch.isEmpty {
                    var failure: (any Error)?
                    for pause in [Duration.zero, .milliseconds(100), .milliseconds(500)] {
                        if pause > .zero { try? await Task.sleep(for: pause) }
                        do {
                            try await store.write(batch.map(\.record))
                            failure = nil
                            break
                        } catch {
                            failure = error
                        }
                    }
                    if let failure {
                        let now = ContinuousClock.now
                        if said.map({ now - $0 > .seconds(60) }) ?? true {
                            said = now
                            logger.error(
                                "directory database: \(batch.count) records not written (tried three times), answered anyway: \(failure)"
                            )
                        }
                    }
                    for entry in batch { entry.done() }
                }
                if ContinuousClock.now - pruned > .seconds(3600) {
                    pruned = ContinuousClock.now
                    try? await store.prune(unixSeconds: Hub.unixSeconds(), postsFor: postsFor, seenFor: seenFor)
                }
            }
        }
    }

    func write(_ record: RendezvousRecord, then done: @escaping @Sendable () -> Void) {
        queue.withLockedValue { $0.append((record, done)) }
        wake.yield()
    }

    /// Writes what is queued, then stops.
    func finish() async {
        wake.finish()
        await task.value
    }
}

/// One TCP connection of the rendezvous.
final class RendezvousConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    private let hub: Hub
    private var id: ConnectionID?

    init(hub: Hub) { self.hub = hub }

    func channelActive(context: ChannelHandlerContext) {
        id = hub.opened(context.channel)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard let id else { return }
        var buffer = unwrapInboundIn(data)
        if let bytes = buffer.readBytes(length: buffer.readableBytes) { hub.received(id, bytes) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if let id { hub.closed(id) }
        id = nil
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
