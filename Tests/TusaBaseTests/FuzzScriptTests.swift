import Testing
import TusaBase

/// The reader the fuzz scripts share: steps, arguments and runs, and the ends.
struct FuzzScriptTests {
    @Test func readsStepsArgumentsAndRunsUpToTheInputsEnd() {
        var script = FuzzScript([1, 2, 3, 4, 5, 6], maximumSteps: 10)
        #expect(script.nextStep() == 1)
        #expect(script.next() == 2)
        #expect(script.take(3) == [3, 4, 5])
        #expect(script.take(9) == [6])  // what is left
        #expect(script.take(2) == [])
        #expect(script.next() == nil)
        #expect(script.nextStep() == nil)
    }

    @Test func stopsAfterItsMaximumSteps() {
        var script = FuzzScript([UInt8](repeating: 7, count: 100), maximumSteps: 3)
        var steps = 0
        while script.nextStep() != nil { steps += 1 }
        #expect(steps == 3)
        #expect(script.next() == 7)  // the arguments after are still there
    }
}
