import Testing
import Transport
import TusaBase

/// User-given HOST[:PORT] text to an address (`tusa stun`, `tusa turn`).
@Suite("address resolver")
struct AddressResolverTests {
    @Test(
        "IP literals, with and without a port",
        arguments: [
            ("192.0.2.1:5000", UInt16?.some(3478), "192.0.2.1:5000"),
            ("192.0.2.1", UInt16?.some(3478), "192.0.2.1:3478"),
            ("[2001:db8::1]:5000", UInt16?.none, "[2001:db8::1]:5000"),
            ("::1", UInt16?.some(3478), "[::1]:3478"),
        ])
    func literals(_ text: String, _ defaultPort: UInt16?, _ expected: String) throws {
        #expect(try AddressResolver.resolve(text, defaultPort: defaultPort).description == expected)
    }

    @Test("localhost resolves, with its port")
    func name() throws {
        let address = try AddressResolver.resolve("localhost:4000", defaultPort: nil)
        #expect(address.port == 4000)
        #expect(address.ip == .v4(0x7F00_0001) || address.ip == .v6(high: 0, low: 1))
        #expect(try AddressResolver.resolve("localhost", defaultPort: 3478).port == 3478)
    }

    @Test("says what is wrong")
    func errors() {
        #expect(throws: AddressResolutionError.badPort("localhost:http")) {
            try AddressResolver.resolve("localhost:http", defaultPort: 3478)
        }
        #expect(throws: AddressResolutionError.missingPort("localhost")) {
            try AddressResolver.resolve("localhost", defaultPort: nil)
        }
        #expect(throws: AddressResolutionError.unresolvable(host: "no-such-host.invalid")) {
            try AddressResolver.resolve("no-such-host.invalid:3478", defaultPort: nil)
        }
        #expect(AddressResolutionError.badPort("x:y").description == "'x:y': bad port")
        #expect(AddressResolutionError.unresolvable(host: "x").description == "cannot resolve 'x'")
    }
}
