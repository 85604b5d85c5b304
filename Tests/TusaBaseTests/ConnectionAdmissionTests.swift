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

    @Test("an IPv6 source is its /64 (one host holds a whole /64); an IPv4-mapped address counts as its IPv4 address")
    func ipv6SourcesArePrefixes() {
        let admission = ConnectionAdmission(limits: .init(total: 100, perSource: 2))
        let prefix: UInt64 = 0x2001_0DB8_0000_0001
        #expect(admission.admit(.v6(high: prefix, low: 1)) == nil)
        #expect(admission.admit(.v6(high: prefix, low: 0xDEAD_BEEF)) == nil)
        #expect(admission.admit(.v6(high: prefix, low: 2)) == .perSource, "the same /64")
        #expect(admission.admit(.v6(high: prefix + 1, low: 1)) == nil, "the next /64 is another source")
        // ::ffff:10.0.0.1 and 10.0.0.1 are one source; ::ffff:10.0.0.2 another.
        #expect(admission.admit(.v6(high: 0, low: 0xFFFF_0A00_0001)) == nil)
        #expect(admission.admit(a) == nil)
        #expect(admission.admit(a) == .perSource)
        #expect(admission.admit(.v6(high: 0, low: 0xFFFF_0A00_0002)) == nil)
        admission.release(.v6(high: prefix, low: 7))
        #expect(admission.admit(.v6(high: prefix, low: 3)) == nil, "a close anywhere in the /64 frees its slot")
        #expect(admission.open.sources == 4)
    }
}
