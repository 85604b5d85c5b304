import ArgumentParser
import Call
import Foundation
import Party
import Secure
import Transport
import TusaBase
import Voice

/// `tusa party`: group voice rooms on a relay, end-to-end encrypted.
struct PartyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "party",
        abstract: "Create or join a party: a group voice room on a relay, sealed end to end.",
        subcommands: [PartyCreate.self, PartyJoin.self]
    )
}

/// What `tusa party create` and `tusa party join` share.
struct PartyOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "The relay's party service, HOST:PORT (tusa relay --party-port prints it).", valueName: "host:port"))
    var relay: String

    @Option(
        name: .customLong("relay-key"),
        help: ArgumentHelp("The relay's public key (base64; tusa relay prints it beside the party port).", valueName: "key"))
    var relayKey: String

    @OptionGroup var audio: PartyAudioOptions

    func relayAddress() throws -> TransportAddress {
        guard let a = TransportAddress(relay, defaultPort: 3481) else {
            throw ValidationError("--relay '\(relay)' is not HOST:PORT")
        }
        return a
    }

    func key() throws -> PublicKey {
        guard let k = PublicKey(base64: relayKey) else {
            throw ValidationError("--relay-key '\(relayKey)' is not a 32-byte base64 public key")
        }
        return k
    }
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
        help: ArgumentHelp("What to send: a WAV file, 'device', 'tone' or 'silence'.", valueName: "file.wav|device"))
    var input = "silence"

    @Option(
        name: .customLong("out"),
        help: ArgumentHelp("Where the room's mix goes: a WAV file (8 kHz), 'device' or 'none'.", valueName: "file.wav|device"))
    var output = "none"

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

    @Flag(help: "Print the final report as JSON on standard output.")
    var json = false

    @Flag(help: "Nothing on standard error but errors: no status line, no roster or key changes.")
    var quiet = false

    func codecConfiguration() throws -> CodecConfiguration {
        guard let kind = CodecKind(rawValue: codec) else { throw ValidationError("--codec must be opus, speex or l16") }
        guard let d = FrameDuration(rawValue: frame) else { throw ValidationError("--frame must be 10 or 20") }
        guard (6_000...128_000).contains(bitrate) else { throw ValidationError("--bitrate must be 6000-128000") }
        var c = CodecConfiguration(kind: kind, frameDuration: d, bitrate: bitrate)
        if kind == .l16 { c.inbandFEC = false }
        _ = try makeEncoder(c)
        return c
    }

    var inputIsFile: Bool { !["silence", "none", "tone", "device"].contains(input) }

    func source() throws -> AudioSource? {
        switch input {
        case "silence", "none": return NullSource(sampleRate: voiceSampleRate)
        case "tone": return ToneSource(frequency: 440, amplitude: 8000, sampleRate: voiceSampleRate)
        case "device": return try PortAudioDevice(sampleRate: voiceSampleRate, framesPerBuffer: 160, capture: true, render: false)
        default: return try WAVFileSource(path: input)
        }
    }

    func sink() throws -> AudioSink? {
        switch output {
        case "none": return nil
        case "device": return try PortAudioDevice(sampleRate: voiceSampleRate, framesPerBuffer: 160, capture: false, render: true)
        default: return try WAVFileSink(path: output, sampleRate: voiceSampleRate)
        }
    }

    func loadIdentity() throws -> Identity {
        if let identity { return try Identity.read(from: identity) }
        if FileManager.default.fileExists(atPath: Keygen.defaultPath) { return try Identity.read(from: Keygen.defaultPath) }
        return Identity.generate()
    }
}

struct PartyCreate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "create",
        abstract: "Create a party named NAME on the relay and join it.",
        discussion: PartySession.discussion
    )

    @Argument(help: "The room's name (a game, say).")
    var name: String

    @Option(
        help: ArgumentHelp(
            "Allow only these keys to join besides you (repeatable; default: anyone with the id).", valueName: "key"))
    var invite: [String] = []

    @Option(help: "Members the room may hold (the relay's --max-party-size caps it).")
    var max: Int?

    @OptionGroup var options: PartyOptions

    func run() async throws {
        let keys = try invite.map { text -> PublicKey in
            guard let k = PublicKey(base64: text) else {
                throw ValidationError("--invite '\(text)' is not a 32-byte base64 public key")
            }
            return k
        }
        if let max { guard max >= 2 else { throw ValidationError("--max must be at least 2") } }
        try await PartySession.run(options, command: "party create") { c in
            try await c.create(name: name, maxMembers: max, invite: keys)
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
        try await PartySession.run(options, command: "party join") { c in try await c.join(id) }
    }
}

/// One member's stay in a room, from the command line.
enum PartySession {
    static let discussion = """
        Prints the room's id and roster (each member's key fingerprint), then runs until --duration, the input's end, \
        the room's end or Ctrl-C. Lines on standard input act at once: 'kick N' (the creator removes member #N), \
        'mute', 'unmute', 'close' (the creator closes the room), 'leave'. At the end, a report per speaker heard. \
        Exit status: 0 after a normal stay, 64 on bad usage, 2 when the relay could not be reached or refused, or the audio failed.
        """

