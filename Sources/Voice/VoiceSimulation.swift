/// The real voice pipeline over a simulated network, offline: what
/// `tusa voice simulate` and `make quality` run.
///
/// input (any rate) → resample to the codec rate → [capture chain] → `VoiceSender`
/// → packets → a `NetworkTrace` on a virtual clock → `VoiceReceiver` (packet ring,
/// jitter buffer, decoder, concealment) → output at the codec rate.

/// Which playout turns the arriving packets into sound.
public enum PlayoutKind: String, CaseIterable, Sendable {
    /// Tusa's adaptive jitter buffer with FEC, concealment, comfort noise and time-stretch.
    case tusa
    /// The baseline: speexdsp's jitter buffer with the codec's plain concealment.
    case speex
    /// No network at all: every packet decoded in order (the codec alone).
    case ideal
}

public struct VoiceSimulationOptions: Sendable {
    public var codec: CodecConfiguration
    public var playout: PlayoutKind
    public var playoutConfiguration: PlayoutConfiguration
    /// The sender's cleaning chain (nil: encode the input as it is). No far end plays
    /// in a one-way simulation, so the echo canceller sees a silent reference.
    public var capture: CaptureConfiguration?
    /// Write each stage to `<directory>/<stage>.wav` (`played` is the output itself).
    public var tapsDirectory: String?
    /// Previous frames each packet carries again (``RedundantAudio``, 0–2; Tusa's playout only).
    public var redundancy = 0

    public init(
        codec: CodecConfiguration = CodecConfiguration(),
        playout: PlayoutKind = .tusa,
        playoutConfiguration: PlayoutConfiguration = PlayoutConfiguration(),
        capture: CaptureConfiguration? = nil,
        tapsDirectory: String? = nil
    ) {
        self.codec = codec
        self.playout = playout
        self.playoutConfiguration = playoutConfiguration
        self.capture = capture
        self.tapsDirectory = tapsDirectory
    }
}

public struct VoiceSimulationResult: Sendable {
    /// What the receiver played, at `sampleRate`.
    public var output: [Int16]
    public var sampleRate: Int
    public var packetsSent: Int
    public var payloadBytes: Int
    /// The jitter buffer's statistics and the end-to-end delay (nil for `.ideal`).
    public var replay: TraceReplayResult?
}

public enum VoiceSimulation {
    /// Frames needed for `sampleCount` samples at the codec rate.
    public static func frameCount(samples sampleCount: Int, codec: CodecConfiguration) -> Int {
        (sampleCount + codec.samplesPerFrame - 1) / codec.samplesPerFrame
    }

    /// Resamples `input` (at `inputRate`) to the codec's rate, encodes it frame by
    /// frame through a `VoiceSender`, and plays the packets through `trace`.
    /// The trace must cover every frame (`frameCount`); its frame duration must be the codec's.
    public static func run(
        input: [Int16], inputRate: Int, trace: NetworkTrace?, options: VoiceSimulationOptions
    ) throws(VoiceError) -> VoiceSimulationResult {
        let codec = options.codec
        let pcm = try Resampler.resampleAll(input, from: inputRate, to: codec.sampleRate)
        let taps = try options.tapsDirectory.map { (dir: String) throws(VoiceError) in
            try PCMTaps(directory: dir, sampleRate: codec.sampleRate)
        }
        defer { taps?.close() }

        // Encode.
        let sender = try VoiceSender(codec: codec, capture: options.capture, taps: taps)
        guard (0...RedundantAudio.maximumDepth).contains(options.redundancy) else {
            throw .invalidConfiguration("redundancy must be 0-\(RedundantAudio.maximumDepth), not \(options.redundancy)")
        }
        // The codec alone decodes every frame in order: nothing to carry twice.
        let redundancy = options.playout == .tusa ? options.redundancy : 0
        sender.adapt(redundancy: redundancy)
        let frames = frameCount(samples: pcm.count, codec: codec)
        let spf = codec.samplesPerFrame
        var packets: [[UInt8]] = []
        packets.reserveCapacity(frames)
        var frame = [Int16](repeating: 0, count: spf)
        var payload = [UInt8](repeating: 0, count: sender.maximumPayloadSize)
        var payloadBytes = 0
        for f in 0..<frames {
            let start = f * spf
            let end = min(start + spf, pcm.count)
            for i in 0..<spf { frame[i] = start + i < end ? pcm[start + i] : 0 }
            let encoded = try frame.withUnsafeBufferPointer { (captured) throws(VoiceError) -> EncodedFrame in
                try payload.withUnsafeMutableBufferPointer { (out) throws(VoiceError) -> EncodedFrame in
                    try sender.encode(captured: captured, reference: nil, into: UnsafeMutableRawBufferPointer(out))
                }
            }
            payloadBytes += encoded.byteCount
            packets.append(Array(payload[0..<encoded.byteCount]))
        }

        guard options.playout != .ideal else {
            let decoded = try decodeInOrder(packets, codec: codec, taps: taps)
            decoded.withUnsafeBufferPointer { taps?.write(.played, $0) }
            return VoiceSimulationResult(
                output: decoded, sampleRate: codec.sampleRate,
                packetsSent: frames, payloadBytes: payloadBytes, replay: nil)
        }
        guard let trace else {
            throw .invalidConfiguration("a network trace is needed unless the playout is 'ideal'")
        }
        guard trace.frameMilliseconds == codec.frameDuration.milliseconds else {
            throw .invalidConfiguration(
                "the trace has \(trace.frameMilliseconds) ms frames, the codec \(codec.frameDuration.milliseconds) ms")
        }
        let covered = Set(trace.entries.map(\.sequence))
        if let missing = (0..<frames).first(where: { !covered.contains($0) }) {
            throw .invalidConfiguration(
                "the trace does not cover packet \(missing) (\(frames) packets needed, \(covered.count) in the trace)")
        }
        let receiver = try VoiceReceiver(
            codec: codec, playout: options.playoutConfiguration, baseline: options.playout == .speex, taps: taps)
        receiver.redundantPayloads = redundancy > 0
        let replay = TraceReplay.run(
            trace: trace, packets: packets, playout: receiver,
            samplesPerFrame: spf, sampleRate: codec.sampleRate)
        // Offline there is no device after the receiver: what it gave is what was played.
        replay.output.withUnsafeBufferPointer { taps?.write(.played, $0) }
        return VoiceSimulationResult(
            output: replay.output, sampleRate: codec.sampleRate,
            packetsSent: frames, payloadBytes: payloadBytes, replay: replay)
    }

    /// Every packet decoded in order: the codec alone, no network.
    static func decodeInOrder(_ packets: [[UInt8]], codec: CodecConfiguration, taps: PCMTaps?) throws(VoiceError) -> [Int16] {
        let decoder = try makeDecoder(codec)
        let spf = codec.samplesPerFrame
        var out = [Int16](repeating: 0, count: packets.count * spf)
        for (i, packet) in packets.enumerated() {
            try out.withUnsafeMutableBufferPointer { (all) throws(VoiceError) in
                let slice = UnsafeMutableBufferPointer(rebasing: all[(i * spf)..<((i + 1) * spf)])
                if packet.isEmpty {
                    _ = try decoder.conceal(into: slice)
                } else {
                    _ = try packet.withUnsafeBufferPointer { (bytes) throws(VoiceError) -> Int in
                        try decoder.decode(UnsafeRawBufferPointer(bytes), into: slice)
                    }
                }
                taps?.write(.received, UnsafeBufferPointer(slice))
            }
        }
        return out
    }
}
