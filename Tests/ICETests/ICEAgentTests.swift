import Foundation
import ICE
import STUN
import TestSupport
import Testing
import TusaBase

// The ICE agent core on a virtual clock: two agents joined by TestSupport's
// VirtualNetwork, which can drop packets and put either side behind a NAT.

private func ip(_ a: UInt8, _ b: UInt8, _ c: UInt8, _ d: UInt8) -> IPAddress {
    .v4(UInt32(a) << 24 | UInt32(b) << 16 | UInt32(c) << 8 | UInt32(d))
}

/// An ICE agent on the virtual network at one host address (base 0).
private func agentHost(_ agent: ICEAgent, at host: TransportAddress, on network: VirtualNetwork) -> VirtualHost<ICEAgent> {
    VirtualHost(agent, at: [host], on: network) { d in
        .datagram(d.bytes, from: d.from, base: 0)
    } output: { action in
        guard case .send(let bytes, _, let to) = action else { return nil }
        return (bytes, host, to)
    }
}

/// Two agents on a `VirtualNetwork` (1 ms one way), `a` optionally behind a NAT.
private final class Net {
    let network = VirtualNetwork(clock: VirtualClock(.seconds(100)), impairment: .init(delay: .milliseconds(1)))
    let a: VirtualHost<ICEAgent>
    let b: VirtualHost<ICEAgent>
    let nat: VirtualNetwork.NATID?

    init(a: ICEAgent, at ha: TransportAddress, b: ICEAgent, at hb: TransportAddress, natOnA: NAT?) {
        let network = self.network
        self.a = agentHost(a, at: ha, on: network)
        self.b = agentHost(b, at: hb, on: network)
        nat = natOnA.map { network.addNAT($0) }
        network.attach(self.a, behind: nat)
        network.attach(self.b)
    }

    var aHost: TransportAddress { a.addresses[0] }
    var bHost: TransportAddress { b.addresses[0] }
    /// Where b sees a's datagrams come from.
    var aOutside: TransportAddress { nat.flatMap { network.mapping($0, of: aHost, for: bHost) } ?? aHost }
    /// Drops every packet while true.
    var blackhole: Bool {
        get { network.impairment.loss >= 1 }
        set { network.impairment.loss = newValue ? 1 : 0 }
    }
    var sent: Int { a.sent + b.sent }
    var aEvents: [ICEEvent] {
        get { events(a) }
        set { a.reported = newValue.map { .event($0) } }
    }
    var bEvents: [ICEEvent] {
        get { events(b) }
        set { b.reported = newValue.map { .event($0) } }
    }

    func run(for seconds: Double) {
        network.run(for: .milliseconds(Int(seconds * 1000)))
        #expect(network.spins == 0, "an agent asked for its timeout again at a time that had passed")
    }
}

private func events(_ host: VirtualHost<ICEAgent>) -> [ICEEvent] {
    host.reported.compactMap { if case .event(let e) = $0 { e } else { nil } }
}

private func pair(aRole: ICERole = .controlling, bRole: ICERole = .controlled, natOnA: Bool = false) -> Net {
    let ha = TransportAddress(ip: ip(10, 0, 0, 1), port: 4000)
    let hb = TransportAddress(ip: ip(192, 0, 2, 7), port: 5000)
    let a = ICEAgent(role: aRole, candidates: [.host(ha, base: 0)], tieBreaker: 7)
    let b = ICEAgent(role: bRole, candidates: [.host(hb, base: 0)], tieBreaker: 9)
    return Net(a: a, at: ha, b: b, at: hb, natOnA: natOnA ? .fullCone(ip(203, 0, 113, 1)) : nil)
}

private func signal(_ net: Net, aLearnsB: Bool = true, bLearnsA: Bool = true) {
    let ca = net.a.core.local
    let cb = net.b.core.local
    net.a.handle(.setRemote(cb, candidates: aLearnsB ? net.b.core.advertised : [], complete: true))
    net.b.handle(.setRemote(ca, candidates: bLearnsA ? net.a.core.advertised : [], complete: true))
}

