import ArgumentParser
import Call
import Foundation
import Party
import Rendezvous
import Secure
import Synchronization
import Transport
import TusaBase
import Voice

/// `tusa party`: group voice rooms on a relay, end-to-end encrypted.
struct PartyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "party",
        abstract: "Create or join a party: a group voice room on a relay, sealed end to end.",
        subcommands: [PartyCreate.self, PartyJoin.self, PartyWatch.self, PartyList.self]
    )
}

/// Where the parties are: a relay's rendezvous (which tells where its party
/// service is, and carries invitations), or the party service itself.
struct PartyPlace: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "The relay's rendezvous, HOST:PORT (tusa relay --rendezvous-port with --party-port), or a directory's: it says where the parties are and carries invitations. \(RendezvousServers.listHelp)",
            valueName: "host:port"))
    var rendezvous: String?

    @Option(
        help: ArgumentHelp(
            "The relay's party service, HOST:PORT (tusa relay --party-port prints it), without a rendezvous.",
            valueName: "host:port"))
    var relay: String?

    @Option(
        name: .customLong("relay-key"),
        help: ArgumentHelp("The relay's public key (base64; tusa relay prints it beside the party port).", valueName: "key"))
    var relayKey: String?

    func validate() throws {
        if rendezvous == nil && (relay == nil || relayKey == nil) {
            throw ValidationError("give --rendezvous HOST:PORT, or --relay HOST:PORT and --relay-key KEY")
        }
        if (relay == nil) != (relayKey == nil) { throw ValidationError("--relay and --relay-key go together") }
    }

    func rendezvousServers() throws -> [TransportAddress]? {
        guard let rendezvous else { return nil }
        return try RendezvousServers.parse(rendezvous)
    }

    /// The party service and its key as given on the command line, if they were.
    func givenRelay() throws -> (TransportAddress, PublicKey)? {
        guard let relay, let relayKey else { return nil }
        return try Self.parse(relay: relay, key: relayKey)
    }

    static func parse(relay: String, key: String) throws -> (TransportAddress, PublicKey) {
        let a = try HostAndPort.resolve(relay, option: "relay", defaultPort: 3481)
        guard let k = PublicKey(base64: key) else {
            throw ValidationError("relay key '\(key)' is not a 32-byte base64 public key")
        }
        return (a, k)
    }
}

/// `--transport`, as ArgumentParser reads it.
struct PartyTransportArgument: ExpressibleByArgument {
    let value: PartyTransport
    init(_ value: PartyTransport) { self.value = value }
    init?(argument: String) {
        guard let v = PartyTransport(rawValue: argument) else { return nil }
        value = v
    }
    static let auto = PartyTransportArgument(.auto)
    static var allValueStrings: [String] { PartyTransport.allCases.map(\.rawValue) }
    var defaultValueDescription: String { value.rawValue }
}

/// What `tusa party create` and `tusa party join` share.
struct PartyOptions: ParsableArguments {
    @OptionGroup var place: PartyPlace
    @OptionGroup var audio: PartyAudioOptions
}

/// The audio options, as `tusa call` has them.
struct PartyAudioOptions: ParsableArguments {
    @Option(
        name: .customLong("identity"),
        help: ArgumentHelp(
            "Identity key file (tusa keygen); default ~/.config/tusa/identity.key, or a fresh key when that is missing.",
            valueName: "file"))
    var identity: String?

    @Option(
        name: .customLong("in"),
        help: ArgumentHelp(
            "What to send: a WAV file, 'device' (the default input) or 'device:NAME', 'tone' or 'silence' (the default; 'device' with --in-device).",
            valueName: "file.wav|device"))
    var inputOption: String?

    @Option(
        name: .customLong("in-device"),
        help: ArgumentHelp(
            "The capture device (--in device when --in is not given): a name from 'tusa voice devices', or a part of its name or description.",
            valueName: "name"))
    var inputDevice: String?

    @Option(
        name: .customLong("out-device"),
        help: ArgumentHelp(
            "The playback device (--out device when --out is not given): a name from 'tusa voice devices', or a part of its name or description.",
            valueName: "name"))
    var outputDevice: String?

    @Option(
        name: .customLong("echo-cancel"),
        help: ArgumentHelp(
            "Cancel the echo of what is heard from what is sent: auto (on when --in and --out are both devices), on or off.",
            valueName: "auto|on|off"))
    var echoCancel: EchoCancelArgument = .auto

    @Flag(help: "Play the --in file over and over: stay until --duration, the room's end or Ctrl-C.")
    var loop = false

    @Option(
        name: .customLong("out"),
        help: ArgumentHelp(
            "Where the room's mix goes: a WAV file (8 kHz), 'device' (the default output) or 'device:NAME', or 'none' (the default; 'device' with --out-device).",
            valueName: "file.wav|device"))
    var outputOption: String?

    /// `--in`, else a device when `--in-device` names one, else silence.
    var input: String { inputOption ?? (inputDevice == nil ? "silence" : "device") }

    /// `--out`, else a device when `--out-device` names one, else none.
    var output: String { outputOption ?? (outputDevice == nil ? "none" : "device") }

    @Option(help: "opus, speex or l16.")
    var codec = "opus"

    @Option(help: "Frame duration in ms: 10 or 20.")
    var frame = 20

    @Option(help: "Codec bitrate in bits per second.")
    var bitrate = 24_000

    @Option(
        help:
            "Leave after this many seconds (default: one second after a file input ends; with another input, when the room closes or on Ctrl-C)."
    )
    var duration: Double?

    func validate() throws { _ = try duration.map { try seconds($0, of: "--duration") } }

