import TusaBase

/// A STUN client transaction (RFC 8489 §6.2) as a pure state machine.
///
/// Over UDP the request is sent at 0, RTO, 3·RTO, 7·RTO, … (the interval
/// doubles) until `Rc` transmissions, then the client waits `Rm`·RTO more before
/// giving up: 0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5 s and failure at 39.5 s with the
/// defaults. Over a reliable transport it is sent once and fails after `Ti`
/// (39.5 s). The driver performs ``Action``s and calls back with the time.
public struct ClientTransaction: Sendable {
    /// Retransmission parameters.
    public enum Reliability: Hashable, Sendable {
        /// UDP: initial RTO, Rc (total transmissions) and Rm (final wait in RTOs).
        case unreliable(rto: Duration = .milliseconds(500), rc: Int = 7, rm: Int = 16)
        /// TCP/TLS: one transmission, then time out after `timeout` (Ti).
        case reliable(timeout: Duration = .milliseconds(39_500))
    }

    /// What the driver must do.
    public enum Action: Hashable, Sendable {
        /// Send the request bytes now, and call ``timerFired(now:)`` at `wakeAt`.
        case send([UInt8], wakeAt: Timestamp)
        /// Nothing to send; call back at `wakeAt`.
        case wait(until: Timestamp)
        /// The transaction failed: no response in time.
        case timedOut
        /// The transaction is over (answered or timed out); drop it.
        case none
    }

    public enum State: Hashable, Sendable {
        case idle, waiting, answered, timedOut
    }

    public let transactionID: TransactionID
    public let request: [UInt8]
    public let reliability: Reliability
    public private(set) var state: State = .idle
    /// Transmissions so far.
    public private(set) var transmissions = 0
    /// When the driver must call ``timerFired(now:)`` next.
    public private(set) var deadline = Timestamp.zero
    private var interval: Duration = .zero
    public private(set) var startedAt = Timestamp.zero

    /// - Parameter request: the encoded request; its transaction ID must be `transactionID`.
    public init(transactionID: TransactionID, request: [UInt8], reliability: Reliability = .unreliable()) {
        self.transactionID = transactionID
        self.request = request
        self.reliability = reliability
    }

    /// Starts the transaction: returns the first transmission.
    public mutating func start(now: Timestamp) -> Action {
        guard state == .idle else { return .none }
        state = .waiting
        startedAt = now
        transmissions = 1
        switch reliability {
        case .unreliable(let rto, let rc, let rm):
            interval = rto
            deadline = now + (rc <= 1 ? rto * rm : rto)
        case .reliable(let timeout):
            deadline = now + timeout
        }
        return .send(request, wakeAt: deadline)
    }

    /// Advances the clock: retransmits, keeps waiting, or times out.
    public mutating func timerFired(now: Timestamp) -> Action {
        guard state == .waiting else { return .none }
        guard now >= deadline else { return .wait(until: deadline) }
        switch reliability {
        case .reliable:
            state = .timedOut
            return .timedOut
        case .unreliable(let rto, let rc, let rm):
            if transmissions >= rc {
                state = .timedOut
                return .timedOut
            }
            transmissions += 1
            interval = interval * 2
            // After the last transmission, wait Rm·RTO (RFC 8489 §6.2.1).
            deadline = now + (transmissions == rc ? rto * rm : interval)
            return .send(request, wakeAt: deadline)
        }
    }

    /// Offers a decoded response. Returns true when it answers this transaction
    /// (same transaction ID, a response class); the transaction is then over.
    public mutating func receive(_ response: Message) -> Bool {
        guard state == .waiting, response.transactionID == transactionID,
            response.type.messageClass == .successResponse || response.type.messageClass == .errorResponse
        else { return false }
        state = .answered
        return true
    }
}
