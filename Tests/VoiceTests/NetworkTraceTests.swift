import Testing

@testable import Voice

@Suite("NetworkTrace")
struct NetworkTraceTests {
    @Test func formatParseRoundTrip() throws {
        let t = NetworkTrace.generate(
            NetworkModel(jitterMilliseconds: 7, lossRate: 0.1, duplicateRate: 0.05), packets: 500, frameMilliseconds: 20, seed: 9)
        let back = try NetworkTrace(parsing: t.formatted())
        #expect(back == t)
    }

    @Test func parseErrorsNameTheLine() {
        let text = "frame-ms 20\n0 0 20\n# comment\n1 20 banana\n"
        do {
            _ = try NetworkTrace(parsing: text)
            Issue.record("no error")
        } catch {
            #expect(error.description.contains("line 4"))
        }
        do {
            _ = try NetworkTrace(parsing: "0 0 20\n")
            Issue.record("no error")
        } catch {
            #expect(error.description.contains("frame-ms"))
        }
    }

    @Test func generatorMatchesModelAndIsDeterministic() {
        let model = NetworkModel(lossRate: 0.1, meanBurstLength: 3)
        let t = NetworkTrace.generate(model, packets: 50_000, frameMilliseconds: 20, seed: 42)
        let lost = t.entries.map { $0.arrivalMilliseconds == nil }
        let rate = Double(lost.filter { $0 }.count) / Double(lost.count)
        var bursts = 0
        var inBurst = false
        for l in lost {
            if l && !inBurst { bursts += 1 }
            inBurst = l
        }
        let meanBurst = Double(lost.filter { $0 }.count) / Double(max(1, bursts))
        #expect(abs(rate - 0.1) < 0.015, "loss \(rate)")
        #expect(abs(meanBurst - 3) < 0.4, "mean burst \(meanBurst)")
        #expect(t == NetworkTrace.generate(model, packets: 50_000, frameMilliseconds: 20, seed: 42))
        #expect(t != NetworkTrace.generate(model, packets: 50_000, frameMilliseconds: 20, seed: 43))
    }

    /// A trace's times are its file's to say: a packet a day late ends the replay ten
    /// minutes after the audio, not a day of output later (it is not played).
    @Test func aPacketADayLateDoesNotMakeADayOfAudio() throws {
        let trace = try NetworkTrace(parsing: "frame-ms 20\n0 0 25\n1 20 86400000\n2 40 65\n")
        let codec = CodecConfiguration(kind: .l16, sampleRate: 8_000)
        let packets = [[UInt8]](repeating: [UInt8](repeating: 0x10, count: 320), count: 3)
        let result = TraceReplay.run(
            trace: trace, packets: packets, playout: try Playout(decoder: L16Decoder(codec)), samplesPerFrame: 160,
            sampleRate: 8_000)
        #expect(result.output.count <= (60 + 600_000 + 1000 + 20) * 8, "\(result.output.count) samples")
        #expect(result.statistics.packetsReceived == 2)
    }

    /// A trace's times may start anywhere: one 28 hours in replays as the same trace at 0.
    @Test func aTraceStartingLateReplaysAsAtZero() throws {
        let codec = CodecConfiguration(kind: .l16, sampleRate: 8_000)
        let packets = [[UInt8]](repeating: [UInt8](repeating: 0x10, count: 320), count: 50)
        func replay(from origin: Double) throws -> TraceReplayResult {
            let lines = (0..<50).map { i in "\(i) \(origin + Double(i) * 20) \(origin + Double(i) * 20 + 30)" }
            let trace = try NetworkTrace(parsing: "frame-ms 20\n" + lines.joined(separator: "\n"))
            return TraceReplay.run(
                trace: trace, packets: packets, playout: try Playout(decoder: L16Decoder(codec)), samplesPerFrame: 160,
                sampleRate: 8_000)
        }
        let late = try replay(from: 100_000_000)
        let atZero = try replay(from: 0)
        #expect(late.statistics.packetsPlayed == 50 && late.output == atZero.output, "\(late.statistics)")
    }
}
