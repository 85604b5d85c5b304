import Secure
import TusaBase

/// The decisions of an established call, sans IO: hang-ups both ways, when to
/// restart ICE (the peer fell silent, its consent was lost, our addresses
/// changed), answering the peer's restart, glare, rejoining the rendezvous after
/// it dropped and resending what it could not carry, the time limit.
///
/// The driver (Call's `CallAgent`) feeds it the rendezvous' messages, the
/// endpoint's events and the outcome of each action, wakes it at
/// ``nextDeadline``, and performs its actions in order (``SansIOCore``).
public struct CallController: SansIOCore {
    /// The call's timing.
    public struct Configuration: Sendable, Equatable {
        /// Restart ICE (through the rendezvous) when nothing came from the peer for
        /// this long; restarts are at least twice this apart.
        public var restartAfterSilence: Duration = .seconds(2)
        /// When nothing came from the peer for this long, learn our socket's
        /// address from the relay and tell the peer through the rendezvous
        /// (``CallMessage/Kind/reachable``): after a NAT rebinding the peer's
        /// probe there reopens the direct path long before a restart would.
        /// Nil: never.
        public var probeAfterSilence: Duration? = .milliseconds(100)
        /// While the silence lasts, probe again this often (a rebinding just
        /// after a probe, in a loss burst, changes the address it told).
        public var probeRepeat: Duration = .milliseconds(500)
        /// Whether the peer's ``CallMessage/Kind/reachable`` is probed. Off for a
        /// relay-only call (with `probeAfterSilence` nil): a probe from our socket
        /// would show the peer this machine's address.
        public var probesReachablePeer = true
        /// How often this machine's addresses are looked at: when they change (a new
        /// network, a lost one) ICE restarts at once with the new candidates. Nil: never.
        public var networkCheckInterval: Duration? = .seconds(1)
        /// Hang up after this long (nil: never).
        public var maximumDuration: Duration?
        /// Glare: a peer's restart this soon after the caller's own is ignored (the
        /// controlling side's restart wins; the callee answers it).
        public var glareWindow: Duration = .seconds(1)
        /// Attempts to rejoin a dropped rendezvous are at least this far apart.
        public var rejoinInterval: Duration = .seconds(1)
        /// How often the live status is reported.
        public var statusInterval: Duration = .seconds(1)
        public init() {}
    }

    /// The ICE restart in progress (its ``Action/restartICE(_:)`` has no answer yet).
    private enum Restart: Equatable {
        /// Ours: the new description goes to the peer as a restart.
        case ours
        /// The peer's, with its description: ours goes back as the answer, then checks.
        case answering(CallMessage.Path)
    }

    public let role: CallRole
    public let peer: PublicKey
    /// The call's id (the offer's).
    public let call: String
    public let configuration: Configuration
    /// When the call started (the voice session's start).
    public let started: Timestamp

    /// ICE restarts during the call (ours and the peer's we answered).
    public private(set) var iceRestarts = 0
    /// How the call ended; nil while it runs.
    public private(set) var ended: CallEnd?
    /// This machine's addresses as last looked at.
    public private(set) var localAddresses: Set<IPAddress>

    /// When the peer's media last arrived (the call's start before any).
    private var heard: Timestamp
    private var lastRestart: Timestamp?
    private var restarting: Restart?
    /// The restart and the answer that came last while ours was gathering: taken
    /// after it. (Only the newest of each counts: an older one's credentials are
    /// superseded, and a peer that sent thousands would otherwise have us restart
    /// as many times, one after another.)
    private var deferred: [CallMessage] = []
    /// How many of the peer's messages wait for our restart (``CallFuzzChecks``: at most two).
    var heldForLater: Int { deferred.count }
    private var consentLost = false
    /// The ``heard`` of the silence we last probed for, and when.
    private var probedSilence: Timestamp?
    private var lastProbe: Timestamp?
    private var networkChanged = false
    /// Where and when we last probed where the peer said it is
    /// (``CallMessage/Kind/reachable``), and the times of the probes in the last second.
    private var lastPeerProbe: (address: TransportAddress, at: Timestamp)?
    private var recentPeerProbes: [Timestamp] = []
    /// The least time between two probes to one address…
    static let peerProbeInterval: Duration = .milliseconds(100)
    /// …and the most probes in any second, to whatever addresses.
    static let peerProbesPerSecond = 5
    private var lastAddressCheck: Timestamp
    private var rendezvousUp = true
    private var rejoining = false
    private var lastRejoin: Timestamp?
    /// The restart (or its answer) the rendezvous could not carry: sent again once rejoined.
    private var unsent: CallMessage?
    private var lastStatus: Timestamp
    private var actions: [Action] = []

