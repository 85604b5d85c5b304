import Directory
import Foundation
import Logging
import Relay
import Rendezvous
import Secure
import ServiceLifecycle
import TestSupport
import Transport
import TusaBase

// `directory-bench`: invitations posted through a real rendezvous over loopback TCP,
// each acknowledged only once its store has written it: in memory (no store), in
// SQLite (WAL) and in PostgreSQL (a private server from scripts/postgres.sh), side
// by side in one run. Users post at a steady pace, interleaved (the shape of
// many people each inviting a few friends), to recipients that are offline
// (stored for their next login) and online (delivered at once as well).
// Then, on PostgreSQL, an invitation to an online friend at the same directory
// node against one at another node (two nodes on one database): how long until
// the friend has it.
//
//   directory-bench [--clients N] [--rate POSTS_PER_S] [--friend-rate POSTS_PER_S] [--placements N] [--seconds S]
//                   [--no-postgres]
//   directory-bench --idle N --server IP:PORT [--hold S] [--from-user K]
//   directory-bench --legit --server IP:PORT [--seconds S] [--interval S] [--gap S]
//   directory-bench --signal RATE --server IP:PORT [--clients N] [--seconds S] [--from-user K]
//
// With --idle: N users registered at a running directory (900 from each of
// 127.0.0.1, 127.0.0.2, …: a directory takes 1,000 from one address), held idle
// S seconds (their keepalives go on), then closed; Benchmarks/directory-idle.sh
// reads the directory's memory meanwhile.
//
// With --signal: N users (200) registered at a running directory (as --idle places
// them, from user K on), each making the user before it a contact, then sending sealed
// signals (a call's offer's size) to the user after it at RATE a second in all,
// interleaved, for S seconds (Benchmarks/directory-idle.sh runs it beside the idle
// users). Prints 'signal: offered= acknowledged_per_s= refused= ack_p50_ms= ack_p95_ms=
// delivered= delivered_p50_ms= delivered_p95_ms='; exit 1 when one was refused or lost.
//
// With --legit: a legitimate user beside an abuse of the listener (Benchmarks/soak.sh
// directory): every --interval seconds (0.05) a fresh connection from 127.20.0.1
// registers (challenge, proof) and asks one lookup, timed from the connect to the
// answer; S seconds against the quiet directory, a --gap for another process's abuse
// to set in, S seconds beside it. Prints one line a phase, as Benchmarks/tcp-abuse.py
// does ('legit phase=quiet|abuse requests= answered= p50_ms= p95_ms= max_ms='); exit 1
// when a request went unanswered.

struct Options {
    var clients = 200
    var rates = [2000, 5000]
    var friendRates = [200, 2000]
    var placements = 1000
    var seconds = 5.0
    var postgres = true
    var idle: Int?
    var server: TransportAddress?
    var hold = 40.0
    var fromUser = 0
    var legit = false
    var signal: Int?
    var interval = 0.05
    var gap = 2.0

