import ArgumentParser
import Call
import Foundation
import Logging
import Rendezvous
import STUN
import Secure
import Transport
import TusaBase
import Voice

/// What `tusa call` and `tusa answer` share: the rendezvous, the identity, audio and codec.
struct CallOptions: ParsableArguments {
    @Option(
        name: .customLong("rendezvous"),
        help: ArgumentHelp(
            "The relay's rendezvous, HOST:PORT (tusa relay --rendezvous-port), or a directory's (tusa directory). \(RendezvousServers.listHelp)",
            valueName: "host:port"))
    var rendezvous: String

    @Option(
        name: .customLong("identity"),
        help: ArgumentHelp(
            "Identity key file (tusa keygen); default ~/.config/tusa/identity.key, or a fresh key for this call when that is missing.",
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

    @Flag(help: "Play the --in file over and over: the call then lasts until --duration or a hang-up.")
    var loop = false

    @Option(
        name: .customLong("out"),
        help: ArgumentHelp(
            "Where what you hear goes: a WAV file (8 kHz), 'device' (the default output) or 'device:NAME', or 'none' (the default; 'device' with --out-device).",
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

    @Option(help: "Hang up after this many seconds (default: when the input ends, or the peer hangs up).")
    var duration: Double?

    @Option(
        help: ArgumentHelp(
            "Impair outgoing media: loss=10%,burst=3,jitter=30ms,delay=20ms,spike=300ms/10s,seed=N (any subset).",
            valueName: "spec"))
    var impair: String?

    @Flag(
        name: .customLong("relay-only"),
        help:
            "Offer only the relay's candidate: the peer never learns this machine's addresses, and media always goes through the relay (needs a relay that hands out TURN credentials)."
    )
    var relayOnly = false

    @Option(
        help: ArgumentHelp(
            "A STUN server for a server-reflexive candidate, when the rendezvous hands out no TURN credentials.",
            valueName: "host:port"))
    var stun: String?

    @Flag(help: "Print the final report as JSON on standard output.")
    var json = false

    @Flag(help: "No live status line on standard error.")
    var quiet = false

    func loadIdentity() throws -> Identity { try AudioArguments.identity(identity) }

    func codecConfiguration() throws -> CodecConfiguration {
        try AudioArguments.codec(codec, frame: frame, bitrate: bitrate)
    }

    func source(placing: Bool) throws -> AudioSource? {
        try AudioArguments.source(input, loop: loop, device: inputDevice, placing: placing)
    }

    func sink() throws -> AudioSink? { try AudioArguments.sink(output, device: outputDevice) }

    func servers() throws -> [TransportAddress] { try RendezvousServers.parse(rendezvous) }

    func agentOptions() throws -> CallAgent.Options {
        var o = CallAgent.Options()
        o.codec = try codecConfiguration()
        o.maximumDuration = try duration.map { try seconds($0, of: "--duration") }
        o.candidatePolicy = relayOnly ? .relay : .all
        if let stun { o.stunServer = try HostAndPort.resolve(stun, option: "--stun", defaultPort: 3478) }
        o.impairment = try AudioArguments.impairment(impair)
        o.echoCancellation = AudioArguments.echoCancellation(echoCancel, input: input, output: output)
        if !quiet {
            o.onStatus = { report in
                FileHandle.standardError.write(Data(("\r" + report.statusLine + "   ").utf8))
            }
        }
        return o
    }

    /// Prints the report; a call whose audio failed (whatever ended it) then exits 2
    /// with the reason on standard error.
    func finish(_ report: CallReport, command: String, source: AudioSource?, sink: AudioSink?) throws {
        var report = report
        (report.captureDevice, report.playbackDevice) = LiveAudioStatistics.of(source: source, sink: sink)
        if !quiet { FileHandle.standardError.write(Data("\n".utf8)) }
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            if let data = try? encoder.encode(report) { print(String(decoding: data, as: UTF8.self)) }
        } else {
            print(report.humanReadable)
        }
        flushStandardOutput()
        if let audioError = report.audioError {
            FileHandle.standardError.write(Data("tusa \(command): \(audioError)\n".utf8))
            throw ExitCode(2)
        }
    }
}

/// Errors only on standard error, or the level `TUSA_LOG` names (trace … critical).
func quietLogger() -> Logger {
    var logger = Logger(label: "tusa.call")
    logger.logLevel = ProcessInfo.processInfo.environment["TUSA_LOG"].flatMap(Logger.Level.init(rawValue:)) ?? .error
    return logger
}

/// `tusa call PEER`: calls a peer registered at the rendezvous.
struct CallCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "call",
        abstract: "Place an end-to-end encrypted call to PEER (its public key) through a relay's rendezvous.",
        discussion:
            "Ctrl-C hangs up (the peer is told) and prints the report; a second Ctrl-C exits at once. Exit status: 0 when the call ran and ended normally (Ctrl-C included), 64 on bad usage, 2 when the call could not be placed or failed, or its audio could not be read or written, 130 on Ctrl-C before the call was set up."
    )

    @Argument(help: "The peer's public key (base64, as tusa keygen prints it).")
    var peer: String

    @OptionGroup var options: CallOptions

    func run() async throws {
        guard let key = PublicKey(base64: peer) else {
            throw ValidationError("PEER '\(peer)' is not a 32-byte base64 public key")
        }
        let (identity, servers, agentOptions, source, sink) = try prepare(options, placing: true)
        guard key != identity.publicKey else {
            throw ValidationError("PEER is this identity's own key: call another (or give --identity)")
        }
        let report: CallReport
        // Ctrl-C or SIGTERM hangs up (the peer told) and reports; from here on.
        let hangUp = HangUpSwitch()
        let interrupts = onInterrupt { hangUp.press() }
        defer { for source in interrupts { source.cancel() } }
        do {
            let rendezvous = try await RendezvousConnection.connect(toAnyOf: servers, identity: identity.privateKey)
            let agent = CallAgent(rendezvous: rendezvous, identity: identity, options: agentOptions, logger: quietLogger())
            hangUp.attach(agent)
            report = try await agent.call(key, source: source, sink: sink)
            await rendezvous.close()
        } catch CallError.hungUp {
            sink?.close()
            FileHandle.standardError.write(Data("tusa call: \(CallError.hungUp)\n".utf8))
            throw ExitCode(130)
        } catch {
            sink?.close()
            FileHandle.standardError.write(Data("tusa call: \(error)\n".utf8))
            throw ExitCode(2)
        }
        try options.finish(report, command: "call", source: source, sink: sink)
    }
}

/// `tusa answer`: waits for a call and answers it.
struct AnswerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "answer",
        abstract: "Register at a relay's rendezvous, wait for a call and answer it.",
        discussion:
            "Prints 'answering as KEY' once registered. Ctrl-C hangs up a call (the peer is told) and prints the report. Exit status: 0 when a call ran and ended normally (Ctrl-C included), 64 on bad usage, 2 when no call came or it failed, or its audio could not be read or written, 130 on Ctrl-C before a call was set up."
    )

    @Option(help: ArgumentHelp("Answer only this caller (public key).", valueName: "key"))
    var from: String?

    @Option(help: "Seconds to wait for a call.")
    var timeout: Double = 60

    @OptionGroup var options: CallOptions

    func run() async throws {
        let only = try from.map { text -> PublicKey in
            guard let k = PublicKey(base64: text) else {
                throw ValidationError("--from '\(text)' is not a 32-byte base64 public key")
            }
            return k
        }
        let ringTimeout = try seconds(timeout, of: "--timeout")
        var (identity, servers, agentOptions, source, sink) = try prepare(options, placing: false)
        agentOptions.ringTimeout = ringTimeout
        let report: CallReport
        let hangUp = HangUpSwitch()
        let interrupts = onInterrupt { hangUp.press() }
        defer { for source in interrupts { source.cancel() } }
        do {
            let rendezvous = try await RendezvousConnection.connect(toAnyOf: servers, identity: identity.privateKey)
            let agent = CallAgent(rendezvous: rendezvous, identity: identity, options: agentOptions, logger: quietLogger())
            hangUp.attach(agent)
            print("answering as \(identity.publicKey.base64)")
            flushStandardOutput()
            report = try await agent.answer(only: only, source: source, sink: sink)
            await rendezvous.close()
        } catch CallError.hungUp {
            sink?.close()
            FileHandle.standardError.write(Data("tusa answer: \(CallError.hungUp)\n".utf8))
            throw ExitCode(130)
        } catch {
            sink?.close()
            FileHandle.standardError.write(Data("tusa answer: \(error)\n".utf8))
            throw ExitCode(2)
        }
        try options.finish(report, command: "answer", source: source, sink: sink)
    }
}

private func prepare(_ options: CallOptions, placing: Bool) throws -> (
    Identity, [TransportAddress], CallAgent.Options, AudioSource?, AudioSink?
) {
    // A file size limit (ulimit -f) then fails the write with EFBIG: the recording
    // stops and says so, rather than the process being killed with it unclosed.
    signal(SIGXFSZ, SIG_IGN)
    let identity: Identity
    do { identity = try options.loadIdentity() } catch { throw ValidationError("\(error)") }
    let servers = try options.servers()
    let agentOptions = try options.agentOptions()
    let source: AudioSource?
    let sink: AudioSink?
    do {
        source = try options.source(placing: placing)
        sink = try options.sink()
    } catch {
        throw ValidationError("\(error)")
    }
    return (identity, servers, agentOptions, source, sink)
}
