import ArgumentParser
import Foundation
import Logging
import NIOCore
import STUN
import TURN
import Transport
import TusaBase

/// `tusa turn HOST[:PORT] --user U:P --peer ADDR:PORT`: allocate a relay on a
/// TURN server, send test packets through it to an echoing peer, and report
/// round-trip times and loss.
struct Turn: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Allocate a TURN relay and measure a round trip through it to an echoing peer.",
        discussion: """
            Allocates on the server (answering its 401 challenge), prints the relayed and mapped \
            addresses, creates a permission for the peer, binds a channel (unless --no-channel), \
            sends --count packets to the peer through the relay, matches the peer's echoes \
            (coturn's turnutils_peer, or any UDP echo), prints the round-trip times and the loss, \
            and deallocates. Exits 1 on failure, and when every packet was lost.
            """
    )

    @Argument(help: "The TURN server, HOST[:PORT] (default port 3478; IPv6 as [ADDR]:PORT).")
    var server: String

    @Option(help: "Long-term credentials USER:PASSWORD, required (split at the last ':', so REST usernames expiry:user work).")
    var user: String?

    @Option(help: "The realm the server must name (default: whatever it says).")
    var realm: String?

    @Option(help: "The echoing peer, ADDR:PORT, as the relay reaches it; required.")
    var peer: String?

    @Option(help: "Packets to send.")
    var count = 10

    @Option(name: .customLong("interval-ms"), help: "Milliseconds between packets.")
    var intervalMs = 20

    @Option(help: "Bytes of payload per packet (8 or more).")
    var size = 100

    @Flag(help: "Reach the server over TCP instead of UDP.")
    var tcp = false

    @Flag(name: .customLong("no-channel"), help: "Send in Send indications instead of binding a channel.")
    var noChannel = false

    @Option(help: "Seconds to wait for each server answer, and for the last echoes.")
    var timeout: Double = 5

    @Flag(help: "Print each packet's round trip.")
    var verbose = false

    /// Every argument problem is one `tusa turn: ...` line and exit 1, like the network's.
    func check() -> (username: String, password: String, peer: String) {
        guard let user else { Self.fail("--user USER:PASSWORD is required") }
        guard let (username, password) = Self.credentials(user) else { Self.fail("--user '\(user)' is not USER:PASSWORD") }
        guard let peer else { Self.fail("--peer ADDR:PORT is required") }
        guard count >= 1, count <= 1_000_000 else { Self.fail("--count must be between 1 and 1000000") }
        guard intervalMs >= 0, intervalMs <= 60_000 else { Self.fail("--interval-ms must be between 0 and 60000") }
        guard size >= 8, size <= 65_000 else { Self.fail("--size must be between 8 and 65000 bytes") }
        guard timeout > 0, timeout <= 600 else { Self.fail("--timeout must be above 0 and at most 600 seconds") }
        return (username, password, peer)
    }

    static func credentials(_ text: String) -> (String, String)? {
        guard let colon = text.lastIndex(of: ":") else { return nil }
        let name = String(text[..<colon])
        let password = String(text[text.index(after: colon)...])
        guard !name.isEmpty, !password.isEmpty else { return nil }
        return (name, password)
    }

    func run() async throws {
        let (username, password, peer) = check()
        let serverAddress = Self.resolve(server, defaultPort: 3478, what: "server")
        let peerAddress = Self.resolve(peer, defaultPort: nil, what: "peer")
        let wait = Duration.milliseconds(Int64(timeout * 1000))
        let configuration = TURNClient.Configuration(
            username: username, password: password, realm: realm, software: "tusa \(TusaVersion.string)")
        var logger = Logger(label: "tusa.turn")
        logger.logLevel = .error

        let turn: TURNClientConnection
        do {
            turn = try await TURNClientConnection.connect(
                to: serverAddress, over: tcp ? .tcp : .udp, configuration: configuration, connectTimeout: wait, logger: logger)
        } catch {
            Self.fail("\(serverAddress): \(error)")
        }
        do {
            let allocation = try await turn.allocate(timeout: wait)
            print("relayed address: \(allocation.relayed)")
            print("mapped address: \(allocation.mapped.map { "\($0)" } ?? "(not given)")")
            try await turn.createPermission(for: peerAddress, timeout: wait)
            if noChannel {
                print("permission for \(peerAddress.ip); sending in Send indications")
            } else {
                let channel = try await turn.bindChannel(to: peerAddress, timeout: wait)
                print("channel \(channel) bound to \(peerAddress)")
            }
            let stats = try await measure(turn, peer: peerAddress, wait: wait)
            print(stats.summary(count: count))
            do {
                try await turn.close(timeout: wait)
                print("deallocated")
            } catch {
                Self.warn("\(serverAddress): deallocation not confirmed: \(error)")
            }
            if stats.received == 0 { Self.fail("no echoes from \(peerAddress): all \(count) packets lost") }
        } catch {
            try? await turn.close(timeout: .milliseconds(500))
            Self.fail(Self.explain(error, server: serverAddress, wait: timeout))
        }
    }

    /// Sends the packets at the interval and matches the echoes.
    func measure(_ turn: TURNClientConnection, peer: TransportAddress, wait: Duration) async throws(TURNClientError) -> Tally {
        let run = UInt32.random(in: .min ... .max)
        let tally = TallyBox(count: count)
        let size = self.size
        let verbose = self.verbose
        let listener = Task {
            for await datagram in turn.received where datagram.peer == peer {
                guard let seq = Probe.sequence(of: datagram.payload, run: run, size: size) else {
                    await tally.stray()
                    continue
                }
                if let rtt = await tally.echo(seq, at: ContinuousClock.now), verbose {
                    print("seq=\(seq) rtt=\(Tally.milliseconds(rtt)) ms")
                }
            }
        }
        defer { listener.cancel() }
        let clock = ContinuousClock()
        var next = clock.now
        for seq in 0..<count {
            await tally.sent(seq, at: clock.now)
            try await turn.send(Probe.payload(run: run, sequence: UInt32(truncatingIfNeeded: seq), size: size), to: peer)
            next = next.advanced(by: .milliseconds(intervalMs))
            if seq + 1 < count, next > clock.now { try? await Task.sleep(until: next, clock: clock) }
        }
        // The last echoes: until all are in, or the timeout.
        let deadline = clock.now.advanced(by: wait)
        while clock.now < deadline, await tally.snapshot().received < count {
            try? await Task.sleep(for: .milliseconds(5))
        }
        return await tally.snapshot()
    }

    static func explain(_ error: Error, server: TransportAddress, wait: Double) -> String {
        guard let error = error as? TURNClientError else { return "\(server): \(error)" }
        switch error {
        case .timeout(let method):
            return "\(server): no answer to \(method) within \(Tally.format(wait)) s"
        default:
            return "\(server): \(error)"
        }
    }

    /// HOST[:PORT] or [V6]:PORT → an address, resolving names; a clear error otherwise.
    static func resolve(_ text: String, defaultPort: UInt16?, what: String) -> TransportAddress {
        do throws(AddressResolutionError) {
            return try AddressResolver.resolve(text, defaultPort: defaultPort)
        } catch {
            switch error {
            case .badPort(let text): fail("\(what) '\(text)': bad port")
            case .missingPort(let text): fail("\(what) '\(text)' needs a port (ADDR:PORT)")
            case .unresolvable(let host): fail("cannot resolve \(what) '\(host)'")
            }
        }
    }

    static func warn(_ message: String) {
        FileHandle.standardError.write(Data("tusa turn: \(message)\n".utf8))
    }

    static func fail(_ message: String) -> Never {
        warn(message)
        Foundation.exit(1)
    }
}

