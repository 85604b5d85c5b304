import TusaBase

/// A live session between two endpoints under a script the input writes (see
/// ``run(_:)``): media and control reports both ways (reports read from the
/// input, so that what a peer may say past decryption is fuzzed), a network that
/// drops, reorders, duplicates and corrupts, a peer that moves, and time enough
/// for keepalives, reports, rekeys and a peer given up. What must hold:
///
/// - media that opens is what the other side sealed, and opens once (replays and
///   corrupted packets never do);
/// - after a timeout the timer queue holds every peer's next deadline (one missing
///   would be a timer that never fires);
/// - nothing traps.
public enum SecureSessionFuzzChecks {
    /// What a script did: for tests, to see that it reached the paths it meant to.
    public struct Summary: Equatable, Sendable {
        public var violations: [String] = []
        /// Media payloads opened, each way.
        public var opened = 0
        public var reports = 0
        public var establishments = 0
        public var moves = 0
        public var gone = 0
    }

    /// The first byte of an input that is a script (for the SecureFuzz target, whose
    /// other inputs are packets: none starts so).
    public static let marker: UInt8 = 0xEB

    /// Runs an input that starts with ``marker`` as a script and traps when a check
    /// broke, so that a fuzzer reports it.
    public static func exercise(_ bytes: [UInt8]) {
        guard bytes.first == marker else { return }
        let summary = run(Array(bytes.dropFirst()))
        if let first = summary.violations.first { preconditionFailure("secure session script: \(first)") }
    }

    /// Scripts shaped like sessions (each starts with ``marker``): talk both ways with
    /// reports; loss, reordering and replays; a move; minutes for rekeys; silence long
    /// enough for the peer to be given up, then talk again.
    public static func seeds() -> [[UInt8]] {
        // Each side says something; then it is delivered.
        let say: [UInt8] = [0x00, 20, 0x01, 20, 0x00, 40]
        let talk = say + [0x04]
        let body = ControlReport(highestSequence: 9, jitter: 80, lossHint: 3).encoded()
        let report: [UInt8] = [0x02, UInt8(body.count)] + body + [0x22, UInt8(body.count)] + body + [0x04]
        // Reordered and duplicated; lost toward the responder; the last one toward it corrupted.
        let network: [UInt8] = say + [0x03, 0x0C, 0x04] + say + [0x03, 0x01, 0x04] + say + [0x07, 0x55, 0x00, 0x04]
        let moves: [UInt8] = talk + [0x06, 10] + talk + talk
        // Three minutes in steps of five seconds, talking: keepalives, reports, a rekey.
        let rekeys: [UInt8] = talk + (0..<36).flatMap { _ in [0x05 | 3 << 5, 0x04] } + talk
        // Silence past the peer timeout, then talk again.
        let gone: [UInt8] = talk + [0x05 | 4 << 5, 0x05 | 4 << 5, 0x04] + talk + [0x05 | 2 << 5, 0x04] + talk
        return [talk + report, network, moves, rekeys, gone].map { [marker] + $0 }
    }

    static let initiatorKey = (try? PrivateKey(bytes: [UInt8](repeating: 0x51, count: 32))) ?? .generate()
    static let responderKey = (try? PrivateKey(bytes: [UInt8](repeating: 0x52, count: 32))) ?? .generate()
    static let initiatorAddress = TransportAddress(ip: .v4(0x0A00_0001), port: 5000)
    static let responderAddress = TransportAddress(ip: .v4(0x0A00_0002), port: 4000)

    /// A datagram on its way, and whether the script changed it.
    struct Datagram {
        var bytes: [UInt8]
        var from: TransportAddress
        var corrupted = false
    }

    /// One side: its endpoint, where it sends from, its id for the other side, and
    /// what it sealed (each payload is unique: it starts with a counter).
    final class Side {
        let endpoint: SecureEndpoint
        var address: TransportAddress
        var other: PeerID?
        var sealed: Set<[UInt8]> = []
        var opened: Set<[UInt8]> = []
        /// Datagrams on their way to this side.
        var inbound: [Datagram] = []

        init(_ endpoint: SecureEndpoint, at address: TransportAddress) {
            self.endpoint = endpoint
            self.address = address
        }
    }

    struct Run {
        let a: Side
        let b: Side
        var now = Timestamp.zero
        var counter: UInt32 = 0
        var summary = Summary()

        init() {
            var config = SecureConfiguration()
            config.acceptUnknownPeers = true
            a = Side(
                SecureEndpoint(
                    identity: Identity(privateKey: initiatorKey), configuration: config, random: SeededRandom(seed: 1),
                    now: .zero), at: initiatorAddress)
            b = Side(
                SecureEndpoint(
                    identity: Identity(privateKey: responderKey), configuration: config, random: SeededRandom(seed: 2),
                    now: .zero), at: responderAddress)
            let id = a.endpoint.addPeer(responderKey.publicKey, address: responderAddress)
            a.other = id
            a.endpoint.handle(.connect(id), now: now)
            deliver()
        }

        mutating func fail(_ what: String) {
            if summary.violations.count < 8 { summary.violations.append(what) }
        }

        /// Moves what each side asks to send onto the network, and notes its events.
        mutating func collect() {
            for (from, to) in [(a, b), (b, a)] {
                while let action = from.endpoint.pollAction() {
                    switch action {
                    case .send(let bytes, let destination):
                        if destination == to.address {
                            to.inbound.append(Datagram(bytes: bytes, from: from.address))
                        }
                    case .event(let event):
                        switch event {
                        case .established(let id, let key, _):
                            summary.establishments += 1
                            if from === b, key == initiatorKey.publicKey { b.other = id }
                        case .control: summary.reports += 1
                        case .peerMoved: summary.moves += 1
                        case .peerGone: summary.gone += 1
                        default: break
                        }
                    }
                }
            }
        }

