import ArgumentParser
import Foundation
import Voice

/// `tusa voice`: the voice engine offline.
struct VoiceCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "voice",
        abstract: "The voice engine without a network: simulate a call's audio path, list audio devices.",
        subcommands: [Simulate.self, Devices.self]
    )
}

extension VoiceCommand {
    /// `tusa voice simulate`: the real pipeline over a simulated network.
    struct Simulate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Run speech through the real voice pipeline over a simulated network and print what happened.",
            discussion: """
                The input (a WAV file, any rate) is resampled to the codec rate, encoded frame by \
                frame, sent through a network trace (generated from --loss/--burst/--jitter, or \
                read with --trace), played out by the jitter buffer and written to --out at the \
                codec rate. The sender's loss hint follows the simulated loss, as receiver reports \
                would make it in a call.

                Trace format (--trace, --save-trace): one packet per line, \
                "SEQUENCE SEND_MS ARRIVAL_MS" or "SEQUENCE SEND_MS lost"; see README.
                """
        )

        @Option(name: .customLong("in"), help: "Speech to send (WAV, any rate; channels are mixed down).")
        var input: String

        @Option(name: .customLong("out"), help: "Where to write what the receiver played (16-bit WAV at the codec rate).")
        var output: String

        @Option(help: "Codec: opus, speex (narrowband) or l16 (uncompressed).")
        var codec: String = "opus"

        @Option(help: "Frame duration in ms: 10 or 20 (Speex: 20 only).")
        var frame: Int = 20

        @Option(help: "Codec bitrate in b/s (default: 24000 Opus, 15000 Speex).")
        var bitrate: Int?

        @Option(help: "Encoder complexity, 0-10.")
        var complexity: Int = 5

        @Flag(help: "Opus wideband (16 kHz) instead of narrowband.")
        var wideband = false

        @Flag(help: "Variable bitrate (default: constant, so packet sizes do not leak speech).")
        var vbr = false

        @Flag(help: "Discontinuous transmission in silence.")
        var dtx = false

        @Flag(name: .customLong("no-fec"), help: "Turn Opus in-band FEC off.")
        var noFEC = false

        @Option(
            help:
                "Carry the previous 0, 1 or 2 frames again in every packet (redundant audio, RFC 2198): a burst of that many lost packets is rebuilt from the next (tusa playout only). auto: as a call's sender sets it from the receiver's reports of this network's loss and burst length."
        )
        var redundancy = "0"

        @Option(help: "Packet loss in percent (\"10\" or \"10%\").")
        var loss: String = "0"

        @Option(help: "Mean loss burst length in packets (1 = independent losses).")
        var burst: Double = 1

        @Option(help: "Delay jitter in ms.")
        var jitter: Double = 0

        @Option(help: "One-way base delay in ms.")
        var delay: Double = 20

        @Option(help: "Seconds between delay spikes (0 = none).")
        var spikeInterval: Double = 0

        @Option(help: "Height of a delay spike in ms.")
        var spike: Double = 0

        @Option(help: "Seed for the generated trace.")
        var seed: UInt64 = 1

        @Option(help: "Replay this trace instead of generating one.")
        var trace: String?

        @Option(help: "Write the trace used to this file.")
        var saveTrace: String?

        @Option(
            help:
                "Playout: tusa (adaptive jitter buffer), speex (speexdsp's jitter buffer + plain concealment), ideal (no network)."
        )
        var playout: String = "tusa"

        @Option(help: "Most of the speech time the jitter buffer may stretch or shrink, in percent.")
        var maxStretch: Double = 5

        @Option(help: "The jitter buffer's hard maximum delay in ms.")
        var maxDelay: Int = 400

        @Flag(help: "Run the sender's cleaning chain (echo canceller, noise suppression, VAD).")
        var preprocess = false

        @Option(
            help:
                "Write every stage (captured, echo-cancelled with --preprocess, sent, received, played) as WAV files into this directory."
        )
        var taps: String?

        @Flag(help: "Print the report as JSON.")
        var json = false

        func run() throws {
            do {
                try simulate()
            } catch {
                FileHandle.standardError.write(Data("tusa voice simulate: \(error)\n".utf8))
                throw ExitCode(1)
            }
        }

        private func simulate() throws(VoiceError) {
            guard let kind = CodecKind(rawValue: codec) else {
                throw .invalidConfiguration("--codec must be opus, speex or l16, not \(codec)")
            }
            guard let frameDuration = FrameDuration(rawValue: frame) else {
                throw .invalidConfiguration("--frame must be 10 or 20, not \(frame)")
            }
            guard let playoutKind = PlayoutKind(rawValue: playout) else {
                throw .invalidConfiguration("--playout must be tusa, speex or ideal, not \(playout)")
            }
            let lossPercent = try Self.percent(loss)
            guard burst >= 1 else { throw .invalidConfiguration("--burst must be at least 1, not \(burst)") }
            guard jitter >= 0, delay >= 0, spike >= 0, spikeInterval >= 0 else {
                throw .invalidConfiguration("--jitter, --delay, --spike and --spike-interval cannot be negative")
            }
            if wideband && kind == .speex { throw .invalidConfiguration("--wideband is for Opus only") }

            let codecConfiguration = CodecConfiguration(
                kind: kind,
                sampleRate: wideband ? 16_000 : voiceSampleRate,
                frameDuration: frameDuration,
                bitrate: bitrate ?? (kind == .opus ? 24_000 : 15_000),
                complexity: complexity,
                constantBitrate: !vbr,
                discontinuousTransmission: dtx,
                inbandFEC: !noFEC,
                packetLossPercent: Int(lossPercent.rounded()))

            let (samples, inputRate) = try WAVFile.read(path: input)
            guard !samples.isEmpty else { throw .file(path: input, reason: "no audio in the file") }

            let frames = VoiceSimulation.frameCount(
                samples: Int((Int64(samples.count) * Int64(codecConfiguration.sampleRate)) / Int64(inputRate)),
                codec: codecConfiguration)
            var networkTrace: NetworkTrace?
            if playoutKind != .ideal {
                if let trace {
                    networkTrace = try NetworkTrace.load(path: trace)
                } else {
                    var model = NetworkModel()
                    model.baseDelayMilliseconds = delay
                    model.jitterMilliseconds = jitter
                    model.lossRate = lossPercent / 100
                    model.meanBurstLength = burst
                    model.spikeIntervalSeconds = spikeInterval
                    model.spikeMilliseconds = spike
                    networkTrace = NetworkTrace.generate(
                        model, packets: frames, frameMilliseconds: frameDuration.milliseconds, seed: seed)
                }
                if let saveTrace, let networkTrace { try networkTrace.save(path: saveTrace) }
            }

            guard maxStretch >= 0, maxStretch <= 50 else { throw .invalidConfiguration("--max-stretch must be 0...50 %") }
            var playoutConfiguration = PlayoutConfiguration()
            playoutConfiguration.maximumStretch = maxStretch / 100
            playoutConfiguration.maximumDelayMilliseconds = maxDelay
            var options = VoiceSimulationOptions(
                codec: codecConfiguration, playout: playoutKind, playoutConfiguration: playoutConfiguration,
                capture: preprocess ? CaptureConfiguration(echoCancellation: false) : nil,
                tapsDirectory: taps)
            switch redundancy {
            case "auto":
                var policy = RedundancyPolicy()
                let heard = networkTrace?.lossReport ?? (lossPercent: 0, meanBurstLength: 0)
                options.redundancy = policy.report(lossPercent: heard.lossPercent, meanBurstLength: heard.meanBurstLength)
            default:
                guard let depth = Int(redundancy), (0...RedundantAudio.maximumDepth).contains(depth) else {
                    throw .invalidConfiguration("--redundancy must be 0, 1, 2 or auto, not \(redundancy)")
                }
                options.redundancy = depth
            }
            let result = try VoiceSimulation.run(
                input: samples, inputRate: inputRate, trace: networkTrace, options: options)
            try WAVFile.write(path: output, samples: result.output, sampleRate: result.sampleRate)
            report(result, codec: codecConfiguration, playout: playoutKind, inputRate: inputRate, redundancy: options.redundancy)
        }

        static func dictionary(_ s: PlayoutStatistics) -> [String: Any] {
            [
                "packetsReceived": s.packetsReceived, "duplicates": s.duplicates, "packetsPlayed": s.packetsPlayed,
                "latePackets": s.latePackets, "lostPackets": s.lostPackets, "framesDecoded": s.framesDecoded,
                "framesRecoveredByFEC": s.framesRecoveredByFEC, "framesRecoveredByRedundancy": s.framesRecoveredByRedundancy,
                "framesConcealed": s.framesConcealed,
                "framesComfortNoise": s.framesComfortNoise,
                "concealedByCause": [
                    "lost": s.concealedByCause.lost, "late": s.concealedByCause.late,
                    "bufferEmpty": s.concealedByCause.bufferEmpty,
                ],
                "accelerateSamples": s.accelerateSamples, "expandSamples": s.expandSamples,
                "framesDroppedInSilence": s.framesDroppedInSilence, "framesInsertedInSilence": s.framesInsertedInSilence,
                "catchUps": s.catchUps, "interruptions": s.interruptions, "interruptionMilliseconds": s.interruptionMilliseconds,
                "targetDelayMilliseconds": s.targetDelayMilliseconds, "bufferDelayMeanMilliseconds": s.delayMeanMilliseconds,
                "bufferDelayP95Milliseconds": s.delayP95Milliseconds,
            ]
        }

        /// "10", "10%", "0.5" → percent in 0...100.
        static func percent(_ text: String) throws(VoiceError) -> Double {
            let trimmed = text.hasSuffix("%") ? String(text.dropLast()) : text
            guard let value = Double(trimmed), value >= 0, value <= 100 else {
                throw .invalidConfiguration("--loss must be a percentage from 0 to 100, not \(text)")
            }
            return value
        }

        private func report(
            _ result: VoiceSimulationResult, codec: CodecConfiguration, playout: PlayoutKind, inputRate: Int, redundancy: Int
        ) {
            let seconds = Double(result.packetsSent * codec.frameDuration.milliseconds) / 1000
            let kbps = seconds > 0 ? Double(result.payloadBytes * 8) / seconds / 1000 : 0
            var fields: [(String, String)] = [
                (
                    "codec",
                    "\(codec.kind.rawValue) \(codec.sampleRate) Hz, \(codec.frameDuration.milliseconds) ms, \(codec.bitrate) b/s\(codec.constantBitrate ? " CBR" : " VBR")\(codec.inbandFEC ? ", FEC" : "")"
                ),
                ("playout", playout.rawValue),
                ("input", "\(input) (\(inputRate) Hz)"),
                (
                    "output",
                    "\(output) (\(result.sampleRate) Hz, \(String(format: "%.2f", Double(result.output.count) / Double(result.sampleRate))) s)"
                ),
                (
                    "packets sent",
                    "\(result.packetsSent) (\(String(format: "%.1f", kbps)) kb/s payload\(redundancy > 0 ? ", each with the previous \(redundancy) again" : ""))"
                ),
            ]
            if let replay = result.replay {
                fields += [
                    ("network loss", String(format: "%.2f %%", replay.networkLossRate * 100)),
                    ("late loss", String(format: "%.2f %%", replay.lateLossRate * 100)),
                    (
                        "delay mean / p95",
                        String(
                            format: "%.1f / %.1f ms (above the minimum transit)", replay.meanDelayMilliseconds,
                            replay.p95DelayMilliseconds)
                    ),
                ]
            }
            if json {
                var object: [String: Any] = [
                    "codec": codec.kind.rawValue, "sampleRate": codec.sampleRate,
                    "frameMilliseconds": codec.frameDuration.milliseconds, "bitrate": codec.bitrate,
                    "playout": playout.rawValue, "packetsSent": result.packetsSent,
                    "payloadBytes": result.payloadBytes, "outputSamples": result.output.count,
                    "redundancy": redundancy,
                ]
                if let replay = result.replay {
                    object["networkLossRate"] = replay.networkLossRate
                    object["lateLossRate"] = replay.lateLossRate
                    object["meanDelayMilliseconds"] = replay.meanDelayMilliseconds
                    object["p95DelayMilliseconds"] = replay.p95DelayMilliseconds
                    object["playoutStatistics"] = Self.dictionary(replay.statistics)
                }
                if let data = try? JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys]),
                    let text = String(data: data, encoding: .utf8)
                {
                    print(text)
                }
                return
            }
            let width = fields.map(\.0.count).max() ?? 0
            for (key, value) in fields {
                print(key.padding(toLength: width, withPad: " ", startingAt: 0) + "  " + value)
            }
            if let replay = result.replay {
                print("")
                print(replay.statistics.description)
            }
        }
    }

    /// `tusa voice devices`: the live audio devices, from the sound server or PortAudio.
    struct Devices: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "List capture and playback devices, with their rates and channels: PulseAudio's (or PipeWire's) when its server answers, else PortAudio's. The names are what --in-device and --out-device take."
        )

        @Flag(help: "Print the list as JSON.")
        var json = false

        func run() throws {
            let backend: AudioDevices.Backend
            let devices: [AudioDeviceInfo]
            do { (backend, devices) = try AudioDevices.list() } catch {
                FileHandle.standardError.write(Data("tusa voice devices: \(error)\n".utf8))
                throw ExitCode(1)
            }
            if json {
                let entries = devices.map { d -> [String: Any] in
                    [
                        "name": d.name, "description": d.description, "direction": d.direction.rawValue,
                        "sampleRate": d.sampleRate, "channels": d.channels, "default": d.isDefault,
                    ]
                }
                let object: [String: Any] = ["backend": backend.rawValue, "devices": entries]
                let data = try JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys])
                print(String(decoding: data, as: UTF8.self))
                return
            }
            print("\(backend.rawValue): \(devices.isEmpty ? "no devices" : "\(devices.count) devices")")
            for direction in [AudioDeviceInfo.Direction.capture, .playback] {
                let these = devices.filter { $0.direction == direction }
                guard !these.isEmpty else { continue }
                print(direction == .capture ? "capture (--in-device):" : "playback (--out-device):")
                for d in these {
                    let about = d.description == d.name ? "" : "  \(d.description)"
                    print("  \(d.isDefault ? "*" : " ") \(d.name)  \(d.sampleRate) Hz, \(d.channels) ch\(about)")
                }
            }
        }
    }
}
