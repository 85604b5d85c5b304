import STUN
import TusaBase

/// What the fuzzers (and the unit tests that replay their inputs) run on one
/// input: the bytes as a peer's candidate line (one that reads must write a line
/// that reads the same); an agent in each role fed the bytes as they are, and fed them again
/// re-signed with its own credentials (so that fuzzed attributes get past the
/// integrity check into the request and response handlers), then timed out. Any
/// crash or trap is a bug.
public enum ICEFuzzChecks {
    static let local = ICECredentials(ufrag: "fuzz", pwd: "fuzzfuzzfuzzfuzzfuzzfu")
    static let remote = ICECredentials(ufrag: "peer", pwd: "peerpeerpeerpeerpeerpe")
    static let peer = TransportAddress(ip: .v4(0x7F00_0001), port: 7000)

    public static func exercise(_ bytes: [UInt8]) {
        candidateLine(bytes)
        for role in [ICERole.controlling, .controlled] {
            var agent = ICEAgent(
                role: role, local: local,
                candidates: [.host(TransportAddress(ip: .v4(0x7F00_0001), port: 9000), base: 0)], tieBreaker: 5)
            agent.setRemote(remote, candidates: [ICECandidate(foundation: "1", priority: 1, address: peer, type: .host)])
            var now = Timestamp.seconds(1)
            agent.handleTimeout(now: now)
            _ = agent.drainActions()
            _ = agent.receive(bytes, from: peer, base: 0, now: now)
            _ = agent.drainActions()
            if let m = try? Message(decoding: bytes) {
                let key = try? IntegrityKey.shortTerm(password: m.type.messageClass == .request ? local.pwd : remote.pwd)
                var stripped = m
                stripped.attributes.removeAll {
                    $0.type == .messageIntegrity || $0.type == .fingerprint || $0.type == .messageIntegritySHA256
                }
                agent.handle(.datagram(stripped.encode(integrity: key, fingerprint: true), from: peer, base: 0), now: now)
                _ = agent.drainActions()
            }
            now = now + .seconds(1)
            agent.handleTimeout(now: now)
            _ = agent.drainActions()
            _ = agent.nextDeadline
        }
    }

    /// A peer's candidate line (the input as text) that reads writes a line that reads the same.
    static func candidateLine(_ bytes: [UInt8]) {
        guard let candidate = try? ICECandidate(sdp: String(decoding: bytes, as: UTF8.self)) else { return }
        precondition(
            (try? ICECandidate(sdp: candidate.sdp)) == candidate, "a candidate line does not read back: \(candidate.sdp)")
    }
}
