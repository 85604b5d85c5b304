import CallControl
import Secure
import Testing
import TusaBase

@Suite("CallController")
struct CallControllerTests {
    static let hangup = CallMessage(kind: .hangup, call: CallSimulation.callID)

    @Test func callerHangsUp() {
        var sim = CallSimulation()
        sim.advance(by: .seconds(5))
        #expect(sim.caller.actions.restarts.isEmpty && sim.callee.actions.restarts.isEmpty)
        #expect(sim.caller.actions.filter { $0 == .report }.count == 5)
        #expect(sim.caller.actions.filter { $0 == .lookAtLocalAddresses }.count == 5)
        sim.feed(0, .hangUp)
        #expect(Array(sim.caller.actions.suffix(2)) == [.send(Self.hangup), .end(.localHangup)])
        #expect(sim.callee.actions.last == .end(.remoteHangup))
        #expect(sim.callee.actions.sent.isEmpty, "no hang-up goes back to a peer that hung up")
        #expect(sim.caller.controller.nextDeadline == nil && sim.callee.controller.nextDeadline == nil)
    }

    @Test func calleeHangsUp() {
        var sim = CallSimulation()
        sim.advance(by: .seconds(3))
        sim.feed(1, .hangUp)
        #expect(sim.callee.actions.end == .localHangup)
        #expect(sim.callee.actions.sent == [Self.hangup])
        #expect(sim.caller.actions.end == .remoteHangup)
        #expect(sim.caller.actions.sent.isEmpty)
        // Nothing more happens once it ended.
        let before = sim.caller.actions.count
        sim.feed(0, .hangUp)
        sim.advance(by: .seconds(10))
        #expect(sim.caller.actions.count == before)
    }

    @Test func vanishedPeerGetsNoHangup() {
        var sim = CallSimulation()
        sim.feed(0, .peerGone)
        #expect(sim.caller.actions == [.end(.peerVanished)])
    }

    @Test func onlyThePeerCanEndThisCall() throws {
        var sim = CallSimulation()
        let stranger = try PublicKey(bytes: [UInt8](repeating: 7, count: 32))
        sim.feed(0, .signal(Self.hangup, from: stranger))
        sim.feed(0, .signal(CallMessage(kind: .hangup, call: "another-call"), from: sim.callee.key))
        sim.feed(
            0,
            .signal(CallMessage(kind: .restart, call: CallSimulation.callID, path: CallSimulation.path("x", 9)), from: stranger))
        #expect(sim.caller.actions.isEmpty)
        #expect(sim.caller.controller.ended == nil)
    }

