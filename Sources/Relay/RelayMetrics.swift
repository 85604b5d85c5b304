import CoreMetrics
import NIOConcurrencyHelpers
import Party
import STUN
import TURN

/// The relay's counters as swift-metrics metrics, named `tusa_…`.
///
/// The service keeps its own totals (``BindingStatistics``, ``TURNStatistics``);
/// ``update(stun:turn:)`` brings the metrics up to a snapshot of them, adding
/// what each counter gained since the last snapshot, so it can be called
/// whenever convenient (the metrics endpoint calls it about once a second).
/// The metrics come from the `factory` given, never from the global
/// `MetricsSystem` unless asked for; with swift-prometheus's
/// `PrometheusMetricsFactory` they are served by ``MetricsEndpoint``.
///
/// | metric | kind | labels |
/// |---|---|---|
/// | `tusa_allocations_active` | gauge | |
/// | `tusa_relay_ports_held`, `tusa_relay_ports_free` (of the relay port range, every family) | gauge | |
/// | `tusa_allocations_created_total`, `_expired_total`, `_deleted_total` | counter | |
/// | `tusa_permissions_expired_total`, `tusa_channels_expired_total` | counter | |
/// | `tusa_relayed_packets_total`, `tusa_relayed_bytes_total` | counter | `direction`: `to_peer`, `to_client` |
/// | `tusa_auth_failures_total`, `tusa_challenges_total` | counter | |
/// | `tusa_error_responses_total` | counter | `code` (e.g. `401`, `486`) |
/// | `tusa_turn_drops_total` | counter | `reason` (``TURNDropReason``) |
/// | `tusa_stun_responses_total` (every STUN answer, Binding and TURN) | counter | |
/// | `tusa_stun_drops_total` | counter | `reason` (``BindingServer/DropReason``, `-` written `_`) |
/// | `tusa_party_rooms`, `tusa_party_members` | gauge | |
/// | `tusa_memory_used_bytes`, `tusa_memory_limit_bytes` (the fullest limit's), `tusa_memory_short` (1 while new work is refused) | gauge | |
/// | `tusa_memory_refusals_total` (allocations refused for memory) | counter | |
/// | `tusa_party_frames_total` | counter | `outcome`: `forwarded` (copies delivered), `not_selected` (not among the speakers, or muted), `spoofed` (another member's id, or no room) |
public final class RelayMetrics: Sendable {
    private struct State {
        var stun = BindingStatistics()
        var turn = TURNStatistics()
        var party = PartyServer.Statistics()
        var errorCounters: [Int: Counter] = [:]
        var memoryRefusals = 0
    }

    private let factory: any MetricsFactory
    private let state = NIOLockedValueBox(State())

    private let allocationsActive: Gauge
    private let relayPortsHeld: Gauge
    private let relayPortsFree: Gauge
    private let allocationsCreated: Counter
    private let allocationsExpired: Counter
    private let allocationsDeleted: Counter
    private let permissionsExpired: Counter
    private let channelsExpired: Counter
    private let packetsToPeer: Counter
    private let packetsToClient: Counter
    private let bytesToPeer: Counter
    private let bytesToClient: Counter
    private let authFailures: Counter
    private let challenges: Counter
    /// Indexed by ``TURNDropReason/rawValue``.
    private let turnDrops: [Counter]
    private let stunResponses: Counter
    private let stunDrops: [BindingServer.DropReason: Counter]
    private let partyRooms: Gauge
    private let partyMembers: Gauge
    private let partyForwarded: Counter
    private let partyCopiesDropped: Counter
    private let partyNotSelected: Counter
    private let partySpoofed: Counter
    private let memoryUsed: Gauge
    private let memoryLimit: Gauge
    private let memoryShort: Gauge
    private let memoryRefusals: Counter

    public init(factory: any MetricsFactory = MetricsSystem.factory) {
        self.factory = factory
        func counter(_ name: String, _ dimensions: [(String, String)] = []) -> Counter {
            Counter(label: name, dimensions: dimensions, factory: factory)
        }
        allocationsActive = Gauge(label: "tusa_allocations_active", factory: factory)
        allocationsActive.record(0)
        relayPortsHeld = Gauge(label: "tusa_relay_ports_held", factory: factory)
        relayPortsFree = Gauge(label: "tusa_relay_ports_free", factory: factory)
        relayPortsHeld.record(0)
        relayPortsFree.record(0)
        allocationsCreated = counter("tusa_allocations_created_total")
        allocationsExpired = counter("tusa_allocations_expired_total")
        allocationsDeleted = counter("tusa_allocations_deleted_total")
        permissionsExpired = counter("tusa_permissions_expired_total")
        channelsExpired = counter("tusa_channels_expired_total")
        packetsToPeer = counter("tusa_relayed_packets_total", [("direction", "to_peer")])
        packetsToClient = counter("tusa_relayed_packets_total", [("direction", "to_client")])
        bytesToPeer = counter("tusa_relayed_bytes_total", [("direction", "to_peer")])
        bytesToClient = counter("tusa_relayed_bytes_total", [("direction", "to_client")])
        authFailures = counter("tusa_auth_failures_total")
        challenges = counter("tusa_challenges_total")
        turnDrops = TURNDropReason.allCases.map { counter("tusa_turn_drops_total", [("reason", $0.description)]) }
        stunResponses = counter("tusa_stun_responses_total")
        var stunDrops: [BindingServer.DropReason: Counter] = [:]
        for reason in BindingServer.DropReason.allCases {
            stunDrops[reason] = counter(
                "tusa_stun_drops_total", [("reason", String(reason.rawValue.map { $0 == "-" ? "_" : $0 }))])
        }
        self.stunDrops = stunDrops
        partyRooms = Gauge(label: "tusa_party_rooms", factory: factory)
        partyRooms.record(0)
        partyMembers = Gauge(label: "tusa_party_members", factory: factory)
        partyMembers.record(0)
        partyForwarded = counter("tusa_party_frames_total", [("outcome", "forwarded")])
        partyNotSelected = counter("tusa_party_frames_total", [("outcome", "not_selected")])
        partySpoofed = counter("tusa_party_frames_total", [("outcome", "spoofed")])
        partyCopiesDropped = counter("tusa_party_copies_dropped_total")
        memoryUsed = Gauge(label: "tusa_memory_used_bytes", factory: factory)
        memoryLimit = Gauge(label: "tusa_memory_limit_bytes", factory: factory)
        memoryShort = Gauge(label: "tusa_memory_short", factory: factory)
        memoryShort.record(0)
        memoryRefusals = counter("tusa_memory_refusals_total")
    }

