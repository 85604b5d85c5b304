import Secure
import TURN
import TusaBase

/// A connection to the rendezvous, numbered by its driver.
public struct ConnectionID: Hashable, Sendable, CustomStringConvertible {
    public let raw: UInt64
    public init(_ raw: UInt64) { self.raw = raw }
    public var description: String { "#\(raw)" }
}

/// What the server core asks its driver to do.
public enum RendezvousAction: Equatable, Sendable {
    /// Write these bytes (one or more frames) to the connection.
    case send(ConnectionID, [UInt8])
    /// Close the connection (after writing what was queued for it).
    case close(ConnectionID)
    /// Write this down (a driver with a store; others ignore it). The actions after
    /// a record (the `sent` that acknowledges a post) are to wait until it is written.
    case record(RendezvousRecord)
}

public struct RendezvousServerConfiguration: Sendable {
    /// How long a new connection has to register.
    public var registrationTimeout: Duration = .seconds(10)
    /// A registered connection silent this long is closed (clients ping every 30 s).
    /// Only whole frames count as heard: bytes trickled into one do not.
    public var idleTimeout: Duration = .seconds(90)
    /// A frame begun must be whole this long after its first byte (a frame is at most
    /// 16 KiB: seconds even on a poor link), else the connection is closed: a
    /// connection that trickles a byte now and then holds nothing for long.
    public var frameTimeout: Duration = .seconds(10)
    public var maximumConnections = 10_000
    /// Connections open at once from one IP address (the driver enforces it:
    /// the core never sees addresses); more are closed on accept.
    public var maximumConnectionsPerSource = 1_000
    /// Requests a connection may make per second on average, and in a burst.
    public var requestsPerSecond = 20.0
    public var requestBurst = 100.0
    /// Posts one key may make (whatever its connections) to keys that have not made
    /// it a contact: a burst, then this many a minute (posts to those that have cost
    /// nothing). A flood of invitations is cut short; the key's other requests go on,
    /// and a post refused is not kept.
    public var postBurst = 30.0
    public var postsPerMinute = 60.0
    /// A key's contacts (``RendezvousMessage/changeContacts(id:add:remove:)``), at most
    /// (the answer lists them all in one frame: 250 keys are about 12 KB of its 16),
    /// and every key's together (about 100 bytes each in memory).
    public var maximumContacts = 250
    public var contactsTotal = 2_000_000
    /// A key's contacts are forgotten once it has not been registered (here or at any
    /// node of a cluster) for this long: a key gone for good does not keep its rows,
    /// and its share of `contactsTotal`, for ever.
    public var contactsFor: Duration = .seconds(180 * 24 * 3600)
    /// Strangers (keys that have not made the sender one of their contacts) one key
    /// may reach with posts and sends: a burst, then this many an hour. A stranger
    /// reached once costs nothing more for the hour after (a call's several sends,
    /// an answer's), and contacts cost nothing: a flood of invitations to strangers
    /// stops at a few, whatever its keys' post budget.
    public var strangerBurst = 10.0
    public var strangersPerHour = 30.0
    /// How long a key that was registered is remembered, so that a lookup or send can
    /// tell "offline" from "unknown"; at most `rememberedKeys` keys are kept.
    public var rememberFor: Duration = .seconds(24 * 3600)
    public var rememberedKeys = 100_000
    /// TURN REST-API credentials for registered peers (nil: none handed out); with
    /// relays reporting, for the URIs of the least loaded relay that offers TURN.
    public var turn: TURNIssuer?
    /// Where the relay hosts parties, told to every registered peer (nil: it does not).
    public var party: PartyGrant?
    /// Posted payloads (invitations) are kept this long, at most `mailboxPerKey` for
    /// one recipient (the oldest go first) and `mailboxTotal` in all.
    public var mailboxLifetime: Duration = .seconds(24 * 3600)
    public var mailboxPerKey = 64
    /// Of a recipient's box, at most this many posts from strangers: a stranger's post
    /// pushes out the oldest stranger's, never a contact's.
    public var mailboxFromStrangers = 16
    public var mailboxTotal = 100_000
    /// Relays that report with a proof of this secret (`tusa directory --relay-secret`)
    /// are placed by load: a new room goes to the relay ``RelayRegistry`` places it on
    /// (``RendezvousMessage/place(id:)``), a registered peer's TURN grant names the
    /// least loaded relay that offers TURN (nil: relays are not taken).
    public var relaySecret: String?
    public var relays = RelayRegistry.Configuration()
    /// This node's number among the directory nodes that share its database
    /// (``RendezvousCluster``; the database numbers them from 1), 0 for a rendezvous
    /// alone. A node tells the others (through ``RendezvousRecord``s its store
    /// publishes) who registers and leaves here and what it sends their keys, and
    /// hears the same from them (``RendezvousServer/Input/cluster(_:)``).
    public var node: UInt32 = 0

    public init() {}
}

/// Issues coturn REST-API credentials (`--use-auth-secret` on the relay).
///
/// They live a day by default, as coturn's REST-API notes advise: a TURN client
/// refreshes its allocation for the whole call with the credentials it allocated
/// with, so they must outlive the longest call (an hour's ended relayed calls
/// after an hour, and made a clock stepped back an hour refuse new ones).
public struct TURNIssuer: Sendable {
    public var secret: String
    public var lifetime: Duration
    public var uris: [String]
    public init(secret: String, lifetime: Duration = .seconds(24 * 3600), uris: [String]) {
        self.secret = secret
        self.lifetime = lifetime
        self.uris = uris
    }

    /// Credentials for `key` valid from `unixSeconds` for `lifetime`. The username's
    /// user part is a short key id, not the key: the relay's logs need not name callers.
    public func grant(for key: PublicKey, unixSeconds: UInt64) -> TURNGrant {
        let expiry = unixSeconds + UInt64(max(0, lifetime.components.seconds))
        let id = Blake2b.hash(key.bytes, outputLength: 16).prefix(6).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
        let (user, password) = RESTCredentials.make(secret: secret, user: id, expiry: expiry)
        return TURNGrant(username: user, password: password, expiry: expiry, uris: uris)
    }
}

public struct RendezvousStatistics: Sendable, Equatable {
    public var connections = 0
    public var registered = 0
    public var delivered = 0
    /// Payloads kept for later delivery now.
    public var posted = 0
    /// Keys registered at the other nodes of a cluster, as last heard.
    public var elsewhere = 0
    /// Sealed payloads sent to keys registered at other nodes, and from them to keys here.
    public var signalsOut = 0
    public var signalsIn = 0
    public var refused: [RendezvousErrorCode: Int] = [:]
    public init() {}
}

