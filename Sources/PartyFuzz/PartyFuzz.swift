// libFuzzer entry point for the party wire formats and room cores
// (PartyFuzzChecks.exercise): SFrame and voice frame headers, control messages,
// the control channel's parts, invitations, and what reaches the relay's room
// core and a member's core in a room of two. Built and run like STUNFuzz
// (scripts/fuzz.sh); the libFuzzer plumbing and the replay mode live in FuzzDriver.
import FuzzDriver
import Party

@main
struct PartyFuzz {
    static func main() {
        FuzzDriver.run(name: "PartyFuzz", check: PartyFuzzChecks.exercise, seeds: PartyFuzzChecks.seeds)
    }
}
