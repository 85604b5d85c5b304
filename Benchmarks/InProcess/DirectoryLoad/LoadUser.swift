import Foundation
import NIOConcurrencyHelpers
import Party
import Rendezvous
import Secure
import Transport
import TusaBase

/// Why a load user could not do what it was asked.
public struct LoadError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// One user of a directory load (`directory-load`, and issue 16's cluster test):
/// a registration at a directory node (made again at the next node first when
/// its node goes, as `tusa party watch` does), and in a room, a party connection
/// that follows the room to another relay (a ``RoomLocator`` over the same
/// registration), noting when it last heard each other member. What it says is
/// sent by a ``VoiceClock``.
public final class LoadUser: Sendable {
    public let identity = Identity.generate()
    public var key: PublicKey { identity.publicKey }
    public let nodes: [TransportAddress]
    private let rendezvous = NIOLockedValueBox<RendezvousConnection?>(nil)
    private let registered = NIOLockedValueBox(0)
    private let invitations = NIOLockedValueBox<[(PartyInvitation, at: ContinuousClock.Instant)]>([])
    /// Sealed payloads from other users that are not invitations.
    public let signals = NIOLockedValueBox<[String]>([])
    private let party = NIOLockedValueBox<PartyConnection?>(nil)
    private let roomID = NIOLockedValueBox<String?>(nil)
    private let relayKey = NIOLockedValueBox<PublicKey?>(nil)
    /// When each other member of the room was last heard.
    private let lastHeard = NIOLockedValueBox<[MemberID: ContinuousClock.Instant]>([:])
    private let roster = NIOLockedValueBox<Set<MemberID>>([])
    private let tasks = NIOLockedValueBox<[Task<Void, Never>]>([])
    private let posted = NIOLockedValueBox<ContinuousClock.Instant?>(nil)

    /// `nodes`: the directory's nodes, in the order this user tries them.
    public init(nodes: [TransportAddress]) { self.nodes = nodes }

    /// The room it is in (created or joined).
    public var room: String? { roomID.withLockedValue { $0 } }
    /// The relay it reached the room on first (the directory's placement).
    public var firstRelay: PublicKey? { relayKey.withLockedValue { $0 } }
    /// The node it is registered at now.
    public var server: TransportAddress? {
        rendezvous.withLockedValue { $0.map { $0.isClosed ? nil : $0.server } ?? nil }
    }

    /// How many times it has registered (again after each loss of its node).
    public var registrations: Int { registered.withLockedValue { $0 } }

    /// Registers at its first node that answers and keeps a registration until stopped.
    public func register() async throws {
        let first = try await RendezvousConnection.connect(toAnyOf: nodes, identity: identity.privateKey, timeout: .seconds(10))
        rendezvous.withLockedValue { $0 = first }
        registered.withLockedValue { $0 += 1 }
        let task = Task { [self] in
            var connection = first
            while !Task.isCancelled {
                for await (_, payload) in connection.incoming {
                    if let invitation = PartyInvitation(decoding: payload) {
                        invitations.withLockedValue { $0.append((invitation, .now)) }
                    } else {
                        signals.withLockedValue { $0.append(String(decoding: payload, as: UTF8.self)) }
                    }
                }
                // Its node is gone: the next one first, until one takes it.
                while !Task.isCancelled {
                    if let again = try? await connection.connectAgain(identity: identity.privateKey, timeout: .seconds(2)) {
                        connection = again
                        rendezvous.withLockedValue { $0 = again }
                        registered.withLockedValue { $0 += 1 }
                        break
                    }
                    try? await Task.sleep(for: .milliseconds(50))
                }
            }
        }
        tasks.withLockedValue { $0.append(task) }
    }

    private func registration() throws -> RendezvousConnection {
        guard let connection = rendezvous.withLockedValue({ $0 }) else { throw LoadError("not registered") }
        return connection
    }

    /// Creates a room where the directory places it now and invites `friends`
    /// (a sealed post each); returns its id.
    public func create(_ name: String, inviting friends: [PublicKey]) async throws -> String {
        let connection = try registration()
        // Placed by the directory now, as `tusa party create` asks.
        guard let grant = (try? await connection.placeRoom()) ?? connection.party else {
            throw LoadError("the directory placed no party relay")
        }
        guard let address = TransportAddress(grant.address, defaultPort: nil), let relayKey = PublicKey(base64: grant.key)
        else { throw LoadError("the directory's party grant does not read: \(grant)") }
        let joined = try await connect(to: address, relayKey: relayKey) { try await $0.create(name: name, invite: friends) }
        posted.withLockedValue { $0 = .now }
        for friend in friends {
            let invitation = PartyInvitation(room: joined.room, name: name, relay: grant.address, relayKey: grant.key)
            try await connection.post(invitation.encoded(), to: friend)
        }
        return joined.room
    }

    /// When its invitations began to go out (``create(_:inviting:)``).
    public var invitationsPostedAt: ContinuousClock.Instant? { posted.withLockedValue { $0 } }

    /// Joins `room` on the relay the directory says hosts it.
    public func join(_ room: String) async throws {
        let connection = try registration()
        let grant = try await connection.locate(room: room)
        guard let address = TransportAddress(grant.address, defaultPort: nil), let relayKey = PublicKey(base64: grant.key)
        else { throw LoadError("the directory's answer for \(room) does not read: \(grant)") }
        _ = try await connect(to: address, relayKey: relayKey) { try await $0.join(room) }
    }

