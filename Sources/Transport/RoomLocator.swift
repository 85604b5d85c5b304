import NIOConcurrencyHelpers
import Rendezvous
import Secure
import TusaBase

/// Asks a rendezvous or directory where a party room is hosted now
/// (``RendezvousConnection/locate(room:)``), for a ``PartyConnection`` whose relay
/// went silent (``PartyConnection/Locator``). It asks over the registration it is
/// given; when that is lost (its directory node died), it registers again at the
/// next node first. Each answer is waited for at most ``timeout``: a member trying
/// to get back to its room does not wait on a slow directory.
public final class RoomLocator: Sendable {
    public let timeout: Duration
    private let identity: PrivateKey
    private let connection: NIOLockedValueBox<RendezvousConnection>

    public init(_ connection: RendezvousConnection, identity: PrivateKey, timeout: Duration = .seconds(2)) {
        self.connection = NIOLockedValueBox(connection)
        self.identity = identity
        self.timeout = timeout
    }

    /// The registration it asks over now (another after its node was lost).
    public var current: RendezvousConnection { connection.withLockedValue { $0 } }

    /// Where `room` is now: the relay's party address and key (nil: no answer in
    /// time, no relay, or an answer that does not parse). `follow`: asked by a member
    /// that still hears its relay (``RendezvousConnection/locate(room:follow:)``).
    public func locate(_ room: String, follow: Bool = false) async -> (address: TransportAddress, key: PublicKey)? {
        let timeout = self.timeout
        // Whichever comes first, the answer or the deadline (an answer after it is dropped).
        return await withCheckedContinuation { continuation in
            let answered = NIOLockedValueBox(false)
            let finish: @Sendable ((address: TransportAddress, key: PublicKey)?) -> Void = { answer in
                let first = answered.withLockedValue { done in
                    defer { done = true }
                    return !done
                }
                if first { continuation.resume(returning: answer) }
            }
            Task { finish(await self.ask(room, follow: follow)) }
            Task {
                try? await Task.sleep(for: timeout)
                finish(nil)
            }
        }
    }

    private func ask(_ room: String, follow: Bool) async -> (address: TransportAddress, key: PublicKey)? {
        var asking = current
        if asking.isClosed {
            guard let again = try? await asking.connectAgain(identity: identity, timeout: timeout) else { return nil }
            connection.withLockedValue { $0 = again }
            await asking.close()
            asking = again
        }
        guard let grant = try? await asking.locate(room: room, follow: follow),
            let address = TransportAddress(grant.address, defaultPort: nil), let key = PublicKey(base64: grant.key)
        else { return nil }
        return (address, key)
    }

    /// Closes the registration it holds.
    public func close() async { await current.close() }
}
