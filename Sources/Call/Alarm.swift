import TusaBase

/// One timer for a driver: a task sleeping until the deadline it was set to,
/// then yielding ``CallEvent/wake`` into the driver's events. Setting it again
/// cancels the previous sleep.
struct Alarm {
    private let feed: AsyncStream<CallEvent>.Continuation
    private var task: Task<Void, Never>?
    private(set) var deadline: Timestamp?

    init(feed: AsyncStream<CallEvent>.Continuation) { self.feed = feed }

    /// Wakes the driver at `deadline` (nil: never), measured from `now`.
    mutating func set(_ deadline: Timestamp?, now: Timestamp) {
        guard deadline != self.deadline else { return }
        task?.cancel()
        task = nil
        self.deadline = deadline
        guard let deadline else { return }
        let delay = deadline - now
        let feed = feed
        task = Task {
            if delay > .zero { try? await Task.sleep(for: delay) }
            if !Task.isCancelled { feed.yield(.wake) }
        }
    }

    /// A ``CallEvent/wake`` came: the next ``set(_:now:)`` arms again, even for the same deadline.
    mutating func rang() {
        deadline = nil
        task = nil
    }

    mutating func cancel() { set(nil, now: .zero) }
}