    private func connect(
        to address: TransportAddress, relayKey: PublicKey, enter: (PartyConnection) async throws -> PartyJoined
    ) async throws -> PartyJoined {
        // Frames are noted as they are opened, on the connection's event loop: the
        // cooperative pool may be busy (in a test run, with every other suite).
        let heard = lastHeard
        let connection = try await PartyConnection.connect(
            to: address, relayKey: relayKey, identity: identity, transport: .udp,
            audio: { from, _, _, _ in heard.withLockedValue { $0[from] = .now } },
            locate: { [self] room, follow in
                // Over whichever registration this user holds now (its own task makes it again when lost).
                guard let current = rendezvous.withLockedValue({ $0 }), !current.isClosed else { return nil }
                return await RoomLocator(current, identity: identity.privateKey).locate(room, follow: follow)
            })
        party.withLockedValue { $0 = connection }
        self.relayKey.withLockedValue { $0 = relayKey }
        let joined = try await enter(connection)
        roomID.withLockedValue { $0 = joined.room }
        roster.withLockedValue { $0 = Set(joined.roster.map(\.member)).subtracting([joined.me]) }
        let listener = Task { [self] in
            for await event in connection.events {
                switch event {
                case .memberJoined(let entry): roster.withLockedValue { _ = $0.insert(entry.member) }
                case .memberLeft(let member, _): roster.withLockedValue { _ = $0.remove(member) }
                default: break
                }
            }
        }
        tasks.withLockedValue { $0.append(listener) }
        return joined
    }

    /// Its party connection, once in a room.
    public var connection: PartyConnection? { party.withLockedValue { $0 } }

    /// Whether every other member of its room has been heard since `instant`.
    public func hearsEveryone(since instant: ContinuousClock.Instant) -> Bool {
        let others = roster.withLockedValue { $0 }
        let heard = lastHeard.withLockedValue { $0 }
        return !others.isEmpty && others.allSatisfy { (heard[$0] ?? instant) > instant }
    }

    /// How long ago the member of its room heard last was heard (nil: none yet).
    public func longestSilence(now: ContinuousClock.Instant = .now) -> Duration? {
        let others = roster.withLockedValue { $0 }
        let heard = lastHeard.withLockedValue { $0 }
        guard !others.isEmpty else { return nil }
        var longest = Duration.zero
        for member in others {
            guard let at = heard[member] else { return nil }
            longest = max(longest, at.duration(to: now))
        }
        return longest
    }

    /// The room of the first invitation it has, waiting up to `limit`.
    public func invitation(within limit: Duration) async -> String? {
        _ = await waitUntil(within: limit, poll: .milliseconds(20)) { !invitations.withLockedValue { $0.isEmpty } }
        return invitations.withLockedValue { $0.first?.0.room }
    }

    /// When its first invitation arrived.
    public var invitedAt: ContinuousClock.Instant? { invitations.withLockedValue { $0.first?.at } }

    /// Sends a sealed payload to `peer` through the directory (a call's offer).
    public func send(_ payload: [UInt8], to peer: PublicKey) async throws {
        try await registration().send(payload, to: peer)
    }

    /// The parties the directory lists for this user (``RendezvousConnection/parties()``).
    public func parties() async throws -> [PartyEntry] { try await registration().parties().0 }

    /// Whether `peer` is online, as this user's node sees it.
    public func sees(_ peer: PublicKey) async -> Bool {
        guard let connection = rendezvous.withLockedValue({ $0 }) else { return false }
        return (try? await connection.lookup(peer)) == true
    }

    public func stop() async {
        for task in tasks.withLockedValue({ $0 }) { task.cancel() }
        await party.withLockedValue { $0 }?.close()
        await rendezvous.withLockedValue { $0 }?.close()
    }
}

/// Every member speaking: a voice-sized voiced frame from each connection every
/// `interval`, sent from a thread of its own (the cooperative pool may be busy).
public final class VoiceClock: Sendable {
    private let running = NIOLockedValueBox(true)

    public init(_ connections: [PartyConnection], interval: Duration = .milliseconds(100)) {
        let running = self.running
        let microseconds = UInt32(clamping: interval.nanoseconds / 1000)
        let step = UInt32(clamping: interval.nanoseconds / 125_000)  // 8 kHz RTP clock
        let thread = Thread {
            var timestamp: UInt32 = 0
            let frame = [UInt8](repeating: 0x5A, count: 60)
            while running.withLockedValue({ $0 }) {
                for connection in connections {
                    connection.send(frame, timestamp: timestamp, level: AudioLevel(level: 30, voiced: true))
                }
                timestamp &+= step
                usleep(microseconds)
            }
        }
        thread.start()
    }

    public func stop() { running.withLockedValue { $0 = false } }
}

/// Polls `condition` every `poll` until it holds or `limit` has passed; whether it held.
public func waitUntil(
    within limit: Duration, poll: Duration = .milliseconds(10), _ condition: () async throws -> Bool
) async rethrows -> Bool {
    let deadline = ContinuousClock.now + limit
    while true {
        if try await condition() { return true }
        guard ContinuousClock.now < deadline else { return try await condition() }
        try? await Task.sleep(for: poll)
    }
}