    @Option(
        help: ArgumentHelp(
            "Impair what this member sends: loss=10%,burst=3,jitter=30ms,delay=20ms,spike=300ms/10s,seed=N (any subset).",
            valueName: "spec"))
    var impair: String?

    @Option(
        name: .customLong("min-delay"),
        help: ArgumentHelp(
            "Play every speaker at least this long behind its fastest packets, in ms (0-300; default 0: as early as the path allows, as a call does): a packet that came n ms slower than those waits n ms less in the jitter buffer. More rides out a path or a machine that delays packets often.",
            valueName: "ms"))
    var minimumDelay: Int?

    @Flag(help: "Print the final report as JSON on standard output.")
    var json = false

    @Flag(help: "Nothing on standard error but errors: no status line, no roster or key changes.")
    var quiet = false

    @Option(
        help: ArgumentHelp(
            "How to reach the relay: auto (UDP, and TCP at once if UDP does not answer within 250 ms; back to UDP when it passes again), udp, tcp, or tls (TCP inside TLS, to a relay's --party-tls-port given in --relay, e.g. HOST:443; the relay is proven by its key, not its certificate).",
            valueName: "auto|udp|tcp|tls"))
    var transport: PartyTransportArgument = .auto

    func codecConfiguration() throws -> CodecConfiguration {
        try AudioArguments.codec(codec, frame: frame, bitrate: bitrate)
    }

    var inputIsFile: Bool { AudioArguments.isFile(input) }

    /// A party is joined (or created) by the user now: what they say as it starts is sent.
    func source() throws -> AudioSource? {
        try AudioArguments.source(input, loop: loop, device: inputDevice, placing: true)
    }

    /// Each speaker's jitter buffer: the party's (`PartyVoice.defaultPlayout`), its floor
    /// moved by `--min-delay`.
    func playout(for codec: CodecConfiguration) throws -> PlayoutConfiguration {
        var playout = PartyVoice.defaultPlayout(for: codec)
        guard let minimumDelay else { return playout }
        guard (0...300).contains(minimumDelay) else { throw ValidationError("--min-delay must be 0-300 ms, not \(minimumDelay)") }
        playout.minimumDelayMilliseconds = minimumDelay
        return playout
    }

    func sink() throws -> AudioSink? { try AudioArguments.sink(output, device: outputDevice) }

    /// The identity, or a usage error saying why it cannot be read.
    func identityOrExit() throws -> Identity {
        do { return try loadIdentity() } catch { throw ValidationError("\(error)") }
    }

    func loadIdentity() throws -> Identity { try AudioArguments.identity(identity) }
}

struct PartyCreate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "create",
        abstract: "Create a party named NAME on the relay and join it.",
        discussion: PartySession.discussion
            + " With --invite or --contacts and --rendezvous, exit status 3 after a stay in which some invited keys could not be told (the room let them in: send them its id); without --rendezvous nobody is told, which a notice says."
    )

    @Argument(help: "The room's name (a game, say).")
    var name: String

    @Option(
        help: ArgumentHelp(
            "Allow only these keys to join besides you (repeatable; at most \(PartyControl.maximumInvited) keys, --contacts counted in; default: anyone with the id).",
            valueName: "key"))
    var invite: [String] = []

    @Flag(
        help:
            "Invite every contact too (tusa contacts, kept by the rendezvous): each is let in and told, as an --invite key is (\(PartyControl.maximumInvited) keys at most in all)."
    )
    var contacts = false

    @Option(help: "Members the room may hold (the relay's --max-party-size caps it).")
    var max: Int?

    @OptionGroup var options: PartyOptions

    func run() async throws {
        var keys: [PublicKey] = []
        for text in invite {
            guard let k = PublicKey(base64: text) else {
                throw ValidationError("--invite '\(text)' is not a 32-byte base64 public key")
            }
            // A key named twice is let in, and told, once.
            if !keys.contains(k) { keys.append(k) }
        }
        if let max { guard max >= 2 else { throw ValidationError("--max must be at least 2") } }
        guard keys.count <= PartyControl.maximumInvited else {
            throw ValidationError(
                "--invite names \(keys.count) keys; a room lets in at most \(PartyControl.maximumInvited) by key: invite fewer, or create an open room (no --invite) and send its id"
            )
        }
        if contacts && options.place.rendezvous == nil {
            throw ValidationError("--contacts needs --rendezvous: the rendezvous keeps the contacts")
        }
        let command = "party create"
        let identity = try options.audio.identityOrExit()
        let (relay, relayKey, rendezvous) = try await PartySession.place(
            options.place, identity: identity, command: command, transport: options.audio.transport.value)
        if contacts, let rendezvous {
            do {
                for key in try await rendezvous.contacts() where !keys.contains(key) && key != identity.publicKey {
                    keys.append(key)
                }
            } catch {
                FileHandle.standardError.write(Data("tusa \(command): cannot read the contacts: \(error)\n".utf8))
                await rendezvous.close()
                throw ExitCode(2)
            }
            guard keys.count <= PartyControl.maximumInvited else {
                await rendezvous.close()
                throw ValidationError(
                    "--contacts and --invite name \(keys.count) keys; a room lets in at most \(PartyControl.maximumInvited) by key: invite fewer, or create an open room (no --invite, no --contacts) and send its id"
                )
            }
        }
        let locator = rendezvous.map { RoomLocator($0, identity: identity.privateKey) }
        if !keys.isEmpty && rendezvous == nil {
            FileHandle.standardError.write(
                Data("tusa \(command): notice: without --rendezvous the invited keys are let in but not told\n".utf8))
        }
        var untold = 0
        try await PartySession.run(
            options.audio, identity: identity, relay: relay, relayKey: relayKey, command: command, locator: locator,
            enter: { c in try await c.create(name: name, maxMembers: max, invite: keys) },
            joined: { joined in
                // Each invited key learns of the room through the rendezvous: now if it is
                // online, at its next registration within a day if not.
                guard let rendezvous = locator?.current else { return }
                let invitation = PartyInvitation(
                    room: joined.room, name: joined.name, relay: "\(relay)", relayKey: relayKey.base64)
                for key in keys {
                    do {
                        try await rendezvous.post(invitation.encoded(), to: key)
                        print("invited \(key.base64)")
                    } catch {
                        untold += 1
                        FileHandle.standardError.write(Data("tusa \(command): cannot invite \(key.base64): \(error)\n".utf8))
                    }
                }
                flushStandardOutput()
            })
        await locator?.close()
        // The stay went as asked, but not everyone invited knows of it: a script must see that.
        if untold > 0 {
            FileHandle.standardError.write(
                Data(
                    "tusa \(command): \(untold) of \(keys.count) invited keys were let in but not told; send them the room's id\n"
                        .utf8))
            throw ExitCode(3)
        }
    }
}

