import Foundation
import Secure
import TusaBase

/// What the PartyFuzz target (and the pinned crash inputs' test) runs on each
/// input: every parser that sees a party packet or message from the network, and
/// the relay's and a member's room cores behind them, in a room of two already
/// talking (fixed keys, seeded randomness, so that an input always does the same).
/// Nothing may trap; what decodes must encode to the bytes it came from or to
/// what decodes the same; a real frame or control packet with the input XORed in
/// must not authenticate once changed; the relay never forwards a frame under a
/// sender id that is not the sending session's.
public enum PartyFuzzChecks {
    public static func exercise(_ bytes: [UInt8]) {
        sframe(bytes)
        frameHeader(bytes)
        control(bytes)
        invitation(bytes)
        audioFormat(bytes)
        channel(bytes)
        guard let room = Room.prepared else { preconditionFailure("the fuzz checks' room of two did not form") }
        opener(bytes, room)
        relay(bytes, room)
        member(bytes, room)
    }

    /// Inputs shaped like what reaches a relay and a member, a fuzzer's first corpus:
    /// the room's real frame and last control packet, messages' JSON and the channel
    /// packets that carry them (one message in parts), an invitation, an audio format.
    public static func seeds() -> [[UInt8]] {
        guard let room = Room.prepared else { return [] }
        var channel = ControlChannel(id: 5)
        let id = "abcdefghijkl"
        let messages: [PartyControl] = [
            .create(name: "Factorio", maxMembers: 8, invite: []), .join(room: id), .leave, .ping, .mute(true),
            .kick(member: MemberID(2)), .describe(room: id), .keyAck(member: MemberID(1), kid: 0x1_0000),
            .refused(code: .full, detail: "full"), .memberLeft(member: MemberID(2), reason: .kicked), .moving,
        ]
        var seeds = [room.frame, room.controlToBob] + messages.map { $0.encodedJSON() }
        seeds += messages.flatMap { channel.send($0, now: Room.now) }
        seeds += channel.send(json: [UInt8](repeating: 0x20, count: 2_500), now: Room.now)
        seeds.append(PartyInvitation(room: id, name: "Factorio", relay: "127.0.0.1:3481", relayKey: "k").encoded())
        var format: [UInt8] = []
        PartyAudioFormat(codec: "opus", sampleRate: 8000, frameMilliseconds: 20)?.encode(into: &format)
        seeds.append(format)
        return seeds
    }

    // MARK: - Parsers

    /// An SFrame header reads back to the bytes it came from, in as many.
    private static func sframe(_ bytes: [UInt8]) {
        guard let (header, length) = try? SFrameHeader.decode(bytes) else { return }
        var out: [UInt8] = []
        header.encode(into: &out)
        precondition(length == header.encodedLength && out[...] == bytes.prefix(length), "an SFrame header does not encode back")
    }

    /// A voice frame's header reads back to its bytes, and the relay's peek agrees with it.
    private static func frameHeader(_ bytes: [UInt8]) {
        let peeked = PartyFrameHeader.peek(bytes)
        guard let header = try? PartyFrameHeader.decode(bytes) else { return }
        var out: [UInt8] = []
        header.encode(into: &out)
        precondition(out[...] == bytes.prefix(header.length), "a party frame header does not encode back")
        // (A header that decodes has its SFrame byte past the fixed part: peek reads it too.)
        precondition(peeked?.sender == header.sender && peeked?.level == header.level, "peek disagrees with decode")
        precondition(PartyFrameHeader.peekTimestamp(bytes) == header.timestamp, "peekTimestamp disagrees with decode")
    }

    /// A control message's JSON decodes to what its encoding decodes to.
    private static func control(_ bytes: [UInt8]) {
        guard let message = try? PartyControl(json: bytes) else { return }
        guard let again = try? PartyControl(json: message.encodedJSON()), again == message else {
            preconditionFailure("a party control message does not decode to itself after encoding: \(message)")
        }
    }

    /// An invitation (a call message's payload) decodes to what its encoding decodes to.
    private static func invitation(_ bytes: [UInt8]) {
        guard let invitation = PartyInvitation(decoding: bytes) else { return }
        precondition(PartyInvitation(decoding: invitation.encoded()) == invitation, "an invitation does not round-trip")
    }

    /// A member's audio format (what ends its format message) reads back to its bytes.
    private static func audioFormat(_ bytes: [UInt8]) {
        guard let format = try? PartyAudioFormat.decode(bytes[...]) else { return }
        var out: [UInt8] = []
        format.encode(into: &out)
        precondition(out == bytes, "an audio format does not encode back: \(format)")
    }