    static func run(
        _ options: PartyOptions, command: String, enter: (PartyConnection) async throws -> PartyJoined
    ) async throws {
        signal(SIGXFSZ, SIG_IGN)
        let relay = try options.relayAddress()
        let relayKey = try options.key()
        let audio = options.audio
        if let d = audio.duration { guard d > 0, d.isFinite else { throw ValidationError("--duration must be positive") } }
        let codec = try audio.codecConfiguration()
        let identity: Identity
        let voice: PartyVoice
        do {
            identity = try audio.loadIdentity()
            voice = try PartyVoice(codec: codec, source: try audio.source(), sink: try audio.sink())
        } catch {
            throw ValidationError("\(error)")
        }
        let connection: PartyConnection
        let joined: PartyJoined
        do {
            connection = try await PartyConnection.connect(
                to: relay, relayKey: relayKey, identity: identity, audio: voice.audioHandler, logger: quietLogger())
            joined = try await enter(connection)
        } catch {
            FileHandle.standardError.write(Data("tusa \(command): \(error)\n".utf8))
            throw ExitCode(2)
        }
        print("party \(joined.room) \"\(joined.name)\" as \(joined.me): tusa party join \(joined.room)")
        for m in joined.roster { print(rosterLine(m, me: joined.me)) }
        fflush(nil)

        let started = ContinuousClock.now
        let state = PartyState(me: joined.me, roster: joined.roster)
        voice.start(sending: connection)
        let limit: Duration? = audio.duration.map { .milliseconds(Int64($0 * 1000)) }
        let followInput = audio.duration == nil && audio.inputIsFile
        let stop = AsyncStream.makeStream(of: String.self)
        // The live status line on a terminal; roster and key changes as lines anyway (unless --quiet).
        let live = !audio.quiet && isatty(STDERR_FILENO) != 0
        // Events: the roster, the room's end.
        let eventsTask = Task {
            for await event in connection.events {
                if let line = state.apply(event) {
                    if !audio.quiet { FileHandle.standardError.write(Data(((live ? "\r" : "") + line + "\n").utf8)) }
                }
                if case .ended(let reason) = event { stop.continuation.yield("ended: \(reason.rawValue)") }
            }
        }
        // Commands on standard input.
        let commands = Task.detached {
            while let line = readLine() {
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
        let timer = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(200))
                if let limit, started.duration(to: .now) >= limit { stop.continuation.yield("duration") }
                if followInput, voice.sourceEnded {
                    try? await Task.sleep(for: .seconds(1))
                    stop.continuation.yield("input ended")
                }
                if voice.audioError != nil { stop.continuation.yield("audio error") }
                if live { FileHandle.standardError.write(Data(("\r" + state.statusLine(voice.speakers) + "   ").utf8)) }
            }
        }
        for await _ in stop.stream { break }
        timer.cancel()
        commands.cancel()
        await voice.stop()
        await connection.close()
        eventsTask.cancel()
        if live { FileHandle.standardError.write(Data("\n".utf8)) }
        let report = PartyReport(
            room: joined.room, name: joined.name, me: joined.me.value, framesSent: voice.framesSent,
            seconds: Double(started.duration(to: .now).components.seconds),
            speakers: voice.speakers.map { PartyReport.Speaker($0, frameMilliseconds: codec.frameDuration.rawValue) },
            audioError: voice.audioError)
        if audio.json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            if let data = try? encoder.encode(report) { print(String(decoding: data, as: UTF8.self)) }
        } else {
            print(report.humanReadable)
        }
        fflush(nil)
        if let error = voice.audioError {
            FileHandle.standardError.write(Data("tusa \(command): \(error)\n".utf8))
            throw ExitCode(2)
        }
    }

    static func rosterLine(_ m: RosterEntry, me: MemberID) -> String {
        let fingerprint = m.publicKey.map { Fingerprint.digits(of: $0) } ?? "?"
        return "  \(m.member) \(m.key) \(fingerprint)\(m.creator ? " creator" : "")\(m.member == me ? " (you)" : "")"
    }
}

/// The roster as this member sees it, for the status line.
final class PartyState: @unchecked Sendable {
    private let lock = NSLock()
    private let me: MemberID
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
        var delayMeanMilliseconds: Double
        var delayP95Milliseconds: Double
        var mos: Double

        init(_ s: PartySpeakerReport, frameMilliseconds: Int) {
            let p = s.playout
            member = s.member.value
            packets = s.packetsReceived
            played = p.packetsPlayed
            let expected = max(1, p.packetsPlayed + p.lostPackets)
            lostPercent = (1000 * Double(p.lostPackets) / Double(expected)).rounded() / 10
            concealed = p.framesConcealed
            delayMeanMilliseconds = (p.delayMeanMilliseconds * 10).rounded() / 10
            delayP95Milliseconds = (p.delayP95Milliseconds * 10).rounded() / 10
            let oneWay = p.delayMeanMilliseconds + Double(frameMilliseconds) + 5
            mos = (EModel.mos(oneWayDelayMilliseconds: oneWay, lossPercent: lostPercent) * 100).rounded() / 100
        }
    }

    var room: String
    var name: String
    var me: UInt16
    var framesSent: Int
    var seconds: Double
    var speakers: [Speaker]
    var audioError: String?

    var humanReadable: String {
        var lines = ["party \(room) \"\(name)\": \(framesSent) frames sent as #\(me) in \(Int(seconds)) s"]
        if speakers.isEmpty { lines.append("  heard nobody") }
        for s in speakers {
            lines.append(
                "  heard #\(s.member): \(s.packets) packets, \(s.lostPercent)% lost, \(s.concealed) concealed, delay \(s.delayMeanMilliseconds) ms (p95 \(s.delayP95Milliseconds)), MOS \(s.mos)"
            )
        }
        if let audioError { lines.append("  audio: \(audioError)") }
        return lines.joined(separator: "\n")
    }
}
