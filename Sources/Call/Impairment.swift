import Synchronization
import Voice

/// The project's own network impairment for live calls (the CI kernel has no
/// netem): outgoing media packets are dropped and delayed by a generated trace
/// (`NetworkModel`: Gilbert–Elliott loss, jitter, spikes), so `make demo
/// IMPAIR="loss=10%,jitter=30ms"` runs a real call over a bad network.
public struct Impairment: Sendable, Equatable {
    public var model: NetworkModel
    public var seed: UInt64

    /// Parses `loss=10%,burst=3,jitter=30ms,delay=20ms,spike=300ms/10s,seed=7` (any subset, any order).
    public init(parsing text: String) throws(CallError) {
        var model = NetworkModel(baseDelayMilliseconds: 0)
        var seed: UInt64 = 1
        for part in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !part.isEmpty {
            let kv = part.split(separator: "=", maxSplits: 1).map(String.init)
            guard kv.count == 2 else { throw .badImpairment("impairment '\(part)' is not NAME=VALUE") }
            let (name, value) = (kv[0].lowercased(), kv[1].lowercased())
            // (Each value held below where it would mean nothing, or overflow the
            // trace's arithmetic: a delay of 1e16 ms is no network.)
            func number(_ v: String, _ suffix: String, atMost limit: Double) throws(CallError) -> Double {
                let digits = v.hasSuffix(suffix) ? String(v.dropLast(suffix.count)) : v
                guard let d = Double(digits), d.isFinite, d >= 0 else {
                    throw .badImpairment("impairment \(name)=\(value): not a number")
                }
                guard d <= limit else {
                    throw .badImpairment("impairment \(name)=\(value): at most \(Int(limit))\(suffix)")
                }
                return d
            }
            switch name {
            case "loss": model.lossRate = try number(value, "%", atMost: 100) / 100
            case "burst": model.meanBurstLength = max(1, try number(value, "", atMost: 1_000_000))
            case "jitter": model.jitterMilliseconds = try number(value, "ms", atMost: 60_000)
            case "delay": model.baseDelayMilliseconds = try number(value, "ms", atMost: 60_000)
            case "spike":
                let sides = value.split(separator: "/").map(String.init)
                guard sides.count == 2 else { throw .badImpairment("impairment spike=\(value): use SIZEms/INTERVALs") }
                model.spikeMilliseconds = try number(sides[0], "ms", atMost: 60_000)
                model.spikeIntervalSeconds = try number(sides[1], "s", atMost: 86_400)
            case "seed":
                guard let s = UInt64(value) else {
                    throw .badImpairment("impairment seed=\(value): a whole number from 0 to \(UInt64.max)")
                }
                seed = s
            default: throw .badImpairment("unknown impairment '\(name)' (loss, burst, jitter, delay, spike, seed)")
            }
        }
        self.model = model
        self.seed = seed
    }

    /// The per-datagram decision for `SecureUDPEndpoint.impairMedia`: walks a generated
    /// trace (10 minutes of frames, then again), nil for a lost packet, else its delay.
    public func decider(frameMilliseconds: Int) -> @Sendable () -> Duration? {
        let trace = NetworkTrace.generate(
            model, packets: 600_000 / frameMilliseconds, frameMilliseconds: frameMilliseconds, seed: seed)
        let entries = trace.entries
        let index = Mutex(0)
        return {
            guard !entries.isEmpty else { return .zero }
            let e = entries[
                index.withLock { i in
                    defer { i += 1 }
                    return i % entries.count
                }]
            guard let arrival = e.arrivalMilliseconds else { return nil }
            return .microseconds(Int64(max(0, arrival - e.sendMilliseconds) * 1000))
        }
    }
}
