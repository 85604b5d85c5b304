import Secure
import TusaBase

/// What the CallFuzz target (and the pinned crash inputs' test) runs on each
/// input: a call message as a peer (or anyone who reaches us through the
/// rendezvous) sends it, and a call's controller, caller and callee, driven by a
/// script the input writes (see ``script(_:)``): the peer's messages, made from
/// the input or read from it as JSON, a stranger's (read), the driver's events,
/// and time. Nothing may trap; a message that reads encodes to one that reads the
/// same; and the controller keeps its promises to its driver: at most a few
/// actions per input, none after the end, a call that ended has no deadline, one
/// that runs has its next deadline after the timeout just handled (a driver would
/// spin otherwise), every message it sends reads back at the peer, what it
/// holds for later stays bounded, and it probes where the peer names at most a
/// few times a second.
public enum CallFuzzChecks {
    public static func exercise(_ bytes: [UInt8]) {
        message(bytes)
        for role in [CallRole.caller, .callee] { controller(script(bytes), role: role) }
    }

    /// Inputs shaped like a call's signalling, a fuzzer's first corpus: a message of
    /// every kind as JSON, and scripts: silence until restarts, the peer's restarts
    /// flooding while ours gathers, the rendezvous dropping and failing to come back,
    /// a hang-up each way.
    public static func seeds() -> [[UInt8]] {
        let path = CallMessage.Path(
            ufrag: "ab12", password: "0123456789abcdefghijkl",
            candidates: ["candidate:1 1 udp 2130706431 10.0.0.1 4000 typ host"])
        let codec = CallMessage.Codec(name: "opus", sampleRate: 8000, frameMilliseconds: 20, bitrate: 24_000)
        let messages = [
            CallMessage(kind: .offer, call: call, path: path, codec: codec),
            CallMessage(kind: .answer, call: call, path: path, codec: codec),
            CallMessage(kind: .reject, call: call, reason: "busy"), CallMessage(kind: .hangup, call: call),
            CallMessage(kind: .restart, call: call, path: path), CallMessage(kind: .restartAnswer, call: call, path: path),
            CallMessage(kind: .reachable, call: call, address: "[2001:db8::1]:4000"),
        ].map { $0.encoded() }
        let restart = messages[4]
        return messages + [
            [0x0F, 250, 0x0F, 250, 0x1F, 0x1F, 0x1F],
            [0x04, 0x1F] + (0..<200).flatMap { i -> [UInt8] in [0x41, UInt8(i & 0x7F)] } + [0x0B, 1, 0x0B, 2],
            [0x07, 0x1F, 0x09, 0x1F, 0x51, 3, 0x0D, 0x08, 0x1F, 0x0C, 0x1F],
            [0x02, 0x61, 0, 0x1F, 0x31, 0x80, 0x0E],
            [0x04, 0x1F, 0x00, UInt8(clamping: restart.count)] + restart + [0x1F, 0x0B, 9],
            (0..<255).map { UInt8($0) },
        ]
    }

    /// A message that reads encodes to one that reads the same.
    static func message(_ bytes: [UInt8]) {
        guard let m = try? CallMessage(decoding: bytes) else { return }
        guard let again = try? CallMessage(decoding: m.encoded()), again == m else {
            preconditionFailure("a call message does not read back after encoding: \(m)")
        }
    }

    static let call = "fuzz-call"
    static let peer = (try? PublicKey(bytes: [UInt8](repeating: 0xA1, count: 32)))
    static let stranger = (try? PublicKey(bytes: [UInt8](repeating: 0xC3, count: 32)))

    /// One step of a script.
    enum Step: Equatable {
        /// A message from the peer, or from a stranger.
        case signal(CallMessage, fromPeer: Bool)
        case input(CallController.Input)
        /// Time moves on this far and the controller's timer runs (nil: to its next deadline).
        case wait(Duration?)
    }

