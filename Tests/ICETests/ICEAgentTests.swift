import Foundation
import ICE
import STUN
import Testing
import TusaBase

// The ICE agent core on a virtual clock: two agents joined by a simulated
// network (a fake only here, in the unit tests of the pure core) that can drop
// packets and put one side behind an address-rewriting NAT.

private func ip(_ a: UInt8, _ b: UInt8, _ c: UInt8, _ d: UInt8) -> IPAddress {
    .v4(UInt32(a) << 24 | UInt32(b) << 16 | UInt32(c) << 8 | UInt32(d))
}

private struct Side {
    var agent: ICEAgent
    /// The socket's own address (the host candidate).
    var host: TransportAddress
    /// What others see as the source (a NAT's mapping), when it differs.
    var mapped: TransportAddress?
    var events: [ICEEvent] = []
    var outside: TransportAddress { mapped ?? host }
}

private struct Net {
    var a: Side
    var b: Side
    var now = Timestamp.seconds(100)
    /// Drops every packet while true.
    var blackhole = false
    var sent = 0
    var spins = 0

    /// Delivers what an agent sends (1 ms one way) until both are quiet or `until`.
    mutating func run(for seconds: Double) {
        let end = now + .milliseconds(Int(seconds * 1000))
        var queue: [(at: Timestamp, toA: Bool, bytes: [UInt8], from: TransportAddress)] = []
        func emit(_ outputs: [ICEOutput], fromA: Bool, _ net: inout Net) {
            for o in outputs {
                switch o {
                case .event(let e):
                    if fromA { net.a.events.append(e) } else { net.b.events.append(e) }
                case .send(let bytes, _, let to):
                    net.sent += 1
                    if net.blackhole { continue }
                    let src = fromA ? net.a.outside : net.b.outside
                    // Delivered only to the address the receiver is reachable at.
                    if fromA, to == net.b.outside { queue.append((net.now + .milliseconds(1), false, bytes, src)) }
                    if !fromA, to == net.a.outside { queue.append((net.now + .milliseconds(1), true, bytes, src)) }
                }
            }
        }
        while now < end {
            emit(a.agent.poll(now: now), fromA: true, &self)
            emit(b.agent.poll(now: now), fromA: false, &self)
            // Right after a poll, the next wakeup is in the future (a driver would spin otherwise).
            for w in [a.agent.nextWakeup, b.agent.nextWakeup] { if let w, w <= now { spins += 1 } }
            queue.sort { $0.at < $1.at }
            let wakes = [a.agent.nextWakeup, b.agent.nextWakeup, queue.first?.at].compactMap { $0 }
            guard let next = wakes.min() else { break }
            now = max(now + .milliseconds(1), min(next, end))
            while let first = queue.first, first.at <= now {
                queue.removeFirst()
                if first.toA {
                    emit(a.agent.receive(first.bytes, from: first.from, base: 0, now: now) ?? [], fromA: true, &self)
                } else {
                    emit(b.agent.receive(first.bytes, from: first.from, base: 0, now: now) ?? [], fromA: false, &self)
                }
            }
        }
        #expect(spins == 0, "an agent asked to be polled again at a time that had passed")
    }
}

private func pair(aRole: ICERole = .controlling, bRole: ICERole = .controlled, natOnA: Bool = false) -> Net {
    let ha = TransportAddress(ip: ip(10, 0, 0, 1), port: 4000), hb = TransportAddress(ip: ip(192, 0, 2, 7), port: 5000)
    let a = ICEAgent(role: aRole, candidates: [.host(ha, base: 0)], tieBreaker: 7)
    let b = ICEAgent(role: bRole, candidates: [.host(hb, base: 0)], tieBreaker: 9)
    return Net(a: Side(agent: a, host: ha, mapped: natOnA ? TransportAddress(ip: ip(203, 0, 113, 1), port: 61000) : nil),
               b: Side(agent: b, host: hb))
}

