import STUN
import TusaBase

/// Which side nominates (RFC 8445 §6.1.1): the caller is controlling.
public enum ICERole: String, Hashable, Sendable {
    case controlling, controlled

    var other: ICERole { self == .controlling ? .controlled : .controlling }
}

/// An agent's short-term credentials (ice-ufrag, ice-pwd).
public struct ICECredentials: Hashable, Sendable {
    public var ufrag: String
    public var pwd: String

    public init(ufrag: String, pwd: String) {
        self.ufrag = ufrag
        self.pwd = pwd
    }

    /// Fresh random credentials: 8 and 24 ice-chars (RFC 8839 asks for at least 4 and 22).
    public static func random() -> ICECredentials {
        var rng = SystemRandomNumberGenerator()
        let chars = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
        func pick(_ n: Int) -> String { String((0..<n).map { _ in chars[Int(rng.next() % UInt64(chars.count))] }) }
        return ICECredentials(ufrag: pick(8), pwd: pick(24))
    }

    /// Whether these credentials can be used on the wire (ice-char only, RFC 8839 lengths).
    public var isValid: Bool {
        func iceChars(_ s: String) -> Bool {
            s.utf8.allSatisfy {
                ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x2B || $0 == 0x2F
            }
        }
        return (4...256).contains(ufrag.utf8.count) && (22...256).contains(pwd.utf8.count) && iceChars(ufrag) && iceChars(pwd)
    }
}

/// A candidate pair: where checks (and then media) go from and to.
public struct ICEPair: Hashable, Sendable, CustomStringConvertible {
    public var local: ICELocalCandidate
    public var remote: ICECandidate
    /// The socket or relay allocation to send from.
    public var base: Int { local.base }
    /// A pair through a TURN relay on either side.
    public var isRelayed: Bool { local.candidate.type == .relay || remote.type == .relay }
    public var description: String { "\(local.candidate) -> \(remote)" }
}

public enum ICEEvent: Hashable, Sendable {
    /// The nominated pair: media goes here from now on (again on a better nomination or after a restart).
    case selected(ICEPair)
    /// A role conflict was resolved by switching to this role.
    case roleChanged(ICERole)
    /// No pair can work: every check failed and both sides said they have no more candidates.
    case failed(String)
    /// The selected pair's consent expired (RFC 7675): stop sending on it.
    case consentLost(ICEPair)
}

/// What an ``ICEAgent`` asks its driver to do (its ``SansIOCore`` action).
public enum ICEOutput: Hashable, Sendable {
    /// Send `bytes` from the socket (or relay allocation) `base` to `to`.
    case send([UInt8], base: Int, to: TransportAddress)
    case event(ICEEvent)
}

public struct ICEConfiguration: Hashable, Sendable {
    /// The pacing of new checks (RFC 8445 §14.2: 50 ms by default).
    public var ta: Duration = .milliseconds(50)
    /// First retransmission interval of a check, then doubling; `checkTransmissions`
    /// in all, and a final wait of `checkFinalWait` RTOs (about 8.75 s to give up).
    public var checkRTO: Duration = .milliseconds(250)
    public var checkTransmissions = 6
    public var checkFinalWait = 4
    /// How long the controlling agent waits, after its first valid pair, for a
    /// better one to succeed before it nominates.
    public var nominationDelay: Duration = .milliseconds(200)
    /// Consent freshness (RFC 7675): a check every interval (randomized ±20%),
    /// consent lost after `consentTimeout` without an answer.
    public var consentInterval: Duration = .seconds(5)
    public var consentTimeout: Duration = .seconds(30)
    /// At most this many pairs (RFC 8445 §6.1.2.5 suggests 100) and remote candidates.
    public var maxPairs = 100
    public var maxRemoteCandidates = 64

    public init() {}
}