private func selected(_ events: [ICEEvent]) -> ICEPair? {
    events.compactMap { if case .selected(let p) = $0 { p } else { nil } }.last
}

private func lostConsent(_ events: [ICEEvent]) -> Bool {
    events.contains { if case .consentLost = $0 { true } else { false } }
}

@Suite("ICE agent core")
struct ICEAgentTests {
    @Test func hostCandidatesConnectAndBothSidesSelectThePair() {
        let net = pair()
        signal(net)
        net.run(for: 2)
        let a = selected(net.aEvents)
        let b = selected(net.bEvents)
        #expect(a?.remote.address == net.bHost)
        #expect(b?.remote.address == net.aHost)
        #expect(net.a.core.state == .completed && net.b.core.state == .completed)
        #expect(net.sent < 20, "\(net.sent) packets for one pair")
    }

    /// RFC 8445 §12.2: the controlling side sends once its nomination is answered,
    /// which can be before the controlled side's own check has succeeded, so data is
    /// taken from any candidate of the peer's (signalled, or learnt from a check that
    /// carried its password) before selection, and from no other address ever.
    @Test func dataIsTakenFromThePeersCandidatesBeforeSelectionAndFromNobodyElse() {
        let stranger = TransportAddress(ip: ip(198, 51, 100, 9), port: 4000)
        let signalled = pair()
        #expect(!signalled.b.core.acceptsData(from: signalled.aHost), "nothing signalled yet")
        signal(signalled)
        #expect(signalled.b.core.selected == nil)
        #expect(signalled.b.core.acceptsData(from: signalled.aHost))
        #expect(!signalled.b.core.acceptsData(from: stranger))

        // a behind a NAT, its host address not signalled to b: b learns a's mapping
        // from a's first check, long before it selects.
        let net = pair(natOnA: true)
        signal(net, bLearnsA: false)
        #expect(!net.b.core.acceptsData(from: net.aOutside))
        var steps = 0
        while !net.b.core.remoteCandidates.contains(where: { $0.address == net.aOutside }) && steps < 100 {
            net.run(for: 0.001)
            steps += 1
        }
        #expect(net.b.core.selected == nil)
        #expect(net.b.core.acceptsData(from: net.aOutside))
        #expect(!net.b.core.acceptsData(from: net.aHost) && !net.b.core.acceptsData(from: stranger))
        net.run(for: 3)
        #expect(net.b.core.selected?.remote.address == net.aOutside)
        #expect(net.b.core.acceptsData(from: net.aOutside) && !net.b.core.acceptsData(from: stranger))
    }

    @Test func aBothControllingConflictIsResolvedByTheTieBreaker() {
        let net = pair(aRole: .controlling, bRole: .controlling)
        signal(net)
        net.run(for: 3)
        // a's tie-breaker (7) is the smaller: a gives way.
        #expect(net.aEvents.contains(.roleChanged(.controlled)), "\(net.aEvents)")
        #expect(net.a.core.role == .controlled && net.b.core.role == .controlling)
        #expect(selected(net.aEvents) != nil && selected(net.bEvents) != nil)
    }

    @Test func aBothControlledConflictIsResolvedToo() {
        let net = pair(aRole: .controlled, bRole: .controlled)
        signal(net)
        net.run(for: 3)
        #expect(net.b.core.role == .controlling && net.a.core.role == .controlled, "\(net.aEvents) \(net.bEvents)")
        #expect(selected(net.aEvents) != nil && selected(net.bEvents) != nil)
    }

    @Test func aPeerBehindANATIsLearntAsPeerReflexive() {
        // b only has a's private host address, which it cannot reach; a's checks
        // arrive from the NAT's mapping.
        let net = pair(natOnA: true)
        signal(net)
        net.run(for: 3)
        let b = selected(net.bEvents)
        #expect(b?.remote.address == net.aOutside, "\(net.bEvents)")
        #expect(b?.remote.type == .prflx)
        #expect(selected(net.aEvents)?.remote.address == net.bHost)
        // a learnt its own mapping from b's answer.
        #expect(net.a.core.localCandidates.contains { $0.candidate.type == .prflx && $0.candidate.address == net.aOutside })
    }

