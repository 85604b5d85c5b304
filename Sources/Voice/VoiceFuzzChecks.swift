import Foundation

/// What the VoiceFuzz target (and the pinned crash inputs' test) runs on each
/// input: the receive side of a call or a party member, from the packets a peer
/// sends (after the secure session opened them, so with whatever sequence numbers,
/// timestamps and payloads the peer chose) to the speaker. The input is read as a
/// stream of packets (see ``packets(_:)``), each received by a ``VoiceReceiver``
/// (redundant-audio parsing, the jitter buffer, the codec's decoder) of every codec,
/// with Tusa's playout as a call and as a party sets it and speexdsp's, rendered
/// between them at lengths the input also picks, then on with nothing coming.
/// Nothing may trap.
public enum VoiceFuzzChecks {
    public static func exercise(_ bytes: [UInt8]) {
        redundantBlocks(bytes)
        let packets = packets(bytes)
        guard !packets.isEmpty else { return }
        for codec in codecs {
            for playout in playouts { receive(packets, codec: codec, playout: playout) }
        }
    }

    /// Streams a peer could send, a fuzzer's first corpus: eight frames of a tone each
    /// from Opus (first), Speex and L16 (10 ms frames: a packet's length is one byte), 20 ms apart; packets half a frame apart, a
    /// tick apart, back and forth; redundant audio, whole and cut short.
    public static func seeds() -> [[UInt8]] {
        var seeds: [[UInt8]] = []
        let codecs = [
            CodecConfiguration(kind: .opus), CodecConfiguration(kind: .speex),
            CodecConfiguration(kind: .l16, frameDuration: .ms10, inbandFEC: false),
        ]
        for codec in codecs {
            guard let encoder = try? makeEncoder(codec) else { continue }
            var stream: [UInt8] = []
            var pcm = [Int16](repeating: 0, count: codec.samplesPerFrame)
            var out = [UInt8](repeating: 0, count: encoder.maximumPacketSize)
            for f in 0..<8 {
                for i in pcm.indices { pcm[i] = Int16(6000 * sin(Double(f * pcm.count + i) * 0.05)) }
                let n = pcm.withUnsafeBufferPointer { p in
                    out.withUnsafeMutableBytes { (try? encoder.encode(p, into: $0)) ?? 0 }
                }
                if n < 256 { stream += [0x60, UInt8(n)] + out[0..<n] }
            }
            if !stream.isEmpty { seeds.append(stream) }
        }
        seeds.append((0..<40).flatMap { i -> [UInt8] in [0x42, i % 2 == 0 ? 160 : 1, 1, 0x42] })
        seeds.append((0..<40).flatMap { i -> [UInt8] in [i % 3 == 0 ? 0x64 : 0x62, 200, 3, 1, 2, 3] })
        seeds.append([0x01, 12, 0x80 | 111, 0x00, 0x50, 0x02, 111, 1, 2, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF])
        seeds.append([0x01, 3, 0x80, 0x00, 0x50])
        return seeds
    }

    /// Opus at 8 kHz in 20 and 10 ms frames and at 16 kHz, Speex and L16 at 8 kHz:
    /// what `tusa call` and `tusa party` offer, and a wideband call.
    static let codecs = [
        CodecConfiguration(kind: .opus), CodecConfiguration(kind: .opus, frameDuration: .ms10),
        CodecConfiguration(kind: .opus, sampleRate: 16_000),
        CodecConfiguration(kind: .speex, sampleRate: 8_000), CodecConfiguration(kind: .l16, sampleRate: 8_000),
    ]

    /// Tusa's playout as a call sets it, as a party does (delay added by a late packet
    /// taken off in pauses, `PartyVoice.defaultPlayout`), and speexdsp's (nil).
    static let playouts: [PlayoutConfiguration?] = [
        PlayoutConfiguration(), PlayoutConfiguration(minimumDelayMilliseconds: 0, shrinkInPausesUpToMilliseconds: 60), nil,
    ]

    /// One packet as the input describes it.
    struct Packet {
        var sequence: UInt16
        var timestamp: UInt32
        var arrivalNanoseconds: Int64
        var redundant: Bool
        var payload: [UInt8]
        /// Samples to render after it (0: none).
        var render: Int
    }