/// The rendezvous server, sans-IO: peers register under their public key (proving
/// they hold it), look each other up and exchange sealed payloads (call offers,
/// answers, hang-ups) it forwards without being able to read them.
///
/// The driver feeds it connection events, bytes and time and carries out the
/// returned actions. Every refusal is an `error` message naming the request; a
/// malformed or oversized frame, a failed proof, a flood or a timeout also closes
/// the connection. Closed connections leave nothing behind but the memory of a
/// registered key (bounded in time and count) for "offline" answers.
public struct RendezvousServer: Sendable {
    private struct Connection {
        var framer = RendezvousFrame()
        var serverKey: PrivateKey
        var challenge: [UInt8]
        var key: PublicKey?
        /// When its last whole frame arrived.
        var lastHeard: Timestamp
        /// When the first byte of the frame not yet whole arrived (nil: none begun).
        var frameBegun: Timestamp?
        let opened: Timestamp
        var requests: TokenBucket
        /// When it registered, on both clocks: its key's last-seen time in Unix seconds.
        var registered: (unix: UInt64, at: Timestamp)?
        /// When its key's last-seen row was last written (registered, or still here a day on).
        var seenRecorded: Timestamp?
    }

    public let configuration: RendezvousServerConfiguration
    private var connections: [ConnectionID: Connection] = [:]
    /// The earliest deadline of the connections, remembered keys and boxes, or earlier,
    /// never later: computed whole at each ``poll(now:)`` and lowered as each new
    /// deadline comes (``due(_:)``), so that ``nextDeadline``, asked after every event,
    /// costs nothing however many are connected (it walked them all: with 20,000
    /// connected, 2,000 signals a second took the node's core). A deadline that moved
    /// later (a connection heard again) is found at that poll, which has nothing to do.
    private var earliest: Timestamp?
    private var registry: [PublicKey: ConnectionID] = [:]
    /// Keys that were registered, with when they are forgotten.
    private var seen: [PublicKey: Timestamp] = [:]
    private struct Posted {
        var id: UInt64
        var from: PublicKey
        var sealed: [UInt8]
        /// When it is no longer kept.
        var expires: Timestamp
    }
    private var nextPostID: UInt64
    /// Records made while handling an input, put before its actions (``pending``).
    var records: [RendezvousRecord] = []
    private var mailbox: [PublicKey: [Posted]] = [:]
    /// Each kept post's recipient, by id (a post another node announces is taken once).
    private var postRecipients: [UInt64: PublicKey] = [:]
    private var mailboxCount: Int { postRecipients.count }
    /// Keys registered at the other nodes of a cluster, and where.
    private var elsewhere: [PublicKey: ClusterPresence] = [:]
    /// What is left of each poster's budget (``RendezvousServerConfiguration/postBurst``), and when.
    private var postBudgets: [PublicKey: TokenBucket] = [:]
    /// Each key's contacts: the keys it takes posts and sends from freely.
    private var contacts: [PublicKey: Set<PublicKey>] = [:]
    /// Who has each key among their contacts (``contacts`` the other way round).
    private(set) var contactOf: [PublicKey: Set<PublicKey>] = [:]
    /// How many contacts all keys hold together.
    private var contactCount = 0
    /// When each key with contacts was last registered (Unix seconds), as far as
    /// this node knows (a key registered now, here or at another node, is not
    /// looked at). Unix time: a key may have been gone longer than this host is up.
    private var ownerSeen: [PublicKey: UInt64] = [:]
    /// The Unix time the driver last gave, and when: Unix time now, without a clock.
    var unixClock: (unix: UInt64, at: Timestamp)?
    /// When the contacts of keys gone longer than ``RendezvousServerConfiguration/contactsFor`` are next looked for.
    private var contactSweepAt: Timestamp?
    /// A node of a cluster has read who is registered at the others (a key
    /// registered there for months is not gone).
    private var clusterSynced = false
    /// What is left of each key's stranger budget (``RendezvousServerConfiguration/strangerBurst``).
    private var strangerBudgets: [PublicKey: TokenBucket] = [:]
    /// Who reached whom as a stranger in the last hour (sender → recipients, with
    /// when last): free to reach again, and to be answered freely.
    private var reached: [PublicKey: [PublicKey: Timestamp]] = [:]
    /// This node's own changes of contacts in the last minute (clustered), replayed
    /// over a resync's snapshot, which may have been read before they were written.
    private var recentContactChanges: [(at: Timestamp, owner: PublicKey, add: [PublicKey], remove: [PublicKey])] = []
    private var clustered: Bool { configuration.node != 0 }
    /// See ``Input/memoryShort(_:)``.
    public internal(set) var memoryShort = false
    /// What the driver is to do, in order (``pollAction()``).
    var pending: [RendezvousAction] = []
    public private(set) var statistics = RendezvousStatistics()
    /// The relays that report here, and where peers are sent.
    public private(set) var relayRegistry: RelayRegistry
    /// Which connection each reporting relay holds.
    private(set) var relayConnections: [ConnectionID: PublicKey] = [:]
    /// The party rooms the relays list.
    var parties = PartyTable()
    /// Relays' connections that have begun listing their rooms (the first list on a connection is all of them).
    var listingRooms: Set<ConnectionID> = []
    /// The relay this rendezvous runs in has begun listing its rooms.
    var listingLocalRooms = false
    /// When rooms of relays down too long are next looked for.
    var partySweepAt: Timestamp?

    public init(configuration: RendezvousServerConfiguration = .init(), seed: UInt64 = UInt64.random(in: .min ... .max)) {
        self.configuration = configuration
        nextPostID = RendezvousCluster.firstPostID(node: configuration.node)
        relayRegistry = RelayRegistry(configuration: configuration.relays, seed: seed)
    }

    /// A new connection: the server greets it with a challenge.
    mutating func accept(_ id: ConnectionID, now: Timestamp) -> [RendezvousAction] {
        guard connections.count < configuration.maximumConnections else {
            count(.full)
            return [
                .send(
                    id,
                    RendezvousFrame.frame(
                        .error(code: .full, detail: "the rendezvous holds \(connections.count) connections", id: nil))),
                .close(id),
            ]
        }
        var challenge = [UInt8](repeating: 0, count: 32)
        challenge.withUnsafeMutableBytes { Sodium.randomBytes($0) }
        let c = Connection(
            serverKey: .generate(), challenge: challenge, lastHeard: now, opened: now,
            requests: TokenBucket(burst: configuration.requestBurst, perSecond: configuration.requestsPerSecond, now: now))
        connections[id] = c
        due(now + configuration.registrationTimeout)
        statistics.connections = connections.count
        return [.send(id, RendezvousFrame.frame(.hello(challenge: challenge, serverKey: c.serverKey.publicKey)))]
    }

