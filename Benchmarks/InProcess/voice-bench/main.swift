import ArgumentParser
import Voice

struct VoiceBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "voice-bench",
        abstract: "Voice engine benchmarks: jitter-buffer delay, echo return loss, CPU per call-second.",
        subcommands: [JitterBench.self, EchoBench.self, CPUBench.self]
    )
}

VoiceBench.main()