/// An RFC 8445 ICE agent for one UDP component, as a sans-IO core (``SansIOCore``).
///
/// The driver owns the sockets (and TURN allocations), each named by an integer
/// base. It passes every datagram that may be STUN to ``receive(_:from:base:now:)``
/// — false means "not ICE's", hand it on — (or as ``Input/datagram(_:from:base:)``
/// when it need not know), calls ``handleTimeout(now:)`` at ``nextDeadline`` and
/// performs the ``ICEOutput``s that ``pollAction()`` gives. Checks carry USERNAME,
/// PRIORITY, ICE-CONTROLLING/ICE-CONTROLLED, USE-CANDIDATE when nominating,
/// MESSAGE-INTEGRITY (short-term) and FINGERPRINT. Nomination is regular: the
/// controlling agent nominates its best valid pair with a second check.
/// Server-reflexive candidates are advertised but not paired (they share their
/// host base: a check from it is the same as the host's).
public struct ICEAgent: SansIOCore, Sendable {
    public enum State: Hashable, Sendable { case checking, completed, failed }

    /// What the driver and the signalling tell the agent.
    public enum Input: Hashable, Sendable {
        /// A datagram from `source` on `base` that may be STUN (anything else is ignored).
        case datagram([UInt8], from: TransportAddress, base: Int)
        /// The peer's credentials and candidates (see ``ICEAgent/setRemote(_:candidates:complete:)``).
        case setRemote(ICECredentials, candidates: [ICECandidate], complete: Bool)
        /// One more candidate of the peer's (trickled).
        case addRemote(ICECandidate)
        /// The peer has no more candidates.
        case remoteCandidatesComplete
        /// A candidate of ours gathered late (server-reflexive or relayed).
        case addLocal(ICELocalCandidate)
        /// Our gathering is over.
        case localCandidatesComplete
        /// ICE restart (see ``ICEAgent/restart(local:candidates:)``).
        case restart(local: ICECredentials, candidates: [ICELocalCandidate]?)
        /// The peer's authenticated packets come from another address now (see ``ICEAgent/remoteMoved(to:now:)``).
        case remoteMoved(TransportAddress)
    }
    public typealias Action = ICEOutput

    struct PairEntry: Sendable {
        var pair: ICEPair
        var priority: UInt64
        var state: PairState
        var transaction: ClientTransaction?
        var transactionIsNomination = false
        var earlierTransactions: [TransactionID] = []
        /// Controlled side: the peer nominated this pair; select it once it is valid.
        var nominatedByPeer = false
    }
    enum PairState: Hashable, Sendable { case frozen, waiting, inProgress, succeeded, failed }

    public let configuration: ICEConfiguration
    public private(set) var role: ICERole
    public let tieBreaker: UInt64
    public private(set) var local: ICECredentials
    public private(set) var remote: ICECredentials?
    public private(set) var localCandidates: [ICELocalCandidate]
    public private(set) var remoteCandidates: [ICECandidate] = []
    public private(set) var state: State = .checking
    public private(set) var selected: ICEPair?
    /// The selected pair's consent expired (RFC 7675 §5.1): nothing but checks may
    /// be sent on it, through a restart, until a pair is selected again.
    public private(set) var consentExpired = false

    var pairs: [PairEntry] = []
    private var triggered: [Int] = []
    private var nextCheckAt = Timestamp.zero
    private var firstValidAt: Timestamp?
    private var remoteComplete = false
    private var localComplete = false
    private var prflxCount = 0
    private var checkingSince: Timestamp?
    private var consentTransactions: [TransactionID] = []
    private var lastConsent = Timestamp.zero
    private var nextConsentAt = Timestamp.zero
    private var random: SplitMix64
    /// What ``pollAction()`` gives next, in order.
    private var queued: [ICEOutput] = []

    /// - Parameter gatheringComplete: false while server-reflexive or relayed
    ///   candidates may still come (then call ``localCandidatesComplete()``).
    public init(
        role: ICERole, local: ICECredentials = .random(), candidates: [ICELocalCandidate], gatheringComplete: Bool = true,
        tieBreaker: UInt64 = UInt64.random(in: 1...UInt64.max), configuration: ICEConfiguration = .init()
    ) {
        self.localComplete = gatheringComplete
        self.role = role
        self.local = local
        self.localCandidates = candidates
        self.tieBreaker = tieBreaker
        self.configuration = configuration
        self.random = SplitMix64(seed: tieBreaker | 1)
    }

    /// The candidates to advertise, best first.
    public var advertised: [ICECandidate] { localCandidates.map(\.candidate).sorted { $0.priority > $1.priority } }