struct PartyJoin: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "join",
        abstract: "Join the party ID on the relay.",
        discussion: PartySession.discussion
    )

    @Argument(help: "The room's id (tusa party create prints it).")
    var id: String

    @OptionGroup var options: PartyOptions

    func run() async throws {
        let command = "party join"
        let identity = try options.audio.identityOrExit()
        let (relay, relayKey, rendezvous) = try await PartySession.place(
            options.place, identity: identity, command: command, room: id, transport: options.audio.transport.value)
        let locator = rendezvous.map { RoomLocator($0, identity: identity.privateKey) }
        try await PartySession.run(
            options.audio, identity: identity, relay: relay, relayKey: relayKey, command: command, locator: locator,
            enter: { c in try await c.join(id) })
        await locator?.close()
    }
}

/// `tusa party watch`: invitations as they arrive (and those kept for us).
struct PartyWatch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Register at a relay's rendezvous and print party invitations as they arrive.",
        discussion:
            "Invitations sent while you were away (kept for a day) come first. With --join, joins the first one with the audio options and stays as tusa party join does. Exit status: 0, 64 on bad usage, 2 when the rendezvous could not be reached."
    )

    @Option(
        help: ArgumentHelp(
            "The relay's rendezvous, HOST:PORT, or a directory's. \(RendezvousServers.listHelp)", valueName: "host:port"))
    var rendezvous: String

    @Flag(help: "Join the first invitation.")
    var join = false

    @Option(help: "Stop watching after this many seconds (default: never, or until --join joined).")
    var timeout: Double?

    @OptionGroup var audio: PartyAudioOptions

    func run() async throws {
        let servers = try RendezvousServers.parse(rendezvous)
        let limit = try timeout.map { try seconds($0, of: "--timeout") }
        if join, audio.transport.value == .tls {
            throw ValidationError(
                "--join --transport tls: an invitation names the relay's UDP address, not its TLS port; join with tusa party join ID --relay HOST:TLSPORT --relay-key KEY --transport tls"
            )
        }
        let identity = try audio.identityOrExit()
        let connection: RendezvousConnection
        do { connection = try await RendezvousConnection.connect(toAnyOf: servers, identity: identity.privateKey) } catch {
            FileHandle.standardError.write(Data("tusa party watch: \(error)\n".utf8))
            throw ExitCode(2)
        }
        print("watching as \(identity.publicKey.base64)")
        flushStandardOutput()
        guard join else {
            _ = await PartySession.invitations(from: connection, within: limit, reconnectingAs: identity.privateKey) {
                invitation, from in
                print(PartySession.invitationLine(invitation, from: from))
                flushStandardOutput()
                return false
            }
            await connection.close()
            return
        }
        // Joining: the first room that lets us in (an invitation kept from yesterday
        // may name a room that has closed since), on the relay that hosts it now
        // (a directory's other relay, or another since the invitation was sent).
        guard let grant = connection.party else {
            await connection.close()
            FileHandle.standardError.write(
                Data("tusa party watch: the relay at \(connection.server) hosts no parties\n".utf8))
            throw ExitCode(2)
        }
        let (relay, relayKey) = try PartyPlace.parse(relay: grant.address, key: grant.key)
        let locator = RoomLocator(connection, identity: identity.privateKey)
        try await PartySession.run(
            audio, identity: identity, relay: relay, relayKey: relayKey, command: "party watch", locator: locator,
            enter: { party in
                let deadline = limit.map { ContinuousClock.now + $0 }
                // Past the deadline the rendezvous closes, which ends the wait below.
                let stopper = limit.map { limit in
                    Task {
                        try await Task.sleep(for: limit)
                        await connection.close()
                    }
                }
                defer { stopper?.cancel() }
                for await (from, payload) in connection.incoming {
                    guard let invitation = PartyInvitation(decoding: payload) else { continue }
                    print(PartySession.invitationLine(invitation, from: from))
                    flushStandardOutput()
                    if let deadline, ContinuousClock.now > deadline { break }
                    // Only where the directory says the room is, or this rendezvous' own relay:
                    // an invitation's sender does not choose where this member connects.
                    guard let (address, key) = await PartySession.trustedPlace(of: invitation, asking: locator, grant: grant)
                    else {
                        FileHandle.standardError.write(
                            Data("tusa party watch: \(invitation.room): not a room of this rendezvous' relays\n".utf8))
                        continue
                    }
                    do {
                        try await party.move(to: address, relayKey: key, transport: audio.transport.value)
                        return try await party.join(invitation.room)
                    } catch PartyConnectionError.refused(let code, let detail) {
                        FileHandle.standardError.write(
                            Data("tusa party watch: \(invitation.room): \(code.rawValue): \(detail)\n".utf8))
                    } catch {
                        FileHandle.standardError.write(Data("tusa party watch: \(invitation.room): \(error)\n".utf8))
                    }
                }
                await connection.close()
                throw PartyConnectionError.closed
            })
        await locator.close()
    }
}

