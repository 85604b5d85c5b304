import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Rendezvous
import STUN
import Secure
import TusaBase

/// Errors of a rendezvous connection as a client sees them.
public enum RendezvousConnectionError: Error, Equatable, Sendable, CustomStringConvertible {
    case connectFailed(TransportAddress, String)
    /// No registration answer within the timeout.
    case timedOut(TransportAddress)
    /// The server refused (offline or unknown peer, bad proof, replaced, ...).
    case refused(RendezvousErrorCode, String)
    /// The connection closed (or broke) before an answer.
    case closed(String)

    public var description: String {
        switch self {
        case .connectFailed(let a, let why): "cannot reach the rendezvous at \(a): \(why)"
        case .timedOut(let a): "the rendezvous at \(a) did not answer in time"
        case .refused(let code, let detail): "the rendezvous refused (\(code.rawValue)): \(detail)"
        case .closed(let why): "the rendezvous connection closed: \(why)"
        }
    }
}

/// A registered connection to a rendezvous: the client core over NIO TCP.
/// `incoming` yields what peers sent (opened and authenticated); lookups and sends
/// wait for the server's answer. Pings keep the registration alive.
public final class RendezvousConnection: Sendable {
    public let server: TransportAddress
    public let identity: PublicKey
    /// TURN credentials the rendezvous handed out at registration, if any.
    public let turn: TURNGrant?
    /// Payloads from peers, in arrival order; finishes when the connection closes.
    public let incoming: AsyncStream<(from: PublicKey, payload: [UInt8])>
    /// How long a lookup or send waits for the server's answer.
    public let requestTimeout: Duration = .seconds(10)

    private let channel: any Channel
    private let state: NIOLockedValueBox<State>
    private let pinger: NIOLockedValueBox<RepeatedTask?>

    struct State {
        var core: RendezvousClient
        var pending: [UInt32: CheckedContinuation<RendezvousClient.Event, any Error>] = [:]
        var registration: CheckedContinuation<TURNGrant?, any Error>?
        /// The server's answer to the registration when it came before `connect`
        /// was waiting for it (the hello and the answer can both arrive while the
        /// caller's task has not run again since the TCP connect).
        var registrationOutcome: Result<TURNGrant?, RendezvousConnectionError>?
        var registrationAwaited = false
        var closedReason: String?
        var yield: AsyncStream<(from: PublicKey, payload: [UInt8])>.Continuation
    }

    private init(server: TransportAddress, identity: PublicKey, turn: TURNGrant?, channel: any Channel, state: NIOLockedValueBox<State>,
                 incoming: AsyncStream<(from: PublicKey, payload: [UInt8])>) {
        self.server = server; self.identity = identity; self.turn = turn; self.channel = channel; self.state = state
        self.incoming = incoming
        pinger = NIOLockedValueBox(nil)
    }