    @Test func silenceRestartsICE() {
        var sim = CallSimulation()
        sim.advance(by: .seconds(3))
        sim.hearing[0] = false  // the caller no longer hears the callee (its NAT rebound the callee)
        sim.advance(by: .milliseconds(1999))
        #expect(sim.caller.actions.restarts.isEmpty)
        sim.advance(by: .milliseconds(1))
        #expect(sim.caller.actions.restarts == [.peerFellSilent])
        // The restart went to the callee, which answered with its own new description.
        #expect(
            sim.caller.actions.sent == [
                CallMessage(kind: .restart, call: CallSimulation.callID, path: CallSimulation.path("a", 1))
            ])
        #expect(sim.callee.actions.restarts == [.peerRestarted])
        #expect(
            sim.callee.actions.sent == [
                CallMessage(kind: .restartAnswer, call: CallSimulation.callID, path: CallSimulation.path("b", 1))
            ])
        #expect(sim.caller.actions.checks == [CallSimulation.path("b", 1)])
        #expect(sim.converged && sim.mediaFlows)
        #expect(sim.caller.controller.iceRestarts == 1 && sim.callee.controller.iceRestarts == 1)
        sim.advance(by: .seconds(10))
        #expect(sim.caller.actions.restarts.count == 1, "media flows again: no more restarts")
    }

    static let newMapping = TransportAddress(ip: .v4(0xCB00_7102), port: 61_524)

    @Test("100 ms of silence: learn our address and tell the peer, which probes it; the path comes back without a restart")
    func silenceProbesThePathFirst() {
        var sim = CallSimulation()
        sim.advance(by: .seconds(3))
        // The caller's NAT rebinds: neither side hears the other.
        sim.mediaFlows = false
        sim.reflexive = [Self.newMapping, nil]
        sim.probeReopensPath = true
        sim.advance(by: .milliseconds(99))
        #expect(sim.caller.actions.reflexiveQueries == 0)
        sim.advance(by: .milliseconds(1))
        #expect(sim.caller.actions.reflexiveQueries == 1 && sim.callee.actions.reflexiveQueries == 1)
        let reachable = CallMessage(kind: .reachable, call: CallSimulation.callID, address: "203.0.113.2:61524")
        #expect(sim.caller.actions.sent == [reachable])
        #expect(sim.callee.actions.sent.isEmpty, "the callee's STUN server did not answer: nothing to tell")
        #expect(sim.callee.actions.probes == [Self.newMapping])
        #expect(sim.mediaFlows)
        sim.advance(by: .seconds(10))
        #expect(sim.caller.actions.restarts.isEmpty && sim.callee.actions.restarts.isEmpty)
        #expect(sim.caller.actions.reflexiveQueries == 1, "the silence ended with the first probe")
    }

    @Test("a probe that does not bring the path back is repeated every 500 ms, and the restart comes at 2 s")
    func probeThatFailsStillRestarts() {
        var sim = CallSimulation()
        sim.advance(by: .seconds(1))
        sim.hearing[0] = false
        sim.reflexive = [Self.newMapping, Self.newMapping]
        sim.advance(by: .milliseconds(599))
        #expect(sim.caller.actions.reflexiveQueries == 1)
        sim.advance(by: .milliseconds(1))
        #expect(sim.caller.actions.reflexiveQueries == 2, "again 500 ms later: the address may have changed since")
        sim.advance(by: .milliseconds(1399))
        #expect(sim.caller.actions.reflexiveQueries == 4 && sim.caller.actions.restarts.isEmpty)
        #expect(sim.callee.actions.probes == Array(repeating: Self.newMapping, count: 4))
        sim.advance(by: .milliseconds(1))
        #expect(sim.caller.actions.restarts == [.peerFellSilent])
        // The restart brought the path back (the simulation's checks succeed): no more probes.
        let queries = sim.caller.actions.reflexiveQueries
        sim.advance(by: .seconds(5))
        #expect(sim.caller.actions.reflexiveQueries == queries)
        // Silent again: a new silence, a new probe 100 ms in.
        sim.hearing[0] = false
        sim.advance(by: .milliseconds(100))
        #expect(sim.caller.actions.reflexiveQueries == queries + 1)
    }

    @Test("probing can be turned off; a stranger's or another call's reachable message is not probed")
    func probingOffAndForeignMessages() throws {
        var configuration = CallController.Configuration()
        configuration.probeAfterSilence = nil
        var sim = CallSimulation(configuration: configuration)
        sim.advance(by: .seconds(1))
        sim.mediaFlows = false
        sim.reflexive = [Self.newMapping, Self.newMapping]
        sim.advance(by: .milliseconds(1999))
        #expect(sim.caller.actions.reflexiveQueries == 0 && sim.callee.actions.probes.isEmpty)
        let stranger = try PublicKey(bytes: [UInt8](repeating: 7, count: 32))
        let reachable = CallMessage(kind: .reachable, call: CallSimulation.callID, address: "203.0.113.9:4000")
        sim.feed(0, .signal(reachable, from: stranger))
        sim.feed(0, .signal(CallMessage(kind: .reachable, call: "other", address: "203.0.113.9:4000"), from: sim.callee.key))
        #expect(sim.caller.actions.probes.isEmpty)
        sim.feed(0, .signal(reachable, from: sim.callee.key))
        #expect(sim.caller.actions.probes == [TransportAddress("203.0.113.9:4000")!])
    }

    @Test("a relay-only call neither asks for its address nor probes the peer's")
    func relayOnlyNeverProbes() throws {
        var configuration = CallController.Configuration()
        configuration.probeAfterSilence = nil
        configuration.probesReachablePeer = false
        var sim = CallSimulation(configuration: configuration)
        sim.advance(by: .seconds(1))
        sim.mediaFlows = false
        sim.advance(by: .milliseconds(1999))
        #expect(sim.caller.actions.reflexiveQueries == 0 && sim.callee.actions.reflexiveQueries == 0)
        let reachable = CallMessage(kind: .reachable, call: CallSimulation.callID, address: "203.0.113.9:4000")
        sim.feed(0, .signal(reachable, from: sim.callee.key))
        #expect(sim.caller.actions.probes.isEmpty)
    }

    @Test("a reachable message without a usable address is a typed error")
    func reachableNeedsAnAddress() throws {
        for address in [nil, "nowhere", "203.0.113.9"] as [String?] {
            let bytes = CallMessage(kind: .reachable, call: "c", address: address).encoded()
            #expect(throws: CallMessageError.self) { try CallMessage(decoding: bytes) }
        }
        let good = CallMessage(kind: .reachable, call: "c", address: "[2001:db8::1]:5000")
        #expect(try CallMessage(decoding: good.encoded()) == good)
    }

    @Test func restartsAreFourSecondsApartWhileSilent() {
        var sim = CallSimulation()
        sim.hearing[0] = false
        sim.holdMessages = true  // nothing reaches the callee: the path never comes back
        sim.advance(by: .seconds(2))
        #expect(sim.caller.actions.restarts.count == 1)
        sim.advance(by: .milliseconds(3999))
        #expect(sim.caller.actions.restarts.count == 1)
        sim.advance(by: .milliseconds(1))
        #expect(sim.caller.actions.restarts.count == 2)
        #expect(sim.caller.controller.iceRestarts == 2)
    }

    @Test func consentLossRestartsAtOnce() {
        var sim = CallSimulation()
        sim.advance(by: .milliseconds(500))
        sim.feed(1, .iceConsentLost)
        #expect(sim.callee.actions.restarts == [.consentLost])
        #expect(sim.caller.actions.restarts == [.peerRestarted])
        #expect(sim.converged)
    }

    @Test func consentLossSoonAfterARestartWaitsForTheGap() {
        var sim = CallSimulation()
        sim.feed(1, .iceConsentLost)
        #expect(sim.callee.actions.restarts.count == 1)
        sim.advance(by: .seconds(1))
        sim.feed(1, .iceConsentLost)
        sim.advance(by: .milliseconds(2999))
        #expect(sim.callee.actions.restarts.count == 1)
        sim.advance(by: .milliseconds(1))
        #expect(sim.callee.actions.restarts == [.consentLost, .consentLost])
    }

    @Test func selectedPairClearsConsentLoss() {
        var sim = CallSimulation()
        sim.feed(1, .iceConsentLost)
        sim.advance(by: .seconds(1))
        sim.feed(1, .iceConsentLost)
        sim.feed(1, .iceSelected)  // consent came back before the restart was allowed
        sim.advance(by: .seconds(10))
        #expect(sim.callee.actions.restarts.count == 1)
    }

    @Test func addressChangeRejoinsThenRestarts() {
        var sim = CallSimulation()
        sim.advance(by: .milliseconds(1500))
        sim.sides[0].addresses = [.v4(0xC0A8_0102)]  // we moved to another network
        sim.advance(by: .milliseconds(499))
        #expect(sim.caller.actions.restarts.isEmpty, "addresses are looked at once a second")
        sim.advance(by: .milliseconds(1))
        #expect(sim.caller.controller.localAddresses == [.v4(0xC0A8_0102)])
        let relevant = sim.caller.actions.filter {
            if case .rejoinRendezvous = $0 { true } else if case .restartICE = $0 { true } else { false }
        }
        #expect(relevant == [.rejoinRendezvous(replacing: true), .restartICE(.addressesChanged)])
        #expect(sim.callee.actions.restarts == [.peerRestarted])
        #expect(sim.converged)
        sim.advance(by: .seconds(10))
        #expect(sim.caller.actions.rejoins == [true] && sim.caller.actions.restarts.count == 1)
    }

    @Test func glareTheCallersRestartWins() {
        var sim = CallSimulation()
        sim.advance(by: .seconds(1))
        sim.mediaFlows = false
        sim.holdMessages = true  // both restarts cross in the rendezvous
        sim.advance(by: .seconds(2))
        #expect(sim.caller.actions.restarts == [.peerFellSilent])
        #expect(sim.callee.actions.restarts == [.peerFellSilent])
        #expect(sim.held.count == 2)
        sim.release()
        // The callee answered the caller's restart; the caller ignored the callee's.
        #expect(sim.callee.actions.restarts == [.peerFellSilent, .peerRestarted])
        #expect(sim.caller.actions.restarts == [.peerFellSilent])
        #expect(sim.caller.actions.sent.map(\.kind) == [.restart])
        #expect(sim.callee.actions.sent.map(\.kind) == [.restart, .restartAnswer])
        #expect(sim.caller.actions.checks == [CallSimulation.path("b", 2)], "the caller never checks the losing restart's b1")
        #expect(sim.callee.actions.checks == [CallSimulation.path("a", 1)])
        #expect(sim.converged && sim.mediaFlows)
        sim.advance(by: .seconds(10))
        #expect(sim.caller.actions.restarts.count == 1 && sim.callee.actions.restarts.count == 2)
    }

    @Test func glareWhileTheCalleeIsStillGathering() {
        var sim = CallSimulation()
        sim.advance(by: .seconds(1))
        sim.holdGathering = [1]
        sim.feed(1, .iceConsentLost)  // the callee restarts and is still gathering…
        sim.feed(0, .iceConsentLost)  // …when the caller's restart reaches it
        #expect(sim.callee.actions.restarts == [.consentLost])
        #expect(sim.caller.actions.restarts == [.consentLost])
        #expect(sim.callee.actions.sent.isEmpty && sim.caller.actions.checks.isEmpty)
        sim.finishGathering()
        // The callee's own restart went out and was ignored; then it answered the caller's.
        #expect(sim.callee.actions.restarts == [.consentLost, .peerRestarted])
        #expect(sim.callee.actions.sent.map(\.kind) == [.restart, .restartAnswer])
        #expect(sim.caller.actions.restarts == [.consentLost])
        #expect(sim.caller.actions.checks == [CallSimulation.path("b", 2)])
        #expect(sim.callee.actions.checks == [CallSimulation.path("a", 1)])
        #expect(sim.converged && sim.mediaFlows)
    }

    @Test func calleesRestartIsAnsweredByTheCaller() {
        var sim = CallSimulation()
        sim.hearing[1] = false
        sim.holdMessages = true
        sim.advance(by: .seconds(2))
        #expect(sim.callee.actions.restarts == [.peerFellSilent] && sim.caller.actions.restarts.isEmpty)
        // A callee's restart that comes alone is answered by the caller.
        sim.release()
        #expect(sim.caller.actions.restarts == [.peerRestarted])
        #expect(sim.converged)
    }

    @Test func rendezvousDropsMidRestart() {
        var sim = CallSimulation()
        sim.advance(by: .seconds(1))
        sim.hearing[0] = false
        sim.holdGathering = [0]
        sim.advance(by: .seconds(2))
        #expect(sim.caller.actions.restarts == [.peerFellSilent])
        // The relay restarts while the caller gathers: the rendezvous is gone.
        sim.dropRendezvous()
        #expect(sim.caller.actions.rejoins == [false])
        sim.finishGathering()
        #expect(sim.caller.actions.sent.isEmpty, "no restart is sent without a rendezvous")
        sim.advance(by: .seconds(1))
        #expect(sim.caller.actions.rejoins == [false, false], "another rejoin a second later")
        sim.rendezvousUp = true
        sim.advance(by: .milliseconds(999))
        #expect(sim.caller.actions.rejoins.count == 2)
        sim.advance(by: .milliseconds(1))
        #expect(sim.caller.actions.rejoins.count == 3)
        // Rejoined: the restart goes out, the callee answers, both converge.
        #expect(
            sim.caller.actions.sent == [
                CallMessage(kind: .restart, call: CallSimulation.callID, path: CallSimulation.path("a", 1))
            ])
        #expect(sim.callee.actions.restarts == [.peerRestarted])
        #expect(sim.converged && sim.mediaFlows)
        #expect(sim.caller.controller.iceRestarts == 1)
    }

    @Test func restartRefusedByADeadRendezvousIsSentAgainAfterRejoining() {
        var sim = CallSimulation()
        sim.hearing[0] = false
        sim.rendezvousUp = false  // gone, but the connection has not noticed yet
        sim.advance(by: .seconds(2))
        #expect(sim.caller.actions.sent.map(\.kind) == [.restart])
        #expect(sim.callee.actions.restarts.isEmpty)
        sim.rendezvousUp = true
        sim.feed(0, .rendezvousLost)
        #expect(sim.caller.actions.rejoins == [false])
        #expect(sim.caller.actions.sent.map(\.kind) == [.restart, .restart])
        #expect(sim.callee.actions.restarts == [.peerRestarted])
        #expect(sim.converged)
    }

    @Test func timeLimitHangsUp() {
        var configuration = CallController.Configuration()
        configuration.maximumDuration = .seconds(10)
        var sim = CallSimulation(configuration: configuration)
        sim.advance(by: .milliseconds(9999))
        #expect(sim.caller.controller.ended == nil)
        sim.advance(by: .milliseconds(1))
        #expect(Array(sim.caller.actions.suffix(2)) == [.send(Self.hangup), .end(.timeLimit)])
        #expect(sim.callee.actions.end == .remoteHangup)
    }

    @Test func audioFailureHangsUp() {
        var sim = CallSimulation()
        sim.advance(by: .seconds(2))
        sim.feed(1, .audioFailed)
        #expect(Array(sim.callee.actions.suffix(2)) == [.send(Self.hangup), .end(.audioFailed)])
        #expect(sim.caller.actions.end == .remoteHangup)
    }

    @Test func networkChecksCanBeOff() {
        var configuration = CallController.Configuration()
        configuration.networkCheckInterval = nil
        var sim = CallSimulation(configuration: configuration)
        sim.sides[0].addresses = []
        sim.advance(by: .seconds(5))
        #expect(!sim.caller.actions.contains(.lookAtLocalAddresses))
        #expect(sim.caller.actions.restarts.isEmpty)
    }
}

