import Secure
import Testing
import TusaBase

/// Receiver reports on their own: no keys, no endpoint, a virtual clock.
@Suite struct ReceiverReportsTests {
    func reports(interval: Duration = .seconds(5)) -> ReceiverReports {
        ReceiverReports(clockRate: 8000, interval: interval, firstReportAfter: .milliseconds(500))
    }

    @Test func theFirstReportComesEarlyThenEveryInterval() {
        var r = reports()
        #expect(r.nextReportAt == Timestamp.zero + .milliseconds(500), "before the session starts, counted from zero")
        let start = Timestamp.seconds(100)
        r.sessionStarted(now: start)
        r.sessionStarted(now: start + .seconds(1))  // once
        #expect(r.nextReportAt == start + .milliseconds(500))
        #expect(!r.isDue(now: start + .milliseconds(499)) && r.isDue(now: start + .milliseconds(500)))
        _ = r.makeReport(now: start + .milliseconds(500))
        #expect(r.sent == 1 && r.nextReportAt == start + .milliseconds(5500))

        var off = reports(interval: .zero)
        off.sessionStarted(now: start)
        #expect(off.nextReportAt == nil && !off.isDue(now: start + .seconds(60)))
    }

    @Test func lossIsReportedPerIntervalAndTheHintIsSmoothed() {
        var r = reports()
        let t = Timestamp.seconds(10)
        // 100 packets, every tenth lost.
        for i in 0..<100 where i % 10 != 9 {
            r.record(extendedSequence: UInt64(1000 + i), rtpTimestamp: UInt32(i * 160), arrival: t + .milliseconds(20 * i))
        }
        r.record(extendedSequence: 1100, rtpTimestamp: 16000, arrival: t + .seconds(2))
        let first = r.makeReport(now: t + .seconds(2))
        #expect(first.kind == .report && first.highestSequence == 1100)
        #expect(first.cumulativeLost == 10 && first.fractionLost == UInt8(10 * 256 / 101))
        #expect(first.jitter == 0, "steady arrivals")
        // 0.3 × 25/256 ≈ 2.9 %: one bad interval does not swing the encoder.
        #expect(first.lossHint == 3)
        // A clean interval lowers the hint gradually, not at once.
        for i in 1...50 {
            r.record(
                extendedSequence: UInt64(1100 + i), rtpTimestamp: UInt32(16000 + i * 160),
                arrival: t + .seconds(2) + .milliseconds(20 * i))
        }
        let second = r.makeReport(now: t + .seconds(7))
        #expect(second.fractionLost == 0 && second.lossHint == 3, "0.7 × 2.9 % rounds up to 3")
        #expect(second.cumulativeLost == 10)
        r.restartReception()
        #expect(r.reception.received == 0 && r.reception.expected == 0)
    }

    /// Losses one at a time report a mean burst of one packet (16 in 1/16); losses
    /// three at a time, three (48); the next interval's blend is smoothed; a clean
    /// interval leaves it as it was.
    @Test func theMeanLossBurstIsReportedInSixteenths() {
        var r = reports()
        let t = Timestamp.seconds(10)
        var sequence: UInt64 = 0
        func send(_ count: Int, losingEvery period: Int, run: Int) {
            for i in 0..<count {
                sequence += 1
                if period > 0, i % period < run { continue }
                r.record(
                    extendedSequence: sequence, rtpTimestamp: UInt32(sequence * 160),
                    arrival: t + .milliseconds(20 * Int(sequence)))
            }
        }
        send(100, losingEvery: 10, run: 1)
        #expect(r.makeReport(now: t + .seconds(3)).meanBurstLength == 16)
        send(100, losingEvery: 10, run: 3)
        // 0.7 × 1 + 0.3 × 3 = 1.6 packets.
        #expect(r.makeReport(now: t + .seconds(6)).meanBurstLength == 26)
        send(50, losingEvery: 0, run: 0)
        #expect(r.makeReport(now: t + .seconds(9)).meanBurstLength == 26)
        var fresh = reports()
        #expect(fresh.makeReport(now: t).meanBurstLength == 0, "nothing lost yet")
    }

    @Test func theRoundTripComesFromThePeersEchoOfOurReport() {
        var a = reports()
        var b = reports()
        let t = Timestamp.seconds(50)
        let fromA = a.makeReport(now: t)
        #expect(fromA.lastReportTimestamp == 0, "nothing to echo yet")
        // B gets it 15 ms later, its first: answered at once (when it can send).
        let silent = b.peerReported(fromA, now: t + .milliseconds(15), canAnswer: false)
        let answered = b.peerReported(fromA, now: t + .milliseconds(15), canAnswer: true)
        let again = b.peerReported(fromA, now: t + .milliseconds(15), canAnswer: true)
        #expect(!silent && answered)
        #expect(!again, "only the first")
        #expect(b.lastPeerReport?.report == fromA)
        // B holds it 100 ms, then its report takes 15 ms back: the round trip is 30 ms.
        let fromB = b.makeReport(now: t + .milliseconds(116))
        #expect(fromB.lastReportTimestamp == fromA.timestamp && fromB.delaySinceLastReport > 0)
        _ = a.peerReported(fromB, now: t + .milliseconds(131), canAnswer: true)
        let ms = a.roundTrip.map { $0.nanoseconds / 1_000_000 }
        #expect(ms.map { (29...31).contains($0) } == true, "rtt \(String(describing: ms)) ms")
        #expect(b.roundTrip == nil, "A's report echoed nothing of B's")
    }
}