/// The test packets: a run tag, a sequence number, and a pattern, so that an
/// echo is recognised and checked byte for byte.
enum Probe {
    static func payload(run: UInt32, sequence: UInt32, size: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: size)
        for (i, shift) in [24, 16, 8, 0].enumerated() {
            out[i] = UInt8(truncatingIfNeeded: run >> UInt32(shift))
            out[4 + i] = UInt8(truncatingIfNeeded: sequence >> UInt32(shift))
        }
        for i in 8..<size { out[i] = UInt8(truncatingIfNeeded: Int(sequence) &+ i) }
        return out
    }

    /// The sequence number of an intact echo of this run, or nil.
    static func sequence(of payload: [UInt8], run: UInt32, size: Int) -> Int? {
        guard payload.count == size else { return nil }
        let tag = payload[0..<4].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        let seq = payload[4..<8].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        guard tag == run, payload == Self.payload(run: run, sequence: seq, size: size) else { return nil }
        return Int(seq)
    }
}

/// Send times and round trips of one run.
struct Tally: Sendable {
    var count: Int
    var sentAt: [ContinuousClock.Instant?]
    var rtts: [Duration] = []
    var duplicates = 0
    var strays = 0

    var received: Int { rtts.count }

    func summary(count: Int) -> String {
        let loss = Double(count - received) / Double(count) * 100
        var lines = ["sent \(count), received \(received), loss \(Self.format(loss, digits: 1))%"]
        if let min = rtts.min(), let max = rtts.max() {
            let avg = rtts.reduce(Duration.zero, +) / rtts.count
            lines.append("rtt min/avg/max \(Self.milliseconds(min))/\(Self.milliseconds(avg))/\(Self.milliseconds(max)) ms")
        }
        if duplicates > 0 { lines.append("\(duplicates) duplicate echoes") }
        if strays > 0 { lines.append("\(strays) unrecognised datagrams from the peer") }
        return lines.joined(separator: "\n")
    }

    static func milliseconds(_ d: Duration) -> String {
        format(Double(d.nanoseconds) / 1e6, digits: 3)
    }

    static func format(_ x: Double, digits: Int = 1) -> String {
        String(format: "%.\(digits)f", x)
    }
}

actor TallyBox {
    private var tally: Tally
    private var echoed: [Bool]

    init(count: Int) {
        tally = Tally(count: count, sentAt: Array(repeating: nil, count: count))
        echoed = Array(repeating: false, count: count)
    }

    func sent(_ seq: Int, at time: ContinuousClock.Instant) {
        guard seq < tally.sentAt.count else { return }
        tally.sentAt[seq] = time
    }

    /// Records an echo; returns its round trip unless it was a duplicate or unknown.
    func echo(_ seq: Int, at time: ContinuousClock.Instant) -> Duration? {
        guard seq < echoed.count, let sent = tally.sentAt[seq] else {
            tally.strays += 1
            return nil
        }
        guard !echoed[seq] else {
            tally.duplicates += 1
            return nil
        }
        echoed[seq] = true
        let rtt = time - sent
        tally.rtts.append(rtt)
        return rtt
    }

    func stray() { tally.strays += 1 }

    func snapshot() -> Tally { tally }
}
