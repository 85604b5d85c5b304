import Secure

/// Which relay a party room lives on, in a directory's cluster of relays.
///
/// A relay that reports to a directory starts its rooms' ids with its own tag
/// (``roomPrefix(for:)``: four characters drawn from its key, then `-`), so that
/// the directory finds a room's relay from the id alone, without a table of rooms
/// (``RelayRegistry/host(room:now:)``). When that relay is gone or draining, the
/// room is placed again by rendezvous hashing (highest random weight) over the
/// live relays: every member that asks, at any node of the directory that knows
/// the same relays, is sent to the same one, and a dead relay's rooms spread
/// evenly over the others.
public enum RoomHome {
    /// The alphabet of room ids (no 0/o, 1/l).
    static let alphabet = Array("abcdefghijkmnpqrstuvwxyz23456789")

    /// The four characters a relay's rooms start with.
    public static func tag(of relay: PublicKey) -> String {
        var v = first64Bits(Blake2b.hash(parts: [Array("tusa relay room tag".utf8), relay.bytes], outputLength: 16))
        var s = ""
        for _ in 0..<4 {
            s.append(alphabet[Int(v & 31)])
            v >>= 5
        }
        return s
    }

    /// What a relay of a directory puts before its rooms' ids.
    public static func roomPrefix(for relay: PublicKey) -> String { tag(of: relay) + "-" }

    /// The tag a room id starts with, if it has one.
    public static func tag(ofRoom room: String) -> String? {
        let parts = room.split(separator: "-", maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.count == 2, parts[0].count == 4 else { return nil }
        return String(parts[0])
    }

    /// A relay's weight for a room: the room goes to the live relay of highest weight.
    static func weight(room: String, relay: PublicKey) -> UInt64 {
        first64Bits(Blake2b.hash(parts: [Array("tusa room home".utf8), Array(room.utf8), relay.bytes], outputLength: 16))
    }

    private static func first64Bits(_ hash: [UInt8]) -> UInt64 { hash.prefix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) } }
}
