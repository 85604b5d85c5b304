// secure-bench: the encrypted transport's costs, each beside its baseline in one run.
//
//   handshakes   full Noise IK handshakes per second through two sans-IO
//                SecureEndpoints (initiation, response, key-confirming keepalive),
//                and what a flood costs the responder per initiation: bad mac1
//                (dropped after one BLAKE2b), valid mac1 while under load (a
//                64-byte cookie reply, no Diffie-Hellman), against the full handshake.
//   driver       sealed 160-byte media packets per second through two
//                SecureUDPEndpoints on loopback (NIO, recvmmsg, batched writes),
//                against plain NIO UDP moving the same datagrams unsealed, same batching.
//
// Usage: secure-bench [--seconds S] [--part handshakes|driver|all]
//
// A target of the main package (not of Benchmarks/) so that `make test`'s
// smoke run reuses the package's build instead of compiling SwiftNIO again.
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import STUN
import Secure
import Transport
import TusaBase

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("secure-bench: \(message)\n".utf8))
    exit(1)
}

func monotonicSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

let usage = "usage: secure-bench [--seconds S (0.2-120, default 3)] [--part handshakes|driver|all]"
func parseArguments() -> (seconds: Double, part: String) {
    var seconds = 3.0
    var part = "all"
    var argv = CommandLine.arguments.dropFirst()
    while let flag = argv.popFirst() {
        guard let value = argv.popFirst() else { fail(usage) }
        switch flag {
        case "--seconds":
            guard let s = Double(value), (0.2...120).contains(s) else { fail(usage) }
            seconds = s
        case "--part":
            guard ["handshakes", "driver", "all"].contains(value) else { fail(usage) }
            part = value
        default: fail(usage)
        }
    }
    return (seconds, part)
}
let (seconds, part) = parseArguments()

/// Every action the endpoint has waiting.
func actions(of e: SecureEndpoint) -> [SecureOutput] {
    var out: [SecureOutput] = []
    while let a = e.pollAction() { out.append(a) }
    return out
}

func sendBytes(_ outputs: [SecureOutput]) -> [[UInt8]] {
    outputs.compactMap { if case .send(let b, _) = $0 { b } else { nil } }
}

// MARK: handshakes

func handshakes() {
    let aAddr = TransportAddress(ip: .v4(0x7F00_0001), port: 1000)
    let bAddr = TransportAddress(ip: .v4(0x7F00_0001), port: 2000)
    var t = Timestamp.seconds(1)
    var config = SecureConfiguration()
    config.handshakeRate = 1e9
    config.handshakeBurst = 1e9
    let a = SecureEndpoint(identity: .generate(), configuration: config, now: t)
    let b = SecureEndpoint(identity: .generate(), configuration: config, now: t)
    let bAtA = a.addPeer(b.identity.publicKey, address: bAddr)
    b.addPeer(a.identity.publicKey)

    func one() -> Bool {
        t = t + .milliseconds(1)
        a.handle(.connect(bAtA), now: t)
        guard var initiation = sendBytes(actions(of: a)).first else { return false }
        guard b.receive(&initiation, from: aAddr, now: t) == .handled, var response = sendBytes(actions(of: b)).first else {
            return false
        }
        guard a.receive(&response, from: bAddr, now: t) == .handled, var confirm = sendBytes(actions(of: a)).first else {
            return false
        }
        _ = b.receive(&confirm, from: aAddr, now: t)
        _ = actions(of: b)
        return true
    }
    // The baseline in the same run: the bare Noise IK handshake (both sides'
    // messages and splits, the same static keys), no endpoint around it. The two
    // alternate in 10 slices so that a change in the machine's speed hits both.
    let aStatic = a.identity.privateKey
    let bStatic = b.identity.privateKey
    func bare() -> Bool {
        do {
            let i = try NoiseHandshake(
                pattern: .IK, initiator: true, prologue: [], localStatic: aStatic, remoteStatic: bStatic.publicKey)
            let r = try NoiseHandshake(pattern: .IK, initiator: false, prologue: [], localStatic: bStatic, remoteStatic: nil)
            _ = try r.readMessage(try i.writeMessage(payload: []))
            _ = try i.readMessage(try r.writeMessage(payload: []))
            _ = try i.split()
            _ = try r.split()
            return true
        } catch { return false }
    }
    var n = 0
    var elapsed = 0.0
    var bareN = 0
    var bareElapsed = 0.0
    for _ in 0..<10 {
        var start = monotonicSeconds()
        while monotonicSeconds() - start < seconds / 20 {
            guard one() else { fail("handshake did not complete") }
            n += 1
        }
        elapsed += monotonicSeconds() - start
        start = monotonicSeconds()
        while monotonicSeconds() - start < seconds / 20 {
            guard bare() else { fail("bare Noise handshake failed") }
            bareN += 1
        }
        bareElapsed += monotonicSeconds() - start
    }
    let perHandshake = elapsed / Double(n) * 1e6
    let perBare = bareElapsed / Double(bareN) * 1e6
    print(
        String(
            format:
                "handshakes: %d in %.2f s = %.0f/s (%.1f µs each, both sides, one core); bare Noise IK in the same run: %.1f µs; endpoint / bare %.2f",
            n, elapsed, Double(n) / elapsed, perHandshake, perBare, perHandshake / perBare))

    // The responder under a flood: one genuine initiation replayed from many sources.
    var flood = SecureConfiguration()
    flood.handshakeRate = 0.001
    flood.handshakeBurst = 0
    let victim = SecureEndpoint(identity: .generate(), configuration: flood, now: t)
    let attacker = SecureEndpoint(identity: .generate(), configuration: config, now: t)
    let v = attacker.addPeer(victim.identity.publicKey, address: bAddr)
    attacker.handle(.connect(v), now: t)
    guard let packet = sendBytes(actions(of: attacker)).first else { fail("no initiation") }
    var badMAC = packet
    badMAC[130] ^= 1

    func floodRate(_ template: [UInt8], expect: SecureReceive) -> Double {
        var count = 0
        let s = monotonicSeconds()
        var source = TransportAddress(ip: .v4(0x0A00_0000), port: 9)
        while monotonicSeconds() - s < seconds {
            for _ in 0..<256 {
                var m = template
                source.ip = .v4(0x0A00_0000 | UInt32(count & 0xFFFF))
                guard victim.receive(&m, from: source, now: t) == expect else { fail("flood: unexpected outcome") }
                _ = actions(of: victim)
                count += 1
            }
        }
        return Double(count) / (monotonicSeconds() - s)
    }
    let cookieRate = floodRate(packet, expect: .droppedHandshake(.cookieRequired))
    let badRate = floodRate(badMAC, expect: .droppedHandshake(.badMAC))
    print(
        String(
            format: "flood, valid mac1 under load (cookie reply, no DH): %.0f/s (%.2f µs each, %.3f× a handshake's cost)",
            cookieRate, 1e6 / cookieRate, (1e6 / cookieRate) / perHandshake))
    print(
        String(
            format: "flood, bad mac1 (dropped): %.0f/s (%.2f µs each, %.4f× a handshake's cost)",
            badRate, 1e6 / badRate, (1e6 / badRate) / perHandshake))
}