    @Test func noCandidatesFromThePeerStillConnectsThroughItsChecks() {
        let net = pair()
        signal(net, aLearnsB: true, bLearnsA: false)
        net.run(for: 3)
        #expect(selected(net.bEvents)?.remote.type == .prflx)
        #expect(selected(net.aEvents) != nil)
    }

    /// The callee checks as soon as it has the offer, so its first check can reach
    /// the caller before the answer does: the caller learns the callee's host as
    /// peer-reflexive. The answer's candidates then replace it, pairs included,
    /// so a second, worse host of the callee does not outrank it.
    @Test func aCheckBeforeTheDescriptionDoesNotDemoteTheSignalledCandidate() {
        let net = pair()
        let other = TransportAddress(ip: ip(127, 0, 0, 1), port: 5000)
        net.b.handle(.addLocal(.host(other, base: 0, localPreference: 65534)))
        net.b.handle(.setRemote(net.a.core.local, candidates: net.a.core.advertised, complete: true))
        net.run(for: 0.01)  // B's first check reaches A, which knows nothing of B yet
        #expect(net.a.core.remoteCandidates.map(\.type) == [.prflx])
        net.a.handle(.setRemote(net.b.core.local, candidates: net.b.core.advertised, complete: true))
        #expect(net.a.core.remoteCandidates.map(\.type) == [.host, .host])
        // The best pair succeeds and, nothing better being out, is nominated at once
        // (not after the nomination delay that a falsely better pair would cost).
        net.run(for: 0.05)
        #expect(selected(net.aEvents)?.remote.address == net.bHost, "the better host, signalled after the check")
        #expect(selected(net.aEvents)?.remote.type == .host)
    }

    @Test func unreachablePeersFailOnceEveryCheckTimedOut() {
        let net = pair()
        net.blackhole = true
        signal(net)
        net.run(for: 5)
        #expect(!net.aEvents.contains { if case .failed = $0 { true } else { false } }, "failed before the checks gave up")
        net.run(for: 10)
        #expect(net.aEvents.contains { if case .failed = $0 { true } else { false } }, "\(net.aEvents)")
        #expect(net.a.core.state == .failed)
        #expect(selected(net.aEvents) == nil)
    }

    @Test func withNoPairsAtAllTheAgentWaitsForChecksBeforeFailing() {
        let net = pair()
        net.blackhole = true
        signal(net, aLearnsB: false, bLearnsA: false)
        net.run(for: 3)
        #expect(net.a.core.state == .checking, "failed before a peer's check could have taught a pair")
        net.run(for: 10)
        #expect(net.a.core.state == .failed && net.aEvents.contains(.failed("no candidate pairs")), "\(net.aEvents)")
    }

    @Test func consentIsRefreshedWhileThePeerAnswersAndLostWhenItGoesSilent() {
        let net = pair()
        signal(net)
        net.run(for: 2)
        #expect(selected(net.aEvents) != nil)
        let before = net.sent
        net.run(for: 60)
        #expect(!lostConsent(net.aEvents))
        // About one consent check each way every 5 s.
        #expect((net.sent - before) >= 2 * 8 && (net.sent - before) <= 2 * 2 * 16, "\(net.sent - before) packets in 60 s")
        net.blackhole = true
        net.run(for: 25)
        #expect(!lostConsent(net.aEvents))
        net.run(for: 10)
        #expect(lostConsent(net.aEvents), "consent held without answers")
    }