    /// Bytes from a connection. `unixSeconds` dates TURN credentials.
    mutating func receive(_ id: ConnectionID, _ bytes: some Collection<UInt8>, now: Timestamp, unixSeconds: UInt64)
        -> [RendezvousAction]
    {
        guard var c = connections[id] else { return [] }
        let frames: [[UInt8]]
        do { frames = try c.framer.append(bytes) } catch {
            return refuse(id, .tooLarge, "\(error)", requestID: nil, close: true)
        }
        if !frames.isEmpty { c.lastHeard = now }
        // A frame begun now, or one still waiting for its rest since it began.
        if !c.framer.isPartial {
            c.frameBegun = nil
        } else if c.frameBegun == nil || !frames.isEmpty {
            c.frameBegun = now
            due(now + configuration.frameTimeout)
        }
        connections[id] = c
        var actions: [RendezvousAction] = []
        for frame in frames {
            guard connections[id] != nil else { break }  // closed by an earlier frame
            actions += handle(id, frame, now: now, unixSeconds: unixSeconds)
        }
        return actions
    }

    /// The driver saw the connection close.
    mutating func closed(_ id: ConnectionID, now: Timestamp) { forget(id, leftAt: now) }

    /// A connection closed (by its peer, or by this server): what it held here goes.
    /// Its key left at `leftAt` (nil: when it was last heard).
    private mutating func forget(_ id: ConnectionID, leftAt: Timestamp?) {
        let c = connections.removeValue(forKey: id)
        if let relay = relayConnections.removeValue(forKey: id) { relayLeft(relay) }
        // A list of all its rooms cut short takes none for gone. (A relay registering
        // again replaces its older connection first: an old list never ends a new one.)
        if listingRooms.remove(id) != nil, let relay = c?.key { parties.abandonSync(of: relay) }
        if let c { unregister(c, id, at: leftAt ?? c.lastHeard) }
        statistics.connections = connections.count
    }

    /// A closed connection's key is no longer registered here (if it still was, on this connection).
    private mutating func unregister(_ c: Connection, _ id: ConnectionID, at now: Timestamp) {
        guard let key = c.key, registry[key] == id else { return }
        registry[key] = nil
        keyLeft(key, now)
        recordSeen(c, at: now)
        if clustered { records.append(.offline(key)) }
        statistics.registered = registry.count
    }

    /// Time passes: connections that did not register in time or went silent are closed.
    mutating func poll(now: Timestamp) -> [RendezvousAction] {
        var actions: [RendezvousAction] = []
        for (id, c) in connections {
            if c.key == nil, now - c.opened >= configuration.registrationTimeout {
                actions += refuse(
                    id, .timeout, "no registration within \(configuration.registrationTimeout)", requestID: nil, close: true)
            } else if let begun = c.frameBegun, now - begun >= configuration.frameTimeout {
                actions += refuse(
                    id, .timeout, "a frame begun \(configuration.frameTimeout) ago is not whole", requestID: nil, close: true)
            } else if c.key != nil, now - c.lastHeard >= configuration.idleTimeout {
                actions += refuse(id, .timeout, "silent for \(configuration.idleTimeout)", requestID: nil, close: true)
            }
        }
        seen = seen.filter { now < $0.value }
        // A budget refilled to the burst is the same as none.
        postBudgets = postBudgets.filter { !$0.value.isFull(at: now) }
        strangerBudgets = strangerBudgets.filter { !$0.value.isFull(at: now) }
        reached = reached.compactMapValues { recipients in
            let recent = recipients.filter { now - $0.value < Self.strangerMemory }
            return recent.isEmpty ? nil : recent
        }
        recentContactChanges.removeAll { now - $0.at >= Self.contactReplay }
        if now >= contactSweepAt ?? now {
            contactSweepAt = now + Self.contactSweep
            noteOwnersStillHere(now: now)
            if !clustered || clusterSynced { forgetContactsOfKeysGone(now: now) }
        }
        relayRegistry.expire(now: now)
        if parties.count > 0, now >= partySweepAt ?? now {
            partySweepAt = now + Self.partySweep
            for (room, relay) in parties.expire(now: now, live: liveRelays(now: now)) {
                records.append(.partyClosed(room: room, relay: relay))
            }
        }
        for key in Array(mailbox.keys) { expireMailbox(of: key, now: now) }
        earliest = exactEarliest()
        return actions
    }

    /// A new deadline: ``nextDeadline`` comes no later than it.
    private mutating func due(_ deadline: Timestamp) { earliest = min(earliest ?? deadline, deadline) }

    /// The earliest deadline of the connections, remembered keys and boxes, walking them all.
    private func exactEarliest() -> Timestamp? {
        let connection = connections.values.map { c in
            let timeout = c.key == nil ? c.opened + configuration.registrationTimeout : c.lastHeard + configuration.idleTimeout
            return c.frameBegun.map { min(timeout, $0 + configuration.frameTimeout) } ?? timeout
        }.min()
        let forget = seen.values.min()
        // Each box is in posting order: its first entry is its oldest.
        let expire = mailbox.values.compactMap { $0.first?.expires }.min()
        return [connection, forget, expire].compactMap { $0 }.min()
    }

    /// When ``handleTimeout(now:)`` next may have something to do: never later than
    /// that, sometimes earlier (a connection heard since its deadline was taken; the
    /// poll then finds nothing, and the deadline after it is exact again).
    public var nextDeadline: Timestamp? {
        let sweep = contacts.isEmpty ? nil : contactSweepAt
        let partySweep = parties.count == 0 ? nil : partySweepAt
        return [earliest, sweep, partySweep].compactMap { $0 }.min()
    }

    /// Whether a key is registered now (here, or at another node of the cluster).
    public func isOnline(_ key: PublicKey) -> Bool { registry[key] != nil || elsewhere[key] != nil }

