import TusaBase

/// The peers of a `SecureEndpoint` by when their timers are next due: a binary
/// min-heap of (time, peer). It never removes in place: an entry whose time is not
/// its peer's `timerAt` any more (the peer was queued again earlier, or is gone)
/// is stale, and the endpoint skips it when it reaches the top. So a wake costs
/// the peers due then, not a walk of every peer.
struct TimerQueue {
    private var heap: [(at: Timestamp, id: PeerID)] = []

    var count: Int { heap.count }

    /// The earliest entry, stale or not.
    var first: (at: Timestamp, id: PeerID)? { heap.first }

    mutating func push(_ at: Timestamp, _ id: PeerID) {
        heap.append((at, id))
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard Self.earlier(heap[child], heap[parent]) else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    @discardableResult
    mutating func popFirst() -> (at: Timestamp, id: PeerID)? {
        guard let top = heap.first else { return nil }
        let last = heap.removeLast()
        guard !heap.isEmpty else { return top }
        heap[0] = last
        var parent = 0
        while true {
            let left = 2 * parent + 1
            guard left < heap.count else { break }
            let right = left + 1
            let child = right < heap.count && Self.earlier(heap[right], heap[left]) ? right : left
            guard Self.earlier(heap[child], heap[parent]) else { break }
            heap.swapAt(child, parent)
            parent = child
        }
        return top
    }

    /// Time first; equal times by peer, so runs repeat exactly.
    private static func earlier(_ a: (at: Timestamp, id: PeerID), _ b: (at: Timestamp, id: PeerID)) -> Bool {
        a.at != b.at ? a.at < b.at : a.id.rawValue < b.id.rawValue
    }
}
