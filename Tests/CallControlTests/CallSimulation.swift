import CallControl
import Secure
import Testing
import TusaBase

/// Two call controllers on one virtual clock, wired through a simulated
/// rendezvous and a simulated media path: what each asks for is done at once
/// (a send is delivered, a restart gathers a new description, checks succeed
/// when both sides know each other's current description).
struct CallSimulation {
    typealias Action = CallController.Action

    struct Side {
        var controller: CallController
        let key: PublicKey
        /// The description the side signalled last (its ICE agent's credentials now).
        var description: CallMessage.Path
        /// The peer's description its checks run against.
        var checking: CallMessage.Path
        var addresses: Set<IPAddress>
        /// Every action it asked for, in order.
        var actions: [Action] = []
        var generation = 0
    }

    var now = Timestamp.seconds(100)
    var sides: [Side]
    /// The rendezvous server answers (sends are carried, rejoins succeed).
    var rendezvousUp = true
    /// Whether each side hears the other's media.
    var hearing = [true, true]
    /// Media flows both ways (or not at all).
    var mediaFlows: Bool {
        get { hearing == [true, true] }
        set { hearing = [newValue, newValue] }
    }
    /// Messages sent but not yet delivered while `holdMessages` is on (index of the receiver).
    var held: [(to: Int, message: CallMessage)] = []
    var holdMessages = false
    /// What each side's STUN server says its address is (nil: no answer).
    var reflexive: [TransportAddress?] = [nil, nil]
    /// A probe toward the address a peer named reopens the path (a NAT
    /// rebinding: the probe opens the prober's NAT to the peer's new mapping).
    var probeReopensPath = false
    /// Sides whose restarts gather without answering, until ``finishGathering()``.
    var holdGathering: Set<Int> = []
    private var gathering: Set<Int> = []

    static let callID = "call-1"

    init(configuration: CallController.Configuration = .init()) {
        let keyA = try! PublicKey(bytes: [UInt8](repeating: 0xA1, count: 32))
        let keyB = try! PublicKey(bytes: [UInt8](repeating: 0xB2, count: 32))
        let pathA = Self.path("a", 0)
        let pathB = Self.path("b", 0)
        let addresses: Set<IPAddress> = [.v4(0x0A00_0001)]
        let start = Timestamp.seconds(100)
        sides = [
            Side(
                controller: CallController(
                    role: .caller, peer: keyB, call: Self.callID, configuration: configuration,
                    localAddresses: addresses, now: start),
                key: keyA, description: pathA, checking: pathB, addresses: addresses),
            Side(
                controller: CallController(
                    role: .callee, peer: keyA, call: Self.callID, configuration: configuration,
                    localAddresses: addresses, now: start),
                key: keyB, description: pathB, checking: pathA, addresses: addresses),
        ]
    }

    static func path(_ side: String, _ generation: Int) -> CallMessage.Path {
        CallMessage.Path(
            ufrag: "\(side)\(generation)", password: "pw-\(side)\(generation)",
            candidates: ["candidate:1 1 udp 1 10.0.0.1 4000 typ host"])
    }

    var caller: Side { sides[0] }
    var callee: Side { sides[1] }

    /// Both sides run ICE against each other's current description.
    var converged: Bool {
        sides[0].checking == sides[1].description && sides[1].checking == sides[0].description
    }

    /// Feeds `input` to side `i` now and performs what follows.
    mutating func feed(_ i: Int, _ input: CallController.Input) {
        sides[i].controller.handle(input, now: now)
        perform(i)
    }

    /// Runs both controllers' timers up to `duration` from now (media, when it
    /// flows, is heard at every wake-up, as the driver tells it).
    mutating func advance(by duration: Duration) {
        let target = now + duration
        var wakes = 0
        while true {
            let next = sides.compactMap { $0.controller.nextDeadline }.min()
            guard let next, next <= target else { break }
            wakes += 1
            if wakes > 100_000 {
                // A deadline that passes without anything changing: a driver would spin.
                Issue.record("the controllers keep waking at \(next) and do nothing")
                break
            }
            now = max(now, next)
            for i in sides.indices where sides[i].controller.nextDeadline.map({ $0 <= now }) ?? false {
                if hearing[i] { sides[i].controller.handle(.mediaArrived(at: now), now: now) }
                sides[i].controller.handleTimeout(now: now)
                perform(i)
            }
        }
        now = target
    }

    /// Delivers what was held back, in order.
    mutating func release() {
        holdMessages = false
        let messages = held
        held = []
        for (to, message) in messages { feed(to, .signal(message, from: sides[1 - to].key)) }
    }

    /// Answers the restarts that were gathering.
    mutating func finishGathering() {
        holdGathering = []
        for i in gathering.sorted() { gathered(i) }
        gathering = []
    }

    /// The rendezvous server restarts: every connection to it closes.
    mutating func dropRendezvous() {
        rendezvousUp = false
        for i in sides.indices { feed(i, .rendezvousLost) }
    }

    private mutating func gathered(_ i: Int) {
        sides[i].generation += 1
        sides[i].description = Self.path(i == 0 ? "a" : "b", sides[i].generation)
        feed(i, .iceRestarted(sides[i].description))
    }

    private mutating func perform(_ i: Int) {
        while let action = sides[i].controller.pollAction() {
            sides[i].actions.append(action)
            switch action {
            case .send(let message):
                if !rendezvousUp {
                    feed(i, .sendFailed(message))
                } else if holdMessages {
                    held.append((1 - i, message))
                } else {
                    feed(1 - i, .signal(message, from: sides[i].key))
                }
            case .restartICE:
                if holdGathering.contains(i) { gathering.insert(i) } else { gathered(i) }
            case .checkICE(let theirs):
                sides[i].checking = theirs
                if converged {
                    mediaFlows = true
                    feed(0, .iceSelected)
                    feed(1, .iceSelected)
                }
            case .rejoinRendezvous:
                feed(i, rendezvousUp ? .rendezvousRejoined : .rejoinFailed)
            case .lookAtLocalAddresses:
                feed(i, .localAddresses(sides[i].addresses))
            case .learnReflexiveAddress:
                feed(i, .reflexiveAddress(reflexive[i]))
            case .probe:
                if probeReopensPath { mediaFlows = true }
            case .report, .end:
                break
            }
        }
    }
}

extension Array where Element == CallController.Action {
    /// The messages among these actions.
    var sent: [CallMessage] {
        compactMap { if case .send(let m) = $0 { m } else { nil } }
    }

    var restarts: [ICERestartReason] {
        compactMap { if case .restartICE(let why) = $0 { why } else { nil } }
    }

    var checks: [CallMessage.Path] {
        compactMap { if case .checkICE(let p) = $0 { p } else { nil } }
    }

    var rejoins: [Bool] {
        compactMap { if case .rejoinRendezvous(let replacing) = $0 { replacing } else { nil } }
    }

    var probes: [TransportAddress] {
        compactMap { if case .probe(let a) = $0 { a } else { nil } }
    }

    var reflexiveQueries: Int { filter { $0 == .learnReflexiveAddress }.count }

    var end: CallEnd? {
        compactMap { if case .end(let e) = $0 { e } else { nil } }.first
    }
}
