// libFuzzer entry point for every STUN decoder (FuzzChecks.exercise) and the
// ICE agent's input handling (ICEFuzzChecks.exercise), with the TURN
// server's scripts for seeds (TURNServerFuzzChecks.seeds); the
// libFuzzer plumbing and the replay mode live in FuzzDriver.
import FuzzDriver
import ICE
import STUN
import TURN

@main
struct STUNFuzz {
    static func main() {
        FuzzDriver.run(
            name: "STUNFuzz",
            check: { bytes in
                FuzzChecks.exercise(bytes)
                TURNFuzzChecks.exercise(bytes)
                ICEFuzzChecks.exercise(bytes)
            }, seeds: TURNServerFuzzChecks.seeds)
    }
}