private func signal(_ net: inout Net, aLearnsB: Bool = true, bLearnsA: Bool = true) {
    let ca = net.a.agent.local, cb = net.b.agent.local
    net.a.agent.setRemote(cb, candidates: aLearnsB ? net.b.agent.advertised : [])
    net.b.agent.setRemote(ca, candidates: bLearnsA ? net.a.agent.advertised : [])
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
        var net = pair()
        signal(&net)
        net.run(for: 2)
        let a = selected(net.a.events), b = selected(net.b.events)
        #expect(a?.remote.address == net.b.host)
        #expect(b?.remote.address == net.a.host)
        #expect(net.a.agent.state == .completed && net.b.agent.state == .completed)
        #expect(net.sent < 20, "\(net.sent) packets for one pair")
    }

    @Test func aBothControllingConflictIsResolvedByTheTieBreaker() {
        var net = pair(aRole: .controlling, bRole: .controlling)
        signal(&net)
        net.run(for: 3)
        // a's tie-breaker (7) is the smaller: a gives way.
        #expect(net.a.events.contains(.roleChanged(.controlled)), "\(net.a.events)")
        #expect(net.a.agent.role == .controlled && net.b.agent.role == .controlling)
        #expect(selected(net.a.events) != nil && selected(net.b.events) != nil)
    }

    @Test func aBothControlledConflictIsResolvedToo() {
        var net = pair(aRole: .controlled, bRole: .controlled)
        signal(&net)
        net.run(for: 3)
        #expect(net.b.agent.role == .controlling && net.a.agent.role == .controlled, "\(net.a.events) \(net.b.events)")
        #expect(selected(net.a.events) != nil && selected(net.b.events) != nil)
    }

    @Test func aPeerBehindANATIsLearntAsPeerReflexive() {
        // b only has a's private host address, which it cannot reach; a's checks
        // arrive from the NAT's mapping.
        var net = pair(natOnA: true)
        signal(&net)
        net.run(for: 3)
        let b = selected(net.b.events)
        #expect(b?.remote.address == net.a.outside, "\(net.b.events)")
        #expect(b?.remote.type == .prflx)
        #expect(selected(net.a.events)?.remote.address == net.b.host)
        // a learnt its own mapping from b's answer.
        #expect(net.a.agent.localCandidates.contains { $0.candidate.type == .prflx && $0.candidate.address == net.a.outside })
    }

    @Test func noCandidatesFromThePeerStillConnectsThroughItsChecks() {
        var net = pair()
        signal(&net, aLearnsB: true, bLearnsA: false)
        net.run(for: 3)
        #expect(selected(net.b.events)?.remote.type == .prflx)
        #expect(selected(net.a.events) != nil)
    }

    /// The callee checks as soon as it has the offer, so its first check can reach
    /// the caller before the answer does: the caller learns the callee's host as
    /// peer-reflexive. The answer's candidates then replace it, pairs included,
    /// so a second, worse host of the callee does not outrank it.
    @Test func aCheckBeforeTheDescriptionDoesNotDemoteTheSignalledCandidate() {
        var net = pair()
        let other = TransportAddress(ip: ip(127, 0, 0, 1), port: 5000)
        net.b.agent.addLocal(.host(other, base: 0, localPreference: 65534))
        net.b.agent.setRemote(net.a.agent.local, candidates: net.a.agent.advertised)
        net.run(for: 0.01)   // B's first check reaches A, which knows nothing of B yet
        #expect(net.a.agent.remoteCandidates.map(\.type) == [.prflx])
        net.a.agent.setRemote(net.b.agent.local, candidates: net.b.agent.advertised)
        #expect(net.a.agent.remoteCandidates.map(\.type) == [.host, .host])
        // The best pair succeeds and, nothing better being out, is nominated at once
        // (not after the nomination delay that a falsely better pair would cost).
        net.run(for: 0.05)
        #expect(selected(net.a.events)?.remote.address == net.b.host, "the better host, signalled after the check")
        #expect(selected(net.a.events)?.remote.type == .host)
    }

    @Test func unreachablePeersFailOnceEveryCheckTimedOut() {
        var net = pair()
        net.blackhole = true
        signal(&net)
        net.run(for: 5)
        #expect(!net.a.events.contains { if case .failed = $0 { true } else { false } }, "failed before the checks gave up")
        net.run(for: 10)
        #expect(net.a.events.contains { if case .failed = $0 { true } else { false } }, "\(net.a.events)")
        #expect(net.a.agent.state == .failed)
        #expect(selected(net.a.events) == nil)
    }

    @Test func withNoPairsAtAllTheAgentWaitsForChecksBeforeFailing() {
        var net = pair()
        net.blackhole = true
        signal(&net, aLearnsB: false, bLearnsA: false)
        net.run(for: 3)
        #expect(net.a.agent.state == .checking, "failed before a peer's check could have taught a pair")
        net.run(for: 10)
        #expect(net.a.agent.state == .failed && net.a.events.contains(.failed("no candidate pairs")), "\(net.a.events)")
    }

    @Test func consentIsRefreshedWhileThePeerAnswersAndLostWhenItGoesSilent() {
        var net = pair()
        signal(&net)
        net.run(for: 2)
        #expect(selected(net.a.events) != nil)
        let before = net.sent
        net.run(for: 60)
        #expect(!lostConsent(net.a.events))
        // About one consent check each way every 5 s.
        #expect((net.sent - before) >= 2 * 8 && (net.sent - before) <= 2 * 2 * 16, "\(net.sent - before) packets in 60 s")
        net.blackhole = true
        net.run(for: 25)
        #expect(!lostConsent(net.a.events))
        net.run(for: 10)
        #expect(lostConsent(net.a.events), "consent held without answers")
    }

    @Test func consentLostStaysLostThroughARestartUntilItsChecksSelectAPair() {
        var net = pair()
        signal(&net)
        net.run(for: 2)
        let first = selected(net.a.events)
        net.blackhole = true
        net.run(for: 35)
        #expect(lostConsent(net.a.events))
        #expect(net.a.agent.consentExpired && net.a.agent.state == .failed)
        // The restart's signalling takes a while; the lost pair is not lost a second time, nor usable.
        net.blackhole = false
        net.a.agent.restart()
        net.b.agent.restart()
        net.a.events = []
        net.run(for: 5)
        #expect(net.a.events.isEmpty, "\(net.a.events)")
        #expect(net.a.agent.consentExpired && net.a.agent.state == .checking)
        signal(&net)
        net.run(for: 2)
        #expect(selected(net.a.events) == first && !net.a.agent.consentExpired)
        // Consent is checked again on the new selection, and holds.
        net.run(for: 60)
        #expect(!lostConsent(net.a.events), "\(net.a.events)")
    }

    @Test func aConsentThatExpiresWhileARestartWaitsDoesNotStopTheRestart() {
        var net = pair()
        signal(&net)
        net.run(for: 2)
        net.a.agent.restart()
        net.b.agent.restart()
        net.a.events = []
        // The new descriptions take longer than the consent timeout to arrive.
        net.run(for: 35)
        #expect(lostConsent(net.a.events), "\(net.a.events)")
        #expect(net.a.agent.consentExpired && net.a.agent.state == .checking)
        signal(&net)
        net.run(for: 2)
        #expect(selected(net.a.events) != nil && !net.a.agent.consentExpired && net.a.agent.state == .completed, "\(net.a.events)")
    }

    @Test func aRestartWithNewCredentialsConnectsAgain() {
        var net = pair()
        signal(&net)
        net.run(for: 2)
        let old = net.a.agent.local
        net.a.agent.restart()
        net.b.agent.restart()
        #expect(net.a.agent.local != old)
        #expect(net.a.agent.selected != nil, "media keeps its pair during the restart")
        net.a.events = []; net.b.events = []
        signal(&net)
        net.run(for: 2)
        #expect(selected(net.a.events) != nil && selected(net.b.events) != nil)
    }

    @Test func checksWithAWrongPasswordOrUsernameAreRefusedAndFormNoPair() throws {
        let host = TransportAddress(ip: ip(127, 0, 0, 1), port: 9)
        var agent = ICEAgent(role: .controlled, local: ICECredentials(ufrag: "abcd", pwd: "0123456789012345678901"),
                             candidates: [.host(host, base: 0)])
        agent.setRemote(ICECredentials(ufrag: "wxyz", pwd: "zyxwvutsrqponmlkjihgfe"), candidates: [])
        let peer = TransportAddress(ip: ip(127, 0, 0, 1), port: 7000)
        func check(username: String, password: String) -> [UInt8] {
            Message(type: .bindingRequest, attributes: [.username(username), .priority(1), .iceControlling(1)])
                .encode(integrity: try? IntegrityKey.shortTerm(password: password), fingerprint: true)
        }
        for (bytes, code) in [(check(username: "abcd:wxyz", password: "wrongwrongwrongwrongwr"), 401),
                              (check(username: "nope:wxyz", password: "0123456789012345678901"), 401),
                              (Message(type: .bindingRequest, attributes: [.username("abcd:wxyz")]).encode(fingerprint: true), 400)] {
            let answer = agent.receive(bytes, from: peer, base: 0, now: .seconds(1))
            let out = try #require(answer)
            guard case .send(let reply, _, _)? = out.first, let m = try? Message(decoding: reply),
                  case .errorCode(let e)? = try? m.value(.errorCode) else { Issue.record("no error response: \(out)"); continue }
            #expect(e.code == code)
        }
        #expect(agent.remoteCandidates.isEmpty, "an unauthenticated check taught a candidate")
        // Not STUN, truncated STUN, a response to nobody: not the agent's, no crash.
        #expect(agent.receive([0x80, 0, 1, 2, 3], from: peer, base: 0, now: .seconds(1)) == nil)
        let good = check(username: "abcd:wxyz", password: "0123456789012345678901")
        for n in 0..<good.count { _ = agent.receive(Array(good.prefix(n)), from: peer, base: 0, now: .seconds(1)) }
        let stray = Message(type: .bindingSuccess, attributes: [.xorMappedAddress(peer)]).encode(fingerprint: true)
        #expect(agent.receive(stray, from: peer, base: 0, now: .seconds(1)) == nil)
        // The right password is answered, signed, and the sender becomes a candidate.
        let answer = agent.receive(good, from: peer, base: 0, now: .seconds(1))
        let out = try #require(answer)
        guard case .send(let reply, _, let to)? = out.first else { Issue.record("\(out)"); return }
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
        let c = try ICECandidate(sdp: "candidate:842163049 1 udp 1677729535 198.51.100.7 46154 typ srflx raddr 10.0.0.2 rport 46154 generation 0")
        #expect(c.type == .srflx && c.priority == 1_677_729_535 && c.address.port == 46154)
        #expect(c.relatedAddress == TransportAddress(ip: ip(10, 0, 0, 2), port: 46154))
        #expect(try ICECandidate(sdp: c.sdp) == c)
        let v6 = try ICECandidate(sdp: "1 1 UDP 2130706431 2001:db8::1 5000 typ host")
        #expect(v6.address.ip.family == 2)
        for bad in ["", "1 1 udp", "1 1 tcp 2130706431 10.0.0.1 9 typ host tcptype active",
                    "1 1 udp 2130706431 example.com 5000 typ host", "1 1 udp 2130706431 10.0.0.1 70000 typ host",
                    "1 0 udp 2130706431 10.0.0.1 5000 typ host", "1 1 udp 2130706431 10.0.0.1 5000 typ bogus"] {
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
