import STUN
import TusaBase

extension TURNServer: SansIOCore {
    /// What reaches the server: the generic form of its hot-path calls.
    public enum Input: Sendable {
        /// A datagram (or a frame cut from a stream) from a client.
        case fromClient([UInt8], FiveTuple)
        /// A datagram from a peer, arrived on the relay socket at `relay`.
        case fromPeer([UInt8], from: TransportAddress, relay: TransportAddress)
        /// A client's TCP or TLS connection closed (its allocation goes with it).
        case connectionClosed(FiveTuple)
    }

    /// What the server asks its driver to do.
    public enum Action: Sendable {
        /// Send these bytes to the client of this 5-tuple (an answer, ChannelData or a Data indication).
        case sendToClient([UInt8], FiveTuple)
        /// Send this payload from the relay socket at `relay` to `peer`.
        case sendToPeer([UInt8], relay: TransportAddress, peer: TransportAddress)
        /// Something worth a log line.
        case event(TURNEvent)
    }

    /// How often the server sweeps expired allocations, permissions, channels and reservations.
    public static let sweepInterval: Duration = .seconds(1)

    public func handle(_ input: Input, now: Timestamp) {
        switch input {
        case .fromClient(let bytes, let tuple):
            switch handleClient(bytes, from: tuple, now: now) {
            case .reply(let reply):
                actions.append(.sendToClient(reply, tuple))
            case .relay(let allocation, let peer, let range):
                guard let relay = allocation.relay(toward: peer) else {
                    recordDrop(.noRelaySocket)
                    return
                }
                actions.append(.sendToPeer(Array(bytes[range]), relay: relay, peer: peer))
            case .drop:
                break
            }
        case .fromPeer(let payload, let peer, let relay):
            guard let allocation = allocation(relay: relay) else {
                recordDrop(.noAllocation)
                return
            }
            switch handlePeer(payload, from: peer, allocation: allocation, now: now) {
            case .channel(let number, let tuple):
                let frame = ChannelData(channel: number, data: payload)
                actions.append(.sendToClient(frame.encode(padded: tuple.transport.isStream), tuple))
            case .indication(let bytes, let tuple):
                actions.append(.sendToClient(bytes, tuple))
            case .drop:
                break
            }
        case .connectionClosed(let tuple):
            connectionClosed(tuple, now: now)
        }
    }

    /// Frees every expired allocation, permission, channel and reservation.
    public func handleTimeout(now: Timestamp) {
        lastSweep = now
        expire(now: now)
    }

    /// The next sweep: a second after the last one (at once before the first).
    public var nextDeadline: Timestamp? {
        lastSweep.map { $0 + Self.sweepInterval } ?? .zero
    }

    public func pollAction() -> Action? {
        actions.isEmpty ? nil : actions.removeFirst()
    }

    func report(_ event: TURNEvent) {
        actions.append(.event(event))
    }
}