    @Test func consentLostStaysLostThroughARestartUntilItsChecksSelectAPair() {
        let net = pair()
        signal(net)
        net.run(for: 2)
        let first = selected(net.aEvents)
        net.blackhole = true
        net.run(for: 35)
        #expect(lostConsent(net.aEvents))
        #expect(net.a.core.consentExpired && net.a.core.state == .failed)
        // The restart's signalling takes a while; the lost pair is not lost a second time, nor usable.
        net.blackhole = false
        net.a.handle(.restart(local: .random(), candidates: nil))
        net.b.handle(.restart(local: .random(), candidates: nil))
        net.aEvents = []
        net.run(for: 5)
        #expect(net.aEvents.isEmpty, "\(net.aEvents)")
        #expect(net.a.core.consentExpired && net.a.core.state == .checking)
        signal(net)
        net.run(for: 2)
        #expect(selected(net.aEvents) == first && !net.a.core.consentExpired)
        // Consent is checked again on the new selection, and holds.
        net.run(for: 60)
        #expect(!lostConsent(net.aEvents), "\(net.aEvents)")
    }

    /// A peer whose address changed (its NAT rebound) after selection: a's agent now
    /// sends from another address. b's consent checks follow it once the layer above
    /// says the peer's authenticated packets come from there (`remoteMoved`); b told
    /// nothing keeps checking the old address and loses consent at 30 s (the ICE
    /// restart the call then makes, which the move did not need); b told of an address
    /// that never answers a check loses consent as soon, however it was told.
    @Test func consentFollowsAPeerThatMovedAndIsStillLostToAnAddressThatNeverAnswers() {
        let moved = TransportAddress(ip: ip(10, 0, 0, 1), port: 4999)
        let stranger = TransportAddress(ip: ip(198, 51, 100, 9), port: 4000)
        for told in [TransportAddress?.some(moved), nil, stranger] {
            let net = pair()
            signal(net)
            net.run(for: 2)
            #expect(selected(net.bEvents)?.remote.address == net.aHost)
            // The same agent, from now on at another address (its old one gone).
            let movedA = agentHost(net.a.core, at: moved, on: net.network)
            net.network.detach(net.a)
            net.network.attach(movedA)
            net.run(for: 1)
            if let told { net.b.handle(.remoteMoved(told)) }
            net.run(for: 60)
            let lost = lostConsent(net.bEvents)
            if told == moved {
                #expect(!lost, "consent lost though the peer answers at its new address: \(net.bEvents)")
                #expect(net.b.core.selected?.remote.address == moved && net.b.core.acceptsData(from: moved))
                #expect(!lostConsent(events(movedA)), "the moved side's own checks are answered")
            } else {
                #expect(lost, "told \(told.map { "\($0)" } ?? "nothing"): consent held without an answer")
            }
        }
    }

    /// The peer moves while a restart waits for its new description (the restart made
    /// because it went quiet): the moved-to address, a candidate now, keeps its pair, so
    /// the signalled candidate at that address is checked and selected.
    @Test func aMoveDuringARestartLeavesThePeersNewAddressSelectable() {
        let moved = TransportAddress(ip: ip(10, 0, 0, 1), port: 4999)
        let net = pair()
        signal(net)
        net.run(for: 2)
        let movedA = agentHost(net.a.core, at: moved, on: net.network)
        net.network.detach(net.a)
        net.network.attach(movedA)
        movedA.handle(.restart(local: .random(), candidates: [.host(moved, base: 0)]))
        net.b.handle(.restart(local: .random(), candidates: nil))
        net.b.handle(.remoteMoved(moved))
        net.run(for: 0.5)
        net.bEvents = []
        movedA.handle(.setRemote(net.b.core.local, candidates: net.b.core.advertised, complete: true))
        net.b.handle(.setRemote(movedA.core.local, candidates: movedA.core.advertised, complete: true))
        net.run(for: 3)
        #expect(net.b.core.state == .completed, "\(net.bEvents)")
        #expect(selected(net.bEvents)?.remote.address == moved, "\(net.bEvents)")
    }

    @Test func aConsentThatExpiresWhileARestartWaitsDoesNotStopTheRestart() {
        let net = pair()
        signal(net)
        net.run(for: 2)
        net.a.handle(.restart(local: .random(), candidates: nil))
        net.b.handle(.restart(local: .random(), candidates: nil))
        net.aEvents = []
        // The new descriptions take longer than the consent timeout to arrive.
        net.run(for: 35)
        #expect(lostConsent(net.aEvents), "\(net.aEvents)")
        #expect(net.a.core.consentExpired && net.a.core.state == .checking)
        signal(net)
        net.run(for: 2)
        #expect(selected(net.aEvents) != nil && !net.a.core.consentExpired && net.a.core.state == .completed, "\(net.aEvents)")
    }