    /// The input as is and under each control type, into a channel that heard a ping
    /// from channel 3: every message handed on reads, and only what a restarted peer
    /// sends first (a whole message, or a first part, under another channel id)
    /// restarts the channel. Then cut into numbered parts of one message.
    private static func channel(_ bytes: [UInt8]) {
        var ping: [UInt8] = [PartyPacketType.control.rawValue]
        ping.appendUInt32(3)
        ping.appendUInt32(1)
        ping += PartyControl.ping.encodedJSON()
        for type: UInt8? in [nil, 0x02, 0x03, 0x04, 0x05] {
            var channel = ControlChannel(id: 7)
            guard (try? channel.receive(ping, newID: 8))?.messages == [.ping] else { preconditionFailure("a ping did not read") }
            var packet = bytes
            if let type, !packet.isEmpty { packet[0] = type }
            guard let received = try? channel.receive(packet, newID: 8) else { continue }
            if received.restarted {
                let first =
                    packet[0] == PartyPacketType.control.rawValue
                    || (packet[0] == PartyPacketType.controlPart.rawValue && packet.readUInt32(at: 5) == 1)
                precondition(packet.readUInt32(at: 1) != 3 && first, "a packet restarted a channel that was not a peer's first")
            }
            for message in received.messages { precondition((try? PartyControl(json: message.encodedJSON())) == message) }
        }
        // The input as the JSON of one message sent in parts of 7 bytes: it comes out
        // whole, once, when it reads, or as one malformed message, never as anything else.
        guard !bytes.isEmpty, bytes.count <= 512 else { return }
        var receiver = ControlChannel(id: 9)
        var outcomes: (messages: [PartyControl], malformed: Int) = ([], 0)
        let parts = stride(from: 0, to: bytes.count, by: 7).map { bytes[$0..<min($0 + 7, bytes.count)] }
        for (i, part) in parts.enumerated() {
            var packet: [UInt8] = [i == parts.count - 1 ? (parts.count == 1 ? 0x02 : 0x05) : 0x04]
            packet.appendUInt32(3)
            packet.appendUInt32(UInt32(i + 1))
            packet += part
            guard let got = try? receiver.receive(packet, newID: 10) else { continue }
            outcomes.messages += got.messages
            outcomes.malformed += got.malformed.count
        }
        let whole = try? PartyControl(json: bytes)
        if parts.count > 1 {
            precondition(outcomes.messages == (whole.map { [$0] } ?? []), "parts put together read otherwise than the whole")
            precondition(outcomes.malformed == (whole == nil ? 1 : 0), "parts that do not read were not told once")
        }
    }

    // MARK: - Cores

    /// A relay with two members in one room, Alice (session 1) and Bob (session 2),
    /// Bob holding Alice's sender key, and a frame Alice sealed that Bob opens; built
    /// once, copied per input.
    struct Room {
        let server: PartyServer
        let bob: PartyMember
        let frame: [UInt8]
        /// Alice's sender key, as her key log would give it to `tusa interop decrypt`.
        let aliceKey: (kid: UInt64, base: SecretKey)
        /// The last control packet the relay sent Bob, for the XOR check.
        let controlToBob: [UInt8]

        static let aliceSession = PartySession(1)
        static let bobSession = PartySession(2)
        static let now = Timestamp.seconds(100)

        nonisolated(unsafe) static let prepared: Room? = make()

        private static func key(_ byte: UInt8) -> PrivateKey {
            (try? PrivateKey(bytes: [UInt8](repeating: byte, count: 32))) ?? .generate()
        }

        private static func make() -> Room? {
            let tickets = RoomTicketAuthority(
                key: (try? SecretKey(bytes: [UInt8](repeating: 0x66, count: 32))) ?? .random(), incarnation: 1)
            var server = PartyServer(tickets: tickets, random: SeededRandom(seed: 1))
            var members = [
                aliceSession: PartyMember(identity: key(0x61), random: SeededRandom(seed: 2)),
                bobSession: PartyMember(identity: key(0x62), random: SeededRandom(seed: 3)),
            ]
            var lastControl: [UInt8] = []
            func pump() {
                var busy = true
                while busy {
                    busy = false
                    for s in [aliceSession, bobSession] {
                        while let action = members[s]?.pollAction() {
                            busy = true
                            if case .send(let bytes) = action { server.handle(.received(s, bytes), now: now) }
                        }
                    }
                    while let action = server.pollAction() {
                        busy = true
                        guard case .send(let target, let bytes) = action else { continue }
                        if target == bobSession, bytes.first == PartyPacketType.control.rawValue { lastControl = bytes }
                        members[target]?.handle(.received(bytes), now: now)
                    }
                }
            }
            for s in [aliceSession, bobSession] {
                guard let identity = members[s]?.identity else { return nil }
                server.handle(.opened(s, key: identity.publicKey), now: now)
            }
            members[aliceSession]?.handle(.create(name: "Factorio", maxMembers: nil, invite: []), now: now)
            pump()
            guard let room = members[aliceSession]?.room else { return nil }
            members[bobSession]?.handle(.join(room: room), now: now)
            pump()
            guard var alice = members[aliceSession], let bob = members[bobSession], let aliceID = alice.me,
                bob.me != nil, bob.keyring.hasKey(from: aliceID), let key = alice.keyring.current,
                let base = try? SecretKey(bytes: key.baseBytes),
                let frame = alice.seal(
                    [UInt8](repeating: 0x42, count: 40), timestamp: 160, level: .init(level: 30, voiced: true), now: now)
            else { return nil }
            var keyring = bob.keyring
            guard let header = try? PartyFrameHeader.decode(frame), (try? keyring.open(frame, header: header)) != nil,
                case .opened = PartyFrameOpener(keys: [(key.id.kid, base)]).open(frame)
            else { return nil }
            return Room(server: server, bob: bob, frame: frame, aliceKey: (key.id.kid, base), controlToBob: lastControl)
        }
    }

