import ArgumentParser
import Foundation
import STUN
import TusaInterop

/// `tusa interop`: tools for checking Tusa against other implementations.
struct Interop: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check captured STUN/TURN/ICE traffic; decrypt captured media with a key log.",
        subcommands: [Check.self, Decrypt.self]
    )

    struct Check: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Decode, round-trip and verify every STUN message and ChannelData frame.",
            discussion: """
                FILE is a pcap/pcapng capture (UDP and TCP) or a raw message file; a folder \
                means the capture and message files in it. Prints one summary line per file \
                and each failure with its packet number; exits 1 if anything failed.
                """
        )

        @Argument(help: "Capture files, raw message files, or folders of them.")
        var files: [String]

        @Option(name: .customLong("user"), help: "Long-term credentials USER:PASSWORD (repeatable).")
        var users: [String] = []

        @Option(help: "Realm for long-term keys (default: each message's REALM).")
        var realm: String?

        @Option(name: .customLong("secret"), help: "REST-API shared secret for usernames expiry[:user] (repeatable).")
        var secrets: [String] = []

        @Option(name: .customLong("ice"), help: "ICE short-term credentials UFRAG:PASSWORD (repeatable).")
        var ice: [String] = []

        func validate() throws {
            for u in users where InteropCredentials.pair(u) == nil {
                throw ValidationError("--user '\(u)' is not USER:PASSWORD")
            }
            for i in ice where InteropCredentials.pair(i) == nil {
                throw ValidationError("--ice '\(i)' is not UFRAG:PASSWORD")
            }
        }

        func run() throws {
            var credentials = InteropCredentials()
            for u in users { if let (n, p) = InteropCredentials.pair(u) { credentials.users[n] = p } }
            for i in ice { if let (n, p) = InteropCredentials.pair(i) { credentials.ice[n] = p } }
            credentials.secrets = secrets
            credentials.realm = realm
            let checker = InteropChecker(credentials: credentials)
            var anyFailed = false
            let paths = expand(files)
            // A folder with no capture in it checked nothing: that is not a pass.
            guard !paths.isEmpty else {
                FileHandle.standardError.write(
                    Data(
                        "tusa interop check: no captures in \(files.joined(separator: ", ")) (looked for .\(Self.extensions.sorted().joined(separator: ", .")))\n"
                            .utf8))
                throw ExitCode(1)
            }
            for path in paths {
                let report = checker.check(path: path)
                print("\(path): \(report.summary)")
                for f in report.failures { print("  \(f)") }
                for n in report.notes { print("  note: \(n)") }
                anyFailed = anyFailed || !report.passed
            }
            if anyFailed { throw ExitCode(1) }
        }

        static let extensions: Set<String> = ["pcap", "pcapng", "cap", "bin", "raw", "stun"]

        func expand(_ inputs: [String]) -> [String] {
            var out: [String] = []
            let fm = FileManager.default
            for input in inputs {
                var isDirectory: ObjCBool = false
                if fm.fileExists(atPath: input, isDirectory: &isDirectory), isDirectory.boolValue {
                    let names = (try? fm.contentsOfDirectory(atPath: input)) ?? []
                    out += names.sorted()
                        .filter { Self.extensions.contains(($0 as NSString).pathExtension.lowercased()) }
                        .map { (input as NSString).appendingPathComponent($0) }
                } else {
                    out.append(input)
                }
            }
            return out
        }
    }
}