    /// The input as at most 256 steps, each an operation byte, then what it asks for.
    ///
    /// ```
    /// op % 16   0: a message, JSON of the next byte's length (bit 4: from a stranger)
    ///           1: a message made: kind (op >> 4) % 7 (offer, answer, reject, hang-up,
    ///              restart, restart answer, reachable), another call's id when the
    ///              next byte's bit 7 is set, a path or an address from that byte
    ///           2: media arrived now          3: ICE selected      4: consent lost
    ///           5: the peer is gone           6: local addresses (next byte)
    ///           7: the rendezvous lost        8: rejoined          9: rejoin failed
    ///           10: our reflexive address (bit 4: no answer; else from the next byte)
    ///           11: ICE restarted (a path from the next byte)      12: restart failed
    ///           13: a send failed (a message made as in 1, of this call: the
    ///               driver tells only of the controller's own messages)
    ///           14: we hang up (bit 4: our audio failed instead)
    ///           15: time: to the next deadline (bit 4), else on by the next byte × 10 ms
    /// ```
    static func script(_ bytes: [UInt8]) -> [Step] {
        var at = 0
        func next() -> UInt8 {
            guard at < bytes.count else { return 0 }
            defer { at += 1 }
            return bytes[at]
        }
        func path(_ b: UInt8) -> CallMessage.Path {
            CallMessage.Path(
                ufrag: "u\(b)", password: "password-of-\(b)-24chars",
                candidates: ["candidate:1 1 udp 2130706431 10.0.\(b).1 \(4000 + Int(b)) typ host"])
        }
        func made(_ op: UInt8, ours: Bool = false) -> CallMessage {
            let b = next()
            let kinds: [CallMessage.Kind] = [.offer, .answer, .reject, .hangup, .restart, .restartAnswer, .reachable]
            let kind = kinds[Int(op >> 4) % kinds.count]
            let id = b & 0x80 != 0 && !ours ? "another-call" : call
            let address = b & 0x40 != 0 ? "[2001:db8::\(b)]:\(5000 + Int(b))" : "192.0.2.\(b):\(5000 + Int(b))"
            return CallMessage(
                kind: kind, call: id, path: kind == .reachable || kind == .hangup ? nil : path(b),
                codec: kind == .offer || kind == .answer
                    ? CallMessage.Codec(name: "opus", sampleRate: 8000, frameMilliseconds: 20, bitrate: 24_000) : nil,
                address: kind == .reachable ? address : nil)
        }
        var steps: [Step] = []
        while steps.count < 256, at < bytes.count {
            let op = next()
            let flag = op & 0x10 != 0
            switch op % 16 {
            case 0:
                let n = Int(next())
                let json = Array(bytes[min(at, bytes.count)..<min(at + n, bytes.count)])
                at += n
                if let m = try? CallMessage(decoding: json) { steps.append(.signal(m, fromPeer: !flag)) }
            case 1: steps.append(.signal(made(op), fromPeer: true))
            case 2: steps.append(.input(.mediaArrived(at: .zero)))  // (stamped with the time it is fed)
            case 3: steps.append(.input(.iceSelected))
            case 4: steps.append(.input(.iceConsentLost))
            case 5: steps.append(.input(.peerGone))
            case 6: steps.append(.input(.localAddresses([.v4(0x0A00_0000 | UInt32(next()))])))
            case 7: steps.append(.input(.rendezvousLost))
            case 8: steps.append(.input(.rendezvousRejoined))
            case 9: steps.append(.input(.rejoinFailed))
            case 10:
                guard !flag else {
                    steps.append(.input(.reflexiveAddress(nil)))
                    continue
                }
                let b = next()
                steps.append(
                    .input(.reflexiveAddress(TransportAddress(ip: .v4(0xC633_6400 | UInt32(b)), port: 6000 + UInt16(b)))))
            case 11: steps.append(.input(.iceRestarted(path(next()))))
            case 12: steps.append(.input(.iceRestartFailed))
            case 13: steps.append(.input(.sendFailed(made(op, ours: true))))
            case 14: steps.append(.input(flag ? .audioFailed : .hangUp))
            default: steps.append(.wait(flag ? nil : .milliseconds(10 * Int(next()))))
            }
        }
        return steps
    }

    /// The most actions one input may bring: a restart answered (send, check, a
    /// deferred restart taken), a rejoin, an address check, a probe, a report, a hang-up and the end.
    static let actionsPerStep = 12

    static func controller(_ steps: [Step], role: CallRole) {
        guard let peer, let stranger else { preconditionFailure("the fuzz checks' keys did not form") }
        var now = Timestamp.seconds(100)
        var configuration = CallController.Configuration()
        configuration.maximumDuration = .seconds(600)
        var c = CallController(
            role: role, peer: peer, call: call, configuration: configuration, localAddresses: [.v4(0x0A00_0001)], now: now)
        var ended = false
        var probes: [Timestamp] = []
        for step in steps {
            switch step {
            case .signal(let m, let fromPeer): c.handle(.signal(m, from: fromPeer ? peer : stranger), now: now)
            case .input(.mediaArrived): c.handle(.mediaArrived(at: now), now: now)
            case .input(let input): c.handle(input, now: now)
            case .wait(let d):
                if let d { now = now + d } else if let deadline = c.nextDeadline { now = max(now, deadline) }
                c.handleTimeout(now: now)
                if let deadline = c.nextDeadline {
                    precondition(deadline > now, "after its timeout at \(now) the controller wants waking at \(deadline)")
                }
            }
            var count = 0
            while let action = c.pollAction() {
                count += 1
                precondition(!ended, "an action after the end: \(action)")
                switch action {
                case .end: ended = true
                case .probe:
                    probes.append(now)
                    let recent = probes.filter { now - $0 < .seconds(1) }.count
                    precondition(recent <= CallController.peerProbesPerSecond, "\(recent) probes in a second")
                case .send(let m):
                    precondition(m.call == call, "a message for another call: \(m)")
                    precondition((try? CallMessage(decoding: m.encoded())) == m, "a message the peer cannot read: \(m)")
                default: break
                }
            }
            precondition(count <= actionsPerStep, "\(count) actions for one input (\(step))")
            precondition((c.ended != nil) == ended, "ended \(String(describing: c.ended)) without its action, or the other way")
            precondition(!ended || c.nextDeadline == nil, "a call that ended still wants waking")
            precondition(c.heldForLater <= 2, "\(c.heldForLater) of the peer's messages held for later")
        }
    }
}
