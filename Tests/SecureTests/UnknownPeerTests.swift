import Testing
import TusaBase

@testable import Secure

/// A responder that takes initiations from keys nobody added (a party relay,
/// `acceptUnknownPeers`): what strangers' initiations may leave behind, and what
/// they may not take from a peer in session.
@Suite struct UnknownPeerTests {
    static func open() -> SecureConfiguration {
        var c = SecureConfiguration()
        c.acceptUnknownPeers = true
        return c
    }

    /// `node` connects to `relay` and sends one payload; returns its peer id for the relay.
    static func connect(
        _ node: SimulatedNetwork.Node, to relay: SimulatedNetwork.Node, on net: SimulatedNetwork, sending payload: [UInt8]
    )
        throws -> PeerID
    {
        let id = node.endpoint.addPeer(relay.endpoint.identity.publicKey, address: relay.address)
        node.endpoint.handle(.connect(id), now: net.now)
        net.flush(node)
        net.run(for: .seconds(1))
        _ = try net.sendMedia(node, to: id, payload: payload)
        net.run(for: .milliseconds(100))
        return id
    }

    /// Initiators with fresh keys that never finish their handshakes: each made a
    /// peer at the responder, and each is forgotten once its unconfirmed keys retire.
    @Test func initiationsThatNeverCompleteLeaveNothingBehind() {
        let net = SimulatedNetwork()
        let relay = net.addNode(port: 1000, configuration: Self.open())
        // The initiators' own answers are lost: they never send the packet that confirms.
        net.tamper = { $0.bytes.first == HandshakeWire.response ? nil : $0 }
        let strangers = (0..<20).map { net.addNode(port: UInt16(2000 + $0)) }
        for s in strangers {
            let id = s.endpoint.addPeer(relay.endpoint.identity.publicKey, address: relay.address)
            s.endpoint.handle(.connect(id), now: net.now)
            net.flush(s)
        }
        net.run(for: .seconds(1))
        let keys = strangers.map(\.endpoint.identity.publicKey)
        #expect(keys.allSatisfy { relay.endpoint.peer(for: $0) != nil })
        // The initiators give up after the handshake timeout; the responder's unconfirmed keys
        // go at rejectAfter, and the peers with them.
        for s in strangers { net.nodes.removeAll { $0 === s } }
        net.run(for: SecureConfiguration().rejectAfter + .seconds(2))
        #expect(keys.allSatisfy { relay.endpoint.peer(for: $0) == nil })
        #expect(relay.endpoint.statistics.peersForgotten == 20)
    }

    /// A stranger's session that goes silent is said gone, then forgotten; the same key
    /// comes back by a new handshake and is heard again.
    @Test func aSilentSessionIsForgottenAndItsKeyComesBack() throws {
        let net = SimulatedNetwork()
        let relay = net.addNode(port: 1000, configuration: Self.open())
        let member = net.addNode(port: 2000)
        _ = try Self.connect(member, to: relay, on: net, sending: [1, 2, 3])
        let first = try #require(relay.endpoint.peer(for: member.endpoint.identity.publicKey))
        #expect(relay.media.count == 1)

        net.nodes.removeAll { $0 === member }
        net.run(for: SecureConfiguration().peerTimeout + .seconds(2))
        #expect(relay.events.contains { if case .peerGone(first) = $0 { true } else { false } })
        #expect(relay.endpoint.peer(for: member.endpoint.identity.publicKey) == nil)
        #expect(relay.endpoint.statistics.peersForgotten == 1)

        let back = net.addNode(member.endpoint.identity, port: 2001)
        _ = try Self.connect(back, to: relay, on: net, sending: [4, 5, 6])
        #expect(relay.media.last?.2 == [4, 5, 6])
        #expect(relay.endpoint.peer(for: member.endpoint.identity.publicKey) != first)
    }

