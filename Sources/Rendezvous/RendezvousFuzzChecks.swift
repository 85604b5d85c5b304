import Secure
import TusaBase

/// What the RendezvousFuzz target (and the pinned crash inputs' test) runs on
/// each input: every parser that sees bytes from a rendezvous connection or the
/// directory database, and the server core behind them. Nothing may trap; what
/// decodes must encode to what decodes the same.
public enum RendezvousFuzzChecks {
    private static let peer = (try? PrivateKey(bytes: [UInt8](repeating: 0x55, count: 32))) ?? .generate()
    private static let unixSeconds: UInt64 = 1_800_000_000

    public static func exercise(_ bytes: [UInt8]) {
        message(bytes)
        framing(bytes)
        notice(bytes)
        server(bytes)
        client(bytes)
    }

    /// The input from the server's side of a connection to a client: as raw stream bytes
    /// and framed as one message, before registration and after (the client connects
    /// over plain TCP: anyone on the path may write these), then the client's timers.
    private static func client(_ bytes: [UInt8]) {
        let now = Timestamp.seconds(1000)
        let framed = bytes.count <= RendezvousFrame.maximumLength ? RendezvousFrame.frame(body: bytes) : []
        for registered in [false, true] {
            var client = RendezvousClient(identity: peer)
            client.handle(.connected, now: now)
            if registered {
                // A real server's hello and registration first.
                var server = RendezvousServer(configuration: .init())
                let id = ConnectionID(1)
                server.handle(.accepted(id), now: now)
                for _ in 0..<4 {
                    for action in server.drainActions() {
                        if case .send(_, let reply) = action { client.handle(.received(reply), now: now) }
                    }
                    for action in client.drainActions() {
                        if case .write(let request) = action {
                            server.handle(.received(id, request, unixSeconds: unixSeconds), now: now)
                        }
                    }
                }
            }
            for input in [framed, bytes] where !input.isEmpty {
                client.handle(.received(input), now: now)
                _ = client.drainActions()
            }
            client.handleTimeout(now: now + .seconds(120))
            _ = client.drainActions()
        }
    }

    /// The input as one frame's body.
    private static func message(_ bytes: [UInt8]) {
        guard let decoded = try? RendezvousMessage(decoding: bytes) else { return }
        guard let again = try? RendezvousMessage(decoding: decoded.encode()), again == decoded else {
            preconditionFailure("a rendezvous message does not decode to itself after encoding: \(decoded)")
        }
    }

    /// The input as stream bytes, in two pieces cut where its first byte says.
    private static func framing(_ bytes: [UInt8]) {
        var framer = RendezvousFrame()
        let cut = bytes.first.map { Int($0) % (bytes.count + 1) } ?? 0
        var frames: [[UInt8]] = []
        do {
            frames += try framer.append(bytes.prefix(cut))
            frames += try framer.append(bytes.dropFirst(cut))
        } catch { return }
        guard frames.allSatisfy({ $0.count <= RendezvousFrame.maximumLength }) else {
            preconditionFailure("a frame longer than the maximum came out")
        }
    }

    /// The input as a notification's text from another directory node.
    private static func notice(_ bytes: [UInt8]) {
        guard let decoded = try? ClusterNotice(decoding: String(decoding: bytes, as: UTF8.self)) else { return }
        guard let again = try? ClusterNotice(decoding: decoded.encode()), again == decoded else {
            preconditionFailure("a cluster notice does not decode to itself after encoding: \(decoded)")
        }
    }

    /// The input from a connection to the server core: a stranger's (before any
    /// registration), then a registered peer's, as raw stream bytes and framed as one
    /// message; then the connections' timeouts.
    private static func server(_ bytes: [UInt8]) {
        var server = RendezvousServer(configuration: .init())
        let now = Timestamp.seconds(1000)
        let stranger = ConnectionID(1)
        server.handle(.accepted(stranger), now: now)
        server.handle(.received(stranger, bytes, unixSeconds: unixSeconds), now: now)
        _ = server.drainActions()

        let registered = ConnectionID(2)
        var client = RendezvousClient(identity: peer)
        server.handle(.accepted(registered), now: now)
        for _ in 0..<4 {
            var sent = false
            for action in server.drainActions() {
                guard case .send(let id, let reply) = action, id == registered else { continue }
                client.handle(.received(reply), now: now)
            }
            for action in client.drainActions() {
                guard case .write(let request) = action else { continue }
                server.handle(.received(registered, request, unixSeconds: unixSeconds), now: now)
                sent = true
            }
            if !sent { break }
        }
        let framed = bytes.count <= RendezvousFrame.maximumLength ? RendezvousFrame.frame(body: bytes) : []
        for input in [framed, bytes] where !input.isEmpty {
            server.handle(.received(registered, input, unixSeconds: unixSeconds), now: now)
            _ = server.drainActions()
        }
        server.handleTimeout(now: now + .seconds(3600))
        _ = server.drainActions()
    }
}
