import Foundation
import NIOCore
import NIOPosix
import Secure
import TestSupport
import Testing
import Transport
import TusaBase

// The drivers' errors keep the socket's error as their cause, so a caller can
// tell "port in use" from "permission denied" without parsing text.
@Suite("Driver errors keep their cause")
struct DriverErrorTests {
    @Test func aPortInUseIsABindErrorWithTheSystemsCause() async throws {
        let first = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate())
        let port = first.localAddress.port
        let outcome: Result<SecureUDPEndpoint, SecureTransportError>
        do {
            outcome = .success(try await SecureUDPEndpoint.bind(host: "127.0.0.1", port: Int(port), identity: .generate()))
        } catch { outcome = .failure(error) }
        await first.close()
        switch outcome {
        case .success(let second):
            await second.close()
            Issue.record("a second bind to port \(port) succeeded")
        case .failure(.bind(let address, let cause)):
            #expect(address == "127.0.0.1:\(port)")
            #expect((cause.error as? IOError)?.errnoCode == EADDRINUSE, "cause \(type(of: cause.error)): \(cause)")
            #expect("\(SecureTransportError.bind(address, cause))".contains("in use"))
        case .failure(let other):
            Issue.record("not a bind error: \(other)")
        }
    }

    @Test func anUnreachableRendezvousIsConnectFailedWithTheSystemsCause() async throws {
        // A port held by a TCP socket that is bound but never listens: nothing can
        // accept there, and no parallel test can take the port meanwhile (a port
        // closed and then connected to could be someone else's listener by then).
        let held = try BoundTCPPort()
        defer { held.close() }
        let server = TransportAddress(ip: .v4(0x7F00_0001), port: held.port)
        let outcome: Result<RendezvousConnection, any Error>
        do {
            outcome = .success(try await RendezvousConnection.connect(to: server, identity: .generate(), timeout: .seconds(5)))
        } catch { outcome = .failure(error) }
        switch outcome {
        case .success(let connection):
            await connection.close()
            Issue.record("connected to a closed port")
        case .failure(RendezvousConnectionError.connectFailed(let address, let cause)):
            #expect(address == server)
            #expect((cause.error as? IOError)?.errnoCode == ECONNREFUSED, "cause \(type(of: cause.error)): \(cause)")
        case .failure(let other):
            Issue.record("not connectFailed: \(other)")
        }
    }
}