    private mutating func handle(_ id: ConnectionID, _ frame: [UInt8], now: Timestamp, unixSeconds: UInt64) -> [RendezvousAction]
    {
        guard var c = connections[id] else { return [] }
        // A relay proven by the directory's secret is not held to a user's pace: its
        // whole list of rooms comes at once on each new connection.
        guard relayConnections[id] != nil || c.requests.take(at: now) else {
            connections[id] = c
            return refuse(
                id, .rateLimited, "more than \(Int(configuration.requestsPerSecond)) requests a second", requestID: nil,
                close: true)
        }
        connections[id] = c
        let message: RendezvousMessage
        do { message = try RendezvousMessage(decoding: frame) } catch {
            return refuse(id, .malformed, error.description, requestID: nil, close: true)
        }
        switch message {
        case .register(let key, let proof):
            if c.key != nil {
                return refuse(id, .alreadyRegistered, "this connection is registered already", requestID: nil, close: false)
            }
            guard RegistrationProof.verify(proof, key: key, server: c.serverKey, challenge: c.challenge) else {
                return refuse(id, .badProof, "the proof does not match \(key)", requestID: nil, close: true)
            }
            var actions: [RendezvousAction] = []
            if let old = registry[key], old != id {
                // The same key on a new connection (a client that moved or restarted) wins.
                actions += refuse(old, .replaced, "\(key) registered again on a newer connection", requestID: nil, close: true)
            }
            c.key = key
            c.registered = (unixSeconds, now)
            // Its deadline is now the idle one (later with the defaults, not with every setting).
            due(c.lastHeard + configuration.idleTimeout)
            connections[id] = c
            registry[key] = id
            seen[key] = nil
            records.append(.seen(key, unixSeconds: unixSeconds))
            // The other nodes hear it; one that holds the key too closes its connection (a client that moved).
            if clustered { records.append(.online(key, unixSeconds: unixSeconds)) }
            statistics.registered = registry.count
            var grant = configuration.turn?.grant(for: key, unixSeconds: unixSeconds)
            var party = configuration.party
            // With relays reporting, a relay where its rooms may go, as a new room would be
            // placed but nothing reserved (a client that asks `place` for a new room gets
            // the placement, reserved; this is for one that does not).
            if configuration.relaySecret != nil,
                let relay = relayRegistry.place(now: now, reserving: false, where: { $0.party != nil })
            {
                party = relay.load.party ?? party
            }
            // Its calls to the least loaded relay that offers TURN (whatever its share:
            // a call through a busy relay beats none).
            if configuration.relaySecret != nil,
                let relay = relayRegistry.leastLoaded(now: now, where: { !$0.turnURIs.isEmpty })
            {
                grant?.uris = relay.load.turnURIs
            }
            actions.append(.send(id, RendezvousFrame.frame(.registered(turn: grant, party: party))))
            // What was posted for this key while it was away (and is still kept).
            expireMailbox(of: key, now: now)
            for p in mailbox[key] ?? [] {
                statistics.delivered += 1
                actions.append(.send(id, RendezvousFrame.frame(.deliver(from: p.from, sealed: p.sealed))))
            }
            return actions
        case .lookup(let requestID, let key):
            guard c.key != nil else {
                return refuse(id, .notRegistered, "register before lookup", requestID: requestID, close: false)
            }
            return [.send(id, RendezvousFrame.frame(.lookupResult(id: requestID, key: key, online: isOnline(key))))]
        case .send(let requestID, let to, let sealed):
            guard let from = c.key else {
                return refuse(id, .notRegistered, "register before send", requestID: requestID, close: false)
            }
            if registry[to] != nil || elsewhere[to] != nil, !mayReach(to, from: from, now: now, unixSeconds: unixSeconds) {
                return refuseStranger(id, to, requestID: requestID)
            }
            if registry[to] == nil, let there = elsewhere[to] {
                // Written down for the node it is registered at, then acknowledged.
                records.append(.signal(ClusterSignal(to: to, node: there.node, from: from, sealed: sealed)))
                statistics.signalsOut += 1
                return [.send(id, RendezvousFrame.frame(.sent(id: requestID)))]
            }
            guard let target = registry[to] else {
                let known = seen[to].map { now < $0 } ?? false
                return known
                    ? refuse(id, .offline, "\(to) is offline", requestID: requestID, close: false)
                    : refuse(id, .unknownPeer, "no peer registered under \(to)", requestID: requestID, close: false)
            }
            statistics.delivered += 1
            return [
                .send(target, RendezvousFrame.frame(.deliver(from: from, sealed: sealed))),
                .send(id, RendezvousFrame.frame(.sent(id: requestID))),
            ]
        case .post(let requestID, let to, let sealed):
            guard let from = c.key else {
                return refuse(id, .notRegistered, "register before post", requestID: requestID, close: false)
            }
            guard !memoryShort else {
                return refuse(id, .full, "the rendezvous is short of memory", requestID: requestID, close: false)
            }
            let fromStranger = !accepts(to, from: from)
            expireMailbox(of: to, now: now)
            var box = mailbox[to] ?? []
            // A full box makes room by its oldest stranger's post, else (a contact's post)
            // by its oldest; strangers' posts have a smaller share. That one counts as gone
            // when the total is checked. All is decided before a budget is spent.
            let theirs = contacts[to] ?? []
            let strangers = box.indices.filter { box[$0].from != to && !theirs.contains(box[$0].from) }
            var pushOut: Int?
            if fromStranger, strangers.count >= configuration.mailboxFromStrangers || box.count >= configuration.mailboxPerKey {
                guard let oldest = strangers.first else {
                    return refuse(
                        id, .full, "\(to) keeps no more posts from strangers (\(box.count) from its contacts)",
                        requestID: requestID, close: false)
                }
                pushOut = oldest
            } else if !fromStranger, box.count >= configuration.mailboxPerKey {
                pushOut = strangers.first ?? 0
            }
            guard mailboxCount - (pushOut == nil ? 0 : 1) < configuration.mailboxTotal else {
                return refuse(id, .full, "the rendezvous keeps \(mailboxCount) posts", requestID: requestID, close: false)
            }
            // Posts to a key that takes them from the poster cost nothing; others the
            // poster's post budget and, to a stranger, its stranger budget.
            if fromStranger {
                var budget = postBudget(of: from, now: now)
                guard budget.hasOne(at: now) else {
                    return refuse(
                        id, .rateLimited,
                        "more than \(Self.count(configuration.postBurst)) posts at once, then \(Self.count(configuration.postsPerMinute)) a minute",
                        requestID: requestID, close: false)
                }
                guard mayReach(to, from: from, now: now, unixSeconds: unixSeconds) else {
                    return refuseStranger(id, to, requestID: requestID)
                }
                _ = budget.take(at: now)
                postBudgets[from] = budget
            }
            if let pushOut {
                let oldest = box.remove(at: pushOut).id
                records.append(.dropped([oldest]))
                postRecipients[oldest] = nil
            }
            let post = RendezvousPost(id: nextPostID, to: to, from: from, sealed: sealed, unixSeconds: unixSeconds)
            nextPostID += 1
            records.append(.posted(post))
            box.append(Posted(id: post.id, from: from, sealed: sealed, expires: now + configuration.mailboxLifetime))
            due(now + configuration.mailboxLifetime)
            mailbox[to] = box
            postRecipients[post.id] = to
            statistics.posted = mailboxCount
            var actions: [RendezvousAction] = []
            if let target = registry[to] {
                statistics.delivered += 1
                actions.append(.send(target, RendezvousFrame.frame(.deliver(from: from, sealed: sealed))))
            }
            return actions + [.send(id, RendezvousFrame.frame(.sent(id: requestID)))]
        case .changeContacts(let requestID, let add, let remove):
            guard let owner = c.key else {
                return refuse(id, .notRegistered, "register before changing contacts", requestID: requestID, close: false)
            }
            guard add.count + remove.count <= RendezvousMessage.maximumContactChange else {
                return refuse(
                    id, .malformed,
                    "at most \(RendezvousMessage.maximumContactChange) keys a change, not \(add.count + remove.count)",
                    requestID: requestID, close: false)
            }
            let before = contacts[owner] ?? []
            let after = before.subtracting(remove).union(add)
            if after.count > before.count {
                guard after.count <= configuration.maximumContacts else {
                    return refuse(
                        id, .full, "at most \(configuration.maximumContacts) contacts, not \(after.count)", requestID: requestID,
                        close: false)
                }
                guard contactCount + after.count - before.count <= configuration.contactsTotal else {
                    return refuse(
                        id, .full, "the rendezvous keeps \(contactCount) contacts", requestID: requestID, close: false)
                }
                guard !memoryShort else {
                    return refuse(id, .full, "the rendezvous is short of memory", requestID: requestID, close: false)
                }
            }
            let added = after.subtracting(before)
            let removed = before.subtracting(after)
            if !added.isEmpty || !removed.isEmpty {
                recordContacts(of: owner, add: Self.ordered(added), remove: Self.ordered(removed), now: now)
            }
            return [.send(id, RendezvousFrame.frame(.contacts(id: requestID, keys: Self.ordered(after))))]
        case .ping:
            return [.send(id, RendezvousFrame.frame(.pong))]
        case .pong:
            return []
        case .load(let load, let proof):
            guard let key = c.key else {
                return refuse(id, .notRegistered, "register before reporting load", requestID: nil, close: false)
            }
            guard relayProves(proof, { RelayLoad.proof(secret: $0, key: key, challenge: c.challenge, load: load) }) else {
                return refuse(id, .badProof, "not a relay of this directory (its secret)", requestID: nil, close: true)
            }
            relayConnections[id] = key
            relayRegistry.report(key, load, now: now)
            if clustered { records.append(.relayLoad(key, load)) }
            return []
        case .rooms(let rooms, let proof):
            guard let key = c.key else {
                return refuse(id, .notRegistered, "register before listing rooms", requestID: nil, close: false)
            }
            guard relayProves(proof, { RelayRooms.proof(secret: $0, key: key, challenge: c.challenge, rooms: rooms) }) else {
                return refuse(id, .badProof, "not a relay of this directory (its secret)", requestID: nil, close: true)
            }
            // A listing that does not check (a name past what a listing carries) is left
            // out, counted as malformed; the rest of the report is taken (refusing it
            // would have the relay send the same list again, forever).
            var taken = rooms
            taken.open = rooms.open.filter { (try? $0.checked()) != nil }
            for _ in taken.open.count..<rooms.open.count { count(.malformed) }
            relayConnections[id] = key
            listRooms(taken, of: key, on: id, now: now, unixSeconds: unixSeconds)
            return []
        case .parties(let requestID):
            guard let key = c.key else {
                return refuse(id, .notRegistered, "register before asking for parties", requestID: requestID, close: false)
            }
            let (entries, more) = partyEntries(for: key, now: now)
            return [.send(id, RendezvousFrame.frame(.partyList(id: requestID, parties: entries, more: more)))]
        case .locate(let requestID, let room, let follow):
            guard c.key != nil else {
                return refuse(id, .notRegistered, "register before locate", requestID: requestID, close: false)
            }
            guard (1...Self.longestRoomID).contains(room.utf8.count) else {
                return refuse(
                    id, .malformed, "a room id is 1-\(Self.longestRoomID) bytes, not \(room.utf8.count)", requestID: requestID,
                    close: false)
            }
            // A relay's own rendezvous: its relay. With relays reporting: where the registry
            // says (a member that follows its room places nothing: only one that lost its
            // relay, or a joiner, moves a room).
            var placed = false
            let relay =
                configuration.relaySecret == nil
                ? nil
                : follow ? relayRegistry.current(room: room) : relayRegistry.host(room: room, now: now, placed: &placed)
            let party = configuration.relaySecret == nil ? configuration.party : relay?.load.party
            // A room moved here: the other nodes send its members to the same relay.
            if placed, clustered, let relay { records.append(.roomMoved(room: room, relay: relay.key)) }
            guard let party else {
                let detail = follow ? "no relay is known to host \(room)" : "no relay hosts parties now"
                return refuse(id, .noRelay, detail, requestID: requestID, close: false)
            }
            return [.send(id, RendezvousFrame.frame(.located(id: requestID, room: room, party: party)))]
        case .place(let requestID):
            guard c.key != nil else {
                return refuse(id, .notRegistered, "register before place", requestID: requestID, close: false)
            }
            // A relay's own rendezvous: its party service. With relays reporting: placed
            // by load, the room's expected use reserved (at the other nodes too).
            guard configuration.relaySecret != nil else {
                guard let party = configuration.party else {
                    return refuse(id, .noRelay, "no relay hosts parties now", requestID: requestID, close: false)
                }
                return [.send(id, RendezvousFrame.frame(.located(id: requestID, room: "", party: party)))]
            }
            guard let relay = relayRegistry.place(now: now, where: { $0.party != nil }), let party = relay.load.party else {
                return refuse(
                    id, .noRelay,
                    "no live relay below \(Int(configuration.relays.ceiling * 100)) % of its capacity hosts parties",
                    requestID: requestID, close: false)
            }
            if clustered { records.append(.placed(relay: relay.key)) }
            return [.send(id, RendezvousFrame.frame(.located(id: requestID, room: "", party: party)))]
        case .hello, .registered, .lookupResult, .sent, .deliver, .error, .located, .contacts, .partyList:
            return refuse(id, .malformed, "a server message sent to the server", requestID: nil, close: true)
        }
    }