    @Test func aRestartWithNewCredentialsConnectsAgain() {
        let net = pair()
        signal(net)
        net.run(for: 2)
        let old = net.a.core.local
        net.a.handle(.restart(local: .random(), candidates: nil))
        net.b.handle(.restart(local: .random(), candidates: nil))
        #expect(net.a.core.local != old)
        #expect(net.a.core.selected != nil, "media keeps its pair during the restart")
        net.aEvents = []
        net.bEvents = []
        signal(net)
        net.run(for: 2)
        #expect(selected(net.aEvents) != nil && selected(net.bEvents) != nil)
    }

    @Test func checksWithAWrongPasswordOrUsernameAreRefusedAndFormNoPair() throws {
        let host = TransportAddress(ip: ip(127, 0, 0, 1), port: 9)
        var agent = ICEAgent(
            role: .controlled, local: ICECredentials(ufrag: "abcd", pwd: "0123456789012345678901"),
            candidates: [.host(host, base: 0)])
        agent.setRemote(ICECredentials(ufrag: "wxyz", pwd: "zyxwvutsrqponmlkjihgfe"), candidates: [])
        let peer = TransportAddress(ip: ip(127, 0, 0, 1), port: 7000)
        func check(username: String, password: String) -> [UInt8] {
            Message(type: .bindingRequest, attributes: [.username(username), .priority(1), .iceControlling(1)])
                .encode(integrity: try? IntegrityKey.shortTerm(password: password), fingerprint: true)
        }
        for (bytes, code) in [
            (check(username: "abcd:wxyz", password: "wrongwrongwrongwrongwr"), 401),
            (check(username: "nope:wxyz", password: "0123456789012345678901"), 401),
            (Message(type: .bindingRequest, attributes: [.username("abcd:wxyz")]).encode(fingerprint: true), 400),
        ] {
            let wasICE = agent.receive(bytes, from: peer, base: 0, now: .seconds(1))
            #expect(wasICE)
            let out = agent.drainActions()
            guard case .send(let reply, _, _)? = out.first, let m = try? Message(decoding: reply),
                case .errorCode(let e)? = try? m.value(.errorCode)
            else {
                Issue.record("no error response: \(out)")
                continue
            }
            #expect(e.code == code)
        }
        #expect(agent.remoteCandidates.isEmpty, "an unauthenticated check taught a candidate")
        // Not STUN, truncated STUN, a response to nobody: not the agent's, no crash.
        let notSTUN = agent.receive([0x80, 0, 1, 2, 3], from: peer, base: 0, now: .seconds(1))
        #expect(!notSTUN)
        let good = check(username: "abcd:wxyz", password: "0123456789012345678901")
        for n in 0..<good.count { _ = agent.receive(Array(good.prefix(n)), from: peer, base: 0, now: .seconds(1)) }
        _ = agent.drainActions()
        let stray = Message(type: .bindingSuccess, attributes: [.xorMappedAddress(peer)]).encode(fingerprint: true)
        let strayWasICE = agent.receive(stray, from: peer, base: 0, now: .seconds(1))
        #expect(!strayWasICE)
        // The right password is answered, signed, and the sender becomes a candidate.
        let goodWasICE = agent.receive(good, from: peer, base: 0, now: .seconds(1))
        #expect(goodWasICE)
        let out = agent.drainActions()
        guard case .send(let reply, _, let to)? = out.first else {
            Issue.record("\(out)")
            return
        }
        let m = try Message(decoding: reply)
        #expect(to == peer && m.type == .bindingSuccess)
        #expect(m.checkMessageIntegrity(key: try IntegrityKey.shortTerm(password: "0123456789012345678901")) == .valid)
        #expect(m.checkFingerprint() == .valid)
        #expect(try m.value(.xorMappedAddress) == .xorMappedAddress(peer))
        #expect(agent.remoteCandidates.map(\.address) == [peer])
    }
}

