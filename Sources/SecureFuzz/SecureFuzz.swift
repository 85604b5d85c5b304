// libFuzzer entry point for the encrypted transport's parsers and openers
// (SecureFuzzChecks.exercise): media and control packets, and the Noise IK
// responder. Built and run like STUNFuzz (scripts/fuzz.sh); the libFuzzer
// plumbing and the replay mode live in FuzzDriver.
import FuzzDriver
import Secure

@main
struct SecureFuzz {
    static func main() {
        FuzzDriver.run(name: "SecureFuzz", check: SecureFuzzChecks.exercise)
    }
}
