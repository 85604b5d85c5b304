import NIOCore
import TusaBase

extension ConnectionAdmission {
    /// Admits a newly accepted connection by its remote IP address and
    /// releases it when the channel closes; on a refusal the channel is left
    /// to the caller (to count and close), and nothing is held. Shared by the
    /// relay's TURN and rendezvous listeners and the secure endpoint's streams.
    public func admit(_ channel: any Channel) -> Refusal? {
        let source = channel.remoteAddress.flatMap(TransportAddress.init)?.ip
        if let refusal = admit(source) { return refusal }
        channel.closeFuture.whenComplete { _ in self.release(source) }
        return nil
    }
}