    /// Connects, registers `identity` and returns once the server confirmed it.
    public static func connect(to server: TransportAddress, identity: PrivateKey, timeout: Duration = .seconds(10),
                               group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) async throws -> RendezvousConnection {
        let (stream, yield) = AsyncStream<(from: PublicKey, payload: [UInt8])>.makeStream()
        let state = NIOLockedValueBox(State(core: RendezvousClient(identity: identity), yield: yield))
        let channel: any Channel
        do {
            channel = try await ClientBootstrap(group: group)
                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                .connectTimeout(.nanoseconds(timeout.nanoseconds))
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(ClientHandler(state: state))
                    }
                }
                .connect(to: SocketAddress(server)).get()
        } catch {
            throw RendezvousConnectionError.connectFailed(server, "\(error)")
        }
        let timer = channel.eventLoop.scheduleTask(in: .nanoseconds(timeout.nanoseconds)) {
            let waiter = state.withLockedValue { s -> CheckedContinuation<TURNGrant?, any Error>? in
                defer { s.registration = nil }
                if !s.registrationAwaited, s.registrationOutcome == nil { s.registrationOutcome = .failure(.timedOut(server)) }
                return s.registration
            }
            waiter?.resume(throwing: RendezvousConnectionError.timedOut(server))
        }
        let turn: TURNGrant?
        do {
            turn = try await withCheckedThrowingContinuation { (c: CheckedContinuation<TURNGrant?, any Error>) in
                let early = state.withLockedValue { s -> Result<TURNGrant?, RendezvousConnectionError>? in
                    s.registrationAwaited = true
                    if let outcome = s.registrationOutcome { return outcome }
                    if let why = s.closedReason { return .failure(.closed(why)) }
                    s.registration = c
                    return nil
                }
                if let early { c.resume(with: early.mapError { $0 as any Error }) }
            }
        } catch {
            timer.cancel()
            channel.close(promise: nil)
            throw error
        }
        timer.cancel()
        let connection = RendezvousConnection(server: server, identity: identity.publicKey, turn: turn, channel: channel, state: state, incoming: stream)
        let task = channel.eventLoop.scheduleRepeatedTask(initialDelay: .seconds(30), delay: .seconds(30)) { [state] _ in
            let ping = state.withLockedValue { $0.core.ping() }
            channel.writeAndFlush(channel.allocator.buffer(bytes: ping), promise: nil)
        }
        connection.pinger.withLockedValue { $0 = task }
        return connection
    }

    /// Whether `peer` is registered now.
    public func lookup(_ peer: PublicKey) async throws -> Bool {
        let event = try await request { core in core.lookup(peer) }
        guard case .lookup(_, _, let online) = event else { throw RendezvousConnectionError.closed("unexpected answer \(event)") }
        return online
    }

    /// Seals `payload` to `peer` and waits until the server passed it on (throws
    /// `.refused(.offline/.unknownPeer, …)` otherwise).
    public func send(_ payload: [UInt8], to peer: PublicKey) async throws {
        var sealError: (any Error)?
        let event = try await request { core in
            do { return try core.send(payload, to: peer) } catch { sealError = error; return nil }
        }
        if let sealError { throw sealError }
        guard case .sent = event else { throw RendezvousConnectionError.closed("unexpected answer \(event)") }
    }

    public func close() async {
        _ = pinger.withLockedValue { $0?.cancel() }
        try? await channel.close()
    }

    private func request(_ make: (inout RendezvousClient) -> (id: UInt32, bytes: [UInt8])?) async throws -> RendezvousClient.Event {
        let made = state.withLockedValue { make(&$0.core) }
        guard let (id, bytes) = made else { return .pong }   // the caller reports its own error
        return try await withCheckedThrowingContinuation { (c: CheckedContinuation<RendezvousClient.Event, any Error>) in
            let closed = state.withLockedValue { s -> String? in
                if let why = s.closedReason { return why }
                s.pending[id] = c
                return nil
            }
            if let closed { c.resume(throwing: RendezvousConnectionError.closed(closed)); return }
            let state = self.state, server = self.server
            // A write onto a connection that is closing fails the request at once...
            channel.writeAndFlush(channel.allocator.buffer(bytes: bytes)).whenFailure { error in
                let waiter = state.withLockedValue { $0.pending.removeValue(forKey: id) }
                waiter?.resume(throwing: RendezvousConnectionError.closed("\(error)"))
            }
            // ...and a server that never answers must not hang the caller.
            channel.eventLoop.scheduleTask(in: .nanoseconds(requestTimeout.nanoseconds)) {
                let waiter = state.withLockedValue { $0.pending.removeValue(forKey: id) }
                waiter?.resume(throwing: RendezvousConnectionError.timedOut(server))
            }
        }
    }

    final class ClientHandler: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        let state: NIOLockedValueBox<State>
        init(state: NIOLockedValueBox<State>) { self.state = state }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var buffer = unwrapInboundIn(data)
            guard let bytes = buffer.readBytes(length: buffer.readableBytes) else { return }
            var resumes: [() -> Void] = []
            let reply: [UInt8]
            do {
                reply = try state.withLockedValue { s -> [UInt8] in
                    let (events, reply) = try s.core.receive(bytes)
                    for event in events {
                        switch event {
                        case .registered(let turn):
                            if let c = s.registration { s.registration = nil; resumes.append { c.resume(returning: turn) } }
                            else if !s.registrationAwaited { s.registrationOutcome = .success(turn) }
                        case .lookup(let id, _, _), .sent(let id):
                            if let c = s.pending.removeValue(forKey: id) { resumes.append { c.resume(returning: event) } }
                        case .refused(let code, let detail, let id):
                            let error = RendezvousConnectionError.refused(code, detail)
                            if let id, let c = s.pending.removeValue(forKey: id) {
                                resumes.append { c.resume(throwing: error) }
                            } else if let c = s.registration {
                                s.registration = nil; resumes.append { c.resume(throwing: error) }
                            } else if id == nil, !s.registrationAwaited, s.registrationOutcome == nil {
                                s.registrationOutcome = .failure(error)
                            }
                        case .received(let from, let payload):
                            s.yield.yield((from, payload))
                        case .unopenable, .pong:
                            break
                        }
                    }
                    return reply
                }
            } catch {
                fail(context: context, reason: "\(error)")
                return
            }
            for resume in resumes { resume() }
            if !reply.isEmpty { context.writeAndFlush(NIOAny(context.channel.allocator.buffer(bytes: reply)), promise: nil) }
        }

        func channelInactive(context: ChannelHandlerContext) {
            fail(context: nil, reason: "closed by the server")
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            fail(context: context, reason: "\(error)")
        }

        private func fail(context: ChannelHandlerContext?, reason: String) {
            let (waiters, registration, yield) = state.withLockedValue { s in
                if s.closedReason == nil { s.closedReason = reason }
                defer { s.pending = [:]; s.registration = nil }
                return (Array(s.pending.values), s.registration, s.yield)
            }
            for w in waiters { w.resume(throwing: RendezvousConnectionError.closed(reason)) }
            registration?.resume(throwing: RendezvousConnectionError.closed(reason))
            yield.finish()
            context?.close(promise: nil)
        }
    }
}