    init(_ arguments: [String]) throws {
        var i = 0
        func value() throws -> String {
            i += 1
            guard i < arguments.count else { throw BenchError("\(arguments[i - 1]) needs a value") }
            return arguments[i]
        }
        while i < arguments.count {
            switch arguments[i] {
            case "--clients": clients = Int(try value()) ?? 0
            case "--rate": rates = try value().split(separator: ",").compactMap { Int($0) }
            case "--friend-rate": friendRates = try value().split(separator: ",").compactMap { Int($0) }
            case "--placements": placements = Int(try value()) ?? 0
            case "--seconds": seconds = Double(try value()) ?? 0
            case "--no-postgres": postgres = false
            case "--idle": idle = Int(try value())
            case "--server": server = TransportAddress(try value())
            case "--hold": hold = Double(try value()) ?? 0
            case "--from-user": fromUser = Int(try value()) ?? -1
            case "--legit": legit = true
            case "--signal": signal = Int(try value()) ?? 0
            case "--interval": interval = Double(try value()) ?? 0
            case "--gap": gap = Double(try value()) ?? -1
            default: throw BenchError("unknown argument \(arguments[i])")
            }
            i += 1
        }
        guard clients > 1, placements > 0, !rates.isEmpty, rates.allSatisfy({ $0 > 0 }), friendRates.allSatisfy({ $0 > 0 }),
            seconds > 0
        else {
            throw BenchError("--clients (2 or more), --rate, --friend-rate and --seconds must be positive")
        }
    }
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

struct Result {
    var acknowledged = 0
    var refused = 0
    var latenciesMs: [Double] = []
    var wallSeconds = 0.0
}

func percentile(_ values: [Double], _ q: Double) -> Double {
    guard !values.isEmpty else { return .nan }
    let sorted = values.sorted()
    return sorted[min(sorted.count - 1, Int((Double(sorted.count - 1) * q).rounded()))]
}

/// One backend at one rate: a fresh rendezvous on the store, `clients` users
/// connected, each posting every clients/rate seconds (offsets spread) for
/// `seconds`; every fourth post goes to an online user, the rest to offline keys.
func run(store: (any RendezvousStore)?, clients: Int, rate: Int, seconds: Double) async throws -> Result {
    var logger = Logger(label: "directory-bench")
    logger.logLevel = .error
    var configuration = RendezvousServerConfiguration()
    let perClient = Double(rate) / Double(clients)
    // The per-connection limit (20/s) stays unless the pace needs more.
    configuration.requestsPerSecond = max(configuration.requestsPerSecond, perClient * 2)
    configuration.mailboxTotal = max(configuration.mailboxTotal, Int(Double(rate) * seconds) * 2)
    // Each user posts at the bench's pace, past a person's budget.
    configuration.postsPerMinute = max(configuration.postsPerMinute, perClient * 120)
    configuration.postBurst = max(configuration.postBurst, perClient * 10)
    // Every post goes to a stranger here: what is measured is the store, not the stranger rule.
    configuration.strangerBurst = .infinity
    configuration.mailboxFromStrangers = configuration.mailboxPerKey
    let service = RendezvousService(
        address: TransportAddress(ip: .v4(0x7F00_0001), port: 0), configuration: configuration, store: store, logger: logger)
    let group = ServiceGroup(configuration: .init(services: [service], logger: logger))
    let running = Task { try await group.run() }
    defer { running.cancel() }
    let server = try await service.boundAddress()

    let users = try await withThrowingTaskGroup(of: RendezvousConnection.self) { group in
        for _ in 0..<clients {
            group.addTask { try await RendezvousConnection.connect(to: server, identity: .generate(), timeout: .seconds(30)) }
        }
        var made: [RendezvousConnection] = []
        for try await c in group { made.append(c) }
        return made
    }
    // Deliveries to the online users are drained (their streams must not back up).
    let listeners = users.map { user in
        Task {
            for await _ in user.incoming {}
        }
    }
    let offline = (0..<1000).map { _ in PrivateKey.generate().publicKey }
    let period = 1 / perClient
    let start = ContinuousClock.now
    let invitation = [UInt8](repeating: 0xA5, count: 160)  // a sealed invitation's size
    let result = try await postAtPace(users, period: period, start: start, seconds: seconds) { k, n in
        let online = users[(k + 1) % users.count].identity
        return (invitation, n % 4 == 0 ? online : offline[(k * 31 + n) % offline.count])
    }
    for user in users { await user.close() }
    for l in listeners { l.cancel() }
    await group.triggerGracefulShutdown()
    _ = try? await running.value
    return result
}

/// Each user posts every `period` seconds from its own offset (the users spread
/// evenly over one period) until `seconds` from `start`; `post(k, n)` is user k's
/// n-th invitation and its recipient. Acknowledgement latencies and refusals, summed,
/// and the seconds it all took.
func postAtPace(
    _ users: [RendezvousConnection], period: Double, start: ContinuousClock.Instant, seconds: Double,
    sending: Bool = false, _ post: @escaping @Sendable (Int, Int) -> ([UInt8], PublicKey)
) async throws -> Result {
    try await withThrowingTaskGroup(of: Result.self) { group in
        for (k, user) in users.enumerated() {
            group.addTask {
                var r = Result()
                var n = 0
                var next = start + .seconds(period * Double(k) / Double(users.count))
                while next < start + .seconds(seconds) {
                    try await Task.sleep(until: next, clock: .continuous)
                    let (invitation, to) = post(k, n)
                    let sent = ContinuousClock.now
                    do {
                        if sending { try await user.send(invitation, to: to) } else { try await user.post(invitation, to: to) }
                        r.acknowledged += 1
                        let d = ContinuousClock.now - sent
                        r.latenciesMs.append(Double(d.components.attoseconds) / 1e15 + Double(d.components.seconds) * 1000)
                    } catch {
                        r.refused += 1
                    }
                    n += 1
                    next += .seconds(period)
                }
                return r
            }
        }
        var total = Result()
        for try await r in group {
            total.acknowledged += r.acknowledged
            total.refused += r.refused
            total.latenciesMs += r.latenciesMs
        }
        let elapsed = ContinuousClock.now - start
        total.wallSeconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        return total
    }
}

/// Payloads that say when they were sent (nanoseconds from `start`, the first 8
/// bytes), and how long after that each reached the connection that heard it.
struct Stamps: Sendable {
    let start = ContinuousClock.now