    /// Whether a datagram that is not STUN, from `source`, is the peer's data.
    /// RFC 8445 §12.2: data may come on any pair, not only the selected one, and
    /// before this side selects: the controlling agent sends once its nomination is
    /// answered, which can be before the controlled agent's own check of that pair
    /// has succeeded. So: the selected pair's remote, or any candidate of the peer's,
    /// signalled or learnt from a check that carried its password; nobody else.
    public func acceptsData(from source: TransportAddress) -> Bool {
        selected?.remote.address == source || remoteCandidates.contains { $0.address == source }
    }

    // MARK: Candidates and credentials

    /// The peer's credentials and candidates (from its offer or answer).
    /// `complete`: the peer has no more candidates to trickle.
    public mutating func setRemote(_ credentials: ICECredentials, candidates: [ICECandidate], complete: Bool = true) {
        remote = credentials
        for c in candidates { addRemote(c) }
        if complete { remoteComplete = true }
    }

    public mutating func addRemote(_ candidate: ICECandidate) {
        guard candidate.component == 1, remoteCandidates.count < configuration.maxRemoteCandidates else { return }
        if let i = remoteCandidates.firstIndex(where: { $0.address == candidate.address }) {
            // A signalled candidate replaces a peer-reflexive one learnt from a check
            // (the peer's check came before its description), in its pairs too: they
            // rank by the signalled priority, not the prflx one (which would put a
            // host pair below every other host pair).
            if remoteCandidates[i].type == .prflx && candidate.type != .prflx {
                remoteCandidates[i] = candidate
                for j in pairs.indices where pairs[j].pair.remote.address == candidate.address {
                    pairs[j].pair.remote = candidate
                }
                recomputePriorities()
            }
            return
        }
        remoteCandidates.append(candidate)
        for l in localCandidates where l.candidate.type != .srflx { addPair(l, candidate) }
    }

    public mutating func remoteCandidatesComplete() { remoteComplete = true }

    /// A candidate gathered late (server-reflexive or relayed, trickled).
    public mutating func addLocal(_ candidate: ICELocalCandidate) {
        guard
            !localCandidates.contains(where: { $0.base == candidate.base && $0.candidate.address == candidate.candidate.address })
        else { return }
        localCandidates.append(candidate)
        guard candidate.candidate.type != .srflx else { return }
        for r in remoteCandidates { addPair(candidate, r) }
    }

    /// Gathering is over: no more local candidates will be added.
    public mutating func localCandidatesComplete() { localComplete = true }

    /// ICE restart (RFC 8445 §9): new local credentials (to signal again), the
    /// peer's candidates and all checks forgotten. The selected pair stays in
    /// use until a new one is selected (unless its consent expired: see
    /// ``consentExpired``).
    public mutating func restart(local credentials: ICECredentials = .random(), candidates: [ICELocalCandidate]? = nil) {
        local = credentials
        remote = nil
        if let candidates { localCandidates = candidates }
        remoteCandidates = []
        pairs = []
        triggered = []
        firstValidAt = nil
        checkingSince = nil
        remoteComplete = false
        consentTransactions = []
        state = .checking
    }

    // MARK: Input

    public mutating func handle(_ input: Input, now: Timestamp) {
        switch input {
        case .datagram(let bytes, let source, let base): _ = receive(bytes, from: source, base: base, now: now)
        case .setRemote(let credentials, let candidates, let complete):
            setRemote(credentials, candidates: candidates, complete: complete)
            // The wait for a peer's checks (no pairs at all) counts from here.
            if checkingSince == nil { checkingSince = now }
        case .addRemote(let candidate): addRemote(candidate)
        case .remoteCandidatesComplete: remoteCandidatesComplete()
        case .addLocal(let candidate): addLocal(candidate)
        case .localCandidatesComplete: localCandidatesComplete()
        case .restart(let credentials, let candidates): restart(local: credentials, candidates: candidates)
        case .remoteMoved(let address): remoteMoved(to: address, now: now)
        }
    }

