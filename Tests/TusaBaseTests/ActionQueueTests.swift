import Testing
import TusaBase

/// A core's action queue: first in, first out, across appends made while it is being drained.
struct ActionQueueTests {
    @Test func actionsComeOutInTheOrderTheyWentInEvenWhenAppendedWhileDraining() {
        var queue = ActionQueue<Int>()
        #expect(queue.isEmpty && queue.popFirst() == nil)
        for i in 0..<5 { queue.append(i) }
        var out: [Int] = []
        while let i = queue.popFirst() {
            out.append(i)
            // An action that leaves more (a copy per member), once.
            if i == 2 { for j in 10..<13 { queue.append(j) } }
        }
        #expect(out == [0, 1, 2, 3, 4, 10, 11, 12])
        #expect(queue.isEmpty)
        // Drained, it starts again from an empty store.
        queue.append(7)
        #expect(!queue.isEmpty && queue.popFirst() == 7 && queue.popFirst() == nil)
    }
}