    /// The input XORed into Alice's real frame: a frame that changed never opens,
    /// at Bob's keyring or at an opener given Alice's logged key.
    private static func opener(_ bytes: [UInt8], _ room: Room) {
        var changed = room.frame
        guard mutate(&changed, with: bytes) else { return }
        var keyring = room.bob.keyring
        guard let header = try? PartyFrameHeader.decode(changed) else { return }
        if (try? keyring.open(changed, header: header)) != nil { preconditionFailure("a changed party frame opened") }
        if case .opened = PartyFrameOpener(keys: [room.aliceKey]).open(changed) {
            preconditionFailure("a changed party frame opened with the logged key")
        }
    }

    /// The input from Alice's session, as is, under each packet type, and XORed into
    /// her frame, then from a session that never opened: the relay forwards no frame
    /// whose sender id is not the one Alice's session holds (an input may make her
    /// leave and join again, under a new id), and goes on with its timers.
    private static func relay(_ bytes: [UInt8], _ room: Room) {
        var server = room.server
        var inputs = asEachType(bytes)
        var changed = room.frame
        if mutate(&changed, with: bytes) { inputs.append(changed) }
        for input in inputs {
            server.handle(.received(Room.aliceSession, input), now: Room.now)
            let actions = server.drainActions()
            // (A voice frame changes no membership: her id now is her id as it was forwarded.)
            let alice = server.rooms.values.lazy.flatMap(\.members.values).first { $0.session == Room.aliceSession }?.id
            for action in actions {
                guard case .send(_, let sent) = action, sent.first == PartyPacketType.media.rawValue else { continue }
                precondition(sent == input, "the relay changed a frame it forwarded")
                precondition(
                    alice != nil && PartyFrameHeader.peek(sent)?.sender == alice, "the relay forwarded a spoofed sender id")
            }
        }
        server.handle(.received(PartySession(99), bytes), now: Room.now)
        for action in server.drainActions() {
            if case .send(_, let sent) = action, sent.first == PartyPacketType.media.rawValue {
                preconditionFailure("the relay forwarded a frame from a session in no room")
            }
        }
        server.handleTimeout(now: Room.now + .seconds(30))
        _ = server.drainActions()
    }

    /// The input reaching Bob from the relay, as is, under each packet type, and XORed
    /// into Alice's frame and a control packet the relay sent him: a changed frame is
    /// never heard.
    private static func member(_ bytes: [UInt8], _ room: Room) {
        var bob = room.bob
        var inputs = asEachType(bytes)
        var control = room.controlToBob
        if mutate(&control, with: bytes) { inputs.append(control) }
        for input in inputs {
            bob.handle(.received(input), now: Room.now)
            _ = bob.drainActions()
        }
        var changed = room.frame
        guard mutate(&changed, with: bytes) else { return }
        bob.handle(.received(changed), now: Room.now)
        for action in bob.drainActions() {
            if case .event(.audio) = action { preconditionFailure("a changed party frame was heard") }
        }
        bob.handleTimeout(now: Room.now + .seconds(30))
        _ = bob.drainActions()
    }

    /// The input as is, then with each party packet type as its first byte.
    private static func asEachType(_ bytes: [UInt8]) -> [[UInt8]] {
        guard !bytes.isEmpty else { return [bytes] }
        return [bytes]
            + [PartyPacketType.media, .control, .ack, .controlPart, .controlLastPart].map { type in
                var typed = bytes
                typed[0] = type.rawValue
                return typed
            }
    }

    /// XORs the input into `packet`, cyclically; whether anything changed.
    private static func mutate(_ packet: inout [UInt8], with bytes: [UInt8]) -> Bool {
        guard !packet.isEmpty, !bytes.isEmpty else { return false }
        var changed = false
        for i in packet.indices {
            let b = bytes[i % bytes.count]
            changed = changed || b != 0
            packet[i] ^= b
        }
        return changed
    }
}