@Suite("ICE candidates")
struct ICECandidateTests {
    @Test func candidateLinesRoundTripAndBadOnesAreTypedErrors() throws {
        let c = try ICECandidate(
            sdp: "candidate:842163049 1 udp 1677729535 198.51.100.7 46154 typ srflx raddr 10.0.0.2 rport 46154 generation 0")
        #expect(c.type == .srflx && c.priority == 1_677_729_535 && c.address.port == 46154)
        #expect(c.relatedAddress == TransportAddress(ip: ip(10, 0, 0, 2), port: 46154))
        #expect(try ICECandidate(sdp: c.sdp) == c)
        let v6 = try ICECandidate(sdp: "1 1 UDP 2130706431 2001:db8::1 5000 typ host")
        #expect(v6.address.ip.family == 2)
        // aioice's foundations (an MD5 in hex, 32 characters), pjnath's, and every character the grammar allows.
        for foundation in ["9ba9f8ed23a2b5e5a2a0c1f3a2b4c6d8", "Hc0a80001", String(repeating: "aZ9+/", count: 6) + "ab"] {
            #expect(try ICECandidate(sdp: "\(foundation) 1 udp 2130706431 10.0.0.1 5000 typ host").foundation == foundation)
        }
        for bad in [
            "", "1 1 udp", "1 1 tcp 2130706431 10.0.0.1 9 typ host tcptype active",
            "1 1 udp 2130706431 example.com 5000 typ host", "1 1 udp 2130706431 10.0.0.1 70000 typ host",
            "1 0 udp 2130706431 10.0.0.1 5000 typ host", "1 1 udp 2130706431 10.0.0.1 5000 typ bogus",
            // A foundation of other than ALPHA / DIGIT / "+" / "/" (RFC 8839), or longer than 32.
            "candidate:candidate:1 1 udp 2130706431 10.0.0.1 5000 typ host", "fo-o 1 udp 2130706431 10.0.0.1 5000 typ host",
            "\u{e9} 1 udp 2130706431 10.0.0.1 5000 typ host",
            String(repeating: "a", count: 33) + " 1 udp 2130706431 10.0.0.1 5000 typ host",
        ] {
            #expect(throws: ICECandidateError.self) { try ICECandidate(sdp: bad) }
        }
    }

    @Test func prioritiesFollowTheRFCFormula() {
        #expect(ICECandidate.priority(type: .host) == 2_130_706_431)
        #expect(ICECandidate.priority(type: .relay, localPreference: 65535) == 16_777_215)
        #expect(ICECandidate.priority(type: .host) > ICECandidate.priority(type: .prflx))
        #expect(ICECandidate.priority(type: .prflx) > ICECandidate.priority(type: .srflx))
        #expect(ICECredentials.random().isValid)
        #expect(!ICECredentials(ufrag: "a:b", pwd: String(repeating: "x", count: 22)).isValid)
    }
}

@Suite("ICE agent under captured and fuzz-seed input")
struct ICEAgentCorpusTests {
    static let shared = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("shared/interop")

    @Test(.enabled(if: FileManager.default.fileExists(atPath: shared.path), "../shared/interop is absent: nothing to replay"))
    func everySeedAndCapturedMessageIsHandledWithoutATrap() throws {
        var count = 0
        for folder in ["fuzz-seeds", "messages"] {
            let dir = Self.shared.appendingPathComponent(folder)
            guard let names = try? FileManager.default.contentsOfDirectory(atPath: dir.path) else { continue }
            for name in names.sorted() where !name.hasSuffix(".md") {
                let bytes = [UInt8](try Data(contentsOf: dir.appendingPathComponent(name)))
                ICEFuzzChecks.exercise(bytes)
                count += 1
            }
        }
        #expect(count > 10, "only \(count) inputs found under \(Self.shared.path)")
    }
}
