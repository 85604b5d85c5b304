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
}