    /// Milliseconds since `start`.
    func now() -> Double {
        let d = ContinuousClock.now - start
        return Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15
    }

    /// `size` bytes: the time now, then `fill`.
    func payload(size: Int, fill: UInt8) -> [UInt8] {
        let at = UInt64(max(0, now() * 1e6))
        return (0..<8).map { UInt8(truncatingIfNeeded: at >> (56 - 8 * $0)) } + [UInt8](repeating: fill, count: max(0, size - 8))
    }

    /// The delays, in ms, of the stamped payloads `user` hears, once its connection closes.
    func delays(heardBy user: RendezvousConnection) -> Task<[Double], Never> {
        Task {
            var delays: [Double] = []
            for await (_, payload) in user.incoming where payload.count >= 8 {
                let sent = payload.prefix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
                delays.append(now() - Double(sent) / 1e6)
            }
            return delays
        }
    }
}

/// Each user sends (or, not `sending`, posts) the next user a stamped payload of `size`
/// bytes every `period` seconds for `seconds`; `settle` later the users close, and what
/// each heard is counted with its delay.
func exchangeStamped(
    _ users: [RendezvousConnection], period: Double, seconds: Double, sending: Bool, size: Int, fill: UInt8,
    settle: Duration
) async throws -> (Result, delivered: [Double]) {
    let stamps = Stamps()
    let listeners = users.map { stamps.delays(heardBy: $0) }
    let result = try await postAtPace(users, period: period, start: stamps.start, seconds: seconds, sending: sending) {
        k, _ in
        (stamps.payload(size: size, fill: fill), users[(k + 1) % users.count].identity)
    }
    try await Task.sleep(for: settle)
    for user in users { await user.close() }
    var delivered: [Double] = []
    for l in listeners { delivered += await l.value }
    return (result, delivered)
}

/// Invitations to online friends: `clients` users spread over one rendezvous per
/// store (nodes on one database when there are two), each posting to the next
/// user (at the other node when there are two) every clients/rate seconds. Each
/// invitation carries when it was posted; the friend's connection says when it
/// arrived.
func runFriends(stores: [any RendezvousStore], clients: Int, rate: Int, seconds: Double) async throws -> (
    Result, delivered: [Double]
) {
    var logger = Logger(label: "directory-bench")
    logger.logLevel = .error
    var configuration = RendezvousServerConfiguration()
    let perClient = Double(rate) / Double(clients)
    configuration.requestsPerSecond = max(configuration.requestsPerSecond, perClient * 2)
    configuration.mailboxTotal = max(configuration.mailboxTotal, Int(Double(rate) * seconds) * 2)
    configuration.postsPerMinute = max(configuration.postsPerMinute, perClient * 120)
    configuration.postBurst = max(configuration.postBurst, perClient * 10)
    // Every post goes to a stranger here: what is measured is the store, not the stranger rule.
    configuration.strangerBurst = .infinity
    configuration.mailboxFromStrangers = configuration.mailboxPerKey
    let services = stores.map {
        RendezvousService(
            address: TransportAddress(ip: .v4(0x7F00_0001), port: 0), configuration: configuration, store: $0, logger: logger)
    }
    let group = ServiceGroup(configuration: .init(services: services, logger: logger))
    let running = Task { try await group.run() }
    defer { running.cancel() }
    var servers: [TransportAddress] = []
    for service in services { servers.append(try await service.boundAddress()) }
    let users = try await withThrowingTaskGroup(of: (Int, RendezvousConnection).self) { group in
        for k in 0..<clients {
            let server = servers[k % servers.count]
            group.addTask {
                (k, try await RendezvousConnection.connect(to: server, identity: .generate(), timeout: .seconds(30)))
            }
        }
        var made: [(Int, RendezvousConnection)] = []
        for try await c in group { made.append(c) }
        return made.sorted { $0.0 < $1.0 }.map(\.1)
    }
    // Every friend is online everywhere before the first post (the nodes have told each other).
    for (k, user) in users.enumerated() {
        let friend = users[(k + 1) % users.count].identity
        var tries = 0
        while !((try? await user.lookup(friend)) ?? false) {
            tries += 1
            guard tries < 50 else { throw BenchError("a friend is not online at the other node after 5 s") }
            try await Task.sleep(for: .milliseconds(100))
        }
    }
    // A sealed invitation's size; what is still on its way arrives within a second.
    let (result, delivered) = try await exchangeStamped(
        users, period: 1 / perClient, seconds: seconds, sending: false, size: 160, fill: 0xA5, settle: .seconds(1))
    await group.triggerGracefulShutdown()
    _ = try? await running.value
    return (result, delivered)
}

/// `--idle`: `users` registered at `server` from several loopback addresses,
/// `concurrently` at a time; held `hold` seconds, then closed. The first is user
/// number `fromUser` (its source address counted from there: several processes,
/// each within its own descriptor limit, share the addresses without crowding one).
func holdIdle(users: Int, server: TransportAddress, hold: Double, fromUser: Int) async throws {
    var limit = rlimit()
    if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }
    let started = ContinuousClock.now
    var held: [RendezvousConnection] = []
    var failures = 0
    var lastError = ""
    let concurrently = 100
    var next = 0
    try await withThrowingTaskGroup(of: Swift.Result<RendezvousConnection, any Error>.self) { group in
        func add(_ k: Int) {
            // 900 a source address: 127.0.0.1, then 127.0.0.2, …
            let local = TransportAddress(ip: .v4(0x7F00_0001 + UInt32((fromUser + k) / 900)), port: 0)
            group.addTask {
                do {
                    return .success(
                        try await RendezvousConnection.connect(
                            to: server, identity: .generate(), timeout: .seconds(30), from: local))
                } catch {
                    return .failure(error)
                }
            }
        }
        while next < min(concurrently, users) {
            add(next)
            next += 1
        }
        while let result = try await group.next() {
            switch result {
            case .success(let c): held.append(c)
            case .failure(let error):
                failures += 1
                lastError = "\(error)"
            }
            if next < users {
                add(next)
                next += 1
            }
        }
    }
    let took = ContinuousClock.now - started
    let seconds = Double(took.components.seconds) + Double(took.components.attoseconds) / 1e18
    print(
        "idle: \(held.count) registered (\(failures) failed\(failures > 0 ? ": \(lastError)" : "")) in "
            + String(format: "%.1f s", seconds))
    fflush(nil)
    try await Task.sleep(for: .seconds(hold))
    let open = held.filter { !$0.isClosed }.count
    print("idle: held \(hold) s, \(open) still registered")
    fflush(nil)
    for c in held { await c.close() }
    if failures > 0 || open < held.count { exit(1) }
}