    /// The peer's packets, authenticated by the layer above (the secure session, which
    /// moved to follow them, as WireGuard's roaming does), now come from `address`: its
    /// NAT rebound, or it changed networks. Consent (RFC 7675) follows the peer there:
    /// the selected pair's remote becomes a peer-reflexive candidate at `address`,
    /// checked at once. Its consent still dates from the last answer the old address
    /// gave, so an address that answers no check loses it within
    /// ``ICEConfiguration/consentTimeout``, as before; one that answers keeps the pair,
    /// and no ICE restart is needed for a move the session already followed.
    /// A new address becomes a remote candidate with its pair, as one learnt from a
    /// check does (so that a restart's signalling of it, or the peer's checks from it,
    /// find the pair). Nothing changes for a pair through a relay of ours (its checks
    /// leave through the allocation; a move seen on the direct path says nothing of
    /// it, and such a pair restarts as before), nor once consent expired, nor for an
    /// address of another family.
    public mutating func remoteMoved(to address: TransportAddress, now: Timestamp) {
        guard let s = selected, !consentExpired, s.remote.address != address, s.local.candidate.type != .relay,
            address.ip.family == s.remote.address.ip.family
        else { return }
        let remote =
            remoteCandidates.first { $0.address == address }
            ?? peerReflexive(at: address, priority: s.remote.priority, base: s.base)
        // (A known candidate may have no pair yet; nor one past maxRemoteCandidates.)
        if let l = hostOrRelay(base: s.base) { addPair(l, remote) }
        selected = ICEPair(local: s.local, remote: remote)
        consentTransactions = []
        nextConsentAt = now
    }

    /// A datagram from `source` on `base`. False when it is not ICE's (not STUN, or
    /// a STUN response to somebody else's transaction): the driver hands it on.
    /// What it leaves to do comes out of ``pollAction()``.
    public mutating func receive(_ bytes: [UInt8], from source: TransportAddress, base: Int, now: Timestamp) -> Bool {
        guard let out = process(bytes, from: source, base: base, now: now) else { return false }
        queued.append(contentsOf: out)
        return true
    }

    public mutating func pollAction() -> ICEOutput? {
        queued.isEmpty ? nil : queued.removeFirst()
    }

    private mutating func process(_ bytes: [UInt8], from source: TransportAddress, base: Int, now: Timestamp) -> [ICEOutput]? {
        guard Message.isSTUN(bytes) else { return nil }
        guard let message = try? Message(decoding: bytes), message.type.method == .binding else { return nil }
        switch message.type.messageClass {
        case .request: return handleRequest(message, from: source, base: base, now: now)
        case .indication: return []  // keepalive
        case .successResponse, .errorResponse: return handleResponse(message, from: source, base: base, now: now)
        }
    }

    private mutating func handleRequest(_ m: Message, from source: TransportAddress, base: Int, now: Timestamp) -> [ICEOutput] {
        guard m.checkFingerprint() == .valid else { return [] }  // RFC 8445 §7.3: FINGERPRINT is required
        guard case .username(let username)? = try? m.value(.username),
            m.attribute(.messageIntegrity) != nil
        else { return [errorResponse(m, 400, base: base, to: source)] }
        let parts = username.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.count == 2, parts[0] == local.ufrag, let key = try? IntegrityKey.shortTerm(password: local.pwd),
            m.checkMessageIntegrity(key: key) == .valid
        else { return [errorResponse(m, 401, base: base, to: source)] }

        var out: [ICEOutput] = []
        // Role conflicts (§7.3.1.1).
        let theirs: (ICERole, UInt64)? = {
            if case .iceControlling(let t)? = try? m.value(.iceControlling) { return (.controlling, t) }
            if case .iceControlled(let t)? = try? m.value(.iceControlled) { return (.controlled, t) }
            return nil
        }()
        if let (theirRole, theirTie) = theirs, theirRole == role {
            let keepOurs = role == .controlling ? tieBreaker >= theirTie : tieBreaker < theirTie
            if keepOurs { return [errorResponse(m, 487, base: base, to: source)] }
            switchRole(&out)
        }

        // Answer: XOR-MAPPED-ADDRESS, signed with our password.
        let response = Message(type: .bindingSuccess, transactionID: m.transactionID, attributes: [.xorMappedAddress(source)])
        out.append(.send(response.encode(integrity: key, fingerprint: true), base: base, to: source))

        // The sender is a candidate (peer-reflexive if new), and the pair gets a triggered check.
        if !remoteCandidates.contains(where: { $0.address == source }), remoteCandidates.count < configuration.maxRemoteCandidates
        {
            var priority = ICECandidate.priority(type: .prflx)
            if case .priority(let p)? = try? m.value(.priority) { priority = p }
            _ = peerReflexive(at: source, priority: priority, base: base)
        }
        guard let index = pairs.firstIndex(where: { $0.pair.base == base && $0.pair.remote.address == source }) else {
            return out
        }
        let useCandidate = m.attribute(.useCandidate) != nil
        if useCandidate && role == .controlled { pairs[index].nominatedByPeer = true }
        switch pairs[index].state {
        case .succeeded:
            if useCandidate && role == .controlled { select(index, now: now, &out) }
        case .frozen, .waiting, .failed, .inProgress:
            if pairs[index].state != .inProgress || pairs[index].transactionIsNomination == false {
                if pairs[index].state != .inProgress { pairs[index].state = .waiting }
                if !triggered.contains(index) { triggered.append(index) }
                if nextCheckAt > now { nextCheckAt = now }  // answer a peer's check at once
            }
        }
        return out
    }

