import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// A private PostgreSQL server for one test (`scripts/postgres.sh`): its own data
/// folder under the temporary folder and a free loopback port. Tests that need
/// it are disabled with ``absentMessage`` when PostgreSQL is not installed.
public final class PostgresServer: Sendable {
    public static let script = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("scripts/postgres.sh").path

    /// Whether Debian's PostgreSQL is installed (scripts/setup.sh installs it).
    public static var isInstalled: Bool {
        let versions = (try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? []
        return versions.contains { FileManager.default.isExecutableFile(atPath: "/usr/lib/postgresql/\($0)/bin/initdb") }
    }
    public static let absentMessage = "PostgreSQL is not installed (scripts/setup.sh installs it): PostgreSQL tests skipped"

    public let folder: String
    public let port: Int
    /// `postgres://tusa@127.0.0.1:PORT/tusa`.
    public let url: String

    /// Makes the cluster and starts it; throws with the script's own words when it cannot.
    public init() throws {
        folder = NSTemporaryDirectory() + "tusa-pg-\(UUID().uuidString)"
        // Where nothing takes it unasked while the server restarts on it.
        port = Int(QuietPort.draw())
        let (status, output) = try Self.script(["start", folder, "\(port)"])
        guard status == 0, let line = output.split(separator: "\n").last(where: { $0.hasPrefix("postgres://") }) else {
            try? FileManager.default.removeItem(atPath: folder)
            throw PostgresServerError("scripts/postgres.sh start failed (\(status)): \(output)")
        }
        url = String(line)
    }

    /// Starts it again after ``stop()`` (same folder, same port).
    public func start() throws {
        let (status, output) = try Self.script(["start", folder, "\(port)"])
        guard status == 0 else { throw PostgresServerError("scripts/postgres.sh start failed (\(status)): \(output)") }
    }

    public func stop() {
        _ = try? Self.script(["stop", folder])
    }

    /// Stops the server and deletes its folder.
    public func remove() {
        stop()
        try? FileManager.default.removeItem(atPath: folder)
    }

    /// Runs the script, its output in a file, and waits for it with `waitpid`
    /// (Foundation's `Process` here can miss the exit of a script that leaves a
    /// daemon behind).
    private static func script(_ arguments: [String]) throws -> (Int32, String) {
        let log = NSTemporaryDirectory() + "tusa-pg-script-\(UUID().uuidString).log"
        defer { try? FileManager.default.removeItem(atPath: log) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        let argv = (["/bin/bash", script] + arguments).map { strdup($0) } + [nil]
        defer { for a in argv { free(a) } }
        var pid = pid_t()
        let spawned = posix_spawn(&pid, "/bin/bash", &actions, nil, argv, environ)
        guard spawned == 0 else { throw PostgresServerError("cannot run \(script): errno \(spawned)") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        let exited = status & 0x7f == 0
        return (exited ? (status >> 8) & 0xff : 128 + (status & 0x7f), output)
    }

    /// A loopback TCP port nobody holds now, where nothing takes it unasked while
    /// the server restarts on it.
    private static func freePort() throws -> Int { Int(QuietPort.draw()) }
}

public struct PostgresServerError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
