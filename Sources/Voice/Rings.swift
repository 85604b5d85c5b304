import Synchronization

/// A fixed-slot single-producer/single-consumer queue of packets: the network
/// thread pushes, the audio clock pops. Lock-free and allocation-free after init:
/// each slot owns `maximumPacketSize` bytes of one preallocated block.
///
/// Indices only grow; the producer owns `head`, the consumer owns `tail`, each
/// publishes its index with release ordering and reads the other's with acquire.
public final class PacketRing: @unchecked Sendable {
    public let slots: Int
    public let maximumPacketSize: Int
    private let storage: UnsafeMutableRawPointer
    private let lengths: UnsafeMutablePointer<Int>
    private let sequences: UnsafeMutablePointer<UInt16>
    private let timestamps: UnsafeMutablePointer<UInt32>
    private let arrivals: UnsafeMutablePointer<Int64>
    private let redundant: UnsafeMutablePointer<Bool>
    private let head = Atomic<Int>(0)
    private let tail = Atomic<Int>(0)
    private let dropped = Atomic<Int>(0)

    public init(slots: Int, maximumPacketSize: Int) {
        self.slots = max(slots, 1)
        self.maximumPacketSize = max(maximumPacketSize, 1)
        storage = .allocate(byteCount: self.slots * self.maximumPacketSize, alignment: 16)
        lengths = .allocate(capacity: self.slots)
        lengths.initialize(repeating: 0, count: self.slots)
        sequences = .allocate(capacity: self.slots)
        sequences.initialize(repeating: 0, count: self.slots)
        timestamps = .allocate(capacity: self.slots)
        timestamps.initialize(repeating: 0, count: self.slots)
        arrivals = .allocate(capacity: self.slots)
        arrivals.initialize(repeating: 0, count: self.slots)
        redundant = .allocate(capacity: self.slots)
        redundant.initialize(repeating: false, count: self.slots)
    }

    deinit {
        storage.deallocate()
        lengths.deallocate()
        sequences.deallocate()
        timestamps.deallocate()
        arrivals.deallocate()
        redundant.deallocate()
    }

    /// Producer: copies the packet in (`redundant`: its payload is ``RedundantAudio``).
    /// False (and counted) when the ring is full or the packet too large.
    @discardableResult
    public func push(
        sequence: UInt16, timestamp: UInt32, arrivalNanoseconds: Int64, payload: UnsafeRawBufferPointer, redundant: Bool = false
    ) -> Bool {
        let h = head.load(ordering: .relaxed)
        guard payload.count <= maximumPacketSize, h - tail.load(ordering: .acquiring) < slots else {
            dropped.wrappingAdd(1, ordering: .relaxed)
            return false
        }
        let slot = h % slots
        if let base = payload.baseAddress, !payload.isEmpty {
            (storage + slot * maximumPacketSize).copyMemory(from: base, byteCount: payload.count)
        }
        lengths[slot] = payload.count
        sequences[slot] = sequence
        timestamps[slot] = timestamp
        arrivals[slot] = arrivalNanoseconds
        self.redundant[slot] = redundant
        head.store(h + 1, ordering: .releasing)
        return true
    }

    /// Consumer: hands the oldest packet to `body`, then frees its slot. False when empty.
    @discardableResult
    public func pop(
        _ body: (_ sequence: UInt16, _ timestamp: UInt32, _ arrivalNanoseconds: Int64, _ payload: UnsafeRawBufferPointer) -> Void
    ) -> Bool {
        popPacket { sequence, timestamp, arrival, payload, _ in body(sequence, timestamp, arrival, payload) }
    }

    /// ``pop(_:)``, with whether the payload is ``RedundantAudio``.
    @discardableResult
    public func popPacket(
        _ body:
            (
                _ sequence: UInt16, _ timestamp: UInt32, _ arrivalNanoseconds: Int64, _ payload: UnsafeRawBufferPointer,
                _ redundant: Bool
            ) -> Void
    ) -> Bool {
        let t = tail.load(ordering: .relaxed)
        guard head.load(ordering: .acquiring) > t else { return false }
        let slot = t % slots
        body(
            sequences[slot], timestamps[slot], arrivals[slot],
            UnsafeRawBufferPointer(start: storage + slot * maximumPacketSize, count: lengths[slot]), redundant[slot])
        tail.store(t + 1, ordering: .releasing)
        return true
    }