/// `tusa party list`: the rooms one is invited to.
struct PartyList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract:
            "List the parties you are invited to (invitations of the last day, kept by the relay's rendezvous), and your friends' parties.",
        discussion: """
            Under each invitation, who is in the room now (asked of the relay that hosts it), or that it has closed. \
            Then the parties the directory holds that you may see (your own, those you are invited to, and the open \
            rooms of keys that have you among their contacts), with who is in each, as their relays last told it. \
            Exit status: 0, 64 on bad usage, 2 when the rendezvous could not be reached.
            """
    )

    @OptionGroup var user: RendezvousUser

    func run() async throws {
        let servers = try RendezvousServers.parse(user.rendezvous)
        var options = PartyAudioOptions()
        options.identity = user.identity
        let me = try options.identityOrExit()
        let connection: RendezvousConnection
        do { connection = try await RendezvousConnection.connect(toAnyOf: servers, identity: me.privateKey) } catch {
            FileHandle.standardError.write(Data("tusa party list: \(error)\n".utf8))
            throw ExitCode(2)
        }
        // What was kept for us comes right after the registration; a lookup of our own
        // key travels behind it, so once it is answered everything kept has arrived.
        let found = InvitationList()
        let collector = Task {
            _ = await PartySession.invitations(from: connection, within: .seconds(10)) { invitation, from in
                found.add(invitation, from: from)
                return false
            }
        }
        _ = try? await connection.lookup(me.publicKey)
        // (What came before the answer is on its way to the collector already: a moment for it, then done.)
        try? await Task.sleep(for: .milliseconds(100))
        collector.cancel()
        await collector.value
        let invitations = found.all
        // Where each room is now (a room on a directory's relay may have moved since it was sent).
        let locator = RoomLocator(connection, identity: me.privateKey)
        var places: [String: (address: TransportAddress, key: PublicKey)] = [:]
        for (invitation, _) in invitations { places[invitation.room] = await PartySession.whereIs(invitation, asking: locator) }
        // The directory's parties (last: an older rendezvous knows no `parties` and closes the connection over it).
        let listed: Result<([PartyEntry], more: Bool), any Error>
        do { listed = .success(try await locator.current.parties()) } catch { listed = .failure(error) }
        let closedByIt = locator.current.isClosed
        await locator.close()
        if invitations.isEmpty { print("no invitations") }
        // Who is in each room now, asked of its relay (one session per relay).
        var relays: [String: PartyConnection] = [:]
        for (invitation, from) in invitations {
            print(PartySession.invitationLine(invitation, from: from))
            guard let (address, key) = places[invitation.room] else {
                print("  (its relay is not known: \(invitation.relay) \(invitation.relayKey) does not parse)")
                continue
            }
            let place = "\(address) \(key.base64)"
            let relay: PartyConnection
            if let open = relays[place] {
                relay = open
            } else {
                do {
                    relay = try await PartyConnection.connect(
                        to: address, relayKey: key, identity: me, timeout: .seconds(3), logger: quietLogger())
                    relays[place] = relay
                } catch {
                    print("  (cannot ask its relay: \(error))")
                    continue
                }
            }
            do {
                guard let room = try await relay.describe(invitation.room) else {
                    print("  closed")
                    continue
                }
                print("  \(room.members.count) of at most \(room.maxMembers) in it:")
                for m in room.members { print(PartySession.rosterLine(m, me: nil)) }
            } catch {
                print("  (its relay did not say: \(error))")
            }
        }
        for relay in relays.values { await relay.close() }
        // Rooms an invitation above showed already are not shown again.
        let shown = Set(invitations.map(\.0.room))
        switch listed {
        case .success(let (entries, more)):
            let others = entries.filter { !shown.contains($0.listing.room) }
            if !others.isEmpty { print("parties of yours and your friends:") }
            for entry in others { print(PartySession.partyLines(entry, me: me.publicKey)) }
            if more { print("(more parties than one answer holds: only these are shown)") }
        case .failure(let error):
            if !closedByIt { print("(the rendezvous did not list parties: \(error))") }
        }
    }
}

/// One member's stay in a room, from the command line.
enum PartySession {
    static let discussion = """
        Prints the room's id and roster (each member's key fingerprint), then runs until --duration, the input's end, \
        the room's end or Ctrl-C (or SIGTERM; either leaves the room and reports). Lines on standard input act at once: 'kick N' (the creator removes member #N), \
        'mute', 'unmute', 'close' (the creator closes the room), 'leave'. At the end, a report per speaker heard. \
        Exit status: 0 after a normal stay, 64 on bad usage, 2 when the relay could not be reached or refused, or the audio failed.
        """

