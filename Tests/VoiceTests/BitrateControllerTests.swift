import Testing
import Voice

/// The loss-based bitrate controller, report by report.
@Suite struct BitrateControllerTests {
    @Test func heavyLossCutsByHalfTheLossFractionDownToTheFloor() {
        var c = BitrateController(maximum: 24_000)
        #expect(c.report(lossFraction: 0.20) == 21_600)
        #expect(c.report(lossFraction: 0.20) == 19_440)
        for _ in 0..<40 { c.report(lossFraction: 0.5) }
        #expect(c.bitrate == 8_000)
        #expect(c.report(lossFraction: 0.9) == nil)  // at the floor: no change to apply
    }

    @Test func moderateLossHoldsAndLittleLossClimbsBackToTheConfiguredRate() {
        var c = BitrateController(maximum: 24_000)
        c.report(lossFraction: 0.3)
        let cut = c.bitrate
        #expect(cut == 20_400)
        #expect(c.report(lossFraction: 0.05) == nil && c.bitrate == cut)
        #expect(c.report(lossFraction: 0.0) == 22_033)
        var steps = 1
        while c.report(lossFraction: 0.01) != nil { steps += 1 }
        #expect(c.bitrate == 24_000 && steps == 3)  // never above the configured rate
    }

    @Test func nonsenseLossIsClampedNotTrusted() {
        var c = BitrateController(maximum: 16_000, minimum: 12_000)
        #expect(c.report(lossFraction: .nan) == nil)  // read as no loss: already at the maximum
        #expect(c.report(lossFraction: 7) == 12_000)  // read as 100 %: halved, then floored
        #expect(c.report(lossFraction: -1) == 12_961)
        #expect(BitrateController(maximum: 6_000).minimum == 6_000)  // the floor never above the maximum
    }
}