// MARK: driver

/// Counts datagrams a plain NIO UDP channel receives.
final class Counter: ChannelInboundHandler, Sendable {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    let count = NIOLockedValueBox(0)
    func channelRead(context: ChannelHandlerContext, data: NIOAny) { count.withLockedValue { $0 += 1 } }
}

func driver() async throws {
    let payload = [UInt8](repeating: 0x5A, count: 160)
    let batch = 32
    let window = 512

    func run(label: String, send: @escaping @Sendable () -> Void, received: @escaping @Sendable () -> Int) async -> Double {
        var sent = 0
        let start = monotonicSeconds()
        let warm = start + 0.5
        var base = 0
        var measuring = false
        var measureStart = start
        while monotonicSeconds() - start < seconds + 0.5 {
            if !measuring, monotonicSeconds() >= warm {
                measuring = true
                base = received()
                measureStart = monotonicSeconds()
            }
            if sent - received() < window {
                send()
                sent += batch
            } else {
                try? await Task.sleep(for: .microseconds(50))
            }
        }
        let got = received() - base
        let rate = Double(got) / (monotonicSeconds() - measureStart)
        print(String(format: "%@: %.0f packets/s received (%d sent in all)", label, rate, sent))
        return rate
    }

    // Sealed, through the secure driver.
    let counter = NIOLockedValueBox(0)
    let a = try await SecureUDPEndpoint.bind(host: "127.0.0.1", identity: .generate())
    let b = try await SecureUDPEndpoint.bind(
        host: "127.0.0.1", identity: .generate(),
        mediaHandler: { _, _, _ in
            counter.withLockedValue { $0 += 1 }
        })
    async let waiting = b.waitForPeer(a.publicKey)
    let peer = try await a.connect(to: b.publicKey, at: b.localAddress)
    _ = try await waiting
    let frames = [[UInt8]](repeating: payload, count: batch)
    let secure = await run(
        label: "secure driver, sealed 160-byte payloads",
        send: {
            a.send(batch: frames, to: peer, payloadType: 0, timestamp: 0, timestampStep: 160)
        }, received: { counter.withLockedValue { $0 } })
    let stats = try await b.statistics()
    await a.close()
    await b.close()

    // Plain NIO UDP, same sizes (12 + 160 + 16 bytes), same batching, no crypto.
    let handler = Counter()
    let group = MultiThreadedEventLoopGroup.singleton
    let receiver = try await DatagramBootstrap(group: group)
        .channelOption(.datagramVectorReadMessageCount, value: 32)
        .channelOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: 32 * 2048))
        .channelInitializer { $0.pipeline.addHandler(handler) }
        .bind(host: "127.0.0.1", port: 0).get()
    let sender = try await DatagramBootstrap(group: group).bind(host: "127.0.0.1", port: 0).get()
    let to = try require(receiver.localAddress)
    let plain = [UInt8](repeating: 0x5A, count: 12 + 160 + 16)
    let plainRate = await run(
        label: "plain NIO UDP, unsealed 188-byte datagrams",
        send: {
            sender.eventLoop.execute {
                for _ in 0..<batch {
                    var buf = sender.allocator.buffer(capacity: plain.count)
                    buf.writeBytes(plain)
                    sender.write(AddressedEnvelope(remoteAddress: to, data: buf), promise: nil)
                }
                sender.flush()
            }
        }, received: { handler.count.withLockedValue { $0 } })
    try await sender.close()
    try await receiver.close()
    print(String(format: "secure / plain = %.2f (drops at the receiver: %@)", secure / plainRate, "\(stats.dropped)"))
}

func require<T>(_ v: T?) throws -> T {
    guard let v else { fail("missing value") }
    return v
}

if part == "all" || part == "handshakes" { handshakes() }
if part == "all" || part == "driver" { try await driver() }
