/// Uncompressed 16-bit PCM as a codec (big-endian payload, RTP L16): for LAN use, tests and benchmarks.
/// Concealment repeats the last frame with a fade; no redundancy.
public final class L16Encoder: VoiceEncoder {
    public let configuration: CodecConfiguration
    public var maximumPacketSize: Int { configuration.samplesPerFrame * 2 }
    public init(_ configuration: CodecConfiguration) { self.configuration = configuration }

    public func encode(_ pcm: UnsafeBufferPointer<Int16>, into packet: UnsafeMutableRawBufferPointer) throws(VoiceError) -> Int {
        let n = configuration.samplesPerFrame
        guard pcm.count >= n else { throw .bufferTooSmall(needed: n, available: pcm.count) }
        guard packet.count >= 2 * n else { throw .bufferTooSmall(needed: 2 * n, available: packet.count) }
        for i in 0..<n {
            let v = UInt16(bitPattern: pcm[i])
            packet[2 * i] = UInt8(v >> 8)
            packet[2 * i + 1] = UInt8(v & 0xFF)
        }
        return 2 * n
    }
    public func setPacketLossPercent(_ percent: Int) throws(VoiceError) {}
    public func setBitrate(_ bitsPerSecond: Int) throws(VoiceError) {}
    public func setInbandFEC(_ enabled: Bool) throws(VoiceError) {}
}

public final class L16Decoder: VoiceDecoder {
    public let configuration: CodecConfiguration
    public var recoversFromNextPacket: Bool { false }
    private let last: UnsafeMutableBufferPointer<Int16>
    private var gain: Float = 1

    public init(_ configuration: CodecConfiguration) {
        self.configuration = configuration
        last = .allocate(capacity: configuration.samplesPerFrame)
        last.initialize(repeating: 0)
    }
    deinit { last.deallocate() }

    public func decode(_ packet: UnsafeRawBufferPointer, into pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        let n = configuration.samplesPerFrame
        guard packet.count == 2 * n else { throw .invalidPacket("L16 packet of \(packet.count) bytes, expected \(2 * n)") }
        guard pcm.count >= n else { throw .bufferTooSmall(needed: n, available: pcm.count) }
        for i in 0..<n {
            let v = Int16(bitPattern: UInt16(packet[2 * i]) << 8 | UInt16(packet[2 * i + 1]))
            pcm[i] = v
            last[i] = v
        }
        gain = 1
        return n
    }
    public func decodeRedundancy(from nextPacket: UnsafeRawBufferPointer, into pcm: UnsafeMutableBufferPointer<Int16>)
        throws(VoiceError) -> Int
    {
        try conceal(into: pcm)
    }
    /// Repeats the last frame, its gain halving per frame (ramped within the frame).
    public func conceal(into pcm: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        let n = configuration.samplesPerFrame
        guard pcm.count >= n else { throw .bufferTooSmall(needed: n, available: pcm.count) }
        let g0 = gain
        let g1 = gain * 0.5
        for i in 0..<n {
            let g = g0 + (g1 - g0) * Float(i) / Float(n)
            pcm[i] = Int16(Float(last[i]) * g)
        }
        gain = g1
        return n
    }
    public func reset() {
        last.update(repeating: 0)
        gain = 1
    }
}
