import Logging
import NIOCore
import NIOPosix
import STUN
import TusaBase

/// Why a STUN client request failed.
public struct STUNClientError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Code: Hashable, Sendable {
        /// No answer in time.
        case timeout
        /// The network said no (ICMP port unreachable on a connected socket, or a send error).
        case unreachable
        /// The server answered with an error response.
        case errorResponse
        /// The answer lacked what was asked for.
        case badResponse
        /// The client was closed while waiting.
        case closed
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}

/// The useful parts of a Binding success response.
public struct BindingResult: Hashable, Sendable {
    /// XOR-MAPPED-ADDRESS (or MAPPED-ADDRESS from older servers).
    public var mapped: TransportAddress
    public var responseOrigin: TransportAddress?
    public var otherAddress: TransportAddress?
    /// Where the response actually came from.
    public var from: TransportAddress
    public var roundTrip: Duration
    public var response: Message
}

/// A STUN client on one UDP socket: runs ``ClientTransaction``s (RFC 8489
/// retransmission) on the socket's event loop and matches responses by
/// transaction ID.
public final class STUNClient: Sendable {
    private let channel: Channel
    private let handler: NIOLoopBound<ClientHandler>
    /// The socket's own address.
    public let localAddress: TransportAddress?

    private init(channel: Channel, handler: NIOLoopBound<ClientHandler>) {
        self.channel = channel
        self.handler = handler
        self.localAddress = channel.localAddress.flatMap { TransportAddress($0) }
    }

    /// Opens a client socket bound to `local` (port 0 for any), optionally
    /// connected to one server so that ICMP errors surface as ``STUNClientError/Code/unreachable``.
    public static func open(
        local: SocketAddress, connectedTo server: SocketAddress? = nil,
        group: EventLoopGroup = MultiThreadedEventLoopGroup.singleton
    ) async throws -> STUNClient {
        let bootstrap = DatagramBootstrap(group: group)
            .channelOption(.socketOption(.so_reuseaddr), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ClientHandler())
                }
            }
        let channel: Channel
        if let server {
            channel = try await bootstrap.bind(to: local).flatMap { ch in ch.connect(to: server).map { ch } }.get()
        } else {
            channel = try await bootstrap.bind(to: local).get()
        }
        let handler = try await channel.eventLoop.submit {
            NIOLoopBound(try channel.pipeline.syncOperations.handler(type: ClientHandler.self), eventLoop: channel.eventLoop)
        }.get()
        return STUNClient(channel: channel, handler: handler)
    }

    /// Sends a request and waits for its response, retransmitting as RFC 8489
    /// says, but giving up after `timeout` at most.
    public func request(
        _ message: Message, to server: TransportAddress, timeout: Duration = .seconds(5),
        reliability: ClientTransaction.Reliability = .unreliable()
    ) async throws(STUNClientError) -> (Message, TransportAddress, Duration) {
        let bytes = message.encode(fingerprint: true)
        let promise = channel.eventLoop.makePromise(of: (Message, TransportAddress, Duration).self)
        let handler = self.handler
        let channel = self.channel
        channel.eventLoop.execute {
            handler.value.start(
                ClientTransaction(transactionID: message.transactionID, request: bytes, reliability: reliability),
                to: server, timeout: timeout, promise: promise, channel: channel)
        }
        do {
            return try await promise.futureResult.get()
        } catch let error as STUNClientError {
            throw error
        } catch {
            throw STUNClientError(.unreachable, "\(server): \(error)")
        }
    }

    /// A Binding request; `change` adds an RFC 5780 CHANGE-REQUEST.
    public func binding(
        to server: TransportAddress, change: ChangeRequest? = nil, timeout: Duration = .seconds(5)
    ) async throws(STUNClientError) -> BindingResult {
        var request = Message(type: .bindingRequest)
        if let change { request.append(.changeRequest(change)) }
        let (response, from, rtt) = try await self.request(request, to: server, timeout: timeout)
        if response.type.messageClass == .errorResponse {
            var what = "error response"
            if case .errorCode(let e)? = try? response.value(.errorCode) { what = "\(e.code) \(e.reason)" }
            throw STUNClientError(.errorResponse, "\(server) answered \(what)")
        }
        var mapped: TransportAddress?
        if case .xorMappedAddress(let a)? = try? response.value(.xorMappedAddress) {
            mapped = a
        } else if case .mappedAddress(let a)? = try? response.value(.mappedAddress) {
            mapped = a
        }
        guard let mapped else {
            throw STUNClientError(.badResponse, "\(server) answered without a mapped address")
        }
        var result = BindingResult(mapped: mapped, from: from, roundTrip: rtt, response: response)
        if case .responseOrigin(let a)? = try? response.value(.responseOrigin) { result.responseOrigin = a }
        if case .otherAddress(let a)? = try? response.value(.otherAddress) { result.otherAddress = a }
        return result
    }

    public func close() async {
        try? await channel.close()
    }
}

