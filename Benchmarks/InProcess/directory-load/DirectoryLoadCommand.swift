import ArgumentParser
import DirectoryLoad
import Foundation
import Rendezvous
import Secure
import TusaBase

// `directory-load`: many users against a running directory (`tusa directory`, one
// node or several on one PostgreSQL, with `tusa relay --directory` relays), as
// users use it: each registers at a node (friends at another node than their
// room's creator), creators make rooms where the directory places them and invite
// their friends (some offline until the invitations wait for them), friends join
// through `locate`, everyone speaks a voice-sized frame every 100 ms, and each
// friend sends its creator a sealed signal across the nodes. It prints a status
// line a second while they speak (kill a relay or a node meanwhile: the longest
// silence a member had says what it cost), and a report at the end. Issue 16's
// cluster test (`DirectoryClusterTests`) plays the same `LoadUser`s.

@main
struct DirectoryLoadCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "directory-load",
        abstract: "Play many party users against a directory and its relays; report what they got.")

    @Option(help: ArgumentHelp("The directory's nodes.", valueName: "host:port[,host:port...]"))
    var directory: String

    @Option(help: "Rooms, each made by one user.")
    var rooms = 24

    @Option(help: "Friends each creator invites (each joins its room).")
    var friends = 2

    @Option(help: "Friends that register only after their invitations were posted (kept for them).")
    var offline = 0

    @Option(help: "Seconds everyone speaks once in the rooms.")
    var seconds = 30.0

    @Flag(help: "The report as JSON on standard output.")
    var json = false

    @Flag(help: "No status lines on standard error.")
    var quiet = false

    func validate() throws {
        guard (1...10_000).contains(rooms) else { throw ValidationError("--rooms must be 1-10000") }
        guard (1...49).contains(friends) else { throw ValidationError("--friends must be 1-49") }
        guard (0...(rooms * friends)).contains(offline) else { throw ValidationError("--offline must be 0-\(rooms * friends)") }
        guard seconds.isFinite, (0...86_400).contains(seconds) else { throw ValidationError("--seconds must be 0-86400") }
    }

    func run() async throws {
        let nodes = try directory.split(separator: ",").map { text in
            guard let address = TransportAddress(String(text)) else {
                throw ValidationError("--directory: '\(text)' is not host:port")
            }
            return address
        }
        guard !nodes.isEmpty else { throw ValidationError("--directory names no node") }
        func order(_ n: Int) -> [TransportAddress] { (0..<nodes.count).map { nodes[($0 + n) % nodes.count] } }
        let creators = (0..<rooms).map { LoadUser(nodes: order($0)) }
        let friendUsers = (0..<(rooms * friends)).map { LoadUser(nodes: order($0 / friends + 1)) }
        let offlineSet = Set(friendUsers.indices.suffix(offline))
        var report = Report()
        func status(_ line: String) {
            if !quiet { FileHandle.standardError.write(Data((line + "\n").utf8)) }
        }

        // Registrations, one after another (each timed: connect, challenge, proof, written, placed).
        for user in creators + friendUsers.enumerated().filter({ !offlineSet.contains($0.offset) }).map(\.element) {
            let started = ContinuousClock.now
            try await user.register()
            report.registrations.append(started.duration(to: .now))
        }
        status("registered \(report.registrations.count) users")
        // Rooms where the directory placed each as it was made, friends invited.
        var roomIDs: [String] = []
        for (n, creator) in creators.enumerated() {
            let invited = friendUsers[(n * friends)..<((n + 1) * friends)].map(\.key)
            roomIDs.append(try await creator.create("Game \(n)", inviting: invited))
        }
        var perRelay: [PublicKey: Int] = [:]
        for creator in creators { if let relay = creator.firstRelay { perRelay[relay, default: 0] += 1 } }
        report.roomsPerRelay = perRelay.values.sorted()
        status("made \(rooms) rooms on \(perRelay.count) relays: \(report.roomsPerRelay)")
        // Invitations: at once for those online, at their login for the others.
        for (n, friend) in friendUsers.enumerated() where !offlineSet.contains(n) {
            report.invitationsPosted += 1
            if await friend.invitation(within: .seconds(10)) == roomIDs[n / friends], let at = friend.invitedAt,
                let posted = creators[n / friends].invitationsPostedAt
            {
                report.invitationDelays.append(posted.duration(to: at))
            }
        }
        for n in offlineSet.sorted() {
            try await friendUsers[n].register()
            report.offlineInvited += 1
            if await friendUsers[n].invitation(within: .seconds(10)) == roomIDs[n / friends] { report.offlineDelivered += 1 }
        }
        // Everyone in, everyone speaking.
        for friend in friendUsers {
            guard let room = await friend.invitation(within: .seconds(1)) else { continue }
            try await friend.join(room)
        }
        let everyone = creators + friendUsers
        let voices = VoiceClock(everyone.compactMap(\.connection))
        defer { voices.stop() }
        let speaking = ContinuousClock.now
        _ = await waitUntil(within: .seconds(10), poll: .milliseconds(20)) {
            everyone.allSatisfy { $0.hearsEveryone(since: speaking) }
        }
        report.hearing = everyone.filter { $0.hearsEveryone(since: speaking) }.count
        report.users = everyone.count
        report.allHeardAfter = report.hearing == everyone.count ? speaking.duration(to: .now) : nil
        status("\(report.hearing) of \(everyone.count) users hear their whole room")
        // Sealed signals across nodes: each friend to its creator.
        for (n, friend) in friendUsers.enumerated() {
            try await friend.send(Array("offer \(n)".utf8), to: creators[n / friends].key)
        }
        _ = await waitUntil(within: .seconds(5), poll: .milliseconds(20)) {
            creators.allSatisfy { $0.signals.withLockedValue { $0.count } >= friends }
        }
        report.signalsSent = friendUsers.count
        report.signalsDelivered = creators.reduce(0) { $0 + min(friends, $1.signals.withLockedValue { $0.count }) }
        // Speaking: the longest each user went without hearing some member of its room.
        var longest = [Duration](repeating: .zero, count: everyone.count)
        let end = ContinuousClock.now + .seconds(seconds)
        // Sampled off the voices' 100 ms beat (37 ms), so that a sample may fall anywhere between two frames.
        var lastStatus = ContinuousClock.now
        while ContinuousClock.now < end {
            try? await Task.sleep(for: .milliseconds(37))
            let now = ContinuousClock.now
            for (i, user) in everyone.enumerated() {
                longest[i] = max(longest[i], user.longestSilence(now: now) ?? now - speaking)
            }
            if lastStatus.duration(to: now) >= .seconds(1) {
                lastStatus = now
                let hearing = everyone.filter { ($0.longestSilence(now: now) ?? .seconds(1)) < .seconds(1) }.count
                let worst = longest.max() ?? .zero
                status(
                    "t=\(Int(Report.ms(speaking.duration(to: now)) / 1000))s \(hearing) of \(everyone.count) hear their room; longest silence so far \(Report.ms(worst)) ms"
                )
            }
        }
        report.longestSilences = longest
        for user in everyone { await user.stop() }
        if json { print(report.json()) } else { print(report.text()) }
    }
}