    private mutating func handleResponse(_ m: Message, from source: TransportAddress, base: Int, now: Timestamp) -> [ICEOutput]? {
        if let c = consentTransactions.firstIndex(of: m.transactionID) {
            guard let remote, let key = try? IntegrityKey.shortTerm(password: remote.pwd),
                m.checkMessageIntegrity(key: key) == .valid
            else { return [] }
            consentTransactions.remove(at: c)
            if m.type.messageClass == .successResponse, let s = selected, s.base == base, s.remote.address == source {
                lastConsent = now
            }
            return []
        }
        guard
            let index = pairs.firstIndex(where: {
                $0.transaction?.transactionID == m.transactionID || $0.earlierTransactions.contains(m.transactionID)
            })
        else { return nil }
        guard let remote, let key = try? IntegrityKey.shortTerm(password: remote.pwd),
            m.checkMessageIntegrity(key: key) == .valid
        else { return [] }  // forged or stale: ignore
        var out: [ICEOutput] = []
        let wasNomination = pairs[index].transactionIsNomination
        pairs[index].transaction = nil
        pairs[index].earlierTransactions = []
        pairs[index].transactionIsNomination = false
        // Responses must come back the way the check went (§7.2.5.2.1).
        guard source == pairs[index].pair.remote.address, base == pairs[index].pair.base else {
            pairs[index].state = .failed
            return out
        }
        if m.type.messageClass == .errorResponse {
            if case .errorCode(let e)? = try? m.value(.errorCode), e.code == 487 {
                switchRole(&out)
                pairs[index].state = .waiting
                triggered.append(index)
            } else {
                pairs[index].state = .failed
            }
            return out
        }
        if case .xorMappedAddress(let mapped)? = try? m.value(.xorMappedAddress), localCandidates.count < 64,
            !localCandidates.contains(where: { $0.base == base && $0.candidate.address == mapped })
        {
            let l = pairs[index].pair.local.candidate
            localCandidates.append(
                ICELocalCandidate(
                    ICECandidate(
                        foundation: ICELocalCandidate.foundation(.prflx, mapped.ip, base: base),
                        priority: ICECandidate.priority(type: .prflx, localPreference: (l.priority >> 8) & 0xFFFF),
                        address: mapped, type: .prflx, relatedAddress: l.address), base: base))
        }
        pairs[index].state = .succeeded
        if firstValidAt == nil { firstValidAt = now }
        let foundation = pairFoundation(pairs[index].pair)
        for i in pairs.indices where pairs[i].state == .frozen && pairFoundation(pairs[i].pair) == foundation {
            pairs[i].state = .waiting
        }
        if let s = selected, s == pairs[index].pair { lastConsent = now }
        if (role == .controlling && wasNomination) || (role == .controlled && pairs[index].nominatedByPeer) {
            select(index, now: now, &out)
        }
        return out
    }

    // MARK: Time

