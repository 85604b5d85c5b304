import Dispatch
import Foundation
import Relay
import Testing
import Transport

#if canImport(Glibc)
    import Glibc
#endif

// `tusa relay --config FILE`: the binary reading coturn-format files (the pure
// reader's tests are in RelayTests).

@Suite("Relay config file: the binary")
struct RelayConfigBinaryTests {
    /// Every long option of `tusa relay` (as its own help dump lists them) may be set
    /// in a file, and the file takes no name the command does not have: the two lists
    /// cannot drift apart (they did: cert, pkey and the party options were refused or
    /// skipped in files).
    @Test(
        "a file takes exactly tusa relay's long options",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func aFileTakesEveryLongOption() async throws {
        let tusa = try #require(Harness.tusa)
        // Into a file, not a pipe (36 KB; a loaded machine's pipe reader lagged behind the exit).
        let out = try TemporaryFile("")
        let dump = Process()
        dump.executableURL = URL(fileURLWithPath: tusa)
        dump.arguments = ["relay", "--experimental-dump-help"]
        dump.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: out.path))
        dump.standardError = FileHandle.nullDevice
        try dump.run()
        dump.waitUntilExit()
        #expect(dump.terminationStatus == 0)
        let text = try Data(contentsOf: URL(fileURLWithPath: out.path))
        let help = try #require(try? JSONSerialization.jsonObject(with: text) as? [String: Any], "\(text.count) bytes")
        let arguments = try #require((help["command"] as? [String: Any])?["arguments"] as? [[String: Any]])
        let names = Set(
            arguments.flatMap { ($0["names"] as? [[String: Any]]) ?? [] }.filter { $0["kind"] as? String == "long" }
                .compactMap { $0["name"] as? String })
        #expect(names.count > 40, "\(names)")
        #expect(names.subtracting(["config", "help", "version"]) == Set(RelayConfigFile.relayOptions.keys))
    }

    @Test(
        "the command line overrides the file's single-valued options; flags may repeat",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func commandLineOverridesTheFile() async throws {
        let config = try TemporaryFile(
            "listening-ip=127.0.0.1\nlistening-port=0\nrealm=from-file\nuser=alice:wonderland\nno-tcp\n")
        let (relay, _) = try #require(
            try await Harness.startRelay(["-c", config.path, "--realm", "from-command-line", "--no-tcp"]))
        defer { relay.kill() }
        #expect(await relay.waitFor(timeout: 5) { _, err in err.contains("realm=") }, "\(relay.stderr)")
        #expect(relay.stderr.contains("realm=from-command-line"), "\(relay.stderr)")
        #expect(!relay.stdout.contains("listening tcp"))
        #expect(await relay.stop() == 0)
    }

    @Test(
        "config-file mistakes are one line naming FILE:LINE, status 1",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"),
        arguments: [
            ("realm=example.org\nbogus-option=1\n", ":2: unknown option 'bogus-option'"),
            ("# users\nuser=alice:wonderland\nmin-port=lots\n", ":3: The value 'lots' is invalid for '--min-port"),
            ("\n\nno-udp=sometimes\n", ":3: 'no-udp' takes no value or a boolean"),
        ])
    func binaryRefusesBadConfigFiles(_ text: String, _ expected: String) async throws {
        let binary = try #require(Harness.tusa)
        let config = try TemporaryFile(text)
        let r = try await Harness.run(binary, ["relay", "-c", config.path, "--listen", "127.0.0.1:0"], timeout: 10)
        #expect(r.status == 1)
        #expect(r.stderr.hasPrefix("tusa relay: error: \(config.path)\(expected)"), "\(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "\(r.stderr)")
    }

    @Test(
        "a missing config file is a one-line error, status 1",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func binaryReportsMissingFile() async throws {
        let binary = try #require(Harness.tusa)
        let missing = try await Harness.run(
            binary, ["relay", "--config", "/nonexistent/turnserver.conf", "--listen", "127.0.0.1:0"], timeout: 10)
        #expect(missing.status == 1)
        #expect(
            missing.stderr == "tusa relay: error: cannot read config file '/nonexistent/turnserver.conf'\n", "\(missing.stderr)")
    }

    @Test(
        "every config-file option of tusa relay is one of its long flags",
        .enabled(if: Harness.tusa != nil, "tusa binary not built (set TUSA_BIN): binary test skipped"))
    func configOptionsAreRealFlags() async throws {
        let binary = try #require(Harness.tusa)
        let help = try await Harness.run(binary, ["relay", "--help"], timeout: 10)
        for name in RelayConfigFile.relayOptions.keys.sorted() {
            #expect(
                help.stdout.contains("--\(name) ") || help.stdout.contains("--\(name)\n") || help.stdout.contains("--\(name),")
                    || help.stdout.contains("--\(name) <"),
                "--\(name) is not in tusa relay --help")
        }
        #expect(RelayConfigFile.ignoredCoturnOptions.isDisjoint(with: RelayConfigFile.relayOptions.keys))
    }
}