    /// The party service to use: as given, or as the rendezvous says (which stays
    /// open, for invitations and to find the room again if its relay goes): for a
    /// new room, the relay it places this member on; for `room`, the relay that
    /// hosts it (a directory finds it among its relays).
    static func place(
        _ place: PartyPlace, identity: Identity, command: String, room: String? = nil, transport: PartyTransport = .auto
    ) async throws -> (TransportAddress, PublicKey, RendezvousConnection?) {
        let given = try place.givenRelay()
        if transport == .tls, given == nil {
            throw ValidationError(
                "--transport tls needs --relay HOST:PORT (the relay's --party-tls-port) and --relay-key: a rendezvous names relays' UDP addresses"
            )
        }
        guard let servers = try place.rendezvousServers() else {
            guard let given else { throw ValidationError("give --rendezvous, or --relay and --relay-key") }
            return (given.0, given.1, nil)
        }
        var rendezvous: RendezvousConnection
        do { rendezvous = try await RendezvousConnection.connect(toAnyOf: servers, identity: identity.privateKey) } catch {
            FileHandle.standardError.write(Data("tusa \(command): \(error)\n".utf8))
            throw ExitCode(2)
        }
        if let given { return (given.0, given.1, rendezvous) }
        // A room of a directory's relay (its id carries the relay's tag): where the
        // directory says it is. Others (and an answer refused by an older rendezvous,
        // which knows no `locate`): on the relay the rendezvous names.
        var located: PartyGrant?
        if room == nil {
            // A new room: where the directory places it now. An older rendezvous knows no
            // `place` and closes the connection over it: registered again, the room goes
            // to the relay it named at registration.
            do { located = try await rendezvous.placeRoom() } catch {
                if rendezvous.isClosed {
                    do { rendezvous = try await rendezvous.connectAgain(identity: identity.privateKey) } catch {
                        FileHandle.standardError.write(Data("tusa \(command): \(error)\n".utf8))
                        throw ExitCode(2)
                    }
                }
            }
        } else if let room, RoomHome.tag(ofRoom: room) != nil {
            do { located = try await rendezvous.locate(room: room) } catch RendezvousConnectionError.refused(.noRelay, let detail)
            {
                await rendezvous.close()
                FileHandle.standardError.write(Data("tusa \(command): cannot find room \(room): \(detail)\n".utf8))
                throw ExitCode(2)
            } catch {
                located = nil
            }
        }
        guard let grant = located ?? rendezvous.party else {
            await rendezvous.close()
            FileHandle.standardError.write(
                Data("tusa \(command): the relay at \(rendezvous.server) hosts no parties (tusa relay --party-port)\n".utf8))
            throw ExitCode(2)
        }
        do {
            let (a, k) = try PartyPlace.parse(relay: grant.address, key: grant.key)
            return (a, k, rendezvous)
        } catch {
            await rendezvous.close()
            FileHandle.standardError.write(Data("tusa \(command): the rendezvous' party grant: \(error)\n".utf8))
            throw ExitCode(2)
        }
    }