/// The legitimate user of `--legit`: a fresh connection every `interval` seconds for
/// `seconds`, each registering (within 2 s) and asking one lookup (the connection's
/// own 10 s for an answer); its latencies in ms (nil: refused, or no answer in time).
func legitimateRequests(server: TransportAddress, seconds: Double, interval: Double) async -> [Double?] {
    let identity = PrivateKey.generate()
    let from = TransportAddress(ip: .v4(0x7F14_0001), port: 0)  // 127.20.0.1
    var samples: [Double?] = []
    let end = ContinuousClock.now + .seconds(seconds)
    var next = ContinuousClock.now
    while next < end {
        try? await Task.sleep(until: next, clock: .continuous)
        next = next + .seconds(interval)
        let began = ContinuousClock.now
        guard
            let c = try? await RendezvousConnection.connect(to: server, identity: identity, timeout: .seconds(2), from: from)
        else {
            samples.append(nil)
            continue
        }
        if (try? await c.lookup(identity.publicKey)) != nil {
            let took = ContinuousClock.now - began
            samples.append(Double(took.components.seconds) * 1000 + Double(took.components.attoseconds) / 1e15)
        } else {
            samples.append(nil)
        }
        await c.close()
    }
    return samples
}

func latencyLine(_ phase: String, _ samples: [Double?]) -> String {
    let answered = samples.compactMap { $0 }.sorted()
    guard let slowest = answered.last else { return "legit phase=\(phase) requests=\(samples.count) answered=0" }
    return String(
        format: "legit phase=%@ requests=%d answered=%d p50_ms=%.2f p95_ms=%.2f max_ms=%.2f", phase, samples.count,
        answered.count, percentile(answered, 0.5), percentile(answered, 0.95), slowest)
}