    /// Whether a relay's report carries the proof `expected` makes from the
    /// directory's relay secret (never, without one).
    private func relayProves(_ proof: [UInt8], _ expected: (String) -> [UInt8]) -> Bool {
        guard let secret = configuration.relaySecret else { return false }
        return expected(secret).withUnsafeBytes { want in proof.withUnsafeBytes { Sodium.constantTimeEqual($0, want) } }
    }

    /// `key`'s post budget as it stands (a full one when it has none).
    private func postBudget(of key: PublicKey, now: Timestamp) -> TokenBucket {
        postBudgets[key]
            ?? TokenBucket(burst: configuration.postBurst, perSecond: configuration.postsPerMinute / 60, now: now)
    }

    /// A post to a stranger made at another node, or before a restart, `age` ago:
    /// spent from its poster's post budget here too.
    private mutating func spendPost(_ post: RendezvousPost, age: Duration, now: Timestamp) {
        guard age < Self.strangerMemory, !accepts(post.to, from: post.from) else { return }
        let then = now + (.zero - max(age, .zero))
        var budget = postBudget(of: post.from, now: then)
        budget.spend(at: then)
        postBudgets[post.from] = budget
    }

    /// `owner`'s contacts, less `remove`, with `add`.
    private mutating func changeContacts(of owner: PublicKey, add: [PublicKey], remove: [PublicKey]) {
        let before = contacts[owner] ?? []
        let after = before.subtracting(remove).union(add)
        contactCount += after.count - before.count
        contacts[owner] = after.isEmpty ? nil : after
        for key in before.subtracting(after) {
            contactOf[key]?.remove(owner)
            if contactOf[key]?.isEmpty == true { contactOf[key] = nil }
        }
        for key in after.subtracting(before) { contactOf[key, default: []].insert(owner) }
        if after.isEmpty { ownerSeen[owner] = nil }
    }