    public var count: Int { head.load(ordering: .acquiring) - tail.load(ordering: .acquiring) }
    /// Packets refused because the ring was full or they were too large.
    public var droppedPackets: Int { dropped.load(ordering: .relaxed) }
}

/// A ring of audio that keeps the newest `capacity` samples: a write never fails
/// or waits; when the reader falls behind, the oldest samples are dropped (and counted).
///
/// Single producer, single consumer, lock-free. The writer never touches the
/// reader's index: it announces how far it is about to write (`reserved`),
/// writes, then publishes (`committed`). The reader copies what is committed and
/// then checks `reserved`: if the writer has meanwhile lapped into the copied
/// range, those samples may be torn, so the reader skips past them and copies
/// again (a seqlock-style check). Dropping the oldest therefore happens on the
/// reader's side, which counts it.
public final class AudioRing: @unchecked Sendable {
    public let capacity: Int
    private let buffer: UnsafeMutablePointer<Int16>
    private let reserved = Atomic<Int>(0)
    private let committed = Atomic<Int>(0)
    private let readIndex = Atomic<Int>(0)
    private let dropped = Atomic<Int>(0)

    public init(capacity: Int) {
        self.capacity = max(capacity, 1)
        buffer = .allocate(capacity: self.capacity)
        buffer.initialize(repeating: 0, count: self.capacity)
    }

    deinit { buffer.deallocate() }

    /// Samples waiting to be read (at most `capacity`).
    public var count: Int {
        min(committed.load(ordering: .acquiring) - readIndex.load(ordering: .acquiring), capacity)
    }

    /// Samples dropped because the ring was full when they were due to be read.
    public var droppedSamples: Int { dropped.load(ordering: .relaxed) }

    /// Producer: appends `samples`; when more than `capacity` arrive at once only the newest are kept.
    public func write(_ samples: UnsafeBufferPointer<Int16>) {
        guard let base = samples.baseAddress, !samples.isEmpty else { return }
        let w = committed.load(ordering: .relaxed)
        let total = samples.count
        reserved.store(w + total, ordering: .relaxed)
        atomicMemoryFence(ordering: .releasing)
        // Only the last `capacity` samples can survive; the earlier ones count as dropped when read.
        let skip = max(0, total - capacity)
        var index = (w + skip) % capacity
        var i = skip
        while i < total {
            let run = min(total - i, capacity - index)
            (buffer + index).update(from: base + i, count: run)
            i += run
            index = (index + run) % capacity
        }
        committed.store(w + total, ordering: .releasing)
    }

    /// Consumer: copies up to `output.count` of the oldest kept samples; returns how many.
    public func read(into output: UnsafeMutableBufferPointer<Int16>) -> Int {
        guard let out = output.baseAddress, !output.isEmpty else { return 0 }
        var r = readIndex.load(ordering: .relaxed)
        while true {
            let w = committed.load(ordering: .acquiring)
            if w - r > capacity {
                dropped.wrappingAdd(w - r - capacity, ordering: .relaxed)
                r = w - capacity
            }
            let n = min(output.count, w - r)
            if n == 0 {
                readIndex.store(r, ordering: .releasing)
                return 0
            }
            var copied = 0
            var index = r % capacity
            while copied < n {
                let run = min(n - copied, capacity - index)
                (out + copied).update(from: buffer + index, count: run)
                copied += run
                index = (index + run) % capacity
            }
            atomicMemoryFence(ordering: .acquiring)
            let lapped = reserved.load(ordering: .relaxed) - capacity - r
            if lapped > 0 {
                // The writer overwrote (part of) what was copied: drop it and copy again.
                dropped.wrappingAdd(min(lapped, n), ordering: .relaxed)
                r += min(lapped, n)
                continue
            }
            readIndex.store(r + n, ordering: .releasing)
            return n
        }
    }
}