struct Report {
    var users = 0
    var registrations: [Duration] = []
    var roomsPerRelay: [Int] = []
    var invitationsPosted = 0
    var invitationDelays: [Duration] = []
    var offlineInvited = 0
    var offlineDelivered = 0
    var hearing = 0
    var allHeardAfter: Duration?
    var signalsSent = 0
    var signalsDelivered = 0
    var longestSilences: [Duration] = []

    static func ms(_ d: Duration) -> Double {
        (Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15).rounded(toPlaces: 2)
    }

    static func percentiles(_ values: [Duration]) -> [String: Double] {
        guard !values.isEmpty else { return [:] }
        let sorted = values.sorted()
        func at(_ q: Double) -> Double { ms(sorted[min(sorted.count - 1, Int(Double(sorted.count - 1) * q + 0.5))]) }
        return ["p50": at(0.5), "p95": at(0.95), "max": at(1)]
    }

    var spread: Double? {
        guard let most = roomsPerRelay.max(), let least = roomsPerRelay.min(), least > 0 else { return nil }
        return (Double(most) / Double(least)).rounded(toPlaces: 2)
    }

    func json() -> String {
        var object: [String: Any] = [
            "users": users, "registrationMilliseconds": Self.percentiles(registrations), "roomsPerRelay": roomsPerRelay,
            "invitationsPosted": invitationsPosted, "invitationsDelivered": invitationDelays.count,
            "invitationMilliseconds": Self.percentiles(invitationDelays), "offlineInvited": offlineInvited,
            "offlineDelivered": offlineDelivered, "hearing": hearing, "signalsSent": signalsSent,
            "signalsDelivered": signalsDelivered, "longestSilenceMilliseconds": Self.percentiles(longestSilences),
        ]
        if let spread { object["spread"] = spread }
        if let allHeardAfter { object["allHeardAfterMilliseconds"] = Self.ms(allHeardAfter) }
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    func text() -> String {
        func line(_ p: [String: Double]) -> String {
            p.isEmpty ? "-" : "p50 \(p["p50"] ?? 0) / p95 \(p["p95"] ?? 0) / max \(p["max"] ?? 0) ms"
        }
        return [
            "users \(users), registration \(line(Self.percentiles(registrations)))",
            "rooms per relay \(roomsPerRelay)" + (spread.map { " (max/min \($0))" } ?? ""),
            "invitations \(invitationDelays.count) of \(invitationsPosted) delivered, \(line(Self.percentiles(invitationDelays)))",
            "offline invitations \(offlineDelivered) of \(offlineInvited) delivered at login",
            "\(hearing) of \(users) heard their whole room"
                + (allHeardAfter.map { " after \(Self.ms($0)) ms" } ?? ""),
            "signals \(signalsDelivered) of \(signalsSent) delivered across nodes",
            "longest silence while speaking \(line(Self.percentiles(longestSilences)))",
        ].joined(separator: "\n")
    }
}

extension Double {
    fileprivate func rounded(toPlaces places: Int) -> Double {
        let scale = pow(10, Double(places))
        return (self * scale).rounded() / scale
    }
}