    /// A change of `owner`'s contacts made here: recorded (for the store and the
    /// other nodes, which replay it over a resync for a while), then made.
    private mutating func recordContacts(of owner: PublicKey, add: [PublicKey], remove: [PublicKey], now: Timestamp) {
        records.append(.contacts(owner: owner, add: add, remove: remove))
        if clustered {
            recentContactChanges.append((now, owner, add, remove))
            if recentContactChanges.count > Self.contactReplayLimit {
                recentContactChanges.removeFirst(recentContactChanges.count - Self.contactReplayLimit)
            }
        }
        changeContacts(of: owner, add: add, remove: remove)
    }

    /// Unix time at `now`, from the last the driver gave.
    private func unixNow(_ now: Timestamp) -> UInt64? {
        unixClock.map { $0.unix &+ UInt64(max(0, (now - $0.at).components.seconds)) }
    }

    /// A key with contacts registered here for a day has its last-seen row written
    /// again: a directory killed while it was here (no row at its leave) counts its
    /// absence from then, not from a registration months old.
    private mutating func noteOwnersStillHere(now: Timestamp) {
        guard let unix = unixNow(now) else { return }
        for (id, c) in connections {
            guard let key = c.key, registry[key] == id, contacts[key] != nil, let registered = c.registered,
                now - (c.seenRecorded ?? registered.at) >= Self.seenRefresh
            else { continue }
            records.append(.seen(key, unixSeconds: unix))
            connections[id]?.seenRecorded = now
        }
    }

    /// The contacts of keys not registered anywhere for
    /// ``RendezvousServerConfiguration/contactsFor`` are removed, as their owner would
    /// (recorded a change at a time). A key with contacts whose last registration this
    /// node does not know is counted from now.
    private mutating func forgetContactsOfKeysGone(now: Timestamp) {
        guard let unix = unixNow(now) else { return }
        let limit = UInt64(max(0, configuration.contactsFor.components.seconds))
        var gone: [PublicKey] = []
        for owner in contacts.keys where registry[owner] == nil && elsewhere[owner] == nil {
            guard let last = ownerSeen[owner] else {
                ownerSeen[owner] = unix
                continue
            }
            if unix &- min(last, unix) >= limit { gone.append(owner) }
        }
        for owner in gone {
            let all = Self.ordered(contacts[owner] ?? [])
            for start in stride(from: 0, to: all.count, by: RendezvousMessage.maximumContactChange) {
                let part = Array(all[start..<min(start + RendezvousMessage.maximumContactChange, all.count)])
                recordContacts(of: owner, add: [], remove: part, now: now)
            }
        }
    }

    /// Whether `to` made `from` one of its contacts (or is `from`).
    private func accepts(_ to: PublicKey, from: PublicKey) -> Bool {
        to == from || contacts[to]?.contains(from) == true
    }

    /// Whether `from` may post or send to `to` now: always a contact; a stranger it
    /// reached in the last hour, or one that reached it (an answer), again; another
    /// stranger from `from`'s stranger budget. Each reach is remembered for an hour;
    /// one that spent the budget is recorded (``RendezvousRecord/reached(_:)``), so
    /// that a restart and the other nodes of a cluster count it too.
    private mutating func mayReach(_ to: PublicKey, from: PublicKey, now: Timestamp, unixSeconds: UInt64) -> Bool {
        guard !accepts(to, from: from), configuration.strangerBurst.isFinite else { return true }
        if !reachedRecently(from: from, to: to, now: now) {
            var budget = strangerBudget(of: from, now: now)
            guard budget.take(at: now) else {
                strangerBudgets[from] = budget
                return false
            }
            strangerBudgets[from] = budget
            records.append(.reached(RendezvousReach(from: from, to: to, unixSeconds: unixSeconds)))
        }
        noteReach(from: from, to: to, now: now)
        return true
    }

    /// Whether `from` reached `to`, or `to` reached `from`, in the last hour.
    private func reachedRecently(from: PublicKey, to: PublicKey, now: Timestamp) -> Bool {
        let recent = { (then: Timestamp?) in then.map { now - $0 < Self.strangerMemory } ?? false }
        return recent(reached[from]?[to]) || recent(reached[to]?[from])
    }

    private func strangerBudget(of key: PublicKey, now: Timestamp) -> TokenBucket {
        strangerBudgets[key]
            ?? TokenBucket(burst: configuration.strangerBurst, perSecond: configuration.strangersPerHour / 3600, now: now)
    }

    /// A stranger `reach` made at another node, or before a restart, `age` ago:
    /// spent from its sender's budget here too, and free to reach again for the rest
    /// of the hour.
    private mutating func spendReach(_ reach: RendezvousReach, age: Duration, now: Timestamp) {
        guard age < Self.strangerMemory, !accepts(reach.to, from: reach.from), configuration.strangerBurst.isFinite else {
            return
        }
        let then = now + (.zero - max(age, .zero))
        var budget = strangerBudget(of: reach.from, now: then)
        budget.spend(at: then)
        strangerBudgets[reach.from] = budget
        if reached[reach.from]?[reach.to].map({ $0 < then }) ?? true { reached[reach.from, default: [:]][reach.to] = then }
    }

    /// `from` reached `to` now (here, or at another node that told this one): free
    /// for the hour after, both ways.
    private mutating func noteReach(from: PublicKey, to: PublicKey, now: Timestamp) {
        guard !accepts(to, from: from) else { return }
        reached[from, default: [:]][to] = now
    }