    /// A call that starts now, with the media path up.
    public init(
        role: CallRole, peer: PublicKey, call: String, configuration: Configuration = .init(),
        localAddresses: Set<IPAddress>, now: Timestamp
    ) {
        self.role = role
        self.peer = peer
        self.call = call
        self.configuration = configuration
        self.localAddresses = localAddresses
        started = now
        heard = now
        lastAddressCheck = now
        lastStatus = now
    }

    public mutating func handle(_ input: Input, now: Timestamp) {
        guard ended == nil else { return }
        switch input {
        case .signal(let message, let from):
            guard from == peer, message.call == call else { return }
            take(message, now: now)
        case .mediaArrived(let at):
            if at > heard { heard = at }
        case .iceSelected:
            consentLost = false
            unsent = nil  // the path works again: an old restart would only start another round
        case .iceConsentLost:
            consentLost = true
        case .peerGone:
            finish(.peerVanished)
        case .localAddresses(let current):
            if current != localAddresses {
                localAddresses = current
                networkChanged = true
            }
        case .rendezvousLost:
            rendezvousUp = false
        case .rendezvousRejoined:
            rendezvousUp = true
            rejoining = false
            if let message = unsent {
                unsent = nil
                actions.append(.send(message))
            }
        case .rejoinFailed:
            rejoining = false
        case .iceRestarted(let ours):
            guard let restart = restarting else { return }
            restarting = nil
            iceRestarts += 1
            switch restart {
            case .ours:
                signal(CallMessage(kind: .restart, call: call, path: ours))
            case .answering(let theirs):
                lastRestart = now
                signal(CallMessage(kind: .restartAnswer, call: call, path: ours))
                actions.append(.checkICE(theirs))
            }
            takeDeferred(now: now)
        case .iceRestartFailed:
            guard restarting != nil else { return }
            restarting = nil
            takeDeferred(now: now)
        case .reflexiveAddress(let address):
            if let address, rendezvousUp {
                actions.append(.send(CallMessage(kind: .reachable, call: call, address: "\(address)")))
            }
        case .sendFailed(let message):
            if message.kind == .restart || message.kind == .restartAnswer { unsent = message }
        case .hangUp:
            finish(.localHangup)
        case .audioFailed:
            finish(.audioFailed)
        }
        step(now: now)
    }

    public mutating func handleTimeout(now: Timestamp) {
        guard ended == nil else { return }
        step(now: now)
    }

    public var nextDeadline: Timestamp? {
        guard ended == nil else { return nil }
        var next = lastStatus + configuration.statusInterval
        if let limit = configuration.maximumDuration { next = min(next, started + limit) }
        if let every = configuration.networkCheckInterval { next = min(next, lastAddressCheck + every) }
        if let after = configuration.probeAfterSilence {
            let again = probedSilence == heard ? lastProbe.map { $0 + configuration.probeRepeat } : nil
            next = min(next, again ?? heard + after)
        }
        if !rendezvousUp, !rejoining, let lastRejoin { next = min(next, lastRejoin + configuration.rejoinInterval) }
        if restarting == nil {
            let allowed = lastRestart.map { $0 + configuration.restartAfterSilence * 2 } ?? started
            let wanted = consentLost || networkChanged ? allowed : max(allowed, heard + configuration.restartAfterSilence)
            next = min(next, wanted)
        }
        return next
    }

    public mutating func pollAction() -> Action? {
        actions.isEmpty ? nil : actions.removeFirst()
    }

