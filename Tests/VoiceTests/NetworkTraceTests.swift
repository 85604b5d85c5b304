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
}
