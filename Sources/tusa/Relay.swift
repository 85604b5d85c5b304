import ArgumentParser
import Logging
import STUN
import ServiceLifecycle
import Transport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// `tusa relay`: the STUN Binding service on UDP and TCP until SIGTERM or SIGINT.
///
/// Prints `listening udp 127.0.0.1:3478` (one line per socket, flushed) to
/// standard output once every socket is bound, so a script can start it on
/// port 0 and read the real port; logs go to standard error.
struct Relay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Serve STUN Binding requests (RFC 8489) on UDP and TCP, with RFC 5780 behaviour discovery.",
        discussion: """
            Prints one 'listening udp|tcp ADDRESS' line per bound socket to standard output, \
            then serves until SIGTERM or SIGINT and prints a one-line summary.
            """
    )

    enum LogLevel: String, CaseIterable, ExpressibleByArgument {
        case trace, debug, info, notice, warning, error, critical

        var level: Logger.Level {
            switch self {
            case .trace: .trace
            case .debug: .debug
            case .info: .info
            case .notice: .notice
            case .warning: .warning
            case .error: .error
            case .critical: .critical
            }
        }
    }

    @Option(
        name: .customLong("listen"),
        help: ArgumentHelp(
            "Address to listen on, IP:PORT or [IPv6]:PORT (port 3478 if left out); repeatable. Default: 0.0.0.0:3478 and [::]:3478.",
            valueName: "addr:port"))
    var listen: [String] = []

    @Option(
        name: .customLong("alt-address"),
        help: ArgumentHelp(
            "Alternate IP:PORT for RFC 5780 behaviour discovery (UDP; needs a specific listen address of the same family).",
            valueName: "ip:port"))
    var alternateAddress: String?

    @Option(help: ArgumentHelp("SOFTWARE attribute for responses (none by default).", valueName: "text"))
    var software: String?

    @Flag(name: .customLong("no-tcp"), help: "Do not listen on TCP.")
    var noTCP = false

    @Flag(name: .customLong("no-udp"), help: "Do not listen on UDP.")
    var noUDP = false

    @Flag(name: .customLong("no-gso"), help: "Send every UDP answer on its own, without GSO (for NICs without TX checksum offload, or IPsec paths).")
    var noGSO = false

    @Option(help: "Event-loop threads; above 1, one SO_REUSEPORT UDP socket per thread and address.")
    var threads = 1

    @Option(name: .customLong("log-level"), help: "Log level on standard error.")
    var logLevel: LogLevel = .info

    func run() async throws {
        let configuration: BindingService.Configuration
        do {
            configuration = try makeConfiguration()
        } catch {
            throw failure(error.message)
        }

        let level = logLevel.level
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "tusa.relay")

        let service = BindingService(configuration: configuration, logger: logger)
        let group = ServiceGroup(
            configuration: .init(services: [service], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        do {
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                tasks.addTask { try await group.run() }
                tasks.addTask {
                    for socket in try await service.boundSockets() { print("listening \(socket)") }
                    fflush(nil)  // every line out before anyone waits on it
                }
                try await tasks.waitForAll()
            }
        } catch let error as BindingServiceError {
            throw failure(error.message)
        } catch {
            throw failure("\(error)")
        }
        print("stopped: \(service.statistics)")
        fflush(nil)
    }

    private struct ConfigurationProblem: Error {
        var message: String
    }

    private func makeConfiguration() throws(ConfigurationProblem) -> BindingService.Configuration {
        var listenAddresses: [TransportAddress] = []
        for text in listen {
            guard let address = TransportAddress(text, defaultPort: 3478) else {
                throw ConfigurationProblem(message: "--listen '\(text)' is not IP:PORT or [IPv6]:PORT")
            }
            listenAddresses.append(address)
        }
        var alternate: TransportAddress?
        if let text = alternateAddress {
            guard let address = TransportAddress(text) else {
                throw ConfigurationProblem(message: "--alt-address '\(text)' is not IP:PORT or [IPv6]:PORT")
            }
            alternate = address
        }
        guard (1...1024).contains(threads) else {
            throw ConfigurationProblem(message: "--threads must be between 1 and 1024, not \(threads)")
        }
        let configuration = BindingService.Configuration(
            listenAddresses: listenAddresses.isEmpty ? BindingService.Configuration.defaultListenAddresses : listenAddresses,
            alternateAddress: alternate, software: software, udp: !noUDP, tcp: !noTCP, threads: threads, gso: !noGSO)
        do {
            try configuration.validate()
        } catch {
            throw ConfigurationProblem(message: error.message)
        }
        return configuration
    }

    /// Says what was wrong in one line on standard error; throw the result to exit with status 1.
    private func failure(_ message: String) -> ExitCode {
        let line = Array("tusa relay: error: \(message)\n".utf8)
        _ = line.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
        return ExitCode(1)
    }
}
