import Foundation
import Testing
import Voice

#if canImport(Glibc)
    import Glibc
#endif

/// An audio thread asks to run ahead of ordinary work; the rest of the process does not change.
@Suite struct AudioThreadTests {
    static func nice() -> Int32 { getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0) }

    @Test func raisingAnAudioThreadsPriorityChangesThatThreadAlone() async {
        let before = Self.nice()
        let (raised, was, inside) = await withCheckedContinuation {
            (c: CheckedContinuation<(Bool, Int32, Int32), Never>) in
            let t = Thread {
                let was = Self.nice()
                let raised = raiseAudioThreadPriority()
                c.resume(returning: (raised, was, Self.nice()))
            }
            t.start()
        }
        if raised {
            #expect(inside == -11)
        } else {
            // Not allowed here (an ordinary user without RLIMIT_NICE): the thread runs on as it was.
            #expect(inside == was)
        }
        #expect(Self.nice() == before, "the calling thread's priority changed too")
    }
}