/// `--signal`: `clients` users at `server` (from user `fromUser` on, as ``holdIdle``
/// numbers them), each a contact of the next, signalling the next at `rate` a second
/// in all for `seconds`. The acknowledgements (the server passed it on) and what the
/// recipients got, with its delay since it was sent.
func signalAtPace(server: TransportAddress, clients: Int, rate: Int, seconds: Double, fromUser: Int) async throws -> (
    Result, delivered: [Double]
) {
    let users = try await withThrowingTaskGroup(of: (Int, RendezvousConnection).self) { group in
        for k in 0..<clients {
            let local = TransportAddress(ip: .v4(0x7F00_0001 + UInt32((fromUser + k) / 900)), port: 0)
            group.addTask {
                (k, try await RendezvousConnection.connect(to: server, identity: .generate(), timeout: .seconds(30), from: local))
            }
        }
        var made: [(Int, RendezvousConnection)] = []
        for try await c in group { made.append(c) }
        return made.sorted { $0.0 < $1.0 }.map(\.1)
    }
    // Friends, as people calling each other are: each takes the user before it as a
    // contact, so what it is sent is not a stranger's.
    for (k, user) in users.enumerated() {
        _ = try await user.contacts(add: [users[(k + users.count - 1) % users.count].identity])
    }
    // An offer's size; what is still on its way arrives.
    return try await exchangeStamped(
        users, period: Double(clients) / Double(rate), seconds: seconds, sending: true, size: 400, fill: 0x5A,
        settle: .milliseconds(500))
}