    private mutating func refuseStranger(_ id: ConnectionID, _ to: PublicKey, requestID: UInt32) -> [RendezvousAction] {
        refuse(
            id, .rateLimited,
            "\(to) has not made you a contact, and you reached \(Self.count(configuration.strangerBurst)) strangers at once, then \(Self.count(configuration.strangersPerHour)) an hour",
            requestID: requestID, close: false)
    }

    /// How long a stranger reached stays free to reach again (and a store keeps its
    /// ``RendezvousRecord/reached(_:)``).
    public static let strangerMemory = Duration.seconds(3600)
    /// How long this node's own contact changes are replayed over a snapshot (a
    /// node of a cluster), and how many at most.
    static let contactReplay = Duration.seconds(60)
    static let contactReplayLimit = 10_000
    /// How often the contacts of keys gone for ``RendezvousServerConfiguration/contactsFor`` are looked for.
    static let contactSweep = Duration.seconds(600)
    /// How often a key with contacts, registered here, has its last-seen row written again.
    static let seenRefresh = Duration.seconds(24 * 3600)

    /// How long before Unix time `now` Unix time `then` was (none, if after it).
    static func age(of then: UInt64, at now: UInt64) -> Duration {
        .seconds(Int64(min(now &- min(then, now), UInt64(Int64.max / 2))))
    }

    /// A configured figure in a refusal (whole, unless it is not a finite one).
    static func count(_ value: Double) -> String {
        value.isFinite && abs(value) < 1e15 ? String(Int(value)) : "\(value)"
    }

    /// Keys in one order (their bytes'), for answers and records that compare alike.
    static func ordered(_ keys: Set<PublicKey>) -> [PublicKey] {
        keys.sorted { $0.bytes.lexicographicallyPrecedes($1.bytes) }
    }

    /// Drops what was posted for `key` longer ago than the mailbox keeps it.
    private mutating func expireMailbox(of key: PublicKey, now: Timestamp) {
        guard var box = mailbox[key] else { return }
        let expired = box.filter { now >= $0.expires }.map(\.id)
        guard !expired.isEmpty else { return }
        box.removeAll { now >= $0.expires }
        records.append(.dropped(expired))
        for id in expired { postRecipients[id] = nil }
        mailbox[key] = box.isEmpty ? nil : box
        statistics.posted = mailboxCount
    }

    private mutating func refuse(
        _ id: ConnectionID, _ code: RendezvousErrorCode, _ detail: String, requestID: UInt32?, close: Bool
    ) -> [RendezvousAction] {
        count(code)
        var actions: [RendezvousAction] = [.send(id, RendezvousFrame.frame(.error(code: code, detail: detail, id: requestID)))]
        if close {
            actions.append(.close(id))
            // Forget it now: nothing more from it is handled, whatever the driver still delivers.
            forget(id, leftAt: nil)
        }
        return actions
    }

    /// What a store kept, back in the core: posts aged as their Unix times say
    /// (against `unixSeconds`, now), and keys seen, for "offline" answers.
    mutating func restore(_ snapshot: RendezvousSnapshot, unixSeconds: UInt64, now: Timestamp) {
        _ = merge(snapshot, unixSeconds: unixSeconds, now: now)
        // Not before the driver has handed over what else it reads at a start.
        contactSweepAt = now + Self.contactSweep
    }

    /// A snapshot's posts and keys seen taken in (posts already held are not taken
    /// twice); what is new for a key registered here is delivered (returned). The
    /// budgets new posts and stranger reaches spent (before a restart, or at another
    /// node while this one heard nothing) are spent here too.
    private mutating func merge(_ snapshot: RendezvousSnapshot, unixSeconds: UInt64, now: Timestamp) -> [RendezvousAction] {
        func age(_ then: UInt64) -> Duration { Self.age(of: then, at: unixSeconds) }
        /// `lifetime` from Unix time `then`, on this process's clock.
        func end(_ then: UInt64, _ lifetime: Duration) -> Timestamp {
            let age = age(then)
            return age >= lifetime ? now : now + (lifetime - age)
        }
        var actions: [RendezvousAction] = []
        var newPosts: [RendezvousPost] = []
        for post in snapshot.posts where postRecipients[post.id] == nil {
            newPosts.append(post)
            keep(post, expires: end(post.unixSeconds, configuration.mailboxLifetime))
            // Posts this node numbered before (a node alone keeps its number, 0).
            if RendezvousCluster.node(ofPost: post.id) == configuration.node { nextPostID = max(nextPostID, post.id + 1) }
            if let target = registry[post.to] {
                statistics.delivered += 1
                actions.append(.send(target, RendezvousFrame.frame(.deliver(from: post.from, sealed: post.sealed))))
            }
        }
        // The database's contacts are the truth (at a start nothing is known; after a
        // gap, what the others changed is in them), but for this node's own latest
        // changes, which may still be on their way to it: they go on top again.
        contacts = snapshot.contacts
        contactCount = contacts.values.reduce(0) { $0 + $1.count }
        contactOf = [:]
        for (owner, keys) in contacts { for key in keys { contactOf[key, default: []].insert(owner) } }
        for change in recentContactChanges { changeContacts(of: change.owner, add: change.add, remove: change.remove) }
        // When each key with contacts was last registered (the store keeps those rows
        // longer than `seenFor`), for forgetting the contacts of keys gone for good.
        ownerSeen = ownerSeen.filter { contacts[$0.key] != nil }
        for (key, then) in snapshot.seen where contacts[key] != nil {
            if ownerSeen[key].map({ $0 < then }) ?? true { ownerSeen[key] = then }
        }
        // Oldest first, as the budgets were spent; a reach this node knows of (its
        // own, or heard) was spent here already.
        for post in newPosts.sorted(by: { $0.unixSeconds < $1.unixSeconds }) {
            spendPost(post, age: age(post.unixSeconds), now: now)
        }
        for reach in snapshot.reaches.sorted(by: { $0.unixSeconds < $1.unixSeconds })
        where !reachedRecently(from: reach.from, to: reach.to, now: now) {
            spendReach(reach, age: age(reach.unixSeconds), now: now)
        }
        // The most recent first, as many as are remembered.
        for (key, then) in snapshot.seen.sorted(by: { $0.value > $1.value })
        where registry[key] == nil && age(then) < configuration.rememberFor {
            guard seen.count < configuration.rememberedKeys || seen[key] != nil else { break }
            let forget = end(then, configuration.rememberFor)
            if seen[key].map({ $0 < forget }) ?? true {
                seen[key] = forget
                due(forget)
            }
        }
        takeParties(snapshot.parties, now: now)
        statistics.posted = mailboxCount
        return actions
    }