    /// Brings the memory metrics up to the guard's last sample. A guard that has not
    /// sampled yet (its service started beside the endpoint, on a busy machine a moment
    /// after the first scrape) is made to sample now: the limit is never shown as 0.
    public func update(from memory: MemoryGuard) {
        if memory.lastSample == nil { memory.check() }
        let (fullest, short, refusals) = (memory.lastSample, memory.shortage != nil, memory.refusals)
        state.withLockedValue { state in
            if let fullest {
                memoryUsed.record(Int(clamping: fullest.bytes))
                memoryLimit.record(Int(clamping: fullest.limit.bytes))
            }
            memoryShort.record(short ? 1 : 0)
            add(memoryRefusals, refusals, state.memoryRefusals)
            state.memoryRefusals = refusals
        }
    }

    /// Brings the party metrics up to these totals and counts.
    public func update(party: PartyServer.Statistics, rooms: Int, members: Int) {
        state.withLockedValue { state in
            partyRooms.record(rooms)
            partyMembers.record(members)
            let old = state.party
            add(partyForwarded, Int(clamping: party.framesForwarded), Int(clamping: old.framesForwarded))
            add(partyNotSelected, Int(clamping: party.framesNotSelected), Int(clamping: old.framesNotSelected))
            add(partySpoofed, Int(clamping: party.framesSpoofed), Int(clamping: old.framesSpoofed))
            add(partyCopiesDropped, Int(clamping: party.copiesDropped), Int(clamping: old.copiesDropped))
            state.party = party
        }
    }

    /// Takes the party service's totals now and brings the party metrics up to them.
    public func update(from party: PartyService) {
        update(party: party.statistics, rooms: party.roomCount, members: party.memberCount)
    }

    /// Brings every metric up to these totals (counters only ever rise: a
    /// total below the last one seen adds nothing).
    public func update(stun: BindingStatistics, turn: TURNStatistics) {
        state.withLockedValue { state in
            let old = state.turn
            allocationsActive.record(turn.allocationsActive)
            add(allocationsCreated, turn.allocationsCreated, old.allocationsCreated)
            add(allocationsExpired, turn.allocationsExpired, old.allocationsExpired)
            add(allocationsDeleted, turn.allocationsDeleted, old.allocationsDeleted)
            add(permissionsExpired, turn.permissionsExpired, old.permissionsExpired)
            add(channelsExpired, turn.channelsExpired, old.channelsExpired)
            add(packetsToPeer, turn.packetsToPeer, old.packetsToPeer)
            add(packetsToClient, turn.packetsToClient, old.packetsToClient)
            add(bytesToPeer, turn.bytesToPeer, old.bytesToPeer)
            add(bytesToClient, turn.bytesToClient, old.bytesToClient)
            add(authFailures, turn.authFailures, old.authFailures)
            add(challenges, turn.challenges, old.challenges)
            for (index, counter) in turnDrops.enumerated() where index < turn.drops.count {
                add(counter, turn.drops[index], index < old.drops.count ? old.drops[index] : 0)
            }
            for (code, count) in turn.errors {
                let counter =
                    state.errorCounters[code]
                    ?? {
                        let made = Counter(
                            label: "tusa_error_responses_total", dimensions: [("code", "\(code)")], factory: factory)
                        state.errorCounters[code] = made
                        return made
                    }()
                add(counter, count, old.errors[code] ?? 0)
            }
            add(stunResponses, stun.responses, state.stun.responses)
            for (reason, counter) in stunDrops {
                add(counter, stun.drops[reason] ?? 0, state.stun.drops[reason] ?? 0)
            }
            state.stun = stun
            state.turn = turn
        }
    }

    /// Takes the service's totals now and brings the metrics up to them.
    public func update(from service: RelayService) async {
        let turn = await service.turnStatistics()
        update(stun: service.statistics, turn: turn)
        if let ports = service.relayPortUsage { update(relayPortsHeld: ports.held, capacity: ports.capacity) }
    }

    /// Records the relay port range's use.
    public func update(relayPortsHeld held: Int, capacity: Int) {
        relayPortsHeld.record(held)
        relayPortsFree.record(capacity - held)
    }

    private func add(_ counter: Counter, _ new: Int, _ old: Int) {
        if new > old { counter.increment(by: new - old) }
    }
}