/// Placement: relays report 1,000 live rooms between them (their load at 30 %
/// to 50 %) and list them (four members each: the directory's `parties` rows);
/// `registrations` users register one after another at `rate` a second, each told
/// where parties are, then ask for the parties they may see (each is a member of
/// one room, the n-th user of room n). How long a registration takes (TCP connect,
/// challenge, proof, the key's rows written, the relay placed), where they went,
/// how long the `parties` answer takes, and how many were shown their room.
func runPlacement(store: (any RendezvousStore)?, registrations: Int, rate: Int) async throws -> (
    latenciesMs: [Double], perRelay: [Int], partiesMs: [Double], shown: Int
) {
    var logger = Logger(label: "directory-bench")
    logger.logLevel = .error
    var configuration = RendezvousServerConfiguration()
    configuration.relaySecret = "bench"
    let service = RendezvousService(
        address: TransportAddress(ip: .v4(0x7F00_0001), port: 0), configuration: configuration, store: store, logger: logger)
    let group = ServiceGroup(configuration: .init(services: [service], logger: logger))
    let running = Task { try await group.run() }
    defer { running.cancel() }
    let server = try await service.boundAddress()
    // Three relays, 1,000 rooms between them, each reporting every 2 s as a relay does.
    let capacity: UInt64 = 1_000_000_000
    var relays: [(RendezvousConnection, RelayLoad)] = []
    let users = (0..<registrations).map { _ in PrivateKey.generate() }
    var roomNumber = 0
    for (n, rooms) in [300, 333, 367].enumerated() {
        let key = PrivateKey.generate()
        let load = RelayLoad(
            party: PartyGrant(address: "127.0.0.\(n + 10):3481", key: key.publicKey.base64),
            capacityBitsPerSecond: capacity, bitsPerSecond: capacity / 100 * UInt64(30 + 10 * n), rooms: rooms,
            members: rooms * 4)
        let c = try await RendezvousConnection.connect(to: server, identity: key, timeout: .seconds(30))
        try await c.report(load, secret: "bench")
        let listings = (0..<rooms).map { _ in
            defer { roomNumber += 1 }
            let member = users.isEmpty ? PrivateKey.generate().publicKey : users[roomNumber % users.count].publicKey
            return PartyListing(
                room: RoomHome.roomPrefix(for: key.publicKey) + "bench\(roomNumber)", name: "Game \(roomNumber)",
                creator: PrivateKey.generate().publicKey, maxMembers: 50,
                members: [member] + (0..<3).map { _ in PrivateKey.generate().publicKey }, invited: [])
        }
        for report in RelayRooms.reports(open: listings, closed: [], complete: true) {
            try await c.report(report, secret: "bench")
        }
        relays.append((c, load))
    }
    let reporting = Task {
        while !Task.isCancelled {
            try? await Task.sleep(for: .seconds(2))
            for (c, load) in relays { try? await c.report(load, secret: "bench") }
        }
    }
    try await Task.sleep(for: .milliseconds(200))
    var latencies: [Double] = []
    var partiesMs: [Double] = []
    var shown = 0
    var perRelay: [String: Int] = [:]
    func ms(_ d: Duration) -> Double { Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15 }
    let start = ContinuousClock.now
    for (k, identity) in users.enumerated() {
        try await Task.sleep(until: start + .seconds(Double(k) / Double(rate)), clock: .continuous)
        let began = ContinuousClock.now
        let user = try await RendezvousConnection.connect(to: server, identity: identity, timeout: .seconds(30))
        latencies.append(ms(ContinuousClock.now - began))
        perRelay[user.party?.address ?? "none", default: 0] += 1
        let asked = ContinuousClock.now
        let (entries, _) = try await user.parties()
        partiesMs.append(ms(ContinuousClock.now - asked))
        if entries.contains(where: { $0.listing.members.contains(identity.publicKey.base64) && $0.party != nil }) {
            shown += 1
        }
        await user.close()
    }
    reporting.cancel()
    for (c, _) in relays { await c.close() }
    await group.triggerGracefulShutdown()
    _ = try? await running.value
    // In the relays' order (30, 40, 50 %), then those placed nowhere.
    return (latencies, (10..<13).map { perRelay["127.0.0.\($0):3481"] ?? 0 } + [perRelay["none"] ?? 0], partiesMs, shown)
}

