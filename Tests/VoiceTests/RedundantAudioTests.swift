import Foundation
import Testing

@testable import Voice

/// Redundant audio (RFC 2198): the payload format, the sender that carries the
/// previous frames again, the jitter buffer that plays a lost frame from a later
/// packet's copy, and the policy that sizes it from the receiver's reports.
@Suite struct RedundantAudioTests {
    private func blocks(_ payload: [UInt8]) throws -> [(offset: UInt32, back: Int, bytes: [UInt8])] {
        var found: [(offset: UInt32, back: Int, bytes: [UInt8])] = []
        var failure: (any Error)?
        payload.withUnsafeBytes { raw in
            do { try RedundantAudio.forEachBlock(raw) { found.append(($0, $1, Array($2))) } } catch { failure = error }
        }
        if let failure { throw failure }
        return found
    }

    private func write(_ primary: [UInt8], older: (UInt32, [UInt8])?, previous: (UInt32, [UInt8])?) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 2048)
        let olderBytes = older?.1 ?? []
        let previousBytes = previous?.1 ?? []
        let n = try primary.withUnsafeBytes { p in
            try olderBytes.withUnsafeBytes { o in
                try previousBytes.withUnsafeBytes { v in
                    try out.withUnsafeMutableBytes { dst in
                        try RedundantAudio.write(
                            primary: p, payloadType: 111, older: older.map { .init(offset: $0.0, bytes: o) },
                            previous: previous.map { .init(offset: $0.0, bytes: v) }, into: dst)
                    }
                }
            }
        }
        return Array(out.prefix(n))
    }

    /// RFC 2198 §3: F=1, block PT, 14-bit timestamp offset, 10-bit length per
    /// redundant block; F=0 and the primary's PT last; then the data, oldest first.
    @Test func theLayoutIsRFC2198sAndReadsBack() throws {
        let payload = try write([9, 9, 9], older: (320, [1, 2]), previous: (160, [5]))
        #expect(
            payload == [
                0x80 | 111, 0x05, 0x00, 0x02,  // offset 320 = 0b101_0000_0000 << 10, length 2
                0x80 | 111, 0x02, 0x80, 0x01,  // offset 160, length 1
                111,
                1, 2, 5, 9, 9, 9,
            ])
        let read = try blocks(payload)
        #expect(read.map(\.offset) == [320, 160, 0] && read.map(\.back) == [2, 1, 0])
        #expect(read.map(\.bytes) == [[1, 2], [5], [9, 9, 9]])
        // No previous frame: a one-byte header and the primary.
        #expect(try write([7, 7], older: nil, previous: nil) == [111, 7, 7])
        #expect(try blocks([111, 7, 7]).map(\.bytes) == [[7, 7]])
    }

    @Test(
        arguments: [
            [],  // nothing
            [0x80 | 111, 0, 0],  // a header cut short
            [0x80 | 111, 0, 0x00, 0x05, 111, 1, 2],  // a block longer than what follows
            [0x80, 0, 0, 0, 0x80, 0, 0, 0, 0x80, 0, 0, 0, 111],  // three redundant blocks
            [0x80 | 111, 0, 0x02, 0x01],  // headers that never end
        ] as [[UInt8]])
    func malformedPayloadsAreRefusedWithoutABlock(_ payload: [UInt8]) {
        var called = false
        var failure: (any Error)?
        payload.withUnsafeBytes { raw in
            do { try RedundantAudio.forEachBlock(raw) { _, _, _ in called = true } } catch { failure = error }
        }
        #expect(failure != nil && !called)
    }

    /// The sender carries the previous one or two frames it sent (their own bytes,
    /// their timestamp offsets), and none before it has sent any.
    @Test func theSenderCarriesTheFramesItSentBefore() throws {
        let codec = CodecConfiguration()
        let sender = try VoiceSender(codec: codec, capture: nil)
        var plain: [[UInt8]] = []
        var red: [[UInt8]] = []
        var payload = [UInt8](repeating: 0, count: sender.maximumPayloadSize)
        var samples = [Int16](repeating: 0, count: codec.samplesPerFrame)
        for f in 0..<5 {
            for i in samples.indices { samples[i] = Int16(3000 * sin(Double(f * samples.count + i) * 0.3)) }
            sender.adapt(redundancy: f == 0 ? 0 : 2)
            let frame = try samples.withUnsafeBufferPointer { s in
                try payload.withUnsafeMutableBytes { try sender.encode(captured: s, reference: nil, into: $0) }
            }
            let bytes = Array(payload.prefix(frame.byteCount))
            #expect(frame.redundant == (f > 0))
            if f == 0 {
                plain.append(bytes)
            } else {
                red.append(bytes)
                plain.append(try blocks(bytes).last?.bytes ?? [])
            }
        }
        let step = UInt32(codec.timestampStep)
        #expect(try blocks(red[0]).map(\.offset) == [step, 0])
        #expect(try blocks(red[0]).first?.bytes == plain[0])
        for n in 1..<red.count {
            let read = try blocks(red[n])
            #expect(read.map(\.offset) == [2 * step, step, 0] && read.map(\.back) == [2, 1, 0])
            #expect(read.map(\.bytes) == [plain[n - 1], plain[n], plain[n + 1]])
        }
        sender.adapt(redundancy: 7)
        #expect(sender.redundancy == 2)
    }

    /// Two packets lost in a row, their frames carried by the next: played, not
    /// concealed; a copy of a frame whose own packet came changes nothing and is
    /// not counted as received.
    @Test func aBurstOfTwoIsPlayedFromTheNextPacket() throws {
        let codec = CodecConfiguration()
        func run(redundancy: Int) throws -> PlayoutStatistics {
            let sender = try VoiceSender(codec: codec, capture: nil)
            sender.adapt(redundancy: redundancy)
            let receiver = try VoiceReceiver(codec: codec)
            var payload = [UInt8](repeating: 0, count: sender.maximumPayloadSize)
            var samples = [Int16](repeating: 0, count: codec.samplesPerFrame)
            var out = [Int16](repeating: 0, count: codec.samplesPerFrame)
            let frameNs: Int64 = 20_000_000
            for f in 0..<100 {
                for i in samples.indices { samples[i] = Int16(4000 * sin(Double(f * samples.count + i) * 0.05)) }
                let frame = try samples.withUnsafeBufferPointer { s in
                    try payload.withUnsafeMutableBytes { try sender.encode(captured: s, reference: nil, into: $0) }
                }
                let now = Int64(f) * frameNs
                if ![40, 41, 70, 71].contains(f) {
                    _ = payload.withUnsafeBytes { p in
                        receiver.receive(
                            sequence: frame.sequence, timestamp: frame.timestamp,
                            payload: UnsafeRawBufferPointer(rebasing: p[0..<frame.byteCount]), arrivalNanoseconds: now,
                            redundant: frame.redundant)
                    }
                }
                out.withUnsafeMutableBufferPointer { receiver.render(nowNanoseconds: now, into: $0) }
            }
            #expect(receiver.malformedRedundant == 0)
            return receiver.statistics
        }
        let without = try run(redundancy: 0)
        let with = try run(redundancy: 2)
        #expect(with.framesRecoveredByRedundancy == 4 && with.lostPackets == 0, "\(with)")
        #expect(without.lostPackets == 4, "\(without)")
        #expect(with.packetsReceived == 96 && without.packetsReceived == 96 && with.duplicates == 0)
    }

    @Test func thePolicyFollowsLossAndBurstsWithoutFlapping() {
        var policy = RedundancyPolicy()
        #expect(policy.report(lossPercent: 2, meanBurstLength: 3) == 0, "under 3 %: FEC alone")
        #expect(policy.report(lossPercent: 5, meanBurstLength: 1) == 1, "random loss: the frame before")
        #expect(policy.report(lossPercent: 5, meanBurstLength: 2.5) == 2, "bursts: two frames back")
        #expect(policy.report(lossPercent: 2, meanBurstLength: 2.5) == 2, "on until loss is under 1.5 %")
        #expect(policy.report(lossPercent: 1, meanBurstLength: 2.5) == 0)
        #expect(policy.report(lossPercent: 2, meanBurstLength: 2.5) == 0, "off until 3 % again")
    }

    @Test func aTracesLossReportCountsBursts() {
        var model = NetworkModel()
        model.lossRate = 0.2
        model.meanBurstLength = 3
        let trace = NetworkTrace.generate(model, packets: 5000, frameMilliseconds: 20, seed: 4)
        let report = trace.lossReport
        #expect(abs(report.lossPercent - 20) < 3, "\(report)")
        #expect(abs(report.meanBurstLength - 3) < 0.5, "\(report)")
        let clean = NetworkTrace.generate(NetworkModel(), packets: 100, frameMilliseconds: 20, seed: 1).lossReport
        #expect(clean.lossPercent == 0 && clean.meanBurstLength == 0)
    }
}