    /// What the database holds after a gap in what the other nodes said: posts the
    /// others made are taken (and delivered here) or let go as the rows say (this
    /// node's own may still be on their way to the database: they stay), and who is
    /// registered at the other nodes replaces what was known.
    mutating func clusterResync(
        _ snapshot: RendezvousSnapshot, presence: [PublicKey: ClusterPresence], unixSeconds: UInt64, now: Timestamp
    ) -> [RendezvousAction] {
        let rows = Set(snapshot.posts.map(\.id))
        let gone = postRecipients.keys.filter {
            !rows.contains($0) && RendezvousCluster.node(ofPost: $0) != configuration.node
        }
        if !gone.isEmpty { _ = cluster(.dropped(gone), now: now, unixSeconds: unixSeconds) }
        var actions = merge(snapshot, unixSeconds: unixSeconds, now: now)
        let before = elsewhere
        for key in before.keys where presence[key] == nil {
            elsewhere[key] = nil
            if registry[key] == nil {
                keyLeft(key, now)
            }
        }
        for (key, there) in presence { actions += cluster(.online(key, there), now: now, unixSeconds: unixSeconds) }
        statistics.elsewhere = elsewhere.count
        clusterSynced = true
        return actions
    }

    /// A relay that reported here left: down now, here and (clustered) at the other nodes.
    private mutating func relayLeft(_ key: PublicKey) {
        relayRegistry.remove(key)
        if clustered { records.append(.relayGone(key)) }
    }

    /// A post kept in its recipient's box, which stays in the order posts expire
    /// (the order they were made: the oldest first, to expire and to be pushed out).
    private mutating func keep(_ post: RendezvousPost, expires: Timestamp) {
        var box = mailbox[post.to] ?? []
        let at = box.lastIndex { $0.expires <= expires }.map { $0 + 1 } ?? 0
        box.insert(Posted(id: post.id, from: post.from, sealed: post.sealed, expires: expires), at: at)
        due(expires)
        mailbox[post.to] = box
        postRecipients[post.id] = post.to
    }

    /// What another node of the cluster said.
    mutating func cluster(_ event: RendezvousClusterEvent, now: Timestamp, unixSeconds: UInt64) -> [RendezvousAction] {
        var actions: [RendezvousAction] = []
        switch event {
        case .online(let key, let there):
            guard there.node != configuration.node else { return [] }
            let known = elsewhere[key]
            elsewhere[key] = there
            // A registration there not heard of before is the later one (what this
            // node heard of when its own was made, its own replaced there).
            if known != there, let id = registry[key] {
                actions += refuse(
                    id, .replaced, "\(key) registered again at another directory node", requestID: nil, close: true)
            }
        case .offline(let key, let node):
            guard elsewhere[key]?.node == node else { return [] }
            elsewhere[key] = nil
            if registry[key] == nil {
                keyLeft(key, now)
            }
        case .nodeGone(let node):
            for (key, there) in elsewhere where there.node == node {
                elsewhere[key] = nil
                if registry[key] == nil {
                    keyLeft(key, now)
                }
            }
        case .signal(let signal):
            guard signal.node == configuration.node, let target = registry[signal.to] else { return [] }
            noteReach(from: signal.from, to: signal.to, now: now)
            statistics.signalsIn += 1
            statistics.delivered += 1
            actions.append(.send(target, RendezvousFrame.frame(.deliver(from: signal.from, sealed: signal.sealed))))
        case .posted(let post):
            guard postRecipients[post.id] == nil, RendezvousCluster.node(ofPost: post.id) != configuration.node else {
                return []
            }
            let age = Self.age(of: post.unixSeconds, at: unixSeconds)
            guard age < configuration.mailboxLifetime else { return [] }
            keep(post, expires: now + (configuration.mailboxLifetime - age))
            spendPost(post, age: age, now: now)
            noteReach(from: post.from, to: post.to, now: now)
            statistics.posted = mailboxCount
            if let target = registry[post.to] {
                statistics.delivered += 1
                actions.append(.send(target, RendezvousFrame.frame(.deliver(from: post.from, sealed: post.sealed))))
            }
        case .relayLoad(let key, let load):
            // Unless it reports here too: then this node's own connection says when it is gone.
            guard !relayConnections.values.contains(key) else { return [] }
            relayRegistry.report(key, load, now: now)
        case .relayGone(let key):
            guard !relayConnections.values.contains(key) else { return [] }
            relayRegistry.remove(key)
        case .roomMoved(let room, let relay):
            // Moved at once here too, to a heavier relay: the others hear this node's move again.
            if let kept = relayRegistry.remember(room: room, on: relay, now: now) {
                records.append(.roomMoved(room: room, relay: kept))
            }
        case .placed(let relay):
            relayRegistry.reserve(on: relay, now: now)
        case .party(let party):
            parties.put(party, now: now)
        case .partyClosed(let room, let relay):
            parties.close(room, on: relay)
        case .reached(let reach):
            // One already known (read back in a resync that raced its notice, or heard
            // before): spent here once.
            guard !reachedRecently(from: reach.from, to: reach.to, now: now) else { break }
            spendReach(reach, age: .zero, now: now)
        case .contacts(let owner, let add, let remove):
            changeContacts(of: owner, add: add, remove: remove)
        case .dropped(let ids):
            for id in ids {
                guard let key = postRecipients.removeValue(forKey: id) else { continue }
                mailbox[key]?.removeAll { $0.id == id }
                if mailbox[key]?.isEmpty == true { mailbox[key] = nil }
            }
            statistics.posted = mailboxCount
        }
        statistics.elsewhere = elsewhere.count
        return actions
    }

    /// A registered key leaves: when, in Unix seconds, for a store (what a restarted
    /// directory counts a day from).
    private mutating func recordSeen(_ c: Connection, at now: Timestamp) {
        guard let key = c.key, let registered = c.registered else { return }
        let online = UInt64(max(0, (now - registered.at).components.seconds))
        records.append(.seen(key, unixSeconds: registered.unix &+ online))
    }

    /// A key is no longer registered here, nor at the node that said it was: it is
    /// remembered for "offline" answers, and, with contacts, counted gone from now
    /// (``RendezvousServerConfiguration/contactsFor``).
    private mutating func keyLeft(_ key: PublicKey, _ now: Timestamp) {
        if seen.count >= configuration.rememberedKeys, let oldest = seen.min(by: { $0.value < $1.value })?.key {
            seen[oldest] = nil
        }
        seen[key] = now + configuration.rememberFor
        due(now + configuration.rememberFor)
        if contacts[key] != nil, let unix = unixNow(now) { ownerSeen[key] = unix }
    }

    private mutating func count(_ code: RendezvousErrorCode) { statistics.refused[code, default: 0] += 1 }

    /// The longest room id `locate` takes (as an invitation does).
    static let longestRoomID = 64
}
