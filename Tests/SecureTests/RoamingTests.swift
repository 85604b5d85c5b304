import Testing
import TusaBase

@testable import Secure

/// Roaming is one rule for every authenticated packet: the address follows the
/// newest one at most once per `roamInterval`, each move counted and reported;
/// a fresh handshake initiation (a newer timestamp than any before) moves the
/// peer at once (a client restarted on another port is answered at once).
@Suite struct RoamingTests {
    /// The kind of authenticated packet that carries the mover's new address.
    enum Path: CaseIterable, CustomStringConvertible {
        case media, control, initiation, response
        var description: String {
            switch self {
            case .media: "media"
            case .control: "control"
            case .initiation: "handshake initiation"
            case .response: "handshake response"
            }
        }
    }

    /// The mover's NAT maps it to `mapped`: its datagrams arrive from there, and
    /// datagrams to any address it was mapped to reach it.
    final class NAT {
        var mapped: TransportAddress?
        var former: Set<TransportAddress> = []
        func rebind(_ to: TransportAddress) {
            mapped = to
            former.insert(to)
        }
    }

    @Test(arguments: Path.allCases)
    func everyPathCountsRateLimitsAndReportsTheSameWay(_ path: Path) throws {
        var config = SecureConfiguration()
        config.reportInterval = .zero  // nothing but the packets this test sends
        config.keepaliveInterval = .seconds(3600)
        let (net, a, b, bAtA, aAtB) = SimulatedNetwork.pair(configuration: config)
        #expect(a.endpoint.isEstablished(bAtA) && b.endpoint.isEstablished(aAtB))
        // The initiator's handshake response comes from the responder: B moves then, else A.
        let (mover, observer, moverPeer, observed) = path == .response ? (b, a, aAtB, bAtA) : (a, b, bAtA, aAtB)
        let nat = NAT()
        net.tamper = { d in
            var d = d
            if d.from == mover.address, let mapped = nat.mapped { d.from = mapped }
            if nat.former.contains(d.to) { d.to = mover.address }
            return d
        }
        func trigger() throws {
            switch path {
            case .media:
                try net.sendMedia(mover, to: moverPeer, payload: [1, 2, 3])
            case .control:
                mover.endpoint.handle(.sendControl(ControlReport(kind: .report, timestamp: 1), to: moverPeer), now: net.now)
                net.flush(mover)
            case .initiation:
                mover.endpoint.handle(.connect(moverPeer), now: net.now)
                net.flush(mover)
            case .response:
                observer.endpoint.handle(.connect(observed), now: net.now)
                net.flush(observer)
            }
            net.run(for: .milliseconds(50))
        }
        func moves() -> [SecureEvent] { observer.events.filter { if case .peerMoved = $0 { true } else { false } } }
        let original = try #require(observer.endpoint.address(of: observed))
        let first = TransportAddress(ip: .v4(0x0A00_0001), port: 4001)
        let second = TransportAddress(ip: .v4(0x0A00_0002), port: 4002)

        nat.rebind(first)
        try trigger()
        #expect(observer.endpoint.address(of: observed) == first, "\(path): followed")
        #expect(observer.endpoint.statistics.roams == 1, "\(path): counted")
        #expect(moves() == [.peerMoved(observed, from: original, to: first)], "\(path): reported")

        // Within roamInterval (500 ms) of that move: not followed, not counted, not reported;
        // but a fresh initiation is followed at once.
        nat.rebind(second)
        try trigger()
        let immediate = path == .initiation
        #expect(observer.endpoint.address(of: observed) == (immediate ? second : first), "\(path): rate-limited or not")
        #expect(observer.endpoint.statistics.roams == (immediate ? 2 : 1), "\(path)")
        #expect(moves().count == (immediate ? 2 : 1), "\(path)")

        // Once the interval has passed, the next such packet moves the peer (the initiation's already moved it).
        net.run(for: .milliseconds(600))
        try trigger()
        #expect(observer.endpoint.address(of: observed) == second, "\(path): followed after the interval")
        #expect(observer.endpoint.statistics.roams == 2, "\(path)")
        #expect(moves().last == .peerMoved(observed, from: first, to: second), "\(path)")
        #expect(moves().count == 2, "\(path)")
    }
}
