import Foundation

#if canImport(Glibc)
    import Glibc
#endif

// The interop tests' waits. A wait waits for an event, with a deadline that
// only bounds a failure (the event usually comes in milliseconds; the deadline
// is generous because two busy cores can stall a process for seconds). A
// negative check ("nothing more arrived") waits for a later sentinel that
// travels the same path, never for a fixed time.

/// Polls `condition` every `poll` until it holds or `within` has passed;
/// whether it held. Sleeps between polls without holding a thread, also once
/// the task is cancelled (cleanup such as stopping a process still waits, and
/// neither spins nor outlives its deadline).
func eventually(
    within limit: Duration, poll: Duration = .milliseconds(10), _ condition: () async throws -> Bool
) async rethrows -> Bool {
    let clock = ContinuousClock()
    let deadline = clock.now.advanced(by: limit)
    while true {
        if try await condition() { return true }
        guard clock.now < deadline else { return try await condition() }
        do { try await Task.sleep(for: poll) } catch { await uncancellableSleep(poll) }
    }
}

/// Sleeps without holding a thread, whether or not the task is cancelled.
private func uncancellableSleep(_ duration: Duration) async {
    let (s, atto) = duration.components
    await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
        DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(Int(s * 1_000_000_000 + atto / 1_000_000_000))) {
            c.resume()
        }
    }
}

/// ``eventually(within:poll:_:)`` for blocking code that already runs off the
/// cooperative pool (inside ``Harness/offPool(_:)``): it holds its thread.
func eventuallyBlocking(within limit: Duration, poll: Duration = .milliseconds(10), _ condition: () throws -> Bool) rethrows
    -> Bool
{
    let clock = ContinuousClock()
    let deadline = clock.now.advanced(by: limit)
    while true {
        if try condition() { return true }
        guard clock.now < deadline else { return try condition() }
        let (s, atto) = poll.components
        usleep(UInt32(s * 1_000_000 + atto / 1_000_000_000_000))
    }
}

/// What ``withDeadline(_:_:)`` throws when time runs out.
struct DeadlinePassed: Error, CustomStringConvertible {
    var limit: Duration
    var description: String { "timed out after \(limit)" }
}

/// `body`'s result, or ``DeadlinePassed`` (and `body` cancelled) once `limit` has passed.
func withDeadline<T: Sendable>(_ limit: Duration, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: limit)
            throw DeadlinePassed(limit: limit)
        }
        defer { group.cancelAll() }
        guard let first = try await group.next() else { throw DeadlinePassed(limit: limit) }
        return first
    }
}

/// The next element of `stream`, or nil if none comes within `limit`.
func next<Element: Sendable>(_ stream: AsyncStream<Element>, within limit: Duration) async -> Element? {
    (try? await withDeadline(limit) {
        var it = stream.makeAsyncIterator()
        return await it.next()
    }) ?? nil
}
