import TusaBase

/// A STUN client transaction (RFC 8489 §6.2) as a sans-IO core (``SansIOCore``).
///
/// Over UDP the request is sent at 0, RTO, 3·RTO, 7·RTO, … (the interval
/// doubles) until `Rc` transmissions, then the client waits `Rm`·RTO more before
/// giving up: 0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5 s and failure at 39.5 s with the
/// defaults. Over a reliable transport it is sent once and fails after `Ti`
/// (39.5 s). The driver feeds ``Input/start`` and the responses, calls
/// ``handleTimeout(now:)`` at ``nextDeadline`` and performs the ``Action``s.
public struct ClientTransaction: SansIOCore, Sendable {
    /// Retransmission parameters.
    public enum Reliability: Hashable, Sendable {
        /// UDP: initial RTO, Rc (total transmissions) and Rm (final wait in RTOs).
        case unreliable(rto: Duration = .milliseconds(500), rc: Int = 7, rm: Int = 16)
        /// TCP/TLS: one transmission, then time out after `timeout` (Ti).
        case reliable(timeout: Duration = .milliseconds(39_500))
    }

    public enum Input: Hashable, Sendable {
        /// Send the request for the first time (once; later starts are ignored).
        case start
        /// A decoded message that may answer this transaction (see ``ClientTransaction/receive(_:)``).
        case response(Message)
    }

    /// What the driver must do.
    public enum Action: Hashable, Sendable {
        /// Send the request bytes now (the first transmission or a retransmission).
        case send([UInt8])
        /// The transaction failed: no response in time.
        case timedOut
        /// The transaction is over: this response answers it.
        case answered(Message)
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
    /// When the next retransmission (or the time-out) is due, while ``state`` is `.waiting`.
    public private(set) var deadline = Timestamp.zero
    private var interval: Duration = .zero
    public private(set) var startedAt = Timestamp.zero
    private var queued: [Action] = []

    /// - Parameter request: the encoded request; its transaction ID must be `transactionID`.
    public init(transactionID: TransactionID, request: [UInt8], reliability: Reliability = .unreliable()) {
        self.transactionID = transactionID
        self.request = request
        self.reliability = reliability
    }

    public mutating func handle(_ input: Input, now: Timestamp) {
        switch input {
        case .start:
            guard state == .idle else { return }
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
            queued.append(.send(request))
        case .response(let message):
            if receive(message) { queued.append(.answered(message)) }
        }
    }

    /// Retransmits, or times out, when the deadline has come.
    public mutating func handleTimeout(now: Timestamp) {
        guard state == .waiting, now >= deadline else { return }
        switch reliability {
        case .reliable:
            state = .timedOut
            queued.append(.timedOut)
        case .unreliable(let rto, let rc, let rm):
            if transmissions >= rc {
                state = .timedOut
                queued.append(.timedOut)
                return
            }
            transmissions += 1
            interval = interval * 2
            // After the last transmission, wait Rm·RTO (RFC 8489 §6.2.1).
            deadline = now + (transmissions == rc ? rto * rm : interval)
            queued.append(.send(request))
        }
    }

    /// The next retransmission or the time-out; nil once the transaction is over (or not started).
    public var nextDeadline: Timestamp? { state == .waiting ? deadline : nil }

    public mutating func pollAction() -> Action? {
        queued.isEmpty ? nil : queued.removeFirst()
    }

    /// Offers a decoded response. Returns true when it answers this transaction
    /// (same transaction ID, a response class); the transaction is then over.
    /// (For a driver that matches responses itself; ``Input/response(_:)`` does
    /// the same and reports ``Action/answered(_:)``.)
    public mutating func receive(_ response: Message) -> Bool {
        guard state == .waiting, response.transactionID == transactionID,
            response.type.messageClass == .successResponse || response.type.messageClass == .errorResponse
        else { return false }
        state = .answered
        return true
    }
}
