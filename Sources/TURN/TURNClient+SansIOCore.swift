import TusaBase

extension TURNClient: SansIOCore {
    /// What reaches the client from outside, besides its operations.
    public enum Input: Sendable {
        /// One datagram (UDP) or one frame (a ``StreamFramer`` cut from TCP) from the server.
        case received([UInt8])
    }

    /// What the client asks its driver to do.
    public enum Action: Hashable, Sendable {
        /// Send these bytes to the server.
        case transmit([UInt8])
        /// Pass this event on (an operation finished, a refresh failed, ...).
        case event(Event)
        /// Data from a peer arrived through the relay (ChannelData or a Data indication).
        case deliver(Datagram)
    }

    public mutating func handle(_ input: Input, now: Timestamp) {
        switch input {
        case .received(let bytes):
            if let datagram = receive(bytes, now: now) { actions.append(.deliver(datagram)) }
        }
    }

    /// The next message for the server, skipping anything else (tests that play the server).
    public mutating func pollTransmit() -> [UInt8]? {
        guard let i = actions.firstIndex(where: { if case .transmit = $0 { true } else { false } }),
            case .transmit(let bytes) = actions.remove(at: i)
        else { return nil }
        return bytes
    }

    /// The next event, skipping anything else (tests that watch the client's events).
    public mutating func pollEvent() -> Event? {
        guard let i = actions.firstIndex(where: { if case .event = $0 { true } else { false } }),
            case .event(let event) = actions.remove(at: i)
        else { return nil }
        return event
    }
}
