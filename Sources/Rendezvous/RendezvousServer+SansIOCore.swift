import TusaBase

extension RendezvousServer: SansIOCore {
    /// What the driver tells the server about its connections.
    public enum Input: Sendable {
        /// A new connection: the server greets it with a challenge.
        case accepted(ConnectionID)
        /// Bytes from a connection; `unixSeconds` dates TURN credentials (the core reads no clock).
        case received(ConnectionID, [UInt8], unixSeconds: UInt64)
        /// The driver saw the connection close.
        case closed(ConnectionID)
        /// The host is short of memory (true) or no longer (false): while it is,
        /// nothing new is kept (posts are refused); sending to an online peer goes on.
        case memoryShort(Bool)
    }

    public typealias Action = RendezvousAction

    public mutating func handle(_ input: Input, now: Timestamp) {
        switch input {
        case .accepted(let id): pending += accept(id, now: now)
        case .received(let id, let bytes, let unixSeconds): pending += receive(id, bytes, now: now, unixSeconds: unixSeconds)
        case .closed(let id): closed(id, now: now)
        case .memoryShort(let short): memoryShort = short
        }
    }

    /// Connections that did not register in time or went silent are closed; peers
    /// forgotten after `rememberFor`.
    public mutating func handleTimeout(now: Timestamp) {
        pending += poll(now: now)
    }

    public mutating func pollAction() -> RendezvousAction? {
        pending.isEmpty ? nil : pending.removeFirst()
    }
}
