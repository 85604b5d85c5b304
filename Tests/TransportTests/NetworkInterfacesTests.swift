import Testing
import Transport
import TusaBase

/// The host's interface addresses (host candidates, relay IPs).
@Suite("network interfaces")
struct NetworkInterfacesTests {
    @Test("IPv4: loopback last, and only when asked for; no duplicates")
    func ipv4() {
        let all = NetworkInterfaces.addresses(.ipv4, includeLoopback: true)
        let outside = NetworkInterfaces.addresses(.ipv4, includeLoopback: false)
        #expect(all.contains(.v4(0x7F00_0001)))
        #expect(!outside.contains(.v4(0x7F00_0001)))
        #expect(Array(all.prefix(outside.count)) == outside)
        #expect(Set(all).count == all.count)
        #expect(all.allSatisfy { $0.isIPv4 })
    }

    @Test("IPv6: no link-local addresses")
    func ipv6() {
        for ip in NetworkInterfaces.addresses(.ipv6, includeLoopback: true) {
            guard case .v6(let high, _) = ip else {
                Issue.record("\(ip) is not IPv6")
                continue
            }
            #expect(high >> 54 != 0x3FA, "\(ip)")
        }
    }
}
