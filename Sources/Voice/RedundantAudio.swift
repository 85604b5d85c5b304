/// Redundant audio, RFC 2198 ("red"): each packet carries the previous one or two
/// encoded frames beside its own, so a burst of up to that many lost packets is
/// rebuilt from the packet after it, where in-band FEC rebuilds only the last frame
/// of a burst.
///
/// Payload layout: a 4-byte header per redundant block (F = 1, the block's payload
/// type in 7 bits, its timestamp offset back from the primary in 14 bits, its length
/// in 10 bits), a 1-byte header for the primary (F = 0, its payload type), then the
/// redundant blocks' bytes, oldest first, then the primary's.
///
/// Pure: it reads and writes caller-owned buffers and allocates nothing.
public enum RedundantAudio {
    /// The most previous frames a packet carries.
    public static let maximumDepth = 2
    /// Longest block a header can name (10 bits).
    public static let maximumBlockLength = 1023
    /// Largest timestamp offset a header can name (14 bits).
    public static let maximumOffset: UInt32 = 0x3FFF

    /// Header bytes of a RED payload with `redundant` redundant blocks (4 each, and 1 for the primary).
    public static func overhead(redundant: Int) -> Int { 4 * redundant + 1 }

    /// A previous frame to carry again: its bytes and its timestamp offset back from the primary.
    public struct Block {
        public var offset: UInt32
        public var bytes: UnsafeRawBufferPointer
        public init(offset: UInt32, bytes: UnsafeRawBufferPointer) {
            self.offset = offset
            self.bytes = bytes
        }
    }

    /// Writes a RED payload into `out`: `older` and `previous` (the frame two packets
    /// back and the one just before, either absent), then `primary`. Returns the
    /// bytes written.
    public static func write(
        primary: UnsafeRawBufferPointer, payloadType: UInt8, older: Block? = nil, previous: Block? = nil,
        into out: UnsafeMutableRawBufferPointer
    ) throws(VoiceError) -> Int {
        let blocks = (older == nil ? 0 : 1) + (previous == nil ? 0 : 1)
        let total = overhead(redundant: blocks) + primary.count + (older?.bytes.count ?? 0) + (previous?.bytes.count ?? 0)
        guard out.count >= total else { throw .bufferTooSmall(needed: total, available: out.count) }
        var at = 0
        func header(_ block: Block?) throws(VoiceError) {
            guard let block else { return }
            guard block.bytes.count <= maximumBlockLength, block.offset <= maximumOffset else {
                throw .invalidConfiguration("a redundant block of \(block.bytes.count) bytes at offset \(block.offset)")
            }
            let word = UInt32(0x8000_0000) | UInt32(payloadType & 0x7F) << 24 | block.offset << 10 | UInt32(block.bytes.count)
            for shift in stride(from: 24, through: 0, by: -8) {
                out[at] = UInt8(truncatingIfNeeded: word >> UInt32(shift))
                at += 1
            }
        }
        func data(_ bytes: UnsafeRawBufferPointer?) {
            guard let bytes, !bytes.isEmpty else { return }
            UnsafeMutableRawBufferPointer(rebasing: out[at..<(at + bytes.count)]).copyMemory(from: bytes)
            at += bytes.count
        }
        try header(older)
        try header(previous)
        out[at] = payloadType & 0x7F
        at += 1
        data(older?.bytes)
        data(previous?.bytes)
        data(primary)
        return at
    }

    /// Calls `body` for each block of a RED payload, the redundant ones first
    /// (oldest first) with their timestamp offset back from the primary and how many
    /// packets back they were sent (`back`: 1 the one before), then the primary
    /// (offset 0, `back` 0). Throws, calling nothing, when the payload is not RED.
    public static func forEachBlock(
        _ payload: UnsafeRawBufferPointer,
        _ body: (_ offset: UInt32, _ back: Int, _ bytes: UnsafeRawBufferPointer) -> Void
    ) throws(VoiceError) {
        // First pass: headers and lengths check out.
        var at = 0
        var redundant = 0
        var lengths = 0
        while true {
            guard at < payload.count else { throw .invalidPacket("a redundant-audio payload cut inside its headers") }
            if payload[at] & 0x80 == 0 {
                at += 1
                break
            }
            guard at + 4 <= payload.count else { throw .invalidPacket("a redundant-audio header cut short") }
            guard redundant < maximumDepth else { throw .invalidPacket("more than \(maximumDepth) redundant blocks") }
            lengths += (Int(payload[at + 2] & 0x03) << 8) | Int(payload[at + 3])
            redundant += 1
            at += 4
        }
        guard at + lengths <= payload.count else {
            throw .invalidPacket("redundant blocks of \(lengths) bytes in a payload of \(payload.count)")
        }
        // Second pass: the blocks.
        var data = at
        for index in 0..<redundant {
            let h = index * 4
            let offset = (UInt32(payload[h + 1]) << 6) | (UInt32(payload[h + 2]) >> 2)
            let length = (Int(payload[h + 2] & 0x03) << 8) | Int(payload[h + 3])
            body(offset, redundant - index, UnsafeRawBufferPointer(rebasing: payload[data..<(data + length)]))
            data += length
        }
        body(0, 0, UnsafeRawBufferPointer(rebasing: payload[data...]))
    }
}
