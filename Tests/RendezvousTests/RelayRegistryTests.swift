import Secure
import Testing
import TusaBase

@testable import Rendezvous

@Suite("Relay registry: placement by load")
struct RelayRegistryTests {
    private let keys = (0..<5).map { _ in PrivateKey.generate().publicKey }
    private let start = Timestamp.seconds(100)

    private func load(_ bits: UInt64, capacity: UInt64 = 10_000_000, party: String = "") -> RelayLoad {
        RelayLoad(
            party: party.isEmpty ? nil : PartyGrant(address: party, key: keys[0].base64), capacityBitsPerSecond: capacity,
            bitsPerSecond: bits)
    }

    /// Many placements at once, before any report can show them: reservations and
    /// the two random choices spread them (max/min within 1.5), none on a relay past 70 %.
    @Test func placementsSpreadAndAvoidFullRelays() {
        var registry = RelayRegistry(seed: 7)
        for key in keys[0..<3] { registry.report(key, load(1_000_000), now: start) }
        registry.report(keys[3], load(7_500_000), now: start)  // past 70 %: never chosen
        var placed: [PublicKey: Int] = [:]
        for _ in 0..<150 {
            guard let relay = registry.place(now: start) else {
                Issue.record("nowhere to place")
                return
            }
            placed[relay.key, default: 0] += 1
        }
        #expect(placed[keys[3]] == nil)
        let counts = keys[0..<3].map { placed[$0] ?? 0 }
        #expect(counts.reduce(0, +) == 150)
        let most = counts.max() ?? 0
        let least = counts.min() ?? 0
        #expect(least > 0 && Double(most) / Double(least) <= 1.5, "\(counts)")
    }