let options: Options
do { options = try Options(Array(CommandLine.arguments.dropFirst())) } catch {
    FileHandle.standardError.write(Data("directory-bench: \(error)\n".utf8))
    exit(64)
}
if let rate = options.signal {
    guard let server = options.server, rate > 0, options.fromUser >= 0 else {
        FileHandle.standardError.write(
            Data("directory-bench: --signal RATE needs a positive rate, --server IP:PORT (and --from-user 0 or more)\n".utf8))
        exit(64)
    }
    do {
        let (r, delivered) = try await signalAtPace(
            server: server, clients: options.clients, rate: rate, seconds: options.seconds, fromUser: options.fromUser)
        print(
            String(
                format:
                    "signal: offered=%d acknowledged_per_s=%.0f refused=%d ack_p50_ms=%.2f ack_p95_ms=%.2f delivered=%d of %d delivered_p50_ms=%.2f delivered_p95_ms=%.2f",
                rate, Double(r.acknowledged) / r.wallSeconds, r.refused, percentile(r.latenciesMs, 0.5),
                percentile(r.latenciesMs, 0.95), delivered.count, r.acknowledged, percentile(delivered, 0.5),
                percentile(delivered, 0.95)))
        exit(r.refused > 0 || delivered.count < r.acknowledged ? 1 : 0)
    } catch {
        FileHandle.standardError.write(Data("directory-bench: \(error)\n".utf8))
        exit(1)
    }
}
if options.legit {
    guard let server = options.server, options.interval > 0, options.gap >= 0 else {
        FileHandle.standardError.write(
            Data("directory-bench: --legit needs --server IP:PORT, a positive --interval and --gap 0 or more\n".utf8))
        exit(64)
    }
    let quiet = await legitimateRequests(server: server, seconds: options.seconds, interval: options.interval)
    print(latencyLine("quiet", quiet))
    fflush(nil)
    try? await Task.sleep(for: .seconds(options.gap))
    let loaded = await legitimateRequests(server: server, seconds: options.seconds, interval: options.interval)
    print(latencyLine("abuse", loaded))
    exit((quiet + loaded).contains { $0 == nil } ? 1 : 0)
}
if let users = options.idle {
    guard let server = options.server, users > 0, options.hold >= 0, options.fromUser >= 0 else {
        FileHandle.standardError.write(
            Data("directory-bench: --idle N needs --server IP:PORT (and --from-user 0 or more)\n".utf8))
        exit(64)
    }
    do { try await holdIdle(users: users, server: server, hold: options.hold, fromUser: options.fromUser) } catch {
        FileHandle.standardError.write(Data("directory-bench: \(error)\n".utf8))
        exit(1)
    }
    exit(0)
}
var logger = Logger(label: "directory-bench")
logger.logLevel = .error
let sqlitePath = NSTemporaryDirectory() + "directory-bench-\(getpid()).sqlite"
// A private PostgreSQL for the run (scripts/postgres.sh, as the tests start it), removed at the end.
var postgres: PostgresServer?
if options.postgres {
    do { postgres = try PostgresServer() } catch {
        print("(PostgreSQL not run: \(error))")
    }
}
let postgresURL = postgres?.url