    /// One of the peer's messages for this call.
    private mutating func take(_ message: CallMessage, now: Timestamp) {
        if restarting != nil, message.kind == .restart || message.kind == .restartAnswer {
            deferred.removeAll { $0.kind == message.kind }
            deferred.append(message)
            return
        }
        switch message.kind {
        case .hangup:
            finish(.remoteHangup)
        case .restart:
            // Both sides restarting at once: the controlling side's restart wins.
            if role == .caller, let lastRestart, now - lastRestart < configuration.glareWindow { return }
            guard let theirs = message.path else { return }
            restarting = .answering(theirs)
            actions.append(.restartICE(.peerRestarted))
        case .restartAnswer:
            guard let theirs = message.path else { return }
            actions.append(.checkICE(theirs))
        case .reachable:
            guard configuration.probesReachablePeer, let text = message.address, let address = TransportAddress(text)
            else { return }
            // A probe is one datagram to wherever the peer names: one address at most
            // once per interval, however many reachable messages name it (the peer
            // repeats every 500 ms), and a few a second in all. A new address is probed
            // at once: it is where a NAT that rebound again put the peer.
            if let last = lastPeerProbe, last.address == address, now - last.at < Self.peerProbeInterval { return }
            recentPeerProbes.removeAll { now - $0 >= .seconds(1) }
            guard recentPeerProbes.count < Self.peerProbesPerSecond else { return }
            recentPeerProbes.append(now)
            lastPeerProbe = (address, now)
            actions.append(.probe(address))
        case .offer, .answer, .reject:
            break
        }
    }

    private mutating func takeDeferred(now: Timestamp) {
        while restarting == nil, ended == nil, !deferred.isEmpty {
            take(deferred.removeFirst(), now: now)
        }
    }

    /// Sends a restart or its answer now, or once the rendezvous is back.
    private mutating func signal(_ message: CallMessage) {
        if rendezvousUp { actions.append(.send(message)) } else { unsent = message }
    }

    /// The timers, in the order the decisions were always taken.
    private mutating func step(now: Timestamp) {
        guard ended == nil else { return }
        if !rendezvousUp, !rejoining, lastRejoin.map({ now - $0 >= configuration.rejoinInterval }) ?? true {
            lastRejoin = now
            rejoining = true
            actions.append(.rejoinRendezvous(replacing: false))
        }
        if let every = configuration.networkCheckInterval, now - lastAddressCheck >= every {
            lastAddressCheck = now
            actions.append(.lookAtLocalAddresses)
        }
        if let after = configuration.probeAfterSilence, now - heard >= after,
            probedSilence != heard || lastProbe.map({ now - $0 >= configuration.probeRepeat }) ?? true
        {
            probedSilence = heard
            lastProbe = now
            if rendezvousUp { actions.append(.learnReflexiveAddress) }
        }
        if restarting == nil, consentLost || networkChanged || now - heard >= configuration.restartAfterSilence,
            lastRestart.map({ now - $0 >= configuration.restartAfterSilence * 2 }) ?? true
        {
            lastRestart = now
            let why: ICERestartReason = networkChanged ? .addressesChanged : consentLost ? .consentLost : .peerFellSilent
            consentLost = false
            // (Our old connection to the rendezvous may have gone with our old address.)
            if networkChanged, !rejoining {
                rejoining = true
                actions.append(.rejoinRendezvous(replacing: true))
            }
            networkChanged = false
            restarting = .ours
            actions.append(.restartICE(why))
        }
        if let limit = configuration.maximumDuration, now - started >= limit {
            finish(.timeLimit)
            return
        }
        if now - lastStatus >= configuration.statusInterval {
            lastStatus = now
            actions.append(.report)
        }
    }

    /// Ends the call: our hang-up to the peer unless it hung up or vanished.
    private mutating func finish(_ reason: CallEnd) {
        guard ended == nil else { return }
        ended = reason
        if reason.tellsPeer { actions.append(.send(CallMessage(kind: .hangup, call: call))) }
        actions.append(.end(reason))
    }
}
