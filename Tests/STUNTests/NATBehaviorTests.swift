import STUN
import Testing
import TusaBase

/// RFC 5780's decisions, without sockets: which mapped addresses mean which
/// mapping, which answered filtering tests mean which filtering
/// (what `NATBehaviorDiscovery` runs the tests for).
@Suite("NAT behaviour (RFC 5780 §4.3, §4.4)")
struct NATBehaviorTests {
    static let local = TransportAddress("192.168.1.10:40000")!
    static let x1 = TransportAddress("198.51.100.1:50000")!
    static let other = TransportAddress("198.51.100.1:50001")!
    static let third = TransportAddress("198.51.100.1:50002")!

    @Test("mapped address equal to the client's own: no NAT, no further tests")
    func noNAT() {
        #expect(MappingBehavior.classify(local: Self.x1, x1: Self.x1, x2: Self.other, x3: nil) == .noNAT)
    }

    @Test("test II maps like test I: endpoint-independent, test III not needed")
    func endpointIndependent() {
        #expect(MappingBehavior.classify(local: Self.local, x1: Self.x1, x2: Self.x1, x3: nil) == .endpointIndependent)
        #expect(MappingBehavior.classify(local: nil, x1: Self.x1, x2: Self.x1, x3: nil) == .endpointIndependent)
    }

    @Test("test II differs: undecided until test III")
    func needsTestIII() {
        #expect(MappingBehavior.classify(local: Self.local, x1: Self.x1, x2: Self.other, x3: nil) == nil)
    }

    @Test("test III maps like test II: address-dependent; unlike it: address-and-port-dependent")
    func testIII() {
        #expect(MappingBehavior.classify(local: Self.local, x1: Self.x1, x2: Self.other, x3: Self.other) == .addressDependent)
        #expect(
            MappingBehavior.classify(local: Self.local, x1: Self.x1, x2: Self.other, x3: Self.third) == .addressAndPortDependent)
    }

    @Test("filtering from the change-request answers")
    func filtering() {
        #expect(FilteringBehavior.classify(changedIPAndPortAnswered: true, changedPortAnswered: true) == .endpointIndependent)
        #expect(FilteringBehavior.classify(changedIPAndPortAnswered: false, changedPortAnswered: true) == .addressDependent)
        #expect(
            FilteringBehavior.classify(changedIPAndPortAnswered: false, changedPortAnswered: false) == .addressAndPortDependent)
    }

    @Test("classic names")
    func classicNames() {
        #expect(NATBehavior(mapping: .endpointIndependent, filtering: .endpointIndependent).classicName == "full cone")
        #expect(NATBehavior(mapping: .endpointIndependent, filtering: .addressDependent).classicName == "restricted cone")
        #expect(
            NATBehavior(mapping: .endpointIndependent, filtering: .addressAndPortDependent).classicName == "port-restricted cone")
        #expect(NATBehavior(mapping: .addressAndPortDependent, filtering: .addressDependent).classicName == "symmetric")
        #expect(NATBehavior(mapping: .noNAT, filtering: .endpointIndependent).classicName == "open internet (no NAT)")
    }
}
