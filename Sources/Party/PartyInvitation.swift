import Foundation

/// An invitation to a party, sealed end to end from the creator to an invited
/// key and kept by the rendezvous for a day (`post`): where the room is and how
/// to reach the relay that hosts it.
public struct PartyInvitation: Codable, Hashable, Sendable {
    /// Marks the payload among the others a rendezvous carries (call messages).
    public var type = "party-invite"
    public var room: String
    public var name: String
    /// The relay's party service, `HOST:PORT`.
    public var relay: String
    /// The relay's static key, base64.
    public var relayKey: String

    public init(room: String, name: String, relay: String, relayKey: String) {
        self.room = room
        self.name = name
        self.relay = relay
        self.relayKey = relayKey
    }

    public func encoded() -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return Array((try? encoder.encode(self)) ?? Data())
    }

    /// The invitation in `payload`; nil for any other payload (a call message, garbage).
    public init?(decoding payload: [UInt8]) {
        guard let v = try? JSONDecoder().decode(PartyInvitation.self, from: Data(payload)), v.type == "party-invite",
            !v.room.isEmpty, v.room.count <= 64, v.name.count <= 256
        else { return nil }
        self = v
    }
}