    /// Media finds its peer by SSRC, which is in the clear on every packet. A
    /// stranger's initiation that claims a member's SSRC is refused, and the member's
    /// media still opens; before, the member's packets went to the stranger's peer
    /// and were dropped until the member shook hands again.
    @Test func anInitiationCannotTakeTheSSRCOfAPeerInSession() throws {
        let net = SimulatedNetwork()
        let relay = net.addNode(port: 1000, configuration: Self.open())
        // The same random numbers: the stranger's first peer gets the member's SSRC.
        let member = net.addNode(port: 2000, random: SeededRandom(seed: 42))
        let stranger = net.addNode(port: 3000, random: SeededRandom(seed: 42))
        let relayAtMember = try Self.connect(member, to: relay, on: net, sending: [1])
        #expect(relay.media.count == 1)

        let relayAtStranger = stranger.endpoint.addPeer(relay.endpoint.identity.publicKey, address: relay.address)
        #expect(stranger.endpoint.ssrcs(of: relayAtStranger)?.local == member.endpoint.ssrcs(of: relayAtMember)?.local)
        stranger.endpoint.handle(.connect(relayAtStranger), now: net.now)
        net.flush(stranger)
        net.run(for: .milliseconds(100))
        #expect(relay.endpoint.statistics.handshakeDrops[.ssrcInUse] == 1)
        #expect(!stranger.endpoint.isEstablished(relayAtStranger))

        _ = try net.sendMedia(member, to: relayAtMember, payload: [2])
        net.run(for: .milliseconds(100))
        #expect(relay.media.map(\.2) == [[1], [2]], "\(relay.drops)")
    }

    /// A stranger whose handshake never completed is forgotten 180 s on; by then a
    /// member may hold the same SSRC (the stranger was not in session, so that was
    /// allowed). Forgetting the stranger leaves the member's entry alone: its media
    /// still opens (it was dropped as an unknown session until its next handshake).
    @Test func forgettingAStrangerLeavesAMembersSSRCAlone() throws {
        let net = SimulatedNetwork()
        let relay = net.addNode(port: 1000, configuration: Self.open())
        let stranger = net.addNode(port: 3000, random: SeededRandom(seed: 7))
        let member = net.addNode(port: 2000, random: SeededRandom(seed: 7))
        // The stranger never confirms (its answers are lost).
        net.tamper = { $0.to == stranger.address ? nil : $0 }
        let relayAtStranger = stranger.endpoint.addPeer(relay.endpoint.identity.publicKey, address: relay.address)
        stranger.endpoint.handle(.connect(relayAtStranger), now: net.now)
        net.flush(stranger)
        net.run(for: .milliseconds(100))
        net.nodes.removeAll { $0 === stranger }
        let relayAtMember = try Self.connect(member, to: relay, on: net, sending: [1])
        #expect(stranger.endpoint.ssrcs(of: relayAtStranger)?.local == member.endpoint.ssrcs(of: relayAtMember)?.local)
        #expect(relay.media.count == 1)
        // Past the stranger's unconfirmed keys' life, the member talking all along.
        for i in 0..<40 {
            _ = try net.sendMedia(member, to: relayAtMember, payload: [2, UInt8(i)])
            net.run(for: .seconds(5))
        }
        #expect(relay.endpoint.statistics.peersForgotten == 1)
        _ = try net.sendMedia(member, to: relayAtMember, payload: [3])
        net.run(for: .milliseconds(100))
        // Every packet: none dropped as an unknown session when the stranger went.
        #expect(relay.media.count == 1 + 40 + 1, "\(relay.drops.suffix(3))")
        #expect(relay.media.last?.2 == [3])
    }

    /// An initiator refused because its SSRC is another's in session is not told
    /// (nothing answers a refused initiation); once its handshake has failed it draws
    /// another SSRC, and its next attempt gets in.
    @Test func anInitiatorWhoseSSRCIsTakenGetsInUnderAnotherAfterItsHandshakeFails() throws {
        var quick = SecureConfiguration()
        quick.handshakeTimeout = .seconds(3)
        let net = SimulatedNetwork()
        let relay = net.addNode(port: 1000, configuration: Self.open())
        let holder = net.addNode(port: 2000, random: SeededRandom(seed: 9))
        let late = net.addNode(port: 3000, configuration: quick, random: SeededRandom(seed: 9))
        _ = try Self.connect(holder, to: relay, on: net, sending: [1])
        let relayAtLate = late.endpoint.addPeer(relay.endpoint.identity.publicKey, address: relay.address)
        let taken = late.endpoint.ssrcs(of: relayAtLate)?.local
        late.endpoint.handle(.connect(relayAtLate), now: net.now)
        net.flush(late)
        net.run(for: .seconds(4))
        #expect(late.events.contains { if case .handshakeFailed = $0 { true } else { false } })
        #expect(relay.endpoint.statistics.handshakeDrops[.ssrcInUse, default: 0] >= 1)
        #expect(late.endpoint.ssrcs(of: relayAtLate)?.local != taken)
        late.endpoint.handle(.connect(relayAtLate), now: net.now)
        net.flush(late)
        net.run(for: .seconds(1))
        #expect(late.endpoint.isEstablished(relayAtLate))
    }
}