@Suite("A peer that floods the call's signalling")
struct CallSignallingFloodTests {
    @Test("a thousand restarts while ours gathers: the newest is answered, once")
    func restartsWhileGathering() throws {
        let caller = try PublicKey(bytes: [UInt8](repeating: 0xA1, count: 32))
        var now = Timestamp.seconds(100)
        var callee = CallController(
            role: .callee, peer: caller, call: CallSimulation.callID, localAddresses: [.v4(0x0A00_0001)], now: now)
        func actions() -> [CallController.Action] {
            var all: [CallController.Action] = []
            while let a = callee.pollAction() { all.append(a) }
            return all
        }
        now = now + .seconds(1)
        callee.handle(.iceConsentLost, now: now)  // the callee restarts and gathers…
        #expect(actions().restarts == [.consentLost])
        for n in 0..<1000 {  // …while the caller's client sends restart after restart
            let path = CallSimulation.path("x", n)
            callee.handle(.signal(CallMessage(kind: .restart, call: CallSimulation.callID, path: path), from: caller), now: now)
        }
        #expect(actions().isEmpty)
        // Ours gathered: it goes out, and the newest restart is answered…
        callee.handle(.iceRestarted(CallSimulation.path("b", 1)), now: now)
        let first = actions()
        #expect(first.sent.map(\.kind) == [.restart] && first.restarts == [.peerRestarted], "\(first)")
        callee.handle(.iceRestarted(CallSimulation.path("b", 2)), now: now)
        let second = actions()
        #expect(second.sent.map(\.kind) == [.restartAnswer])
        #expect(second.checks == [CallSimulation.path("x", 999)])
        // …and nothing is left to restart for.
        #expect(second.restarts.isEmpty, "\(second)")
    }

