import NIOCore
import TusaBase

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

extension Timestamp {
    /// The monotonic clock every driver reads: NIO's uptime clock, the one its
    /// scheduled tasks run on, so a core's deadline is a timer's deadline as it is.
    public static func now() -> Timestamp { Timestamp(nanoseconds: NIODeadline.now().uptimeNanoseconds) }

    /// Unix time, in nanoseconds, at this clock's zero: a core that must stamp wall-clock
    /// time (TAI64N handshakes, REST credentials' expiry) adds its `Timestamp` to this.
    public static func unixNanosecondsAtZero() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let uptime = NIODeadline.now().uptimeNanoseconds
        return (UInt64(max(0, ts.tv_sec)) * 1_000_000_000 + UInt64(max(0, ts.tv_nsec))) &- uptime
    }
}

/// What ``CoreHost`` runs: a ``SansIOCore`` whose type its timer's closure may
/// capture (Swift 6.2 checks that a metatype crossing into such a closure is Sendable).
#if compiler(>=6.2)
    public typealias HostableCore = SansIOCore & SendableMetatype
#else
    public typealias HostableCore = SansIOCore
#endif

/// Runs one sans-IO core (``SansIOCore``) on a NIO event loop: reads the clock,
/// feeds the core, performs every action it leaves, in order, and keeps one
/// timer armed at its `nextDeadline`.
///
/// Every driver in Tusa hosts its cores this way; what differs between them is
/// only what an action means (write to this socket, wrap for that relay, yield
/// to that stream). A host lives on its event loop: every call must come from
/// that loop (checked in debug builds). It holds its `perform` closure strongly,
/// so a driver that owns the host passes a closure that does not retain the
/// driver, or calls ``stop()`` when it is done.
///
/// ```swift
/// let host = CoreHost(TURNClient(configuration: c), on: loop) { [unowned self] action in
///     switch action { case .transmit(let bytes): write(bytes) ... }
/// } afterActions: { [unowned self] in channel.flush() }
/// host.handle(.received(bytes))
/// let id = try host.with { core, now in try core.allocate(now: now) }
/// ```
public final class CoreHost<Core: HostableCore> {
    public let eventLoop: any EventLoop
    private var core: Core
    private let perform: (Core.Action) -> Void
    private let afterActions: (() -> Void)?
    private var timer: Scheduled<Void>?
    private var timerAt: Timestamp?
    private var draining = false
    private(set) public var isStopped = false

    /// - Parameters:
    ///   - perform: what each action means to this driver; called on the loop, in order.
    ///   - afterActions: called once after a run of actions (e.g. one flush for many writes).
    public init(
        _ core: Core, on eventLoop: any EventLoop, perform: @escaping (Core.Action) -> Void,
        afterActions: (() -> Void)? = nil
    ) {
        self.core = core
        self.eventLoop = eventLoop
        self.perform = perform
        self.afterActions = afterActions
    }

    /// Feeds one input at the current time and performs what the core asks.
    public func handle(_ input: Core.Input) {
        with { core, now in core.handle(input, now: now) }
    }

    /// Any other call on the core (an operation that returns a value, a hot path,
    /// a change of configuration), at the current time; whatever it leaves to do
    /// is performed before this returns, and the timer follows the new deadline.
    @discardableResult
    public func with<Result, Failure: Error>(
        _ body: (inout Core, Timestamp) throws(Failure) -> Result
    ) throws(Failure) -> Result {
        eventLoop.assertInEventLoop()
        defer { drain() }
        return try body(&core, .now())
    }

    /// Reads the core without changing it (no actions, no timer change).
    public func read<Result, Failure: Error>(_ body: (Core) throws(Failure) -> Result) throws(Failure) -> Result {
        eventLoop.assertInEventLoop()
        return try body(core)
    }

    /// Cancels the timer; later calls still reach the core but arm no timer.
    public func stop() {
        isStopped = true
        timer?.cancel()
        timer = nil
        timerAt = nil
    }

    // MARK: the pump

    private func drain() {
        // An action may call back into this host (perform → with): the outer drain
        // goes on with whatever that call left, in order.
        guard !draining else { return }
        draining = true
        defer { draining = false }
        var performed = false
        while let action = core.pollAction() {
            perform(action)
            performed = true
        }
        if performed { afterActions?() }
        arm()
    }

    private func arm() {
        guard !isStopped else { return }
        let next = core.nextDeadline
        guard next != timerAt else { return }
        timer?.cancel()
        timer = nil
        timerAt = next
        guard let next else { return }
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        timer = eventLoop.scheduleTask(deadline: .uptimeNanoseconds(next.nanoseconds)) {
            let host = bound.value
            host.timer = nil
            host.timerAt = nil
            host.with { core, now in core.handleTimeout(now: now) }
        }
    }
}
