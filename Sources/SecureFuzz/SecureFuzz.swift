// libFuzzer entry point for the encrypted transport's parsers and openers
// (SecureFuzzChecks.exercise): media and control packets, the Noise IK
// responder, and live sessions under scripts (SecureSessionFuzzChecks, whose
// seeds these are). Built and run like STUNFuzz (scripts/fuzz.sh); the libFuzzer
// plumbing and the replay mode live in FuzzDriver.
import FuzzDriver
import Secure

@main
struct SecureFuzz {
    static func main() {
        FuzzDriver.run(name: "SecureFuzz", check: SecureFuzzChecks.exercise, seeds: SecureSessionFuzzChecks.seeds)
    }
}
