import TURN
import Testing
import TusaBase

/// RFC 7065 TURN URIs: what a rendezvous hands out and a caller reads back.
@Suite("TURN URIs (RFC 7065)")
struct TURNURITests {
    @Test("parses scheme, host, port and transport")
    func parsesParts() throws {
        let uri = try TURNURI(parsing: "turn:198.51.100.7:3478?transport=udp")
        #expect(uri.scheme == .turn)
        #expect(uri.host == "198.51.100.7")
        #expect(uri.port == 3478)
        #expect(uri.transport == .udp)
        #expect(uri.address == TransportAddress("198.51.100.7:3478"))

        let tcp = try TURNURI(parsing: "turn:[2001:db8::1]:3479?transport=tcp")
        #expect(tcp.host == "2001:db8::1")
        #expect(tcp.transport == .tcp)
        #expect(tcp.address == TransportAddress("[2001:db8::1]:3479"))
    }

    @Test("without a port, the scheme's default; without a query, no transport")
    func defaults() throws {
        let plain = try TURNURI(parsing: "turn:192.0.2.1")
        #expect(plain.port == nil)
        #expect(plain.transport == nil)
        #expect(plain.address == TransportAddress("192.0.2.1:3478"))
        let tls = try TURNURI(parsing: "turns:[::1]")
        #expect(tls.scheme == .turns)
        #expect(tls.address == TransportAddress("[::1]:5349"))
    }

    @Test("host names are kept and not resolved")
    func hostName() throws {
        let uri = try TURNURI(parsing: "turns:turn.example.org:443?transport=tcp")
        #expect(uri.host == "turn.example.org")
        #expect(uri.port == 443)
        #expect(uri.address == nil)
    }

    @Test("scheme and transport ignore case")
    func caseInsensitive() throws {
        let uri = try TURNURI(parsing: "TURN:192.0.2.1:3478?Transport=UDP")
        #expect(uri.scheme == .turn)
        #expect(uri.transport == .udp)
    }

    @Test(
        "formats what it parses, IPv6 in brackets",
        arguments: [
            "turn:198.51.100.7:3478?transport=udp",
            "turn:[2001:db8::1]:3478?transport=tcp",
            "turns:turn.example.org:5349",
            "turn:192.0.2.1",
        ])
    func roundTrip(_ text: String) throws {
        #expect(try TURNURI(parsing: text).description == text)
    }

    @Test("a server socket's URI is what the relay's rendezvous advertises")
    func fromAddress() {
        #expect(
            TURNURI(address: TransportAddress("127.0.0.1:3478")!, transport: .udp).description
                == "turn:127.0.0.1:3478?transport=udp")
        #expect(
            TURNURI(address: TransportAddress("[::1]:40000")!, transport: .tcp).description
                == "turn:[::1]:40000?transport=tcp")
    }

    @Test(
        "says what is wrong",
        arguments: [
            ("stun:192.0.2.1:3478", TURNURIError.unknownScheme("stun:192.0.2.1:3478")),
            ("192.0.2.1:3478", TURNURIError.unknownScheme("192.0.2.1:3478")),
            ("turn:", TURNURIError.missingHost("turn:")),
            ("turn::3478", TURNURIError.missingHost("turn::3478")),
            ("turn:[::1:3478", TURNURIError.badIPv6Literal("turn:[::1:3478")),
            ("turn:[::1]3478", TURNURIError.badIPv6Literal("turn:[::1]3478")),
            ("turn:[nothex]:3478", TURNURIError.badIPv6Literal("turn:[nothex]:3478")),
            ("turn:192.0.2.1:70000", TURNURIError.badPort("turn:192.0.2.1:70000")),
            ("turn:192.0.2.1:", TURNURIError.badPort("turn:192.0.2.1:")),
            ("turn:192.0.2.1:+5", TURNURIError.badPort("turn:192.0.2.1:+5")),
            ("turn:192.0.2.1:3478?transport=sctp", TURNURIError.badQuery("turn:192.0.2.1:3478?transport=sctp")),
            ("turn:192.0.2.1:3478?foo=bar", TURNURIError.badQuery("turn:192.0.2.1:3478?foo=bar")),
        ])
    func errors(_ text: String, _ expected: TURNURIError) {
        #expect(throws: expected) { try TURNURI(parsing: text) }
    }
}