        /// Delivers everything on its way, rounds until nothing is left (at most 8).
        mutating func deliver() {
            for _ in 0..<8 {
                collect()
                guard !a.inbound.isEmpty || !b.inbound.isEmpty else { return }
                for side in [a, b] {
                    let datagrams = side.inbound
                    side.inbound = []
                    for d in datagrams { receive(d, at: side) }
                }
            }
            collect()
        }

        mutating func receive(_ d: Datagram, at side: Side) {
            var bytes = d.bytes
            guard case .media(_, _, let range) = side.endpoint.receive(&bytes, from: d.from, now: now) else { return }
            let payload = Array(bytes[range])
            let sender = side === a ? b : a
            guard sender.sealed.contains(payload) else {
                return fail(d.corrupted ? "a corrupted packet opened" : "media opened that the other side never sealed")
            }
            guard side.opened.insert(payload).inserted else { return fail("media opened twice (a replay)") }
            summary.opened += 1
        }

        /// `side` seals a media payload of `length` bytes (unique by its counter) for the other.
        mutating func send(from side: Side, length: Int, marker: Bool) {
            guard let id = side.other else { return }
            counter += 1
            let payload = withUnsafeBytes(of: counter.bigEndian) { Array($0) } + [UInt8](repeating: 0x6D, count: length)
            var out = [UInt8](repeating: 0, count: payload.count + 64)
            let sealed = payload.withUnsafeBytes { p in
                out.withUnsafeMutableBytes { o in
                    try? side.endpoint.sealMedia(
                        to: id, payloadType: 111, marker: marker, timestamp: counter &* 160, payload: p, into: o, now: now)
                }
            }
            collect()
            guard let sealed else { return }
            side.sealed.insert(payload)
            let other = side === a ? b : a
            other.inbound.append(Datagram(bytes: Array(out[..<sealed.length]), from: side.address))
        }

        mutating func wait(_ d: Duration) {
            now = now + d
            for side in [a, b] {
                side.endpoint.handleTimeout(now: now)
                // (nextDeadline itself is never in the past: it is clamped. What must hold
                // is that the queue it reads has every peer's deadline.)
                if !side.endpoint.timerQueueIsComplete { fail("a peer's deadline is missing from the timer queue") }
            }
            collect()
        }
    }

    /// Runs the input as a script of at most 128 steps, each an operation byte read
    /// as `op & 7` the kind and `op >> 5` a variant `k`:
    ///
    /// ```
    /// 0: the initiator sends media, the next byte's length (k bit 0: marker)
    /// 1: the responder sends media, the next byte's length
    /// 2: a report read from the next byte's length of input, sent by the
    ///    initiator (k bit 0: by the responder); input that is no report is skipped
    /// 3: the network, by the next byte's bits: 1 drops what is on its way to the
    ///    responder, 2 to the initiator, 4 reverses both queues, 8 duplicates them
    /// 4: everything on its way is delivered
    /// 5: time goes on: 1 ms, 20 ms, 1 s, 5 s, 16 s, 125 s, 200 s or 1000 s (k)
    /// 6: the initiator moves to another port (the next byte's)
    /// 7: the next byte is XORed into the last datagram on its way to the
    ///    responder, at the position the byte after picks
    /// ```
    public static func run(_ bytes: [UInt8]) -> Summary {
        var run = Run()
        var script = FuzzScript(bytes)
        while let op = script.nextStep() {
            let variant = op >> 5
            switch op & 7 {
            case 0, 1:
                guard let length = script.next() else { break }
                run.send(from: op & 7 == 0 ? run.a : run.b, length: Int(length) % 200, marker: variant & 1 != 0)
            case 2:
                guard let length = script.next() else { break }
                let input = script.take(Int(length))
                guard let report = try? ControlReport.decode(input) else { break }
                let side = variant & 1 == 0 ? run.a : run.b
                if let id = side.other { side.endpoint.handle(.sendControl(report, to: id), now: run.now) }
                run.collect()
            case 3:
                guard let bits = script.next() else { break }
                if bits & 1 != 0 { run.b.inbound = [] }
                if bits & 2 != 0 { run.a.inbound = [] }
                for side in [run.a, run.b] {
                    if bits & 4 != 0 { side.inbound.reverse() }
                    if bits & 8 != 0 { side.inbound += side.inbound }
                }
            case 4:
                run.deliver()
            case 5:
                let waits: [Duration] = [
                    .milliseconds(1), .milliseconds(20), .seconds(1), .seconds(5), .seconds(16), .seconds(125),
                    .seconds(200), .seconds(1000),
                ]
                run.wait(waits[Int(variant)])
            case 6:
                guard let port = script.next() else { break }
                run.a.address = TransportAddress(ip: initiatorAddress.ip, port: 5001 + UInt16(port))
            default:
                guard let value = script.next(), let position = script.next() else { break }
                guard var last = run.b.inbound.popLast() else { break }
                if value != 0, !last.bytes.isEmpty {
                    last.bytes[Int(position) % last.bytes.count] ^= value
                    last.corrupted = true
                }
                run.b.inbound.append(last)
            }
        }
        run.deliver()
        return run.summary
    }
}
