import ICE
import STUN
import TestSupport
import Testing
import TusaBase

// Two agents, each behind a NAT of its own (RFC 4787 behaviours), gathering a
// server-reflexive candidate from a STUN server on the VirtualNetwork, then
// checking: which pair wins depends on the NATs' mapping and filtering.

private func ip(_ a: UInt8, _ b: UInt8, _ c: UInt8, _ d: UInt8) -> IPAddress {
    .v4(UInt32(a) << 24 | UInt32(b) << 16 | UInt32(c) << 8 | UInt32(d))
}

/// A STUN Binding server (the STUN core's) at one public address.
private final class BindingServerNode: VirtualNode {
    let addresses: [TransportAddress]
    let network: VirtualNetwork
    let server = BindingServer()
    var nextDeadline: Timestamp? { nil }

    init(at address: TransportAddress, on network: VirtualNetwork) {
        addresses = [address]
        self.network = network
    }

    func handleTimeout(now: Timestamp) {}

    func receive(_ datagram: VirtualNetwork.Datagram, now: Timestamp) {
        guard let (response, destination, _) = server.handle(datagram.bytes, from: datagram.from) else { return }
        network.send(response, from: addresses[0], to: destination)
    }
}

private struct Site {
    let host: TransportAddress
    let nat: VirtualNetwork.NATID
    var srflx: TransportAddress?
}

private final class NATPair {
    let network = VirtualNetwork(impairment: .init(delay: .milliseconds(15)))
    let stun = TransportAddress(ip: ip(198, 51, 100, 1), port: 3478)
    var a: Site
    var b: Site
    var agents: [VirtualHost<ICEAgent>] = []

    init(a natA: NAT, b natB: NAT) {
        a = Site(host: TransportAddress(ip: ip(10, 0, 0, 2), port: 5000), nat: network.addNAT(natA))
        b = Site(host: TransportAddress(ip: ip(192, 168, 1, 9), port: 6000), nat: network.addNAT(natB))
        network.attach(BindingServerNode(at: stun, on: network))
        a.srflx = gather(a)
        b.srflx = gather(b)
    }

    /// A Binding transaction (the STUN client core) from the site's socket.
    func gather(_ site: Site) -> TransportAddress? {
        let request = Message(type: .bindingRequest)
        let transaction = ClientTransaction(
            transactionID: request.transactionID, request: request.encode(fingerprint: true),
            reliability: .unreliable(rto: .milliseconds(250), rc: 4, rm: 4))
        let stun = self.stun
        let client = VirtualHost(transaction, at: [site.host], on: network) { d in
            (try? Message(decoding: d.bytes)).map { .response($0) }
        } output: { action in
            guard case .send(let bytes) = action else { return nil }
            return (bytes, site.host, stun)
        }
        network.attach(client, behind: site.nat)
        client.handle(.start)
        network.run(for: .seconds(5)) { !client.reported.isEmpty }
        network.detach(client)
        guard case .answered(let response)? = client.reported.first,
            case .xorMappedAddress(let mapped)? = try? response.value(.xorMappedAddress)
        else { return nil }
        return mapped
    }

    func agent(_ site: Site, role: ICERole, tieBreaker: UInt64) -> VirtualHost<ICEAgent> {
        var candidates: [ICELocalCandidate] = [.host(site.host, base: 0)]
        if let srflx = site.srflx { candidates.append(.serverReflexive(srflx, baseAddress: site.host, base: 0)) }
        let host = site.host
        let agent = VirtualHost(ICEAgent(role: role, candidates: candidates, tieBreaker: tieBreaker), at: [host], on: network) {
            d in
            .datagram(d.bytes, from: d.from, base: 0)
        } output: { action in
            guard case .send(let bytes, _, let to) = action else { return nil }
            return (bytes, host, to)
        }
        network.attach(agent, behind: site.nat)
        agents.append(agent)
        return agent
    }

    /// Runs both agents until both selected a pair (or one failed), or 15 s.
    func connect() -> (a: ICEPair?, b: ICEPair?, aFailed: Bool) {
        let x = agent(a, role: .controlling, tieBreaker: 7)
        let y = agent(b, role: .controlled, tieBreaker: 9)
        x.handle(.setRemote(y.core.local, candidates: y.core.advertised, complete: true))
        y.handle(.setRemote(x.core.local, candidates: x.core.advertised, complete: true))
        network.run(for: .seconds(15)) {
            (x.core.selected != nil && y.core.selected != nil) || x.core.state == .failed
        }
        #expect(network.spins == 0)
        return (x.core.selected, y.core.selected, x.core.state == .failed)
    }
}

@Suite("ICE through NATs on the virtual network")
struct ICENATTests {
    /// Endpoint-independent mapping on both sides: each side's server-reflexive
    /// address is what the other sees, and the pair is host → the peer's srflx
    /// (port-restricted filtering opens once both have sent).
    @Test func twoConeNATsConnectOnTheServerReflexivePair() throws {
        let net = NATPair(a: .portRestrictedCone(ip(203, 0, 113, 10)), b: .portRestrictedCone(ip(203, 0, 113, 20)))
        let aSrflx = try #require(net.a.srflx)
        let bSrflx = try #require(net.b.srflx)
        #expect(aSrflx.ip == ip(203, 0, 113, 10) && bSrflx.ip == ip(203, 0, 113, 20))
        let (a, b, _) = net.connect()
        let pa = try #require(a)
        let pb = try #require(b)
        #expect(pa.local.candidate.address == net.a.host && pa.remote.address == bSrflx && pa.remote.type == .srflx, "\(pa)")
        #expect(pb.local.candidate.address == net.b.host && pb.remote.address == aSrflx && pb.remote.type == .srflx, "\(pb)")
    }

    /// A symmetric NAT maps a's socket anew for b: b learns that mapping from
    /// a's checks as a peer-reflexive candidate (not a's srflx, which only the
    /// STUN server may use); b's address-restricted cone lets a's checks in
    /// once b has sent to a's public IP.
    @Test func aSymmetricNATAgainstARestrictedConeConnectsOnAPeerReflexivePair() throws {
        let natA = NAT.symmetric(ip(203, 0, 113, 10))
        let net = NATPair(a: natA, b: .restrictedCone(ip(203, 0, 113, 20)))
        let aSrflx = try #require(net.a.srflx)
        let bSrflx = try #require(net.b.srflx)
        let (a, b, _) = net.connect()
        let pa = try #require(a)
        let pb = try #require(b)
        let aForB = try #require(net.network.mapping(net.a.nat, of: net.a.host, for: bSrflx))
        #expect(aForB != aSrflx, "a symmetric NAT maps per destination")
        #expect(pa.local.candidate.address == net.a.host && pa.remote.address == bSrflx, "\(pa)")
        #expect(pb.remote.address == aForB && pb.remote.type == .prflx, "\(pb)")
    }

    /// A symmetric NAT against a port-restricted cone: a's checks come from a
    /// mapping b never sent to, and b's go to one only the STUN server may use.
    /// No pair works (that is what a relay is for).
    @Test func aSymmetricNATAgainstAPortRestrictedConeFails() throws {
        let net = NATPair(a: .symmetric(ip(203, 0, 113, 10)), b: .portRestrictedCone(ip(203, 0, 113, 20)))
        _ = try #require(net.a.srflx)
        let (a, b, failed) = net.connect()
        #expect(a == nil && b == nil)
        #expect(failed, "every check timed out, so the agent gave up")
    }
}