    /// One member's stay. With a `locator`, a member whose relay goes silent asks it
    /// where the room is now, and follows it to another relay.
    static func run(
        _ audio: PartyAudioOptions, identity: Identity, relay: TransportAddress, relayKey: PublicKey, command: String,
        locator: RoomLocator? = nil, enter: (PartyConnection) async throws -> PartyJoined,
        joined afterJoin: (PartyJoined) async -> Void = { _ in }
    ) async throws {
        signal(SIGXFSZ, SIG_IGN)
        let limit = try audio.duration.map { try seconds($0, of: "--duration") }
        let codec = try audio.codecConfiguration()
        let impairment = try AudioArguments.impairment(audio.impair)
        let playout = try audio.playout(for: codec)
        let voice: PartyVoice
        let source: AudioSource?
        let sink: AudioSink?
        do {
            source = try audio.source()
            sink = try audio.sink()
            voice = try PartyVoice(
                codec: codec, source: source, sink: sink,
                echoCancellation: AudioArguments.echoCancellation(audio.echoCancel, input: audio.input, output: audio.output),
                playout: playout)
        } catch {
            throw ValidationError("\(error)")
        }
        // A speaker nobody here can decode is said at once, --quiet or not: it is not heard.
        voice.onUndecodableSpeaker = { member, why in
            FileHandle.standardError.write(Data("tusa \(command): cannot play \(member): \(why)\n".utf8))
        }
        let connection: PartyConnection
        let joined: PartyJoined
        var locate: PartyConnection.Locator?
        if let locator { locate = { room, follow in await locator.locate(room, follow: follow) } }
        var member = PartyMember.Configuration()
        member.audioFormat = voice.announcedFormat
        do {
            connection = try await PartyConnection.connect(
                to: relay, relayKey: relayKey, identity: identity, transport: audio.transport.value, configuration: member,
                audio: voice.audioHandler, locate: locate, logger: quietLogger())
            if let impairment {
                await connection.impairMedia(impairment.decider(frameMilliseconds: codec.frameDuration.milliseconds))
            }
            joined = try await enter(connection)
        } catch {
            FileHandle.standardError.write(Data("tusa \(command): \(error)\n".utf8))
            throw ExitCode(2)
        }
        // How others join: with the relay named when no rendezvous can place the room.
        let join = locator == nil ? " --relay \(relay) --relay-key \(relayKey.base64)" : ""
        print("party \(joined.room) \"\(joined.name)\" as \(joined.me): tusa party join \(joined.room)\(join)")
        if audio.transport.value == .auto, await connection.overTCP, !audio.quiet {
            FileHandle.standardError.write(Data("reached the relay over TCP (UDP did not answer)\n".utf8))
        }
        for m in joined.roster { print(rosterLine(m, me: joined.me)) }
        flushStandardOutput()
        await afterJoin(joined)

        let started = ContinuousClock.now
        let state = PartyState(me: joined.me, roster: joined.roster)
        voice.start(sending: connection)
        let followInput = audio.duration == nil && audio.inputIsFile && !audio.loop
        let stop = AsyncStream.makeStream(of: String.self)
        // The live status line on a terminal; roster and key changes as lines anyway (unless --quiet).
        let live = !audio.quiet && isatty(STDERR_FILENO) != 0
        // Events: the roster, the room's end.
        let eventsTask = Task {
            var at = relay
            for await event in connection.events {
                if var line = state.apply(event) {
                    // A rejoin elsewhere: the room's relay went, and the directory placed it on another.
                    if case .rejoined = event, connection.relay != at {
                        at = connection.relay
                        line += " on the relay at \(at) (the room moved)"
                    }
                    if !audio.quiet { FileHandle.standardError.write(Data(((live ? "\r" : "") + line + "\n").utf8)) }
                }
                if case .memberLeft(let member, _) = event { voice.forget(member) }
                if case .ended(let reason) = event { stop.continuation.yield("ended: \(reason.rawValue)") }
            }
        }
        // Commands on standard input, read on a thread of their own: a read that blocks
        // (a terminal or pipe left open) must not hold one of the few threads async
        // code runs on, or leaving would wait for the input's end.
        let commands = Thread {
            for line in StandardInputLines() {
                let words = line.split(separator: " ").map(String.init)
                switch words.first {
                case "kick":
                    if let n = words.dropFirst().first.flatMap({ UInt16($0.trimmingCharacters(in: ["#"])) }) {
                        connection.kick(MemberID(n))
                    }
                case "mute": connection.mute(true)
                case "unmute": connection.mute(false)
                case "close": connection.closeRoom()
                case "leave": stop.continuation.yield("left")
                default:
                    FileHandle.standardError.write(Data("tusa \(command): commands: kick N, mute, unmute, close, leave\n".utf8))
                }
            }
        }
        commands.start()
        // Ctrl-C or SIGTERM: leave the room as "leave" does (the others see it at once) and report.
        let interrupts = onInterrupt { stop.continuation.yield("interrupted") }
        defer { for source in interrupts { source.cancel() } }
        let timer = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(200))
                if let limit, started.duration(to: .now) >= limit { stop.continuation.yield("duration") }
                if followInput, voice.sourceEnded {
                    try? await Task.sleep(for: .seconds(1))
                    stop.continuation.yield("input ended")
                }
                if voice.audioErrorLeaves { stop.continuation.yield("audio error") }
                if live { FileHandle.standardError.write(Data(("\r" + state.statusLine(voice.speakers) + "   ").utf8)) }
            }
        }
        for await _ in stop.stream { break }
        timer.cancel()
        await voice.stop()
        let transport = await connection.overTCP ? (audio.transport.value == .tls ? "tls" : "tcp") : "udp"
        await connection.close()
        eventsTask.cancel()
        if live { FileHandle.standardError.write(Data("\n".utf8)) }
        let devices = LiveAudioStatistics.of(source: source, sink: sink)
        let report = PartyReport(
            room: joined.room, name: joined.name, me: joined.me.value, framesSent: voice.framesSent,
            seconds: Double(started.duration(to: .now).components.seconds), transport: transport,
            speakers: voice.speakers.map(PartyReport.Speaker.init),
            undecodable: voice.undecodableSpeakers.sorted { $0.key < $1.key }.map {
                .init(member: $0.key.value, reason: $0.value)
            },
            joinToFirstAudioMilliseconds: voice.startToFirstAudioMilliseconds.map { ($0 * 10).rounded() / 10 },
            audioError: voice.audioError, captureDevice: devices.capture, playbackDevice: devices.playback)
        if audio.json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            if let data = try? encoder.encode(report) { print(String(decoding: data, as: UTF8.self)) }
        } else {
            print(report.humanReadable)
        }
        flushStandardOutput()
        if let error = voice.audioError {
            FileHandle.standardError.write(Data("tusa \(command): \(error)\n".utf8))
            throw ExitCode(2)
        }
    }

    /// Reads invitations from `connection` until `handle` returns true (that one is
    /// returned), the connection closes or `limit` passes. With `reconnectingAs`, a
    /// connection that closes is made again (at the next of its servers first: a
    /// directory node that died), and reading goes on there.
    static func invitations(
        from connection: RendezvousConnection, within limit: Duration?, reconnectingAs identity: PrivateKey? = nil,
        _ handle: @escaping @Sendable (PartyInvitation, PublicKey) -> Bool
    ) async -> (PartyInvitation, PublicKey)? {
        let current = Latest(connection)
        let found = await withTaskGroup(of: (PartyInvitation, PublicKey)?.self) { group in
            group.addTask {
                var connection = connection
                // What a new registration hands over again (kept invitations) is said once.
                var heard = Set<[UInt8]>()
                while true {
                    for await (from, payload) in connection.incoming {
                        guard heard.insert(from.bytes + payload).inserted,
                            let invitation = PartyInvitation(decoding: payload)
                        else { continue }
                        if handle(invitation, from) { return (invitation, from) }
                    }
                    guard let identity, !Task.isCancelled else { return nil }
                    FileHandle.standardError.write(
                        Data("tusa party watch: the rendezvous at \(connection.server) is gone: registering again\n".utf8))
                    while !Task.isCancelled {
                        if let again = try? await connection.connectAgain(identity: identity, timeout: .seconds(3)) {
                            connection = again
                            current.value.withLock { $0 = again }
                            FileHandle.standardError.write(Data("tusa party watch: watching at \(again.server)\n".utf8))
                            break
                        }
                        try? await Task.sleep(for: .seconds(1))
                    }
                }
            }
            if let limit {
                group.addTask {
                    try? await Task.sleep(for: limit)
                    return nil
                }
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
        // The caller closes the connection it gave; one made here is closed here.
        let last = current.value.withLock { $0 }
        if last !== connection { await last.close() }
        return found
    }

    /// The connection ``invitations(from:within:reconnectingAs:_:)`` reads now.
    private final class Latest: Sendable {
        let value: Mutex<RendezvousConnection>
        init(_ connection: RendezvousConnection) { value = Mutex(connection) }
    }

    /// Where an invitation's room is now: for a room of a directory's relay (its id
    /// carries the relay's tag), as the directory says; else, or without an
    /// answer, on the relay the invitation names.
    static func whereIs(_ invitation: PartyInvitation, asking locator: RoomLocator) async -> (
        address: TransportAddress, key: PublicKey
    )? {
        if RoomHome.tag(ofRoom: invitation.room) != nil, let found = await locator.locate(invitation.room) { return found }
        return try? PartyPlace.parse(relay: invitation.relay, key: invitation.relayKey)
    }

    /// Where `party watch --join` may go for an invitation: for a room of a
    /// directory's relay, where the directory says it is; else the rendezvous' own
    /// relay, when the invitation names it (nil otherwise).
    static func trustedPlace(of invitation: PartyInvitation, asking locator: RoomLocator, grant: PartyGrant) async -> (
        address: TransportAddress, key: PublicKey
    )? {
        if RoomHome.tag(ofRoom: invitation.room) != nil { return await locator.locate(invitation.room) }
        guard invitation.relayKey == grant.key else { return nil }
        return try? PartyPlace.parse(relay: grant.address, key: grant.key)
    }

    static func invitationLine(_ invitation: PartyInvitation, from: PublicKey) -> String {
        "\(from.base64) (\(Fingerprint.digits(of: from))) created party \(invitation.name): tusa party join \(invitation.room) --relay \(invitation.relay) --relay-key \(invitation.relayKey)"
    }

    /// A party of the directory's list: who made it, how full it is, how to join, and who is in it.
    static func partyLines(_ entry: PartyEntry, me: PublicKey) -> String {
        let l = entry.listing
        let creator = PublicKey(base64: l.creator)
        let by = creator.map { "\($0.base64) (\(Fingerprint.digits(of: $0)))" } ?? l.creator
        let join =
            entry.party.map { ": tusa party join \(l.room) --relay \($0.address) --relay-key \($0.key)" }
            ?? " (its relay is down: tusa party join \(l.room) --rendezvous … places it again)"
        var lines = [
            "party \(l.name) \(l.room) by \(by), \(l.memberCount) of at most \(l.maxMembers) in it\(l.invited.isEmpty ? "" : ", invite-only")\(join)"
        ]
        for text in l.members {
            let key = PublicKey(base64: text)
            let fingerprint = key.map { Fingerprint.digits(of: $0) } ?? "?"
            lines.append("  \(text) \(fingerprint)\(text == l.creator ? " creator" : "")\(key == me ? " (you)" : "")")
        }
        if l.memberCount > l.members.count { lines.append("  … and \(l.memberCount - l.members.count) more") }
        return lines.joined(separator: "\n")
    }

    static func rosterLine(_ m: RosterEntry, me: MemberID?) -> String {
        let fingerprint = m.publicKey.map { Fingerprint.digits(of: $0) } ?? "?"
        return "  \(m.member) \(m.key) \(fingerprint)\(m.creator ? " creator" : "")\(m.member == me ? " (you)" : "")"
    }
}

/// The roster as this member sees it, for the status line.
final class PartyState: @unchecked Sendable {
    private let lock = NSLock()
    private var me: MemberID
    private var members: [MemberID: RosterEntry]

    init(me: MemberID, roster: [RosterEntry]) {
        self.me = me
        members = Dictionary(roster.map { ($0.member, $0) }, uniquingKeysWith: { a, _ in a })
    }

    /// Applies an event; a line to print for roster changes.
    func apply(_ event: PartyMemberEvent) -> String? {
        lock.lock()
        defer { lock.unlock() }
        switch event {
        case .memberJoined(let m):
            members[m.member] = m
            return "joined: " + PartySession.rosterLine(m, me: me).trimmingCharacters(in: .whitespaces)
        case .memberLeft(let m, let reason):
            members[m] = nil
            return "left: \(m) (\(reason.rawValue))"
        case .ended(let reason):
            return "the room ended for you: \(reason.rawValue)"
        case .relayDraining:
            return "the relay is shutting down: following the room to its next relay"
        case .connectionLost:
            return "lost the relay; rejoining with the same keys"
        case .rejoined(_, _, let id, let roster):
            let seat = id == me ? "" : " as \(id)"
            me = id
            members = Dictionary(roster.map { ($0.member, $0) }, uniquingKeysWith: { a, _ in a })
            return "rejoined\(seat): \(members.count) in the room"
        case .sendingUnder(let id):
            return "rekeyed: sending under a fresh key (epoch \(id.epoch))"
        case .badKey(let from, let why):
            return "a key from \(from) was refused: \(why)"
        default:
            return nil
        }
    }

    func statusLine(_ speakers: [PartySpeakerReport]) -> String {
        lock.lock()
        let count = members.count
        lock.unlock()
        let heard = speakers.map { s in
            let p = s.playout
            let expected = max(1, p.packetsPlayed + p.lostPackets)
            return
                "\(s.member) \(s.packetsReceived) pkts \(Int((100 * Double(p.lostPackets) / Double(expected)).rounded()))% lost \(Int(p.delayMeanMilliseconds.rounded())) ms"
        }
        return "\(count) in the room; " + (heard.isEmpty ? "nobody heard yet" : heard.joined(separator: ", "))
    }
}

/// The end-of-stay report: per speaker heard.
struct PartyReport: Encodable {
    struct Speaker: Encodable {
        var member: UInt16
        var packets: Int
        var played: Int
        var lostPercent: Double
        var concealed: Int
        /// How long the packets waited in the jitter buffer (arrival to playout).
        var delayMeanMilliseconds: Double
        var delayP95Milliseconds: Double
        /// The longest a packet waited (a stall's pile-up shows here).
        var delayMaxMilliseconds: Double
        /// How long the last 50 packets played waited (a second of 20 ms frames): where
        /// the delay stood at the end.
        var delayAtEndMilliseconds: Double
        /// Audio dropped to bring a pile-up back under the playout's cap (after a stall).
        var catchUpDroppedMilliseconds: Double
        /// The delay the jitter buffer aimed at last, over the speaker's fastest packets
        /// (at least `--min-delay`).
        var targetDelayMilliseconds: Double
        /// Speech the jitter buffer time-stretched (accelerated or expanded) to move its
        /// delay: inaudible in small doses, but what a listener's PESQ pays for first.
        var stretchedMilliseconds: Double
        var mos: Double
        /// How the speaker encodes, e.g. "opus 8000 Hz 20 ms".
        var codec: String

        init(_ s: PartySpeakerReport) {
            let p = s.playout
            let frameMilliseconds = s.codec.frameDuration.milliseconds
            let sampleRate = s.codec.sampleRate
            codec = "\(s.codec.kind.rawValue) \(sampleRate) Hz \(frameMilliseconds) ms"
            member = s.member.value
            packets = s.packetsReceived
            played = p.packetsPlayed
            let expected = max(1, p.packetsPlayed + p.lostPackets)
            lostPercent = (1000 * Double(p.lostPackets) / Double(expected)).rounded() / 10
            concealed = p.framesConcealed
            delayMeanMilliseconds = (p.delayMeanMilliseconds * 10).rounded() / 10
            delayP95Milliseconds = (p.delayP95Milliseconds * 10).rounded() / 10
            delayMaxMilliseconds = (p.delayMaxMilliseconds * 10).rounded() / 10
            delayAtEndMilliseconds = (p.delayRecentMilliseconds * 10).rounded() / 10
            catchUpDroppedMilliseconds = Double(p.framesDroppedInCatchUp * frameMilliseconds)
            targetDelayMilliseconds = (p.targetDelayMilliseconds * 10).rounded() / 10
            let stretched = Double(p.accelerateSamples + p.expandSamples) * 1000 / Double(max(1, sampleRate))
            stretchedMilliseconds = (stretched * 10).rounded() / 10
            let oneWay = p.delayMeanMilliseconds + Double(frameMilliseconds) + 5
            mos = (EModel.mos(oneWayDelayMilliseconds: oneWay, lossPercent: lostPercent) * 100).rounded() / 100
        }
    }

    var room: String
    var name: String
    var me: UInt16
    var framesSent: Int
    var seconds: Double
    /// How the relay was reached at the end: udp, or tcp where UDP did not pass.
    var transport: String
    var speakers: [Speaker]
    /// Speakers not heard because this build cannot decode how they encode.
    struct Undecodable: Encodable {
        var member: UInt16
        var reason: String
    }
    var undecodable: [Undecodable]
    /// From joining the room to the first of anyone's audio played (nil: nobody was heard).
    var joinToFirstAudioMilliseconds: Double?
    var audioError: String?
    /// The live microphone and speaker, when the stay used them (as a call's report gives them).
    var captureDevice: LiveAudioStatistics?
    var playbackDevice: LiveAudioStatistics?

    var humanReadable: String {
        var lines = ["party \(room) \"\(name)\": \(framesSent) frames sent as #\(me) in \(Int(seconds)) s over \(transport)"]
        if speakers.isEmpty { lines.append("  heard nobody") }
        if let first = joinToFirstAudioMilliseconds { lines.append("  joined to first audio: \(Int(first.rounded())) ms") }
        for s in speakers {
            lines.append(
                "  heard #\(s.member) (\(s.codec)): \(s.packets) packets, \(s.lostPercent)% lost, \(s.concealed) concealed, delay \(s.delayMeanMilliseconds) ms (p95 \(s.delayP95Milliseconds), max \(s.delayMaxMilliseconds), at the end \(s.delayAtEndMilliseconds)), MOS \(s.mos)"
            )
        }
        for u in undecodable { lines.append("  cannot play #\(u.member): \(u.reason)") }
        if let audioError { lines.append("  audio: \(audioError)") }
        lines += LiveAudioStatistics.reportLines(capture: captureDevice, playback: playbackDevice)
        return lines.joined(separator: "\n")
    }
}

/// Invitations seen, one line per room, in arrival order.
final class InvitationList: Sendable {
    private let state = Mutex<(rooms: Set<String>, all: [(PartyInvitation, PublicKey)])>(([], []))

    func add(_ invitation: PartyInvitation, from: PublicKey) {
        state.withLock { s in
            if s.rooms.insert(invitation.room).inserted { s.all.append((invitation, from)) }
        }
    }

    /// Each room's first invitation and who sent it, in arrival order.
    var all: [(PartyInvitation, PublicKey)] { state.withLock { $0.all } }
}