print(
    "## Directory: invitations acknowledged once stored (directory-bench, \(options.clients) users on loopback TCP, \(Int(options.seconds)) s per run)"
)
print()
print("| store | offered (posts/s) | acknowledged (posts/s) | refused | ack latency p50 / p95 / max (ms) | p95 vs memory |")
print("|---|---|---|---|---|---|")
var failed = false
for rate in options.rates {
    var memoryP95 = Double.nan
    let backends: [(String, String?)] =
        [("memory", nil), ("SQLite (WAL)", "sqlite:\(sqlitePath)")] + (postgresURL.map { [("PostgreSQL", $0)] } ?? [])
    for (name, database) in backends {
        do {
            var store: (any RendezvousStore)?
            if let database { store = try await DirectoryDatabase(database).open(logger: logger) }
            // The service closes its store when it stops.
            let r = try await run(store: store, clients: options.clients, rate: rate, seconds: options.seconds)
            let p95 = percentile(r.latenciesMs, 0.95)
            if name == "memory" { memoryP95 = p95 }
            print(
                String(
                    format: "| %@ | %d | %.0f | %d | %.2f / %.2f / %.2f | %@ |", name, rate,
                    Double(r.acknowledged) / r.wallSeconds, r.refused, percentile(r.latenciesMs, 0.5), p95,
                    r.latenciesMs.max() ?? .nan, name == "memory" ? "1" : String(format: "%.1f×", p95 / memoryP95)))
            if r.refused > 0 { failed = true }
        } catch {
            print("| \(name) | \(rate) | failed: \(error) | | | |")
            failed = true
        }
    }
}
print()
print(
    "## Placement: where registering users are sent, three relays reporting and listing 1,000 rooms (at 30 / 40 / 50 % of their capacity), \(options.placements) registrations at 200 a second, each then asking for its parties"
)
print()
print(
    "| store | registration p50 / p95 / max (ms) | sent to each relay (30 / 40 / 50 %) | to none | parties answer p50 / p95 (ms) | shown their room |"
)
print("|---|---|---|---|---|---|")
let placementBackends: [(String, String?)] =
    [("memory", nil), ("SQLite (WAL)", "sqlite:\(sqlitePath)")] + (postgresURL.map { [("PostgreSQL", $0)] } ?? [])
for (name, database) in placementBackends {
    do {
        var store: (any RendezvousStore)?
        if let database { store = try await DirectoryDatabase(database).open(logger: logger) }
        let (latencies, perRelay, partiesMs, shown) = try await runPlacement(
            store: store, registrations: options.placements, rate: 200)
        print(
            String(
                format: "| %@ | %.2f / %.2f / %.2f | %@ | %d | %.2f / %.2f | %d of %d |", name, percentile(latencies, 0.5),
                percentile(latencies, 0.95), latencies.max() ?? .nan,
                perRelay.prefix(3).map(String.init).joined(separator: " / "), perRelay[3], percentile(partiesMs, 0.5),
                percentile(partiesMs, 0.95), shown, options.placements))
        if perRelay[3] > 0 || shown < options.placements { failed = true }
    } catch {
        print("| \(name) | failed: \(error) | | |")
        failed = true
    }
}
if let postgresURL {
    print()
    print(
        "## Directory nodes: an invitation to an online friend, at the same node and at another node on one PostgreSQL (directory-bench, \(options.clients) users, \(Int(options.seconds)) s per run)"
    )
    print()
    print("| nodes | friend at | offered (posts/s) | posted / delivered | ack p50 / p95 (ms) | delivered p50 / p95 / max (ms) |")
    print("|---|---|---|---|---|---|")
    for rate in options.friendRates {
        for nodes in [1, 2] {
            do {
                var stores: [any RendezvousStore] = []
                for _ in 0..<nodes { stores.append(try await DirectoryDatabase(postgresURL).open(logger: logger)) }
                let (r, delivered) = try await runFriends(
                    stores: stores, clients: options.clients, rate: rate, seconds: options.seconds)
                print(
                    String(
                        format: "| %d | %@ | %d | %d / %d | %.2f / %.2f | %.2f / %.2f / %.2f |", nodes,
                        nodes == 1 ? "the same node" : "the other node", rate, r.acknowledged, delivered.count,
                        percentile(r.latenciesMs, 0.5), percentile(r.latenciesMs, 0.95), percentile(delivered, 0.5),
                        percentile(delivered, 0.95), delivered.max() ?? .nan))
                if r.refused > 0 || delivered.count < r.acknowledged { failed = true }
            } catch {
                print("| \(nodes) | | \(rate) | failed: \(error) | | |")
                failed = true
            }
        }
    }
}
for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: sqlitePath + suffix) }
postgres?.remove()
exit(failed ? 1 : 0)
