// libFuzzer entry point for a call's signalling (CallFuzzChecks.exercise): call
// messages as any peer sends them through the rendezvous, and the call
// controller, caller and callee, under a script of the peer's messages, the
// driver's events and time. Built and run like STUNFuzz (scripts/fuzz.sh); the
// libFuzzer plumbing and the replay mode live in FuzzDriver.
import CallControl
import FuzzDriver

@main
struct CallFuzz {
    static func main() {
        FuzzDriver.run(name: "CallFuzz", check: CallFuzzChecks.exercise, seeds: CallFuzzChecks.seeds)
    }
}