/// Event-loop-confined transaction table: each transaction runs in a
/// ``CoreHost`` of its own (its retransmissions), with a give-up timer for the
/// caller's overall timeout.
final class ClientHandler: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    typealias OutboundOut = AddressedEnvelope<ByteBuffer>

    struct Pending {
        var host: CoreHost<ClientTransaction>
        var destination: TransportAddress
        var deadline: Timestamp
        var promise: EventLoopPromise<(Message, TransportAddress, Duration)>
        var giveUp: Scheduled<Void>?
        /// Where the response being fed came from.
        var responseFrom: TransportAddress?
    }

    private var pending: [TransactionID: Pending] = [:]

    func start(
        _ transaction: ClientTransaction, to destination: TransportAddress, timeout: Duration,
        promise: EventLoopPromise<(Message, TransportAddress, Duration)>, channel: Channel
    ) {
        let id = transaction.transactionID
        guard pending[id] == nil else {
            promise.fail(STUNClientError(.badResponse, "transaction \(id) is already under way"))
            return
        }
        let bound = NIOLoopBound(self, eventLoop: channel.eventLoop)
        // (The host is dropped with its entry in `pending`, which ends the cycle through this closure.)
        let host = CoreHost(transaction, on: channel.eventLoop) { action in
            bound.value.perform(action, id: id, channel: channel)
        }
        let deadline = Timestamp.now() + timeout
        let giveUp = channel.eventLoop.scheduleTask(deadline: .uptimeNanoseconds(deadline.nanoseconds)) {
            bound.value.gaveUp(id)
        }
        pending[id] = Pending(host: host, destination: destination, deadline: deadline, promise: promise, giveUp: giveUp)
        host.handle(.start)
    }

    private func perform(_ action: ClientTransaction.Action, id: TransactionID, channel: Channel) {
        guard let p = pending[id] else { return }
        switch action {
        case .send(let bytes):
            var buffer = channel.allocator.buffer(capacity: bytes.count)
            buffer.writeBytes(bytes)
            let envelope = AddressedEnvelope(remoteAddress: SocketAddress(p.destination), data: buffer)
            let destination = p.destination
            let bound = NIOLoopBound(self, eventLoop: channel.eventLoop)
            channel.writeAndFlush(envelope).whenFailure { error in
                bound.value.fail(id, STUNClientError(.unreachable, "cannot send to \(destination): \(error)"))
            }
        case .timedOut:
            fail(id, STUNClientError(.timeout, "no response from \(p.destination)"))
        case .answered(let message):
            guard let from = p.responseFrom else { return }
            pending[id] = nil
            p.host.stop()
            p.giveUp?.cancel()
            p.promise.succeed((message, from, Timestamp.now() - p.host.read(\.startedAt)))
        }
    }

    private func gaveUp(_ id: TransactionID) {
        guard let p = pending[id] else { return }
        let waited = Double((p.deadline - p.host.read(\.startedAt)).nanoseconds) / 1e9
        fail(id, STUNClientError(.timeout, "no response from \(p.destination) within \(waited) s"))
    }

    private func fail(_ id: TransactionID, _ error: STUNClientError) {
        guard let p = pending.removeValue(forKey: id) else { return }
        p.host.stop()
        p.giveUp?.cancel()
        p.promise.fail(error)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let envelope = unwrapInboundIn(data)
        let bytes = Array(envelope.data.readableBytesView)
        guard let message = try? Message(decoding: bytes), let host = pending[message.transactionID]?.host,
            let from = TransportAddress(envelope.remoteAddress)
        else { return }
        // A FINGERPRINT, when present, must be right (RFC 8489 §7.3).
        if message.attribute(.fingerprint) != nil && message.checkFingerprint() != .valid { return }
        pending[message.transactionID]?.responseFrom = from
        host.handle(.response(message))
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        // On a connected socket, ICMP port unreachable arrives as ECONNREFUSED.
        for id in Array(pending.keys) {
            let destination = pending[id]?.destination.description ?? "server"
            fail(id, STUNClientError(.unreachable, "\(destination) refused (nothing listening?): \(error)"))
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        for id in Array(pending.keys) { fail(id, STUNClientError(.closed, "client closed")) }
        context.fireChannelInactive()
    }
}