    @Test("reachable messages by the hundred: one probe per address per 100 ms, five a second in all")
    func reachableFlood() throws {
        var sim = CallSimulation()
        sim.advance(by: .seconds(1))
        func reachable(_ address: String) {
            sim.feed(
                1, .signal(CallMessage(kind: .reachable, call: CallSimulation.callID, address: address), from: sim.caller.key))
        }
        let a = try #require(TransportAddress("192.0.2.7:4000"))
        for _ in 0..<100 { reachable("192.0.2.7:4000") }
        #expect(sim.callee.actions.probes == [a])
        // A new address (the NAT rebound again) is probed at once.
        reachable("192.0.2.8:4001")
        #expect(sim.callee.actions.probes == [a, try #require(TransportAddress("192.0.2.8:4001"))])
        sim.now = sim.now + .milliseconds(99)
        reachable("192.0.2.8:4001")
        #expect(sim.callee.actions.probes.count == 2)
        sim.now = sim.now + .milliseconds(1)
        reachable("192.0.2.8:4001")
        #expect(sim.callee.actions.probes.count == 3)
        // Addresses by the hundred: five probes in any second.
        for i in 0..<100 { reachable("198.51.100.\(i):5000") }
        #expect(sim.callee.actions.probes.count == 5)
        sim.now = sim.now + .seconds(1)
        for i in 0..<100 { reachable("203.0.113.\(i):5000") }
        #expect(sim.callee.actions.probes.count == 10)
    }
}