    /// The input as packets, at most 64: each a control byte, then what it asks for.
    ///
    /// ```
    /// control  bit 0: redundant audio; bits 1-2: the timestamp (0: 160 on, 20 ms
    ///          at 8 kHz; 1: on by the next byte; 2: back by it; 3: the next four
    ///          bytes); bit 3: the sequence jumps by the next byte (else one on);
    ///          bit 4: render the next byte × 8 samples after it; bits 5-7: arrival
    ///          (the bits × 10 ms on, less 10 ms: a burst at 1, and at 0 before the
    ///          last render, as a packet taken on the network's thread can be)
    /// length   one byte, then that many bytes of payload (fewer where the input ends)
    /// ```
    static func packets(_ bytes: [UInt8]) -> [Packet] {
        var at = 0
        func next() -> UInt8? {
            guard at < bytes.count else { return nil }
            defer { at += 1 }
            return bytes[at]
        }
        var packets: [Packet] = []
        var sequence: UInt16 = 1
        var timestamp: UInt32 = 1_000
        var arrival: Int64 = 1_000_000_000
        while packets.count < 64, let control = next() {
            switch (control >> 1) & 0x03 {
            case 0: timestamp &+= 160
            case 1: timestamp &+= UInt32(next() ?? 0)
            case 2: timestamp &-= UInt32(next() ?? 0)
            default:
                var t: UInt32 = 0
                for _ in 0..<4 { t = t << 8 | UInt32(next() ?? 0) }
                timestamp = t
            }
            sequence &+= control & 0x08 != 0 ? UInt16(next() ?? 0) : 1
            let render = control & 0x10 != 0 ? Int(next() ?? 0) * 8 : 0
            arrival += Int64(control >> 5) * 10_000_000 - 10_000_000
            let length = Int(next() ?? 0)
            let end = min(bytes.count, at + length)
            let payload = Array(bytes[at..<end])
            at = end
            packets.append(
                Packet(
                    sequence: sequence, timestamp: timestamp, arrivalNanoseconds: arrival, redundant: control & 0x01 != 0,
                    payload: payload, render: render))
        }
        return packets
    }

    /// A redundant-audio payload's blocks lie within it, at most ``RedundantAudio/maximumDepth`` before the primary.
    private static func redundantBlocks(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { payload in
            var blocks = 0
            var sum = 0
            try? RedundantAudio.forEachBlock(payload) { _, back, block in
                blocks += 1
                sum += block.count
                precondition(back <= RedundantAudio.maximumDepth, "a redundant block further back than the depth")
            }
            precondition(blocks <= RedundantAudio.maximumDepth + 1 && sum <= payload.count, "blocks outside their payload")
        }
    }

    private static func receive(_ packets: [Packet], codec: CodecConfiguration, playout: PlayoutConfiguration?) {
        guard let receiver = try? VoiceReceiver(codec: codec, playout: playout, baseline: playout == nil) else {
            preconditionFailure("no receiver for \(codec)")
        }
        var output = [Int16](repeating: 0x5555, count: 4 * codec.samplesPerFrame)
        // The audio clock never goes back: a packet stamped before the last render is
        // rendered at that render's time.
        var clock = Int64.min
        for packet in packets {
            clock = max(clock, packet.arrivalNanoseconds)
            packet.payload.withUnsafeBytes {
                _ = receiver.receive(
                    sequence: packet.sequence, timestamp: packet.timestamp, payload: $0,
                    arrivalNanoseconds: packet.arrivalNanoseconds, redundant: packet.redundant)
            }
            // A frame, and as many samples as the input asks for.
            for count in [codec.samplesPerFrame, packet.render] where count > 0 {
                let n = min(count, output.count)
                output.withUnsafeMutableBufferPointer {
                    receiver.render(nowNanoseconds: clock, into: UnsafeMutableBufferPointer(rebasing: $0[0..<n]))
                }
            }
        }
        // Time goes on with nothing coming: concealment, then comfort noise or silence.
        let last = max(clock, packets.last?.arrivalNanoseconds ?? 0)
        for k in 1...10 {
            output.withUnsafeMutableBufferPointer {
                receiver.render(
                    nowNanoseconds: last + Int64(k) * 20_000_000,
                    into: UnsafeMutableBufferPointer(rebasing: $0[0..<codec.samplesPerFrame]))
            }
        }
    }
}
