/// The one contract of every protocol core in Tusa: a state machine that takes
/// inputs and time and says what to do, with no socket and no clock of its own.
///
/// - An input goes in with ``handle(_:now:)``.
/// - At ``nextDeadline`` (or later) the driver calls ``handleTimeout(now:)``.
/// - After either, and after any other call on the core, the driver drains
///   ``pollAction()`` until it returns nil and performs each action in order
///   (send these bytes, report this event).
///
/// A core may offer more calls beside these where a hot path must not go
/// through an enum and an action queue (sealing a voice frame into the caller's
/// buffer, unwrapping ChannelData in place); whatever such a call leaves to do
/// still comes out of ``pollAction()``.
///
/// Drivers host any core the same way (Transport's `CoreHost` on a NIO event
/// loop); tests drive it on a virtual clock (`TestSupport`'s `VirtualClock`).
public protocol SansIOCore {
    /// What the outside world tells the core: a datagram, a user's request, a signal.
    associatedtype Input
    /// What the core asks the driver to do.
    associatedtype Action

    /// Feeds one input at `now`.
    mutating func handle(_ input: Input, now: Timestamp)

    /// Runs the core's timers: retransmissions, refreshes, keepalives, expiries.
    /// Harmless when called early or more than once.
    mutating func handleTimeout(now: Timestamp)

    /// When the core next needs ``handleTimeout(now:)``; nil while only an input can change anything.
    var nextDeadline: Timestamp? { get }

    /// The next thing to do, in the order the core decided them; nil when nothing is left.
    mutating func pollAction() -> Action?
}

extension SansIOCore {
    /// Every action waiting, in order (tests and simple drivers).
    public mutating func drainActions() -> [Action] {
        var actions: [Action] = []
        while let action = pollAction() { actions.append(action) }
        return actions
    }
}

/// A core's actions waiting for ``SansIOCore/pollAction()``, first in first out:
/// taken from the front without shifting the rest (the storage is emptied, its
/// capacity kept, once all are taken), so a relay core that leaves a copy per
/// member for one frame pays no quadratic `removeFirst`.
public struct ActionQueue<Element> {
    private var items: [Element] = []
    private var head = 0

    public init() {}

    /// Whether nothing waits.
    public var isEmpty: Bool { head == items.count }

    public mutating func append(_ item: Element) { items.append(item) }

    /// The oldest action, or nil.
    public mutating func popFirst() -> Element? {
        guard head < items.count else { return nil }
        let item = items[head]
        head += 1
        if head == items.count {
            items.removeAll(keepingCapacity: true)
            head = 0
        }
        return item
    }
}

extension ActionQueue: Sendable where Element: Sendable {}
