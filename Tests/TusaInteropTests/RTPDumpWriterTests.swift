import Testing
import TusaInterop

/// The rtptools rtpdump file `tusa interop decrypt --out` writes.
@Suite("rtpdump writer")
struct RTPDumpWriterTests {
    private func uint16(_ b: [UInt8], _ i: Int) -> Int { Int(b[i]) << 8 | Int(b[i + 1]) }
    private func uint32(_ b: [UInt8], _ i: Int) -> Int { uint16(b, i) << 16 | uint16(b, i + 2) }

    @Test("nothing written: an empty file")
    func empty() {
        let dump = RTPDumpWriter()
        #expect(dump.bytes.isEmpty)
        #expect(dump.count == 0)
    }

    @Test("the text line and the file header carry the first packet's time")
    func fileHeader() {
        var dump = RTPDumpWriter()
        dump.add([0x80, 0x00, 0x00, 0x01], at: 1_700_000_000.25)
        let line = Array("#!rtpplay1.0 0.0.0.0/0\n".utf8)
        #expect(Array(dump.bytes.prefix(line.count)) == line)
        let header = Array(dump.bytes[line.count..<line.count + 16])
        #expect(uint32(header, 0) == 1_700_000_000)  // start seconds
        #expect(uint32(header, 4) == 250_000)  // start microseconds
        #expect(uint32(header, 8) == 0)  // source address
        #expect(uint16(header, 12) == 0)  // port
        #expect(uint16(header, 14) == 0)  // padding
    }

    @Test("each packet: record length, packet length, milliseconds since the start, the bytes")
    func records() {
        var dump = RTPDumpWriter()
        let first: [UInt8] = [0x80, 0x00, 0x00, 0x01, 0xAA]
        let second: [UInt8] = [0x80, 0x00, 0x00, 0x02, 0xBB, 0xCC]
        dump.add(first, at: 100.0)
        dump.add(second, at: 100.0206)
        #expect(dump.count == 2)
        var at = "#!rtpplay1.0 0.0.0.0/0\n".utf8.count + 16
        let b = dump.bytes
        #expect(uint16(b, at) == first.count + 8)
        #expect(uint16(b, at + 2) == first.count)
        #expect(uint32(b, at + 4) == 0)
        #expect(Array(b[at + 8..<at + 8 + first.count]) == first)
        at += 8 + first.count
        #expect(uint16(b, at) == second.count + 8)
        #expect(uint16(b, at + 2) == second.count)
        #expect(uint32(b, at + 4) == 21)  // 20.6 ms, rounded
        #expect(Array(b[(at + 8)...]) == second)
    }

    @Test("a packet too long for a record is skipped")
    func tooLong() {
        var dump = RTPDumpWriter()
        dump.add([UInt8](repeating: 0x80, count: RTPDumpWriter.maximumPacketLength + 1), at: 5)
        #expect(dump.count == 0)
        dump.add([UInt8](repeating: 0x80, count: RTPDumpWriter.maximumPacketLength), at: 5)
        #expect(dump.count == 1)
    }

    /// A capture's times are the file's to say: a pcapng block's resolution and offset
    /// can put them past any Int, or make them NaN. Each packet is still written, its
    /// times held to their fields.
    @Test("times beyond any clock are held to their fields, never a crash")
    func timesBeyondAnyClock() {
        var dump = RTPDumpWriter()
        let times: [Double] = [1e30, .nan, -1e30, .infinity, -.infinity, 1e19, 3]
        for t in times { dump.add([0x80, 0x00, 0x00, 0x01], at: t) }
        #expect(dump.count == times.count)
        let line = "#!rtpplay1.0 0.0.0.0/0\n".utf8.count
        #expect(uint32(dump.bytes, line) == Int(UInt32.max))  // start seconds, held
        // The second record (NaN) is 0 ms on; the third (far before the start) 0 too.
        #expect(uint32(dump.bytes, line + 16 + 12 + 4) == 0)
    }
}
