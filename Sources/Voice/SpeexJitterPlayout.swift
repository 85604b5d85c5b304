import CSpeexDSP

/// Baseline: speexdsp's JitterBuffer (init/put/get/tick/update_delay, default settings unless
/// `marginMilliseconds` or `lateCost` are set) with the codec's plain concealment — the
/// "Mumble-style" pipeline the benchmark compares against.
///
/// Statistics: packetsReceived, packetsPlayed, framesDecoded, framesConcealed (= lostPackets: every
/// frame the library did not return), interruptions and the buffer-delay histogram; speexdsp does not
/// report late or duplicate packets.
public final class SpeexJitterPlayout: PlayoutBuffer, PlayoutTimingReporting {
    public let configuration: PlayoutConfiguration
    private let decoder: any VoiceDecoder
    private let jitter: OpaquePointer
    private let spf: Int
    private let rate: Double
    private let packet: UnsafeMutablePointer<CChar>
    private let frame: UnsafeMutableBufferPointer<Int16>
    private var frameOffset: Int
    private var started = false
    private var stats = PlayoutStatistics()
    private var delays = DelayHistogram()
    private var arrivalMs: [Double]
    private var arrivalTs: [UInt32]
    private var concealRun = 0
    public var onPacketPlayed: ((UInt32, Int64) -> Void)?

    /// `marginMilliseconds`: speexdsp's JITTER_BUFFER_SET_MARGIN (extra delay); `lateCost`: its
    /// JITTER_BUFFER_SET_LATE_COST (default 50); nil keeps the library default.
    public init(
        decoder: any VoiceDecoder, configuration: PlayoutConfiguration = .init(),
        marginMilliseconds: Int? = nil, lateCost: Int? = nil
    ) throws(VoiceError) {
        try configuration.validate()
        spf = configuration.frameDuration.samples(atRate: configuration.sampleRate)
        guard decoder.configuration.samplesPerFrame == spf else {
            throw .invalidConfiguration("decoder frame differs from the playout frame")
        }
        guard let jb = jitter_buffer_init(Int32(spf)) else { throw .library("jitter_buffer_init failed", code: -1) }
        self.jitter = jb
        self.configuration = configuration
        self.decoder = decoder
        rate = Double(configuration.sampleRate)
        if let marginMilliseconds {
            var m = spx_int32_t(marginMilliseconds * configuration.sampleRate / 1000)
            jitter_buffer_ctl(jb, JITTER_BUFFER_SET_MARGIN, &m)
        }
        if let lateCost {
            var c = spx_int32_t(lateCost)
            jitter_buffer_ctl(jb, JITTER_BUFFER_SET_LATE_COST, &c)
        }
        packet = .allocate(capacity: configuration.maximumPayloadSize)
        frame = .allocate(capacity: spf)
        frame.initialize(repeating: 0)
        frameOffset = spf
        arrivalMs = Array(repeating: 0, count: configuration.capacity * 4)
        arrivalTs = Array(repeating: 0, count: configuration.capacity * 4)
    }

    deinit {
        jitter_buffer_destroy(jitter)
        packet.deallocate()
        frame.deallocate()
    }

    public var statistics: PlayoutStatistics {
        var s = stats
        s.takeDelays(from: delays)
        return s
    }

    public func insert(sequence: UInt16, timestamp: UInt32, payload: UnsafeRawBufferPointer, arrivalNanoseconds: Int64) {
        stats.packetsReceived += 1
        guard let base = payload.baseAddress, payload.count > 0, payload.count <= configuration.maximumPayloadSize else { return }
        var p = JitterBufferPacket()
        p.data = UnsafeMutablePointer(mutating: base.assumingMemoryBound(to: CChar.self))
        p.len = spx_uint32_t(payload.count)
        p.timestamp = timestamp
        p.span = spx_uint32_t(spf)
        p.sequence = UInt16(sequence)
        p.user_data = 0
        jitter_buffer_put(jitter, &p)  // speexdsp copies the data
        let i = Int(timestamp / UInt32(spf)) % arrivalMs.count
        arrivalMs[i] = Double(arrivalNanoseconds) / 1e6
        arrivalTs[i] = timestamp
        started = true
    }

    public func pull(nowNanoseconds: Int64, into output: UnsafeMutableBufferPointer<Int16>) {
        var filled = 0
        let nowMs = Double(nowNanoseconds) / 1e6
        while filled < output.count {
            if frameOffset == spf {
                if !started {
                    output[filled] = 0
                    filled += 1
                    continue
                }
                produce(playMs: nowMs + Double(filled) * 1000 / rate)
                frameOffset = 0
            }
            let n = min(spf - frameOffset, output.count - filled)
            for i in 0..<n { output[filled + i] = frame[frameOffset + i] }
            frameOffset += n
            filled += n
        }
    }

    private func produce(playMs: Double) {
        var p = JitterBufferPacket()
        p.data = packet
        p.len = spx_uint32_t(configuration.maximumPayloadSize)
        var offset: spx_int32_t = 0
        let r = jitter_buffer_get(jitter, &p, spx_int32_t(spf), &offset)
        var ok = false
        if r == JITTER_BUFFER_OK {
            let raw = UnsafeRawBufferPointer(start: packet, count: Int(p.len))
            if (try? decoder.decode(raw, into: frame)) != nil {
                ok = true
                stats.framesDecoded += 1
                stats.packetsPlayed += 1
                if concealRun > 0 && concealRun * configuration.frameDuration.milliseconds >= 150 {
                    stats.interruptions += 1
                    stats.interruptionMilliseconds += concealRun * configuration.frameDuration.milliseconds
                }
                concealRun = 0
                let i = Int(p.timestamp / UInt32(spf)) % arrivalMs.count
                if arrivalTs[i] == p.timestamp { delays.add(playMs - arrivalMs[i]) }
                onPacketPlayed?(p.timestamp, Int64(playMs * 1e6))
            }
        } else {
            jitter_buffer_update_delay(jitter, &p, nil)
        }
        if !ok {
            if (try? decoder.conceal(into: frame)) == nil { frame.update(repeating: 0) }
            stats.framesConcealed += 1
            stats.lostPackets += 1
            concealRun += 1
        }
        jitter_buffer_tick(jitter)
    }
}
