// libFuzzer entry point for the voice receive path (VoiceFuzzChecks.exercise): the
// packets a call peer or party member sends, as sequence numbers, timestamps,
// arrival times and payloads of its choosing, through redundant-audio parsing, the
// jitter buffers (Tusa's and speexdsp's) and the Opus, Speex and L16 decoders.
// Built and run like STUNFuzz (scripts/fuzz.sh); the libFuzzer plumbing and the
// replay mode live in FuzzDriver.
import FuzzDriver
import Voice

@main
struct VoiceFuzz {
    static func main() {
        FuzzDriver.run(name: "VoiceFuzz", check: VoiceFuzzChecks.exercise, seeds: VoiceFuzzChecks.seeds)
    }
}
