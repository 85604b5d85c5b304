// The C reference forwarder (Benchmarks/Sources/room-forward) as the server: the machine's
// limit for room forwarding. Members have no handshake and no room core: a member joins
// with one datagram ('J', room), resent until acknowledged, and its key is derived from
// its address as room-forward derives it. A speaker's frame is a datagram of the length
// tusa's party relay carries ('M', the phase tag, a counter, ChaCha20-Poly1305 over the
// phase stamp and padding); deliveries are opened with the member's key and counted (one
// in --open-every, the others counted by the tag), as the party members open theirs.
import BenchSodium
import BenchSupport

#if canImport(Glibc)
    import Glibc
#endif

final class ReferenceLoad: RoomLoad {
    static let header = 12
    static let tag = 16

    let datagram: Int
    /// Every member's key, 32 bytes each.
    var keys: UnsafeMutablePointer<UInt8>
    var counters: [UInt64]
    var joined: [Bool]
    var joinSentAt: [Double]
    let plain: UnsafeMutableRawBufferPointer
    let opened: UnsafeMutableRawBufferPointer
    let nonceBytes: UnsafeMutablePointer<UInt8>

    /// `datagram`: bytes on the wire per frame, at least header + 4 + tag.
    init(rooms: Int, size: Int, speakers: Int, rate: Double, datagram: Int, relay: (ip: UInt32, port: UInt16), net: UInt32) {
        self.datagram = datagram
        counters = Array(repeating: 0, count: rooms * size)
        joined = Array(repeating: false, count: rooms * size)
        joinSentAt = Array(repeating: -1, count: rooms * size)
        plain = .allocate(byteCount: 2048, alignment: 16)
        plain.initializeMemory(as: UInt8.self, repeating: 0)
        opened = .allocate(byteCount: 2048, alignment: 16)
        nonceBytes = .allocate(capacity: 12)
        nonceBytes.initialize(repeating: 0, count: 12)
        keys = .allocate(capacity: rooms * size * 32)
        super.init(rooms: rooms, size: size, speakers: speakers, rate: rate, relay: relay, net: net)
        if sodium_init() < 0 { fail("libsodium did not initialise") }
        let port = localPort(socket)
        for i in 0..<memberCount {
            (keys + 32 * i).initialize(from: Self.key(ip: ip(of: i), port: port), count: 32)
        }
    }

    /// room-forward's key for a member: BLAKE2b-256 of "room-forward", the IPv4 address and the port.
    static func key(ip: UInt32, port: UInt16) -> [UInt8] {
        var input = Array("room-forward".utf8)
        input += [UInt8(ip >> 24), UInt8(ip >> 16 & 255), UInt8(ip >> 8 & 255), UInt8(ip & 255)]
        input += [UInt8(port >> 8), UInt8(port & 255)]
        var key = [UInt8](repeating: 0, count: 32)
        _ = crypto_generichash(&key, 32, input, UInt64(input.count), nil, 0)
        return key
    }

    /// The nonce of the frame whose header is at `header`: 4 zero bytes and its counter.
    func nonce(_ header: UnsafeRawPointer) -> UnsafeMutablePointer<UInt8> {
        (nonceBytes + 4).update(from: header.assumingMemoryBound(to: UInt8.self) + 4, count: 8)
        return nonceBytes
    }

    // MARK: setup

    /// Every member's join acknowledged; false on timeout.
    func setUp(joinRate: Double, timeout: Double) -> (ok: Bool, seconds: Double, why: String) {
        let begin = monotonicSeconds()
        while true {
            let now = monotonicSeconds()
            if now - begin > timeout {
                return (false, now - begin, "\(joined.filter { $0 }.count) of \(memberCount) joined")
            }
            let due = min(memberCount, Int((now - begin) * joinRate) + 1)
            for i in 0..<due where !joined[i] && (joinSentAt[i] < 0 || now - joinSentAt[i] > 0.5) {
                joinSentAt[i] = now
                let room = UInt32(i / size)
                let join: [UInt8] = [
                    0x4A, 0, 0, 0, UInt8(room >> 24), UInt8(room >> 16 & 255), UInt8(room >> 8 & 255), UInt8(room & 255),
                ]
                join.withUnsafeBytes { queue($0, from: ip(of: i)) }
            }
            flush()
            receive()
            if due == memberCount && !joined.contains(false) { return (true, now - begin, "") }
            wait(ms: 1)
        }
    }

    // MARK: frames

    override func sendFrame(from index: Int, timestamp: UInt32, level: UInt8) -> Bool {
        let slot = nextSlot()
        guard let out = slot.baseAddress, datagram <= slot.count else { return false }
        let length = datagram - Self.header - Self.tag
        plain.storeBytes(of: timestamp.bigEndian, toByteOffset: 0, as: UInt32.self)
        // 'M', the phase tag (room-forward copies bytes 1-3 into every copy), 0, 0.
        out.storeBytes(of: (0x4D00_0000 | (timestamp >> 24) << 16).bigEndian, toByteOffset: 0, as: UInt32.self)
        out.storeBytes(of: counters[index].bigEndian, toByteOffset: 4, as: UInt64.self)
        counters[index] += 1
        let nonce = nonce(out)
        var sealed: UInt64 = 0
        let r = crypto_aead_chacha20poly1305_ietf_encrypt(
            out.assumingMemoryBound(to: UInt8.self) + Self.header, &sealed,
            plain.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(length),
            out.assumingMemoryBound(to: UInt8.self), UInt64(Self.header), nil, nonce, keys + 32 * index)
        guard r == 0 else { return false }
        enqueueSlot(length: Self.header + Int(sealed), from: ip(of: index))
        return true
    }

    override func deliver(_ datagram: UnsafeMutableRawBufferPointer, to index: Int, seconds: Double) {
        guard let p = datagram.baseAddress, datagram.count >= 8 else { return }
        let kind = datagram[0]
        if kind == 0x41, datagram.count == 8 {  // 'A': a join acknowledged
            joined[index] = true
            return
        }
        guard kind == 0x4D, datagram.count >= Self.header + 4 + Self.tag else { return }
        if openEvery > 1, datagram[1] != 0, !sampled() {
            countDelivery(stamp: UInt32(datagram[1]) << 24)
            return
        }
        let nonce = nonce(p)
        var length: UInt64 = 0
        let r = crypto_aead_chacha20poly1305_ietf_decrypt(
            opened.baseAddress!.assumingMemoryBound(to: UInt8.self), &length, nil,
            p.assumingMemoryBound(to: UInt8.self) + Self.header, UInt64(datagram.count - Self.header),
            p.assumingMemoryBound(to: UInt8.self), UInt64(Self.header), nonce, keys + 32 * index)
        guard r == 0, length >= 4 else {
            if counting { counts.openFailed += 1 }
            return
        }
        if counting { counts.opened += 1 }
        countDelivery(stamp: UInt32(bigEndian: opened.load(fromByteOffset: 0, as: UInt32.self)))
    }
}
