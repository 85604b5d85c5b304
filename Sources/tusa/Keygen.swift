import ArgumentParser
import Foundation
import Secure

/// `tusa keygen`: a long-term identity key, and its fingerprint.
struct Keygen: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create an identity key file (mode 0600) and print its public key and fingerprint.",
        discussion: """
            The public key is what others add to reach you; the fingerprint (30 digits) is \
            what you read to each other to check that nobody sits in between. With --show, \
            prints them for an existing key file instead.
            """
    )

    @Option(name: [.short, .customLong("out")], help: "Key file to write (default: ~/.config/tusa/identity.key).")
    var out: String?

    @Flag(help: "Replace an existing key file (its old identity is lost).")
    var force = false

    @Option(help: "Print the public key and fingerprint of this key file; write nothing.")
    var show: String?

    static var defaultPath: String {
        let home = ProcessInfo.processInfo.environment["HOME"] ?? "."
        return home + "/.config/tusa/identity.key"
    }

    func run() throws {
        do {
            if let show {
                describe(try Identity.read(from: show), path: show)
                return
            }
            let path = out ?? Self.defaultPath
            let dir = (path as NSString).deletingLastPathComponent
            if !dir.isEmpty, !FileManager.default.fileExists(atPath: dir) {
                try FileManager.default.createDirectory(
                    atPath: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            }
            let identity = Identity.generate()
            try identity.write(to: path, overwrite: force)
            describe(identity, path: path)
        } catch let e as IdentityFileError {
            FileHandle.standardError.write(Data("tusa keygen: \(e)\n".utf8))
            throw ExitCode(1)
        } catch {
            FileHandle.standardError.write(Data("tusa keygen: \(error.localizedDescription)\n".utf8))
            throw ExitCode(1)
        }
    }

    private func describe(_ identity: Identity, path: String) {
        print("key file:    \(path)")
        print("public key:  \(identity.publicKey.base64)")
        print("fingerprint: \(Fingerprint.digits(of: identity.publicKey))")
    }
}
