import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
import STUN
import Transport
import TusaBase

/// `tusa stun HOST[:PORT]`: ask a STUN server for this host's mapped address,
/// and with `--behavior` classify the NAT with RFC 5780's tests.
struct Stun: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the mapped (server-reflexive) address a STUN server sees.",
        discussion:
            "With --behavior, run the RFC 5780 mapping and filtering tests (the server needs an alternate address) and name the NAT type."
    )

    @Argument(help: "The STUN server, HOST[:PORT] (default port 3478; IPv6 as [ADDR]:PORT).")
    var server: String

    @Flag(help: "Run RFC 5780 behaviour discovery and name the NAT type.")
    var behavior = false

    @Option(help: "Seconds to wait for each answer.")
    var timeout: Double = 5

    @Option(help: "Local address to send from, IP[:PORT].")
    var local: String?

    func run() async throws {
        guard timeout > 0, timeout <= 600 else { Self.fail("--timeout must be above 0 and at most 600 seconds") }
        let serverAddress = Self.resolve(server)
        let wait = Duration.milliseconds(Int64(timeout * 1000))
        let localAddress: SocketAddress
        if let local {
            guard let a = TransportAddress(local, defaultPort: 0) else { Self.fail("--local '\(local)' is not IP[:PORT]") }
            localAddress = SocketAddress(a)
        } else {
            localAddress = NATBehaviorDiscovery.sourceAddress(toward: serverAddress)
        }
        do {
            if behavior {
                await discover(serverAddress, local: localAddress, wait: wait)
            } else {
                let client = try await STUNClient.open(local: localAddress, connectedTo: SocketAddress(serverAddress))
                let result: Result<BindingResult, STUNClientError>
                do { result = .success(try await client.binding(to: serverAddress, timeout: wait)) } catch {
                    result = .failure(error)
                }
                await client.close()
                print(try result.get().mapped)
            }
        } catch let error as STUNClientError {
            Self.fail(error.message)
        } catch {
            Self.fail("\(serverAddress): \(error)")
        }
    }

    func discover(_ server: TransportAddress, local: SocketAddress, wait: Duration) async {
        do throws(NATBehaviorDiscoveryError) {
            let found = try await NATBehaviorDiscovery.run(server: server, local: local, timeout: wait)
            print("mapped address: \(found.mapped)")
            print("other address: \(found.other)")
            print("mapping: \(found.behavior.mapping.rawValue)")
            print("filtering: \(found.behavior.filtering.rawValue)")
            print("NAT type: \(found.behavior.classicName)")
        } catch {
            // What was learnt before the failure, as the tests went.
            if let mapped = error.mapped { print("mapped address: \(mapped)") }
            if let other = error.other { print("other address: \(other)") }
            Self.fail(error.description)
        }
    }

    /// HOST[:PORT] → an address, resolving names; a clear error otherwise.
    static func resolve(_ text: String) -> TransportAddress {
        do throws(AddressResolutionError) {
            return try AddressResolver.resolve(text, defaultPort: 3478)
        } catch {
            fail(error.description)
        }
    }

    static func fail(_ message: String) -> Never {
        FileHandle.standardError.write(Data("tusa stun: \(message)\n".utf8))
        Foundation.exit(1)
    }
}
