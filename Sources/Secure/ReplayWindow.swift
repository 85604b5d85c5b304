/// The answer of a replay check.
public enum ReplayVerdict: Sendable, Equatable {
    /// Not seen, within the window or ahead of it.
    case fresh
    /// Seen already.
    case replayed
    /// Too far behind the highest accepted index to be judged.
    case tooOld
}

/// Sliding anti-replay window over 64-bit packet indices (RFC 6479 style):
/// a ring of 64-bit blocks, advanced by clearing whole blocks, no bit shifts.
/// An index is judged when it is at most `size − 1` behind the highest one
/// accepted. Check before decrypting; accept only after authentication.
public struct ReplayWindow: Sendable, Equatable {
    public static let size: UInt64 = 2048
    /// 2048 consecutive indices span at most 33 blocks of 64.
    private static let blockCount = 33

    private var blocks: [UInt64]
    /// The highest accepted index; `nil` until the first accept.
    public private(set) var highest: UInt64?

    public init() {
        blocks = [UInt64](repeating: 0, count: Self.blockCount)
    }

    @inline(__always) private static func slot(_ index: UInt64) -> (block: Int, bit: UInt64) {
        (Int((index >> 6) % UInt64(blockCount)), UInt64(1) << (index & 63))
    }

    public func check(_ index: UInt64) -> ReplayVerdict {
        guard let highest, index <= highest else { return .fresh }
        if highest - index >= Self.size { return .tooOld }
        let (block, bit) = Self.slot(index)
        return blocks[block] & bit != 0 ? .replayed : .fresh
    }

    /// Records `index` as received. Indices too old to judge are ignored.
    public mutating func accept(_ index: UInt64) {
        if let top = highest {
            if index > top {
                // Clear the blocks the window moves into (at most all of them).
                let oldBlock = top >> 6
                let newBlock = index >> 6
                let steps = min(newBlock - oldBlock, UInt64(Self.blockCount))
                var b = newBlock
                for _ in 0..<steps {
                    blocks[Int(b % UInt64(Self.blockCount))] = 0
                    b -= 1
                }
                highest = index
            } else if top - index >= Self.size {
                return
            }
        } else {
            highest = index
        }
        let (block, bit) = Self.slot(index)
        blocks[block] |= bit
    }
}
