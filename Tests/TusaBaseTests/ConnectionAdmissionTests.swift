import Testing
import TusaBase

/// The listeners' connection limits: in total, and per source address.
struct ConnectionAdmissionTests {
    let a = IPAddress.v4(0x0A00_0001)
    let b = IPAddress.v4(0x0A00_0002)

    @Test("one source cannot take more than its share; others are still admitted; a close frees a slot")
    func perSourceShare() {
        let admission = ConnectionAdmission(limits: .init(total: 10, perSource: 3))
        for _ in 0..<3 { #expect(admission.admit(a) == nil) }
        #expect(admission.admit(a) == .perSource)
        #expect(admission.admit(a) == .perSource)
        #expect(admission.admit(b) == nil)
        #expect(admission.open == (4, 2))
        admission.release(a)
        #expect(admission.admit(a) == nil)
        #expect(admission.admit(a) == .perSource)
        #expect(admission.refused == [.perSource: 3])
    }

    @Test("the total caps every source together; unknown sources count against the total only")
    func totalCap() {
        let admission = ConnectionAdmission(limits: .init(total: 4, perSource: 3))
        #expect(admission.admit(a) == nil)
        #expect(admission.admit(b) == nil)
        #expect(admission.admit(nil) == nil)
        #expect(admission.admit(nil) == nil)
        #expect(admission.admit(b) == .total)
        #expect(admission.admit(nil) == .total)
        #expect(admission.open == (4, 2))
        for source in [a, b, nil, nil] as [IPAddress?] { admission.release(source) }
        #expect(admission.open == (0, 0))
        // Releasing more than was admitted does not go below zero or admit more than the limits.
        admission.release(a)
        #expect(admission.open == (0, 0))
        for _ in 0..<3 { #expect(admission.admit(a) == nil) }
        #expect(admission.admit(a) == .perSource)
        #expect(admission.refused == [.total: 2, .perSource: 1])
    }
}