    /// When ``handleTimeout(now:)`` must run next.
    public var nextDeadline: Timestamp? {
        var t: Timestamp?
        func consider(_ x: Timestamp?) { if let x, t == nil || x < t! { t = x } }
        for p in pairs { if let tr = p.transaction, tr.state == .waiting { consider(tr.deadline) } }
        if state != .failed, remote != nil,
            !triggered.isEmpty || (state == .checking && pairs.contains { $0.state == .waiting || $0.state == .frozen })
        {
            consider(nextCheckAt)
        }
        // (Never a time that has passed unless handleTimeout will act on it: the driver would spin.)
        if state == .checking, role == .controlling, let f = firstValidAt, let best = bestValid(),
            !pairs.contains(where: { $0.transactionIsNomination })
        {
            // At once when no better pair is still being tried, else after the delay.
            let betterOut = pairs.contains { $0.priority > pairs[best].priority && $0.state != .failed && $0.state != .succeeded }
            consider(betterOut ? f + configuration.nominationDelay : f)
        }
        // Every pair failed (the last one by an error response): failure is due now.
        if state == .checking, remoteComplete, localComplete, triggered.isEmpty, !pairs.isEmpty,
            !pairs.contains(where: { $0.state != .failed })
        {
            consider(.zero)
        }
        if state == .checking, pairs.isEmpty, remoteComplete, localComplete, let since = checkingSince {
            consider(since + checkGiveUp)
        }
        if selected != nil, state != .failed, !consentExpired {
            consider(nextConsentAt)
            consider(lastConsent + configuration.consentTimeout)
        }
        return t
    }

    /// Retransmits and times out checks, starts the next check (one per Ta),
    /// nominates, gives up, and keeps consent fresh.
    public mutating func handleTimeout(now: Timestamp) {
        queued.append(contentsOf: runTimers(now: now))
    }

    private mutating func runTimers(now: Timestamp) -> [ICEOutput] {
        var out: [ICEOutput] = []
        // Retransmissions and timeouts.
        for i in pairs.indices {
            guard var tr = pairs[i].transaction, tr.state == .waiting else { continue }
            tr.handleTimeout(now: now)
            while let action = tr.pollAction() {
                switch action {
                case .send(let bytes): out.append(.send(bytes, base: pairs[i].pair.base, to: pairs[i].pair.remote.address))
                case .timedOut:
                    pairs[i].state = .failed
                    pairs[i].transactionIsNomination = false
                case .answered: break
                }
            }
            pairs[i].transaction = tr.state == .waiting ? tr : nil
        }
        guard state != .failed else { return out }
        // One new check per Ta: triggered first, then the best waiting pair.
        if remote != nil, now >= nextCheckAt {
            var index: Int?
            while index == nil, !triggered.isEmpty {
                let t = triggered.removeFirst()
                if t < pairs.count, pairs[t].state == .waiting || pairs[t].state == .inProgress { index = t }
            }
            if index == nil, state == .checking { index = bestWaiting() }
            if let i = index {
                let nominate = role == .controlling && state == .checking && shouldNominate(i, now: now)
                sendCheck(i, nominate: nominate, now: now, &out)
                nextCheckAt = now + configuration.ta
            }
        }
        // Nomination by the controlling agent.
        if state == .checking, role == .controlling, let best = bestValid(),
            !pairs.contains(where: { $0.transactionIsNomination }), shouldNominate(best, now: now)
        {
            sendCheck(best, nominate: true, now: now, &out)
        }
        // Failure: nothing left to try and nothing more to come.
        // (With no pairs at all, a peer's checks may still teach one: wait as long as a check would.)
        if remote != nil, checkingSince == nil { checkingSince = now }
        if state == .checking, remoteComplete, localComplete, triggered.isEmpty,
            !pairs.contains(where: { $0.state != .failed }),
            !pairs.isEmpty || now - (checkingSince ?? now) >= checkGiveUp
        {
            state = .failed
            out.append(.event(.failed(pairs.isEmpty ? "no candidate pairs" : "all \(pairs.count) candidate pairs failed")))
        }
        // Consent freshness on the selected pair.
        if let s = selected, state != .failed, !consentExpired {
            if now - lastConsent >= configuration.consentTimeout {
                consentExpired = true
                // (A restart under way goes on checking: it may find a new pair.)
                if state == .completed { state = .failed }
                out.append(.event(.consentLost(s)))
                return out
            }
            if now >= nextConsentAt {
                // (Not while a restart waits for the peer's new credentials.)
                if let remote {
                    let check = checkRequest(s, nominate: false, remote: remote)
                    consentTransactions.append(check.transactionID)
                    if consentTransactions.count > 8 { consentTransactions.removeFirst() }
                    out.append(.send(check.bytes, base: s.base, to: s.remote.address))
                }
                nextConsentAt = now + jittered(configuration.consentInterval)
            }
        }
        return out
    }

