import Testing
import TusaBase

@testable import Secure

/// The explicit handshake state and the three key slots through a handshake,
/// a confirmation, rekeys and the previous keys' linger.
@Suite struct KeySlotsTests {
    @Test func aHandshakeMovesThroughItsStatesAndSlots() throws {
        var config = SecureConfiguration()
        config.previousKeysLinger = .seconds(2)
        let (net, a, b, bAtA, aAtB) = SimulatedNetwork.pair(configuration: config, connect: false)
        let atA = try #require(a.endpoint.state(of: bAtA))
        let atB = try #require(b.endpoint.state(of: aAtB))
        #expect(atA.handshake.initiation == nil && atA.keys.isEmpty)

        a.endpoint.handle(.connect(bAtA), now: net.now)
        net.flush(a)
        #expect(atA.handshake.initiation != nil, "initiationCreated")
        // The initiation arrives at B: it answers, its keys wait in next.
        net.run(for: .milliseconds(10))
        guard case .responseCreated = atB.handshake else {
            Issue.record("B: \(atB.handshake)")
            return
        }
        #expect(atB.keys.next != nil && atB.keys.current == nil && atB.keys.next?.confirmed == false)
        // The response arrives at A: its keys seal at once.
        net.run(for: .milliseconds(10))
        guard case .zeroed = atA.handshake else {
            Issue.record("A: \(atA.handshake)")
            return
        }
        #expect(atA.keys.current?.confirmed == true && atA.keys.next == nil && atA.keys.previous == nil)
        // A's confirmation arrives at B: next becomes current.
        net.run(for: .milliseconds(10))
        guard case .zeroed = atB.handshake else {
            Issue.record("B: \(atB.handshake)")
            return
        }
        #expect(atB.keys.current?.confirmed == true && atB.keys.next == nil)
        let first = try #require(atA.keys.current)

        // A rekey: the old keys move to previous and linger, then retire.
        a.endpoint.handle(.connect(bAtA), now: net.now)
        net.flush(a)
        net.run(for: .milliseconds(50))
        #expect(atA.keys.current !== first && atA.keys.previous === first)
        #expect(first.retireAt == net.now + .milliseconds(1970), "from the response, 20 ms after the connect")
        #expect(b.endpoint.state(of: aAtB)?.keys.previous != nil)
        net.run(for: .seconds(3))
        #expect(atA.keys.previous == nil && atB.keys.previous == nil, "retired after the linger")
        #expect(a.endpoint.isEstablished(bAtA) && b.endpoint.isEstablished(aAtB))

        // Two rekeys within the linger: the oldest keys retire at once (three slots).
        let second = try #require(atA.keys.current)
        a.endpoint.handle(.connect(bAtA), now: net.now)
        net.flush(a)
        net.run(for: .milliseconds(50))
        a.endpoint.handle(.connect(bAtA), now: net.now)
        net.flush(a)
        net.run(for: .milliseconds(50))
        #expect(atA.keys.previous !== second && atA.keys.all.count == 2)
    }

    @Test func aHandshakeThatIsNeverAnsweredGoesBackToZeroed() {
        var config = SecureConfiguration()
        config.handshakeTimeout = .seconds(3)
        let (net, a, _, bAtA, _) = SimulatedNetwork.pair(configuration: config, connect: false)
        net.tamper = { _ in nil }
        a.endpoint.handle(.connect(bAtA), now: net.now)
        net.flush(a)
        net.run(for: .seconds(5))
        #expect(a.endpoint.state(of: bAtA)?.handshake.initiation == nil)
        #expect(a.events.contains(.handshakeFailed(bAtA)))
    }
}
