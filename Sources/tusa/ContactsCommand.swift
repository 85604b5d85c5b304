import ArgumentParser
import Foundation
import Secure
import Transport

/// `tusa contacts`: the keys a user takes invitations and calls from freely, held by
/// the rendezvous or directory. To it anyone else is a stranger: a key reaches only a
/// few strangers an hour, and a user's box keeps only a few strangers' invitations,
/// so a flood of invitations to strangers stops short and never pushes out a friend's.
struct ContactsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "contacts",
        abstract: "List, add or remove your contacts: the keys whose invitations and calls the rendezvous lets through freely.",
        discussion: """
            Contacts are kept by the rendezvous (or directory) under your key, so every device with your identity \
            sees the same ones (across its restarts when it keeps a database: tusa directory, or tusa relay \
            --rendezvous-database). Anyone not in them is a stranger to you: a key may reach only a few strangers \
            an hour, and your box keeps only a few strangers' invitations; your contacts' invitations reach you \
            without counting against their post budget. At most 250 contacts. 'tusa party create --contacts' \
            invites every contact. Exit status: 0, 64 on bad usage, 2 when the rendezvous could not be reached or \
            refused (one that predates contacts closes the connection).
            """,
        subcommands: [ContactsList.self, ContactsAdd.self, ContactsRemove.self],
        defaultSubcommand: ContactsList.self
    )
}

/// A user at a rendezvous: where (`--rendezvous`, one or several directory nodes)
/// and as whom (`--identity`). What `tusa contacts` and `tusa party list` share.
struct RendezvousUser: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "The relay's rendezvous, HOST:PORT, or a directory's. \(RendezvousServers.listHelp)", valueName: "host:port"))
    var rendezvous: String

    @Option(
        name: .customLong("identity"),
        help: ArgumentHelp("Identity key file (tusa keygen); default ~/.config/tusa/identity.key.", valueName: "file"))
    var identity: String?
}

extension RendezvousUser {
    /// Adds `add`, removes `remove` (both empty: only asks) and prints the contacts now.
    func changeContacts(add: [PublicKey], remove: [PublicKey], command: String) async throws {
        let servers = try RendezvousServers.parse(rendezvous)
        // Contacts are kept under a key: a fresh one (what a call without an identity uses) has none.
        guard identity != nil || FileManager.default.fileExists(atPath: Keygen.defaultPath) else {
            throw ValidationError(
                "contacts are kept under your key: give --identity FILE, or make \(Keygen.defaultPath) with tusa keygen")
        }
        let me: Identity
        do { me = try AudioArguments.identity(identity) } catch { throw ValidationError("\(error)") }
        let connection: RendezvousConnection
        do { connection = try await RendezvousConnection.connect(toAnyOf: servers, identity: me.privateKey) } catch {
            FileHandle.standardError.write(Data("tusa \(command): \(error)\n".utf8))
            throw ExitCode(2)
        }
        let now: [PublicKey]
        do { now = try await connection.contacts(add: add, remove: remove) } catch {
            let older =
                if case RendezvousConnectionError.refused(.malformed, let detail) = error, detail.contains("change-contacts") {
                    " (this rendezvous predates contacts: it needs a newer tusa)"
                } else { "" }
            FileHandle.standardError.write(Data("tusa \(command): \(error)\(older)\n".utf8))
            await connection.close()
            throw ExitCode(2)
        }
        await connection.close()
        if now.isEmpty { print("no contacts") }
        for key in now { print(key.base64) }
    }

}

/// The keys `tusa contacts add` and `remove` are given.
struct ContactKeys: ParsableArguments {
    @Argument(help: "Public keys (base64), as tusa keygen prints them.")
    var keys: [String]

    /// (An empty list is ArgumentParser's usage error already: the argument has no default.)
    func validate() throws { _ = try parsed() }

    /// The keys, or a usage error naming the one that is not a key.
    func parsed() throws -> [PublicKey] {
        try keys.map { text in
            guard let key = PublicKey(base64: text) else { throw ValidationError("'\(text)' is not a 32-byte base64 public key") }
            return key
        }
    }
}

struct ContactsList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "list", abstract: "Print your contacts, one key a line.")

    @OptionGroup var user: RendezvousUser

    func run() async throws { try await user.changeContacts(add: [], remove: [], command: "contacts list") }
}

struct ContactsAdd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "add", abstract: "Make these keys contacts, then print your contacts.")

    @OptionGroup var keys: ContactKeys
    @OptionGroup var user: RendezvousUser

    func run() async throws { try await user.changeContacts(add: try keys.parsed(), remove: [], command: "contacts add") }
}

struct ContactsRemove: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "remove", abstract: "Make these keys strangers again, then print your contacts.")

    @OptionGroup var keys: ContactKeys
    @OptionGroup var user: RendezvousUser

    func run() async throws { try await user.changeContacts(add: [], remove: try keys.parsed(), command: "contacts remove") }
}
