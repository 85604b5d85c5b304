import Testing
import TusaBase

@testable import Secure

/// Two `SecureEndpoint`s on a virtual clock and a simulated network.
@Suite struct SecureEndpointTests {
    func established(_ node: SimulatedNetwork.Node) -> Int {
        node.events.filter { if case .established = $0 { true } else { false } }.count
    }

    func payload(_ i: Int) -> [UInt8] { (0..<160).map { UInt8(truncatingIfNeeded: $0 &+ i) } }

    @Test func handshakeThenMediaBothWays() throws {
        let (net, a, b, bAtA, aAtB) = SimulatedNetwork.pair()
        #expect(established(a) == 1)
        #expect(established(b) == 1, "the responder confirms on the initiator's first packet")
        #expect(a.endpoint.isEstablished(bAtA) && b.endpoint.isEstablished(aAtB))
        for i in 0..<20 {
            try net.sendMedia(a, to: bAtA, payload: payload(i), timestamp: UInt32(i * 160))
            try net.sendMedia(b, to: aAtB, payload: payload(100 + i))
        }
        net.run(for: .seconds(1))
        #expect(b.media.count == 20 && a.media.count == 20)
        #expect(b.media.map(\.2) == (0..<20).map(payload))
        #expect(a.media.map(\.2) == (0..<20).map { payload(100 + $0) })
        let (localA, remoteA) = try #require(a.endpoint.ssrcs(of: bAtA))
        #expect(b.media.allSatisfy { $0.1.ssrc == localA && $0.1.payloadType == 111 })
        #expect(a.media.allSatisfy { $0.1.ssrc == remoteA })
        let seqs = b.media.map { Int($0.1.sequenceNumber) }
        #expect(zip(seqs, seqs.dropFirst()).allSatisfy { ($1 - $0 + 65536) % 65536 == 1 })
        #expect(b.media.map(\.1.timestamp) == (0..<20).map { UInt32($0 * 160) })
        #expect(a.drops.isEmpty && b.drops.isEmpty)
    }

    /// One payload sealed for many peers in one call (a party relay's copies of a
    /// frame): each copy is sealed under its own peer's session, with that session's
    /// next sequence number; a peer without keys starts a handshake, an unknown one
    /// is refused, and neither stops the copies after it.
    @Test func aPayloadSealedForManyPeersOpensAtEachUnderItsOwnSession() throws {
        let net = SimulatedNetwork()
        let hub = net.addNode(port: 1000)
        let listeners = (0..<3).map { net.addNode(port: UInt16(2000 + $0)) }
        let ids = listeners.map { hub.endpoint.addPeer($0.endpoint.identity.publicKey, address: $0.address) }
        for l in listeners { l.endpoint.addPeer(hub.endpoint.identity.publicKey) }
        for id in ids.prefix(2) { hub.endpoint.handle(.connect(id), now: net.now) }
        net.flush(hub)
        net.run(for: .seconds(1))
        #expect(ids.map { hub.endpoint.isEstablished($0) } == [true, true, false])
        // The first listener has had a packet already.
        try net.sendMedia(hub, to: ids[0], payload: payload(0))
        net.run(for: .seconds(1))

        let unknown = PeerID(rawValue: ids.map(\.rawValue).reduce(0, max) + 1)
        let targets = [ids[0], ids[1], ids[2], unknown, ids[1]]
        let words = payload(7)
        var results: [Result<(length: Int, to: TransportAddress), any Error>] = []
        var out = [UInt8](repeating: 0, count: 512)
        words.withUnsafeBytes { p in
            out.withUnsafeMutableBytes { o in
                hub.endpoint.sealMedia(toEach: targets, payloadType: 111, timestamp: 480, payload: p, into: o, now: net.now) {
                    result in
                    results.append(result)
                    // Each copy is sent before the next overwrites it.
                    if case .success(let copy) = result { net.send(Array(o[..<copy.length]), from: hub.address, to: copy.to) }
                }
            }
        }
        #expect(results.count == targets.count)
        let sentTo = results.map { try? $0.get().to }
        #expect(sentTo == [listeners[0].address, listeners[1].address, nil, nil, listeners[1].address])
        #expect(throws: SecureSendError.notEstablished) { try results[2].get() }
        #expect(throws: SecureSendError.unknownPeer) { try results[3].get() }
        net.flush(hub)
        #expect(hub.sent.last?.first == HandshakeWire.initiation, "the peer without keys is being connected")
        net.run(for: .seconds(1))
        #expect(listeners[0].media.map(\.2) == [payload(0), words])
        #expect(listeners[1].media.map(\.2) == [words, words])
        // Each session's own sequence: the next number after its last packet.
        for l in listeners.prefix(2) {
            let seqs = l.media.map(\.1.sequenceNumber)
            #expect(seqs.count == 2 && seqs[1] == seqs[0] &+ 1, "\(seqs)")
        }
        #expect(listeners[1].media.map(\.1.timestamp) == [480, 480])
        #expect(listeners.allSatisfy { $0.drops.isEmpty })
    }

