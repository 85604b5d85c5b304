import ArgumentParser

/// `tusa`: the relay service, the STUN and TURN clients, and the interop checker.
@main
struct Tusa: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tusa",
        abstract: "Encrypted voice over UDP that gets through NATs.",
        version: TusaVersion.string,
        subcommands: [
            Relay.self, DirectoryCommand.self, Stun.self, Turn.self, Keygen.self, CallCommand.self, AnswerCommand.self,
            PartyCommand.self, ContactsCommand.self,
            VoiceCommand.self,
            Interop.self,
            Version.self,
        ]
    )
}