    /// A call's TURN relay is the least loaded live one that offers TURN, past the
    /// placement ceiling too; never a draining or silent one.
    @Test func callsGoToTheLeastLoadedRelayThatOffersTURN() {
        var registry = RelayRegistry(seed: 7)
        func turn(_ bits: UInt64, draining: Bool = false) -> RelayLoad {
            RelayLoad(
                turnURIs: ["turn:x:3478"], capacityBitsPerSecond: 10_000_000, bitsPerSecond: bits, draining: draining)
        }
        registry.report(keys[0], turn(5_000_000), now: start)
        registry.report(keys[1], turn(2_000_000), now: start)
        registry.report(keys[2], turn(0, draining: true), now: start)
        registry.report(keys[3], load(0), now: start)  // no TURN
        registry.report(keys[4], turn(1_000_000), now: start + .seconds(-7))  // down: silent 7 s
        let eligible: (RelayLoad) -> Bool = { !$0.turnURIs.isEmpty }
        for _ in 0..<10 { #expect(registry.leastLoaded(now: start, where: eligible)?.key == keys[1]) }
        registry.report(keys[1], turn(9_000_000), now: start)
        registry.report(keys[0], turn(8_000_000), now: start)
        #expect(registry.leastLoaded(now: start, where: eligible)?.key == keys[0], "past 70 %, still the least loaded")
        #expect(registry.leastLoaded(now: start)?.key == keys[3])
    }

    /// Relays about equally loaded (within 2 % of their capacity) share the calls
    /// granted between two reports; one past that band gets none.
    @Test func callsGrantedBetweenReportsSpreadOverEquallyLoadedRelays() {
        var registry = RelayRegistry(seed: 11)
        for (n, bits) in [1_000_000, 1_100_000, 1_150_000, 1_300_000].enumerated() {
            registry.report(
                keys[n], RelayLoad(turnURIs: ["turn:x:3478"], capacityBitsPerSecond: 10_000_000, bitsPerSecond: UInt64(bits)),
                now: start)
        }
        var grants: [PublicKey?: Int] = [:]
        for _ in 0..<300 { grants[registry.leastLoaded(now: start)?.key, default: 0] += 1 }
        #expect(grants[keys[3]] == nil && grants[nil] == nil, "\(grants)")
        for n in 0..<3 { #expect((60...140).contains(grants[keys[n]] ?? 0), "\(grants)") }
    }

    /// Another node's move of a room this node moved too: the heavier relay wins
    /// (this node's, live, is kept and returned to be told again); this node's move
    /// to a relay no longer live gives way whatever its weight.
    @Test func concurrentMovesOfARoomResolveToTheHeavierLiveRelay() {
        var registry = RelayRegistry(seed: 3)
        for n in 0..<3 {
            registry.report(
                keys[n],
                RelayLoad(party: PartyGrant(address: "127.0.0.\(n):3481", key: keys[n].base64), capacityBitsPerSecond: 1),
                now: start)
        }
        let room = "zzzzzzzzzzzzzzzz"
        // Relays 0-2 by weight for the room, heaviest first.
        let order = keys[0..<3].sorted { RoomHome.weight(room: room, relay: $0) > RoomHome.weight(room: room, relay: $1) }
        #expect(registry.host(room: room, now: start)?.key == order[0])
        #expect(registry.remember(room: room, on: order[1], now: start) == order[0], "the heavier, live, is kept")
        #expect(registry.host(room: room, now: start)?.key == order[0])
        // Its relay silent past the down time: the other node's move stands.
        let later = start + .seconds(7)
        registry.report(
            order[1], RelayLoad(party: PartyGrant(address: "b", key: order[1].base64), capacityBitsPerSecond: 1), now: later)
        registry.report(
            order[2], RelayLoad(party: PartyGrant(address: "c", key: order[2].base64), capacityBitsPerSecond: 1), now: later)
        #expect(registry.remember(room: room, on: order[2], now: later) == nil)
        #expect(registry.host(room: room, now: later)?.key == order[2])
        // A heavier move heard (relay 1 is back): taken.
        #expect(registry.remember(room: room, on: order[1], now: later) == nil)
        #expect(registry.host(room: room, now: later)?.key == order[1])
    }

    /// Where a room is: on the relay its id's tag names while that one is live and
    /// not draining; else on the live relay of highest weight for it, whatever
    /// their loads, where it then stays; a dead relay's rooms spread.
    @Test func roomsStayOnTheirRelayAndMoveByWeightWhenItGoes() {
        var registry = RelayRegistry(seed: 5)
        func party(_ n: Int, bits: UInt64 = 0, draining: Bool = false) -> RelayLoad {
            RelayLoad(
                party: PartyGrant(address: "127.0.0.\(n):3481", key: keys[n].base64), capacityBitsPerSecond: 10_000_000,
                bitsPerSecond: bits, draining: draining)
        }
        for n in 0..<4 { registry.report(keys[n], party(n), now: start) }
        registry.report(keys[4], load(0), now: start)  // no parties: never a room's host
        let rooms = (0..<200).map { RoomHome.roomPrefix(for: keys[0]) + "room\($0)" }
        for room in rooms { #expect(registry.host(room: room, now: start)?.key == keys[0]) }
        // Its relay drains: every room goes elsewhere, spread over the other three, and the answer holds.
        registry.report(keys[0], party(0, draining: true), now: start + .seconds(1))
        var moved: [String: PublicKey] = [:]
        for room in rooms { moved[room] = registry.host(room: room, now: start + .seconds(1))?.key }
        let counts = keys[1..<4].map { key in moved.values.filter { $0 == key }.count }
        #expect(moved.count == 200 && counts.min() ?? 0 >= 40, "\(counts)")
        for room in rooms { #expect(registry.host(room: room, now: start + .seconds(2))?.key == moved[room]) }
        // Another registry with the same relays (another directory node) answers the same without being told.
        var other = RelayRegistry(seed: 99)
        for n in 1..<4 { other.report(keys[n], party(n), now: start) }
        for room in rooms { #expect(other.host(room: room, now: start)?.key == moved[room]) }
        // The drained relay back: rooms moved stay where they went. Loads do not change
        // where a room goes (nodes see them a moment apart): the weight decides.
        registry.report(keys[0], party(0), now: start + .seconds(2))
        for room in rooms { #expect(registry.host(room: room, now: start + .seconds(2))?.key == moved[room]) }
        registry.report(keys[1], party(1, bits: 8_000_000), now: start + .seconds(2))
        other.report(keys[1], party(1, bits: 1_000), now: start + .seconds(2))
        other.report(keys[0], party(0), now: start + .seconds(2))
        let fresh = (0..<50).map { RoomHome.roomPrefix(for: PrivateKey.generate().publicKey) + "room\($0)" }
        for room in fresh {
            #expect(
                registry.host(room: room, now: start + .seconds(3))?.key == other.host(room: room, now: start + .seconds(3))?.key)
        }
        // No relay hosting parties: nowhere.
        var empty = RelayRegistry(seed: 1)
        empty.report(keys[4], load(0), now: start)
        #expect(empty.host(room: rooms[0], now: start) == nil)
    }

    @Test func aRelayIsDownSixSecondsAfterItsLastReportOrWhenItsConnectionCloses() {
        var registry = RelayRegistry(seed: 1)
        registry.report(keys[0], load(0), now: start)
        registry.report(keys[1], load(0), now: start)
        #expect(registry.live(now: start + .milliseconds(5900)).count == 2)
        registry.report(keys[1], load(0), now: start + .seconds(4))
        #expect(registry.live(now: start + .seconds(6)).map(\.key) == [keys[1]])
        for _ in 0..<10 { #expect(registry.place(now: start + .seconds(6))?.key == keys[1]) }
        registry.remove(keys[1])
        #expect(registry.place(now: start + .seconds(6)) == nil)
    }

    @Test func reservationsLapseAndReportsTakeOver() {
        var configuration = RelayRegistry.Configuration()
        configuration.reservation = 1_000_000
        configuration.reservationCeiling = 1
        var registry = RelayRegistry(configuration: configuration, seed: 3)
        registry.report(keys[0], load(0, capacity: 10_000_000), now: start)
        // Seven reservations of 1 Mbit/s fill it to 70 %: the eighth finds no room.
        for _ in 0..<7 { #expect(registry.place(now: start) != nil) }
        #expect(registry.place(now: start) == nil)
        // Ten seconds on, the reservations are gone; the relay says it carries 2 Mbit/s.
        registry.report(keys[0], load(2_000_000), now: start + .seconds(10))
        for _ in 0..<5 { #expect(registry.place(now: start + .seconds(10)) != nil) }
        #expect(registry.place(now: start + .seconds(10)) == nil)
    }

    /// A flood of registrations (keys cost nothing) reserves at most a tenth of a
    /// relay: it never makes a relay look full.
    @Test func reservationsAloneNeverFillARelay() {
        var registry = RelayRegistry(seed: 9)
        registry.report(keys[0], load(0, capacity: 100_000_000), now: start)
        var placed = 0
        for _ in 0..<5_000 where registry.place(now: start) != nil { placed += 1 }
        #expect(placed == 5_000)
        let relay = registry.live(now: start)[0]
        #expect(relay.utilisation(now: start) <= 0.1 + 1e-9)
    }

    @Test func aDrainingRelayTakesNothingNew() {
        var registry = RelayRegistry(seed: 5)
        var draining = load(0)
        draining.draining = true
        registry.report(keys[0], draining, now: start)
        #expect(registry.place(now: start) == nil)
        registry.report(keys[1], load(0), now: start)
        #expect(registry.place(now: start)?.key == keys[1])
    }
}
