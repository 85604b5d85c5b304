// libFuzzer entry point for every STUN decoder (FuzzChecks.exercise); the
// libFuzzer plumbing and the replay mode live in FuzzDriver.
import FuzzDriver
import STUN

@main
struct STUNFuzz {
    static func main() {
        FuzzDriver.run(name: "STUNFuzz", check: FuzzChecks.exercise)
    }
}
