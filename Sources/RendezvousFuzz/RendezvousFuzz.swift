// libFuzzer entry point for the directory's parsers and its server core
// (RendezvousFuzzChecks.exercise): rendezvous messages and stream framing,
// cluster notices, a stranger's and a registered peer's bytes. Built and run like
// STUNFuzz (scripts/fuzz.sh); the libFuzzer plumbing and the replay mode live in
// FuzzDriver.
import FuzzDriver
import Rendezvous

@main
struct RendezvousFuzz {
    static func main() {
        FuzzDriver.run(name: "RendezvousFuzz", check: RendezvousFuzzChecks.exercise)
    }
}