    // MARK: Internals

    /// How long one check takes to give up (all transmissions and the final wait).
    private var checkGiveUp: Duration {
        var total = Duration.zero
        var rto = configuration.checkRTO
        for _ in 1..<max(1, configuration.checkTransmissions) {
            total += rto
            rto = rto * 2
        }
        return total + configuration.checkRTO * configuration.checkFinalWait
    }

    private mutating func addPair(_ l: ICELocalCandidate, _ r: ICECandidate) {
        guard l.candidate.address.ip.family == r.address.ip.family,
            !pairs.contains(where: { $0.pair.base == l.base && $0.pair.remote.address == r.address })
        else { return }
        let pair = ICEPair(local: l, remote: r)
        let g = UInt64(role == .controlling ? l.candidate.priority : r.priority)
        let d = UInt64(role == .controlling ? r.priority : l.candidate.priority)
        let priority = (min(g, d) << 32) + 2 * max(g, d) + (g > d ? 1 : 0)
        let foundation = pairFoundation(pair)
        // The first pair of each foundation waits; the others wait for it (§6.1.2.6).
        let frozen = pairs.contains { pairFoundation($0.pair) == foundation }
        pairs.append(PairEntry(pair: pair, priority: priority, state: frozen ? .frozen : .waiting))
        if pairs.count > configuration.maxPairs,
            let worst = pairs.indices.filter({ pairs[$0].state == .frozen || pairs[$0].state == .waiting })
                .min(by: { pairs[$0].priority < pairs[$1].priority })
        {
            pairs.remove(at: worst)
            triggered = triggered.compactMap { $0 == worst ? nil : ($0 > worst ? $0 - 1 : $0) }
        }
    }

    /// A new peer-reflexive remote candidate at `address` (RFC 8445 §7.3.1.3), listed with
    /// its pair on `base` while there is room for it.
    private mutating func peerReflexive(at address: TransportAddress, priority: UInt32, base: Int) -> ICECandidate {
        prflxCount += 1
        let candidate = ICECandidate(foundation: "prflx\(prflxCount)", priority: priority, address: address, type: .prflx)
        if remoteCandidates.count < configuration.maxRemoteCandidates {
            remoteCandidates.append(candidate)
            if let l = hostOrRelay(base: base) { addPair(l, candidate) }
        }
        return candidate
    }

    private func pairFoundation(_ p: ICEPair) -> String { p.local.candidate.foundation + "/" + p.remote.foundation }

    private func hostOrRelay(base: Int) -> ICELocalCandidate? {
        localCandidates.first { $0.base == base && ($0.candidate.type == .host || $0.candidate.type == .relay) }
    }

    private mutating func recomputePriorities() {
        for i in pairs.indices {
            let l = UInt64(pairs[i].pair.local.candidate.priority)
            let r = UInt64(pairs[i].pair.remote.priority)
            let g = role == .controlling ? l : r
            let d = role == .controlling ? r : l
            pairs[i].priority = (min(g, d) << 32) + 2 * max(g, d) + (g > d ? 1 : 0)
        }
    }

    private mutating func switchRole(_ out: inout [ICEOutput]) {
        role = role.other
        recomputePriorities()
        out.append(.event(.roleChanged(role)))
    }

