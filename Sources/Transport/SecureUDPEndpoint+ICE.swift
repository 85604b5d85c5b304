import ICE
import NIOCore
import STUN
import Secure
import TusaBase

/// The bases (RFC 8445 §5.1.1) of a ``SecureUDPEndpoint``'s ICE agent.
public enum ICEBase {
    /// The endpoint's UDP socket: host and server-reflexive candidates.
    public static let socket = 0
    /// The TURN allocation made with ``SecureUDPEndpoint/useRelay(_:configuration:)``.
    public static let relay = 1
}

extension SecureUDPEndpoint {
    /// Runs an ICE agent on this endpoint's socket (base ``ICEBase/socket``) and,
    /// after ``useRelay(_:configuration:)``, its relay allocation (base
    /// ``ICEBase/relay``): the checks share the socket with the Noise session
    /// (RFC 7983 first-byte demultiplexing), and the selected pair decides whether
    /// the peer is reached directly or through the relay. Returns what to signal.
    ///
    /// - Parameter stunServer: learn a server-reflexive candidate for the socket
    ///   from this STUN server (waiting at most `gatherTimeout`); not the relay's
    ///   address when ``useRelay(_:configuration:)`` ran (its allocation already
    ///   told the mapped address).
    public func startICE(
        role: ICERole, candidates: [ICELocalCandidate], credentials: ICECredentials = .random(),
        stunServer: TransportAddress? = nil, gatherTimeout: Duration = .seconds(1),
        configuration: ICEConfiguration = .init()
    ) async throws(SecureTransportError) -> ICEDescription {
        guard credentials.isValid else { throw .ice(.badDescription("ice-ufrag/ice-pwd are not valid (4+/22+ ice-chars)")) }
        guard !candidates.isEmpty || stunServer != nil else { throw .ice(.badDescription("no local candidates")) }
        let local = localAddress
        let gathered = try await onLoop { e -> EventLoopFuture<Void> in
            if e.ice != nil { throw SecureTransportError.ice(.failed("ICE already runs on this endpoint")) }
            if candidates.contains(where: { $0.base == ICEBase.relay }), e.turn == nil {
                throw SecureTransportError.ice(.badDescription("a relayed candidate without a relay (useRelay first)"))
            }
            let engine = e.makeICEEngine()
            e.ice = engine
            engine.start(
                ICEAgent(
                    role: role, local: credentials, candidates: candidates, gatheringComplete: stunServer == nil,
                    configuration: configuration),
                stunServer: stunServer, local: local)
            return engine.gathered(timeout: gatherTimeout)
        }
        _ = try? await gathered.get()
        return try await onLoop { e in
            guard let ice = e.ice else { throw SecureTransportError.closed }
            return ice.description
        }
    }

    /// Checks the pairs against the peer's description and returns the selected
    /// pair (or throws when every pair failed, or after `timeout`). With a relay,
    /// permissions for the peer's candidate addresses are installed first.
    @discardableResult
    public func connectICE(to remote: ICEDescription, timeout: Duration = .seconds(10)) async throws(SecureTransportError)
        -> ICEPair
    {
        guard remote.credentials.isValid else { throw .ice(.badDescription("the peer's ice-ufrag/ice-pwd are not valid")) }
        if let turn = try await onLoop({ $0.turn }) {
            // One request per address: the relay refuses some (its own networks), and
            // one refusal must not cost the others. Bounded: a check retries anyway.
            let ips = Array(Set(remote.candidates.map(\.address.ip)))
            await withTaskGroup(of: Void.self) { group in
                for ip in ips.prefix(16) {
                    group.addTask { try? await turn.createPermission(for: [ip], timeout: .seconds(2)) }
                }
            }
        }
        let future = try await onLoop { e -> EventLoopFuture<ICEPair> in
            guard let ice = e.ice else { throw SecureTransportError.ice(.failed("startICE first")) }
            return ice.connect(remote, timeout: timeout)
        }
        do { return try await future.get() } catch let e as ICEEndpointError { throw .ice(e) } catch { throw .closed }
    }

    /// From now on the secure session's address for `peer` follows ICE's selected
    /// pair (after a restart, or a better nomination).
    public func followICE(_ peer: PeerID) async throws(SecureTransportError) {
        try await onLoop { e in
            e.iceFollower = peer
            if let pair = e.ice?.selected { e.core.setAddress(pair.remote.address, of: peer) }
        }
    }

    /// ICE restart (RFC 8445 §9): new credentials, optionally new candidates; the
    /// selected pair carries media until checks against the peer's new description
    /// (``connectICE(to:timeout:)``) select another.
    public func restartICE(candidates: [ICELocalCandidate]? = nil) async throws(SecureTransportError) -> ICEDescription {
        try await onLoop { e in
            guard let ice = e.ice else { throw SecureTransportError.ice(.failed("startICE first")) }
            return ice.restart(candidates: candidates)
        }
    }

    /// The selected pair, if any.
    public func selectedPair() async -> ICEPair? {
        (try? await onLoop { $0.ice?.selected }) ?? nil
    }
}

extension SecureEngine {
    /// An ICE engine whose checks leave from the socket (base 0, never wrapped for
    /// the relay) or the relay allocation (base 1), and whose selected pair routes the peer.
    func makeICEEngine() -> ICEEngine {
        let bound = NIOLoopBound(self, eventLoop: channelEventLoop)
        return ICEEngine(
            eventLoop: channelEventLoop,
            output: { bytes, base, to in bound.value.writeICE(bytes, base: base, to: to) },
            flush: { bound.value.flush() },
            onEvent: { bound.value.iceReported($0) })
    }

    private func writeICE(_ bytes: [UInt8], base: Int, to address: TransportAddress) {
        if base == ICEBase.relay {
            // A check the relay cannot take yet (no permission): its retransmission will.
            try? sendThroughRelay(bytes, to: address)
        } else {
            writeDirect(bytes, to: address)
        }
    }

    private func iceReported(_ event: ICEEvent) {
        if case .selected(let pair) = event {
            if pair.base == ICEBase.relay {
                relayed.insert(pair.remote.address)
                // ChannelData (4 bytes of overhead, not 36) once the channel is bound.
                if let turn { Task { try? await turn.bindChannel(to: pair.remote.address, timeout: .seconds(5)) } }
            } else {
                relayed.remove(pair.remote.address)
            }
            if let peer = iceFollower { core.setAddress(pair.remote.address, of: peer) }
        }
        yield(.ice(event))
    }
}