    /// Keys seal nothing once they are `rejectAfter` old: the send throws and starts a
    /// handshake (no timer ran in between: rekeys are off here).
    @Test func keysSealUntilTheyAreRejectAfterOldAndNothingAfter() throws {
        var config = SecureConfiguration()
        config.rejectAfter = .seconds(30)
        config.rekeyAfter = .seconds(3600)
        let (net, a, _, bAtA, _) = SimulatedNetwork.pair(configuration: config)
        // The keys were made during the pair's handshake, in the second before `net.now`.
        var out = [UInt8](repeating: 0, count: 256)
        func seal(at t: Timestamp) throws {
            _ = try [UInt8](repeating: 1, count: 20).withUnsafeBytes { p in
                try out.withUnsafeMutableBytes { o in
                    try a.endpoint.sealMedia(to: bAtA, payloadType: 111, timestamp: 0, payload: p, into: o, now: t)
                }
            }
        }
        try seal(at: net.now + .seconds(29))
        #expect(a.endpoint.takeActions().isEmpty)
        #expect(throws: SecureSendError.notEstablished) { try seal(at: net.now + .seconds(30)) }
        #expect(
            a.endpoint.takeActions().contains {
                if case .send(let m, _) = $0 { m.first == HandshakeWire.initiation } else { false }
            })
    }

    @Test func handshakeMessageSizesNeverAmplify() {
        let (_, a, b, _, _) = SimulatedNetwork.pair()
        let initiation = a.sent.first { $0.first == HandshakeWire.initiation }
        let response = b.sent.first { $0.first == HandshakeWire.response }
        #expect(initiation?.count == HandshakeWire.initiationLength)
        #expect(response?.count == HandshakeWire.responseLength)
        #expect(HandshakeWire.responseLength <= HandshakeWire.initiationLength)
        #expect(HandshakeWire.cookieReplyLength <= HandshakeWire.initiationLength)
    }

    @Test func sendingBeforeTheHandshakeThrowsAndStartsOne() throws {
        let (net, a, _, bAtA, _) = SimulatedNetwork.pair(connect: false)
        #expect(throws: SecureSendError.notEstablished) { try net.sendMedia(a, to: bAtA, payload: [1, 2, 3]) }
        net.flush(a)
        #expect(a.sent.count == 1 && a.sent[0].first == HandshakeWire.initiation)
        net.run(for: .seconds(1))
        #expect(a.endpoint.isEstablished(bAtA))
    }

    @Test func unknownInitiatorIsRefusedUnlessAccepted() {
        let net = SimulatedNetwork()
        let a = net.addNode(port: 1000)
        let b = net.addNode(port: 2000)
        let bAtA = a.endpoint.addPeer(b.endpoint.identity.publicKey, address: b.address)
        a.endpoint.handle(.connect(bAtA), now: net.now)
        net.flush(a)
        net.run(for: .milliseconds(500))
        #expect(b.drops == [.droppedHandshake(.unknownPeer)])
        #expect(!a.endpoint.isEstablished(bAtA))

        var open = SecureConfiguration()
        open.acceptUnknownPeers = true
        let c = net.addNode(port: 3000, configuration: open)
        let cAtA = a.endpoint.addPeer(c.endpoint.identity.publicKey, address: c.address)
        a.endpoint.handle(.connect(cAtA), now: net.now)
        net.flush(a)
        net.run(for: .milliseconds(500))
        #expect(a.endpoint.isEstablished(cAtA))
        #expect(c.endpoint.peer(for: a.endpoint.identity.publicKey) != nil)
    }

    @Test func handshakeRetriesThroughLossThenFailsWhenNobodyAnswers() {
        var config = SecureConfiguration()
        config.handshakeRetry = .seconds(1)
        config.handshakeTimeout = .seconds(5)
        let (net, a, _, bAtA, _) = SimulatedNetwork.pair(configuration: config, connect: false)
        var dropped = 0
        net.tamper = { d in
            if d.bytes.first == HandshakeWire.initiation, dropped < 2 {
                dropped += 1
                return nil
            }
            return d
        }
        a.endpoint.handle(.connect(bAtA), now: net.now)
        net.flush(a)
        net.run(for: .seconds(4))
        #expect(a.endpoint.isEstablished(bAtA), "the third initiation gets through")

        let (net2, a2, _, bAtA2, _) = SimulatedNetwork.pair(configuration: config, connect: false)
        net2.tamper = { _ in nil }
        a2.endpoint.handle(.connect(bAtA2), now: net2.now)
        net2.flush(a2)
        net2.run(for: .seconds(7))
        #expect(a2.events.contains(.handshakeFailed(bAtA2)))
        #expect(a2.sent.count >= 5 && a2.sent.count <= 7)
    }

    @Test func rekeyUnderTrafficWithLossReorderingAndDuplicationLosesNothing() throws {
        var config = SecureConfiguration()
        config.rekeyAfter = .seconds(3)
        config.previousKeysLinger = .seconds(2)
        var impair = SimulatedNetwork.Impairment()
        impair.loss = 0.05
        impair.duplicate = 0.05
        impair.jitter = .milliseconds(60)
        let (net, a, b, bAtA, aAtB) = SimulatedNetwork.pair(configuration: config, impairment: impair)
        #expect(a.endpoint.isEstablished(bAtA))
        var sentAB = 0
        var sentBA = 0
        for i in 0..<1000 {  // 20 s at 50 packets/s each way
            if (try? net.sendMedia(a, to: bAtA, payload: payload(i))) != nil { sentAB += 1 }
            if (try? net.sendMedia(b, to: aAtB, payload: payload(i))) != nil { sentBA += 1 }
            net.run(for: .milliseconds(20))
        }
        net.run(for: .seconds(1))
        #expect(sentAB == 1000 && sentBA == 1000, "keys never went missing on the sending side")
        #expect(established(a) >= 5, "rekeyed every 3 s")
        // Every delivered packet opened: only duplicates were dropped (replayed media and
        // control; a duplicated handshake answer or initiation arriving after the first).
        let duplicates: [SecureReceive] = [
            .dropped(.replayed), .droppedHandshake(.unexpected), .droppedHandshake(.replayedInitiation),
        ]
        for node in [a, b] {
            #expect(node.drops.allSatisfy { duplicates.contains($0) }, "\(node.drops.filter { !duplicates.contains($0) })")
        }
        let expected = 1000.0 * 0.95
        #expect(Double(b.media.count) > expected - 60 && Double(a.media.count) > expected - 60)
        #expect(Set(b.media.map(\.1.sequenceNumber)).count == b.media.count, "no packet accepted twice")
    }

    @Test func rekeyAfterPacketCount() throws {
        var config = SecureConfiguration()
        config.rekeyAfterPackets = 100
        let (net, a, _, bAtA, _) = SimulatedNetwork.pair(configuration: config)
        for i in 0..<450 {
            _ = try? net.sendMedia(a, to: bAtA, payload: payload(i))
            net.run(for: .milliseconds(5))
        }
        #expect(established(a) >= 4)
    }

    @Test func replaysInsideAndOutsideTheWindowAreRefused() throws {
        let (net, a, b, bAtA, _) = SimulatedNetwork.pair()
        let first = try net.sendMedia(a, to: bAtA, payload: payload(0))
        net.run(for: .milliseconds(50))
        #expect(b.media.count == 1)
        net.send(first, from: a.address, to: b.address)
        net.run(for: .milliseconds(50))
        #expect(b.drops.last == .dropped(.replayed))
        for i in 1...2100 { try net.sendMedia(a, to: bAtA, payload: payload(i)) }
        net.run(for: .milliseconds(50))
        #expect(b.media.count == 2101)
        net.send(first, from: a.address, to: b.address)
        net.run(for: .milliseconds(50))
        #expect(b.drops.last == .dropped(.tooOld))
    }

    @Test func everyBitFlipInAMediaPacketIsRefused() throws {
        let (net, a, b, bAtA, _) = SimulatedNetwork.pair()
        let packet = try net.sendMedia(a, to: bAtA, payload: payload(7))
        net.inFlight.removeAll()
        for byte in 0..<packet.count {
            for bit in 0..<8 {
                var forged = packet
                forged[byte] ^= 1 << bit
                var copy = forged
                let r = b.endpoint.receive(&copy, from: a.address, now: net.now)
                guard case .media = r else { continue }
                Issue.record("flip of bit \(bit) in byte \(byte) was accepted")
            }
        }
        var good = packet
        guard case .media = b.endpoint.receive(&good, from: a.address, now: net.now) else {
            Issue.record("the untouched packet must still open after every forgery")
            return
        }
        for n in [0, 1, 11, 12, 27] {
            var short = Array(packet.prefix(n))
            #expect(
                b.endpoint.receive(&short, from: a.address, now: net.now)
                    != .media(bAtA, try RTPHeader.parse(packet), payload: 12..<172))
        }
    }

    @Test func aThirdPartyCannotInjectMedia() throws {
        let (net, a, b, bAtA, _) = SimulatedNetwork.pair()
        let real = try net.sendMedia(a, to: bAtA, payload: payload(1))
        net.run(for: .milliseconds(50))
        // Mallory knows the SSRC and sequence numbers from the wire, not the keys.
        var forged = real
        forged[3] &+= 1
        for i in 12..<forged.count { forged[i] = UInt8.random(in: 0...255) }
        #expect(
            b.endpoint.receive(&forged, from: TransportAddress(ip: .v4(0x0A00_0001), port: 9), now: net.now)
                == .dropped(.authenticationFailed))
        #expect(b.endpoint.address(of: b.endpoint.peer(for: a.endpoint.identity.publicKey)!) == a.address, "no redirect")
        // Nor with its own keys: a session of its own with B is another peer and SSRC.
        var unknown = [UInt8](repeating: 0, count: 40)
        unknown[0] = 0x80
        unknown[8] = 0xAB
        #expect(b.endpoint.receive(&unknown, from: a.address, now: net.now) == .dropped(.unknownSession))
    }

    @Test func recordedInitiationCannotBeReplayed() throws {
        let (net, a, b, _, aAtB) = SimulatedNetwork.pair()
        let initiation = try #require(net.wire.first { $0.bytes.first == HandshakeWire.initiation })
        var copy = initiation.bytes
        #expect(b.endpoint.receive(&copy, from: initiation.from, now: net.now) == .droppedHandshake(.replayedInitiation))
        #expect(b.endpoint.isEstablished(aAtB))
        _ = a
    }

    @Test func bitFlipsInHandshakeMessagesAreRefused() throws {
        let (net, a, b, bAtA, _) = SimulatedNetwork.pair(connect: false)
        a.endpoint.handle(.connect(bAtA), now: net.now)
        net.flush(a)
        let initiation = try #require(net.inFlight.first).bytes
        // mac2 is only checked while the responder is under load (see floodMeetsCookies...).
        for byte in 0..<initiation.count where !HandshakeWire.initiationMAC2.contains(byte) {
            var forged = initiation
            forged[byte] ^= 0x10
            let r = b.endpoint.receive(&forged, from: a.address, now: net.now)
            #expect(r != .handled, "flipped byte \(byte) of the initiation was accepted")
            _ = b.endpoint.takeActions()
        }
        var genuine = initiation
        #expect(b.endpoint.receive(&genuine, from: a.address, now: net.now) == .handled)
        let response = try #require(
            b.endpoint.takeActions().compactMap { if case .send(let bytes, _) = $0 { bytes } else { nil } }.first)
        for byte in 0..<response.count where !HandshakeWire.responseMAC2.contains(byte) {
            var forged = response
            forged[byte] ^= 0x10
            #expect(
                a.endpoint.receive(&forged, from: b.address, now: net.now) != .handled, "flipped byte \(byte) of the response")
        }
        var good = response
        #expect(a.endpoint.receive(&good, from: b.address, now: net.now) == .handled)
        for n in [0, 1, 4, 95, 97] {
            var odd = [UInt8](repeating: HandshakeWire.response, count: n)
            #expect(a.endpoint.receive(&odd, from: b.address, now: net.now) != .handled)
        }
    }

    @Test func floodMeetsCookiesAndTheRealPeerStillGetsThrough() throws {
        var config = SecureConfiguration()
        config.handshakeRate = 1
        config.handshakeBurst = 1
        let (net, a, b, bAtA, aAtB) = SimulatedNetwork.pair(configuration: config, connect: false)
        // A flood of valid-mac1 initiations (replays of a stranger's, from many sources) exhausts B's budget.
        let stranger = net.addNode(port: 4000, configuration: config)
        let bAtS = stranger.endpoint.addPeer(b.endpoint.identity.publicKey, address: b.address)
        stranger.endpoint.handle(.connect(bAtS), now: net.now)
        let floodPacket = try #require(
            stranger.endpoint.takeActions().compactMap { if case .send(let x, _) = $0 { x } else { nil } }.first)
        var cookieReplies = 0
        for i in 0..<200 {
            var m = floodPacket
            let r = b.endpoint.receive(&m, from: TransportAddress(ip: .v4(0x0A00_0000 | UInt32(i)), port: 5000), now: net.now)
            if r == .droppedHandshake(.cookieRequired) { cookieReplies += 1 }
            for case .send(let reply, _) in b.endpoint.takeActions() {
                #expect(reply.count == HandshakeWire.cookieReplyLength && reply.count <= m.count)
            }
        }
        #expect(cookieReplies >= 198, "once the budget is spent, no Diffie-Hellman work without a cookie")
        // A is then asked for a cookie, gets it, and completes with mac2.
        a.endpoint.handle(.connect(bAtA), now: net.now)
        net.flush(a)
        net.run(for: .seconds(2))
        #expect(a.endpoint.isEstablished(bAtA) && b.endpoint.isEstablished(aAtB))
        #expect(b.endpoint.statistics.cookieRepliesSent > 0)
    }

    @Test func aStreamOfCookieRepliesCausesOneImmediateRetryNotOnePerReply() throws {
        let (net, a, b, bAtA, _) = SimulatedNetwork.pair(connect: false)
        a.endpoint.handle(.connect(bAtA), now: net.now)
        var latest = try #require(a.endpoint.takeActions().compactMap { if case .send(let x, _) = $0 { x } else { nil } }.first)
        // Whoever sees an initiation's mac1 can seal a valid cookie reply to it (the cookie key
        // derives from B's public key): forge one for each initiation A sends.
        var forger = CookieChecker(responder: b.endpoint.identity.publicKey, now: net.now)
        var random: any SecureRandom = SystemRandom()
        var sent = 0
        for _ in 0..<50 {
            var reply = forger.reply(
                receiverIndex: latest.readUInt32(at: 4), mac1: latest[HandshakeWire.initiationMAC1], to: a.address, now: net.now,
                random: &random)
            #expect(a.endpoint.receive(&reply, from: b.address, now: net.now) == .handled)
            for case .send(let bytes, _) in a.endpoint.takeActions() {
                sent += 1
                latest = bytes
            }
        }
        #expect(sent == 1, "one initiation with mac2 at once, later ones on the retry timer: \(sent)")
    }

    @Test func roamingFollowsTheNewestAuthenticatedPacket() throws {
        var config = SecureConfiguration()
        config.roamInterval = .seconds(1)
        let (net, a, b, bAtA, aAtB) = SimulatedNetwork.pair(configuration: config)
        net.run(for: .seconds(2))
        let old = a.address
        a.address = TransportAddress(ip: .v4(0x0A00_0002), port: 4444)  // NAT rebinding
        try net.sendMedia(a, to: bAtA, payload: payload(1))
        net.run(for: .milliseconds(50))
        #expect(b.events.contains(.peerMoved(aAtB, from: old, to: a.address)))
        #expect(b.endpoint.address(of: aAtB) == a.address)
        try net.sendMedia(b, to: aAtB, payload: payload(2))
        net.run(for: .milliseconds(50))
        #expect(a.media.count == 1, "B's media follows A to its new address")
        // A stale packet from the old address does not pull B back.
        let stale = try #require(net.wire.last { $0.from == a.address && $0.bytes.first == 0x80 })
        _ = stale
        let older = try net.sendMedia(a, to: bAtA, payload: payload(3))
        try net.sendMedia(a, to: bAtA, payload: payload(4))
        net.run(for: .milliseconds(50))
        var late = older
        _ = b.endpoint.receive(&late, from: old, now: net.now)
        #expect(b.endpoint.address(of: aAtB) == a.address)
        // Rate limit: a second move within roamInterval is not followed.
        let third = TransportAddress(ip: .v4(0x0A00_0003), port: 5555)
        a.address = third
        try net.sendMedia(a, to: bAtA, payload: payload(5))
        net.run(for: .milliseconds(50))
        #expect(b.endpoint.address(of: aAtB) != third)
        net.run(for: .seconds(1))
        try net.sendMedia(a, to: bAtA, payload: payload(6))
        net.run(for: .milliseconds(50))
        #expect(b.endpoint.address(of: aAtB) == third)
    }

    /// A peer whose process restarts (same key, a new port, a new SSRC and
    /// numbering, possibly below the old one) is heard at once after its new
    /// handshake: no wait for the roaming interval, and no floor left from the
    /// old stream's keys refusing the new stream's packets (`wrongEpoch`).
    @Test func aPeerRestartedOnAnotherPortIsHeardAtOnce() throws {
        var config = SecureConfiguration()
        config.rekeyAfter = .seconds(2)
        config.acceptUnknownPeers = true
        let (net, a, b, bAtA, aAtB) = SimulatedNetwork.pair(configuration: config)
        // Long enough for rekeys: B holds current and previous keys that opened A's old stream.
        for i in 0..<300 {
            _ = try? net.sendMedia(a, to: bAtA, payload: payload(i))
            net.run(for: .milliseconds(20))
        }
        #expect(established(b) >= 2)
        net.nodes.removeAll { $0 === a }
        // Restarts go round until a new stream numbers below the old one (the old floor's trap).
        for round in 0..<8 {
            let restarted = net.addNode(a.endpoint.identity, port: UInt16(1100 + round), configuration: config)
            let relay = restarted.endpoint.addPeer(b.endpoint.identity.publicKey, address: b.address)
            restarted.endpoint.handle(.connect(relay), now: net.now)
            net.flush(restarted)
            net.run(for: .milliseconds(30))
            #expect(restarted.endpoint.isEstablished(relay), "round \(round)")
            #expect(b.endpoint.address(of: aAtB) == restarted.address, "round \(round): B answers the new port at once")
            try net.sendMedia(restarted, to: relay, payload: payload(1000 + round))
            net.run(for: .milliseconds(30))
            #expect(b.media.last?.2 == payload(1000 + round), "round \(round): \(b.drops.suffix(3))")
            try net.sendMedia(b, to: aAtB, payload: payload(2000 + round))
            net.run(for: .milliseconds(30))
            #expect(restarted.media.last?.2 == payload(2000 + round), "round \(round)")
            net.nodes.removeAll { $0 === restarted }
        }
        #expect(b.endpoint.statistics.dropped[.wrongEpoch, default: 0] == 0)
    }

    /// A hub with many peers (a relay's party members): each peer's reports and
    /// keepalives are deadlines of their own, and each wake walks every peer. With
    /// `timerSlack` the hub wakes at most once a step however many peers it has,
    /// and every timer still runs (each peer gets its reports, no session is
    /// lost); without it, about once per deadline.
    @Test(arguments: [Duration.zero, .milliseconds(50)])
    func aHubsTimersWakeItAtMostOnceASlackStep(_ slack: Duration) throws {
        let net = SimulatedNetwork()
        var hubConfiguration = SecureConfiguration()
        hubConfiguration.acceptUnknownPeers = true
        hubConfiguration.timerSlack = slack
        let hub = net.addNode(port: 1, configuration: hubConfiguration)
        var clientConfiguration = SecureConfiguration()
        clientConfiguration.reportInterval = .zero  // keepalives only, every 10 s
        var clients: [SimulatedNetwork.Node] = []
        for n in 0..<200 {
            let client = net.addNode(port: UInt16(2000 + n), configuration: clientConfiguration)
            let hubAtClient = client.endpoint.addPeer(hub.endpoint.identity.publicKey, address: hub.address)
            client.endpoint.handle(.connect(hubAtClient), now: net.now)
            net.flush(client)
            net.run(for: .milliseconds(25))  // deadlines spread over the report interval
            clients.append(client)
        }
        let before = hub.wakes
        net.run(for: .seconds(40))
        let wakes = hub.wakes - before
        #expect(!hub.events.contains { if case .peerGone = $0 { true } else { false } })
        let fewest =
            clients.map { client in
                client.events.filter { if case .control(_, let r) = $0, r.kind == .report { true } else { false } }.count
            }.min() ?? 0
        #expect(fewest >= 7, "a report every 5 s to every peer: the fewest got \(fewest)")
        if slack > .zero {
            #expect(wakes <= Int(40 / 0.05) + 1, "\(wakes) wakes in 40 s")
        } else {
            #expect(wakes > 1200, "one wake per report due: \(wakes)")
            print("SecureEndpoint hub of 200 peers: \(wakes) wakes in 40 s without slack")
        }
    }

    /// A hub's wake runs the timers of the peers due then, not of every peer: its
    /// timers cost what is due (reports, keepalives), not wakes × peers. One client
    /// talks all along (a frame every 20 ms), the others are idle; every session
    /// stays up and every client gets its reports.
    @Test func aHubsWakeRunsOnlyThePeersDue() throws {
        let net = SimulatedNetwork()
        var hubConfiguration = SecureConfiguration()
        hubConfiguration.acceptUnknownPeers = true
        let hub = net.addNode(port: 1, configuration: hubConfiguration)
        var clients: [(node: SimulatedNetwork.Node, hub: PeerID)] = []
        for n in 0..<100 {
            let client = net.addNode(port: UInt16(2000 + n))
            let hubAtClient = client.endpoint.addPeer(hub.endpoint.identity.publicKey, address: hub.address)
            client.endpoint.handle(.connect(hubAtClient), now: net.now)
            net.flush(client)
            net.run(for: .milliseconds(50))  // deadlines spread over the report interval
            clients.append((client, hubAtClient))
        }
        let (runsBefore, wakesBefore) = (hub.endpoint.timerRuns, hub.wakes)
        for i in 0..<1500 {  // 30 s
            try net.sendMedia(clients[0].node, to: clients[0].hub, payload: [UInt8(truncatingIfNeeded: i)])
            net.run(for: .milliseconds(20))
        }
        let runs = hub.endpoint.timerRuns - runsBefore
        let wakes = hub.wakes - wakesBefore
        #expect(!hub.events.contains { if case .peerGone = $0 { true } else { false } })
        let fewest =
            clients.map { client in
                client.node.events.filter { if case .control(_, let r) = $0, r.kind == .report { true } else { false } }.count
            }.min() ?? 0
        #expect(fewest >= 5, "a report every 5 s to every client: the fewest got \(fewest)")
        // A report every 5 s and a keepalive at most every 10 s per peer: about 9 runs each in 30 s.
        #expect(runs <= 100 * 12, "\(runs) peer timer runs in \(wakes) wakes")
        #expect(wakes * 100 > 5 * runs, "the hub woke \(wakes) times: a walk of every peer per wake would be far more")
    }

    @Test func keepalivesKeepAnIdleSessionAliveAndSilenceIsDetected() throws {
        var config = SecureConfiguration()
        config.reportInterval = .zero  // reports would keep the path warm too; keepalives alone here
        let (net, a, b, bAtA, aAtB) = SimulatedNetwork.pair(configuration: config)
        let before = net.wire.count
        net.run(for: .seconds(60))
        #expect(!a.events.contains(.peerGone(bAtA)) && !b.events.contains(.peerGone(aAtB)))
        let keepalives = net.wire[before...].filter { $0.bytes.first.map { (128...191).contains($0) } ?? false }
        #expect(keepalives.count >= 10 && keepalives.count <= 16, "one each way every 10 s: \(keepalives.count)")
        // B vanishes: A retries a handshake, then declares B gone.
        net.nodes.removeAll { $0 === b }
        net.run(for: .seconds(40))
        #expect(a.events.contains(.peerGone(bAtA)))
        #expect(!a.endpoint.isEstablished(bAtA))
        #expect(throws: SecureSendError.notEstablished) { try net.sendMedia(a, to: bAtA, payload: [1]) }
    }

    @Test func oldEpochPacketsAreRefusedAfterTheirKeysRetire() throws {
        var config = SecureConfiguration()
        config.rekeyAfter = .seconds(5)
        config.previousKeysLinger = .seconds(1)
        let (net, a, b, bAtA, _) = SimulatedNetwork.pair(configuration: config)
        var early: [[UInt8]] = []
        for i in 0..<5 {
            early.append(try net.sendMedia(a, to: bAtA, payload: payload(i)))
        }
        net.inFlight.removeAll()  // held back by an attacker
        for i in 0..<400 {
            _ = try? net.sendMedia(a, to: bAtA, payload: payload(i))
            net.run(for: .milliseconds(20))
        }
        #expect(established(a) >= 2)
        for var p in early {
            let r = b.endpoint.receive(&p, from: a.address, now: net.now)
            #expect(r == .dropped(.wrongEpoch) || r == .dropped(.authenticationFailed))
        }
        #expect(b.endpoint.statistics.dropped[.wrongEpoch, default: 0] == 5)
    }

    @Test func keyLogOpensTheCapturedMedia() throws {
        var config = SecureConfiguration()
        config.keyLog = true
        config.rekeyAfter = .seconds(2)
        let (net, a, b, bAtA, _) = SimulatedNetwork.pair(configuration: config)
        for i in 0..<200 {
            _ = try? net.sendMedia(a, to: bAtA, payload: payload(i))
            net.run(for: .milliseconds(20))
        }
        let lines = a.events.compactMap { if case .keyLog(let l) = $0 { l } else { nil } }
        #expect(lines.count >= 4)
        let keys = try KeyLog.parse(lines.joined(separator: "\n"))
        let decryptor = MediaDecryptor(keys: keys)
        var opened = 0
        var control = 0
        var failed = 0
        for d in net.wire where d.from == a.address && d.bytes.first == 0x80 {
            var copy = d.bytes
            switch decryptor.open(&copy) {
            case .media(_, let range):
                opened += 1
                #expect(b.media.contains { $0.2 == Array(copy[range]) })
            case .control: control += 1
            default: failed += 1
            }
        }
        #expect(opened == 200 && control > 0 && failed == 0, "\(opened) \(control) \(failed)")
        #expect(throws: KeyLog.ParseError.self) { try KeyLog.parse("TUSA_MEDIA_KEY zz 00") }
    }

    /// The first report goes half a second in and is answered at once: both sides
    /// know the round trip within a second (a short call's report has it too),
    /// long before the 5 s report interval.
    @Test func bothSidesKnowTheRoundTripWithinASecond() throws {
        var impair = SimulatedNetwork.Impairment()
        impair.delay = .milliseconds(15)
        let (net, a, b, bAtA, aAtB) = SimulatedNetwork.pair(configuration: SecureConfiguration(), impairment: impair)
        for i in 0..<50 {  // 1 s of 20 ms frames both ways
            try net.sendMedia(a, to: bAtA, payload: payload(i), timestamp: UInt32(i * 160))
            try net.sendMedia(b, to: aAtB, payload: payload(i), timestamp: UInt32(i * 160))
            net.run(for: .milliseconds(20))
        }
        for rtt in [a.endpoint.roundTripTime(of: bAtA), b.endpoint.roundTripTime(of: aAtB)] {
            let ms = try #require(rtt, "no round trip after 1 s").nanoseconds / 1_000_000
            #expect((29...31).contains(ms), "rtt \(ms) ms")
        }
        let reports = a.events.filter { if case .control(_, let r) = $0 { r.kind == .report } else { false } }
        #expect(reports.count <= 2, "answering is once, not a ping-pong: \(reports.count)")
    }

    @Test func receiverReportsCarryLossJitterAndRoundTripTime() throws {
        var config = SecureConfiguration()
        config.reportInterval = .seconds(2)
        var impair = SimulatedNetwork.Impairment()
        impair.delay = .milliseconds(10)
        let (net, a, b, bAtA, aAtB) = SimulatedNetwork.pair(configuration: config, impairment: impair)
        var n = 0
        net.tamper = { d in
            // Every tenth media packet from A is lost.
            guard d.from == a.address, d.bytes.count > 100 else { return d }
            n += 1
            return n % 10 == 0 ? nil : d
        }
        for i in 0..<500 {  // 10 s of 20 ms frames at 8 kHz
            try net.sendMedia(a, to: bAtA, payload: payload(i), timestamp: UInt32(i * 160))
            net.run(for: .milliseconds(20))
        }
        net.run(for: .seconds(3))
        let seen = try #require(b.endpoint.reception(of: aAtB))
        // The 500th packet is lost too, so the stream is known up to the 499th.
        #expect(seen.received == 450 && seen.cumulativeLost == 49, "\(seen)")
        #expect(seen.jitter < 10, "steady delay: no jitter (\(seen.jitter))")
        let report = try #require(a.endpoint.lastReport(from: bAtA))
        #expect(report.kind == .report)
        #expect((20...32).contains(Int(report.fractionLost)), "about 10 % of 256: \(report.fractionLost)")
        #expect((5...15).contains(Int(report.lossHint)), "\(report.lossHint)")
        #expect(report.cumulativeLost >= 40)
        let reports = a.events.filter { if case .control(_, let r) = $0 { r.kind == .report } else { false } }
        #expect(reports.count >= 5, "every 2 s")
        // Both sides measured the round trip: twice the 10 ms one-way delay.
        for rtt in [a.endpoint.roundTripTime(of: bAtA), b.endpoint.roundTripTime(of: aAtB)] {
            let ms = try #require(rtt).nanoseconds / 1_000_000
            #expect((19...21).contains(ms), "rtt \(ms) ms")
        }
    }
}