    private mutating func bestWaiting() -> Int? {
        if let w = pairs.indices.filter({ pairs[$0].state == .waiting }).max(by: { pairs[$0].priority < pairs[$1].priority }) {
            return w
        }
        // Nothing waiting: unfreeze the best frozen pair.
        guard let f = pairs.indices.filter({ pairs[$0].state == .frozen }).max(by: { pairs[$0].priority < pairs[$1].priority })
        else { return nil }
        pairs[f].state = .waiting
        return f
    }

    private func bestValid() -> Int? {
        pairs.indices.filter { pairs[$0].state == .succeeded }.max { pairs[$0].priority < pairs[$1].priority }
    }

    /// The controlling agent nominates its best valid pair once no better pair is
    /// still being tried, or `nominationDelay` after the first valid pair.
    private func shouldNominate(_ index: Int, now: Timestamp) -> Bool {
        guard pairs[index].state == .succeeded, bestValid() == index else { return false }
        if let f = firstValidAt, now >= f + configuration.nominationDelay { return true }
        return !pairs.contains { $0.priority > pairs[index].priority && $0.state != .failed && $0.state != .succeeded }
    }

    private mutating func sendCheck(_ i: Int, nominate: Bool, now: Timestamp, _ out: inout [ICEOutput]) {
        guard let remote else { return }
        if let old = pairs[i].transaction?.transactionID {
            pairs[i].earlierTransactions.append(old)
            if pairs[i].earlierTransactions.count > 4 { pairs[i].earlierTransactions.removeFirst() }
        }
        let check = checkRequest(pairs[i].pair, nominate: nominate, remote: remote)
        var tr = ClientTransaction(
            transactionID: check.transactionID, request: check.bytes,
            reliability: .unreliable(
                rto: configuration.checkRTO, rc: configuration.checkTransmissions,
                rm: configuration.checkFinalWait))
        tr.handle(.start, now: now)
        if case .send(let bytes)? = tr.pollAction() {
            out.append(.send(bytes, base: pairs[i].pair.base, to: pairs[i].pair.remote.address))
        }
        pairs[i].transaction = tr
        pairs[i].transactionIsNomination = nominate
        if pairs[i].state != .succeeded { pairs[i].state = .inProgress }
    }

    private func checkRequest(_ pair: ICEPair, nominate: Bool, remote: ICECredentials) -> (
        transactionID: TransactionID, bytes: [UInt8]
    ) {
        let l = pair.local.candidate
        var attributes: [Attribute] = [
            .username("\(remote.ufrag):\(local.ufrag)"),
            .priority(ICECandidate.priority(type: .prflx, localPreference: (l.priority >> 8) & 0xFFFF, component: l.component)),
            role == .controlling ? .iceControlling(tieBreaker) : .iceControlled(tieBreaker),
        ]
        if nominate { attributes.append(.useCandidate) }
        let message = Message(type: .bindingRequest, transactionID: .random(), attributes: attributes)
        let key = try? IntegrityKey.shortTerm(password: remote.pwd)
        return (message.transactionID, message.encode(integrity: key, fingerprint: true))
    }

    private func errorResponse(_ request: Message, _ code: Int, base: Int, to: TransportAddress) -> ICEOutput {
        let m = Message(
            type: .bindingError, transactionID: request.transactionID,
            attributes: [
                .errorCode(ErrorCodeValue(code: code, reason: code == 487 ? "Role Conflict" : ErrorCodeValue.defaultReason(code)))
            ])
        return .send(m.encode(fingerprint: true), base: base, to: to)
    }

    private mutating func select(_ index: Int, now: Timestamp, _ out: inout [ICEOutput]) {
        let pair = pairs[index].pair
        if let s = selected, s == pair, state == .completed { return }
        // The controlled side follows a later nomination only if it is better.
        if role == .controlled, state == .completed, let s = selected,
            let current = pairs.first(where: { $0.pair == s }), current.priority > pairs[index].priority
        {
            return
        }
        selected = pair
        state = .completed
        consentExpired = false
        lastConsent = now
        nextConsentAt = now + jittered(configuration.consentInterval)
        triggered.removeAll { pairs[$0].state != .inProgress && $0 != index }
        out.append(.event(.selected(pair)))
    }

    private mutating func jittered(_ d: Duration) -> Duration {
        let factor = 0.8 + 0.4 * random.uniform()
        return d * factor
    }
}
