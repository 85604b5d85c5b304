import Foundation
import Testing
import TusaBase
import TusaInterop

// MARK: - Locations

/// `<package root>/../shared/interop/captures`, found from this file's path.
private let captureDirectory: URL = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent()  // InteropTests
    .deletingLastPathComponent()  // Tests
    .deletingLastPathComponent()  // package root
    .appendingPathComponent("../shared/interop/captures")
    .standardizedFileURL

private let captureSharedExists: Bool = FileManager.default.fileExists(atPath: captureDirectory.path)

/// The shared captures, by file name (empty when the folder is absent).
private let sharedCaptureNames: [String] = {
    let names = (try? FileManager.default.contentsOfDirectory(atPath: captureDirectory.path)) ?? []
    return names.filter { $0.hasSuffix(".pcapng") || $0.hasSuffix(".pcap") }.sorted()
}()

private let captureTsharkPath: String? = {
    var candidates = ["/usr/bin/tshark", "/usr/local/bin/tshark", "/opt/homebrew/bin/tshark"]
    if let path = ProcessInfo.processInfo.environment["PATH"] {
        candidates += path.split(separator: ":").map { "\($0)/tshark" }
    }
    return candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
}()

private func sharedCapturePath(_ name: String) -> String {
    captureDirectory.appendingPathComponent(name).path
}

// MARK: - Real captures, cross-checked with tshark

@Suite(
    "Capture reader: shared interop captures",
    .enabled(if: captureSharedExists, "../shared/interop absent: shared capture tests skipped"))
struct CaptureReaderSharedTests: CaptureFixtures {
    @Test("reads every shared capture", arguments: sharedCaptureNames)
    func readsCapture(_ name: String) throws {
        let capture = try Capture.read(path: sharedCapturePath(name))
        #expect(capture.linkType == 1)
        #expect(capture.frameCount > 0)
        #expect(capture.skipped.isEmpty, "\(capture.skipped)")
        #expect(!capture.udp.isEmpty || !capture.tcpStreams.isEmpty)
        for datagram in capture.udp {
            #expect(datagram.frame >= 1 && datagram.frame <= capture.frameCount)
            #expect(datagram.source.address == "127.0.0.1")
        }
    }

    @Test(
        "UDP datagrams match tshark", .enabled(if: captureTsharkPath != nil, "tshark not installed: cross-check skipped"),
        arguments: sharedCaptureNames)
    func udpMatchesTshark(_ name: String) async throws {
        let path = sharedCapturePath(name)
        let capture = try Capture.read(path: path)

        let frames = try await runTshark(["-r", path, "-T", "fields", "-e", "frame.number"])
        #expect(capture.frameCount == frames.split(separator: "\n").count)

        let filter = "udp && !icmp && !icmpv6 && !(ip.flags.mf == 1) && !(ip.frag_offset > 0)"
        let output = try await runTshark([
            "-r", path, "-T", "fields", "-E", "separator=/t",
            "-e", "frame.number", "-e", "udp.srcport", "-e", "udp.dstport", "-e", "udp.length", "-e", "udp.payload",
            "-Y", filter,
        ])
        let expected = output.split(separator: "\n").map(String.init)
        let actual = capture.udp.map { d in
            "\(d.frame)\t\(d.source.port)\t\(d.destination.port)\t\(d.payload.count + 8)\t\(hex(d.payload))"
        }
        #expect(actual.count == expected.count)
        #expect(actual == expected)
    }

    @Test(
        "TCP streams match tshark's follow", .enabled(if: captureTsharkPath != nil, "tshark not installed: cross-check skipped"),
        arguments: sharedCaptureNames)
    func tcpMatchesTshark(_ name: String) async throws {
        let path = sharedCapturePath(name)
        let capture = try Capture.read(path: path)
        let indices = Set(
            try await runTshark(["-r", path, "-T", "fields", "-e", "tcp.stream", "-Y", "tcp"])
                .split(separator: "\n").compactMap { Int($0) }
        ).sorted()
        let ourConnections = Set(capture.tcpStreams.map(\.connection)).sorted()
        #expect(ourConnections == indices)

        for index in indices {
            let follow = try await runTshark(["-r", path, "-q", "-z", "follow,tcp,raw,\(index)"])
            let (node0, node1, data0, data1) = try #require(parseFollow(follow))
            let streams = capture.tcpStreams.filter { $0.connection == index }
            let forward = streams.first { $0.source.description == node0 && $0.destination.description == node1 }
            let backward = streams.first { $0.source.description == node1 && $0.destination.description == node0 }
            #expect(forward != nil || data0.isEmpty, "stream \(index): no \(node0) → \(node1) direction")
            #expect((forward?.data ?? []).count == data0.count, "stream \(index) \(node0) → \(node1)")
            #expect((forward?.data ?? []) == data0)
            #expect((backward?.data ?? []).count == data1.count, "stream \(index) \(node1) → \(node0)")
            #expect((backward?.data ?? []) == data1)
            for stream in streams {
                #expect(stream.gaps == 0 && stream.missingBytes == 0)
                #expect(stream.synSeen)
                if !stream.data.isEmpty {
                    #expect(stream.chunks.first?.offset == 0)
                    #expect(stream.frame(at: 0) == stream.chunks.first?.frame)
                }
            }
        }
    }

    @Test("TCP chunks point at the frames tshark reports", .enabled(if: captureTsharkPath != nil, "tshark not installed"))
    func tcpChunkFrames() async throws {
        let path = sharedCapturePath("coturn-tcp-control.pcapng")
        try #require(FileManager.default.fileExists(atPath: path))
        let capture = try Capture.read(path: path)
        let output = try await runTshark([
            "-r", path, "-T", "fields", "-e", "frame.number", "-e", "tcp.len", "-Y", "tcp.len > 0",
        ])
        let expected = output.split(separator: "\n").compactMap { line -> Int? in
            Int(line.split(separator: "\t").first ?? "")
        }
        let ours = capture.tcpStreams.flatMap { $0.chunks.map(\.frame) }.sorted()
        #expect(ours == expected)
        #expect(capture.tcpSegments.filter { !$0.payload.isEmpty }.map(\.frame) == expected)
    }
}

// MARK: - Errors

@Suite("Capture reader: errors")
struct CaptureReaderErrorTests: CaptureFixtures {
    @Test("a missing file is fileNotFound")
    func missingFile() {
        let error = readError("/nonexistent/tusa/capture.pcapng")
        #expect(error?.code == .fileNotFound)
        #expect(error?.description.contains("not found") == true)
    }

    @Test("a directory is unreadable")
    func directory() {
        #expect(readError(FileManager.default.temporaryDirectory.path)?.code == .unreadable)
    }

    @Test("a text file is not a capture")
    func textFile() throws {
        let path = try temporaryFile(Array("GET / HTTP/1.1\r\nHost: example.org\r\n\r\n".utf8))
        defer { try? FileManager.default.removeItem(atPath: path) }
        let error = readError(path)
        #expect(error?.code == .notACapture)
        #expect(error?.message.contains("not a pcap") == true)
    }

    @Test("an all-zero file and an empty file are not captures")
    func zeroAndEmpty() throws {
        for bytes in [[UInt8](repeating: 0, count: 4096), [], [0x0a]] {
            let path = try temporaryFile(bytes)
            defer { try? FileManager.default.removeItem(atPath: path) }
            let error = readError(path)
            #expect(error != nil, "\(bytes.count) bytes")
            #expect(error?.code == .notACapture, "\(String(describing: error))")
        }
    }

    @Test("a truncated pcapng is a typed error", .enabled(if: captureSharedExists, "../shared/interop absent"))
    func truncatedPcapng() throws {
        let original = try Array(Data(contentsOf: URL(fileURLWithPath: sharedCapturePath("coturn-binding.pcapng"))))
        // Inside the section header block, inside the interface block, inside the last packet block.
        for length in [12, 100, 170, 200, original.count - 1] {
            let path = try temporaryFile(Array(original.prefix(length)))
            defer { try? FileManager.default.removeItem(atPath: path) }
            let error = readError(path)
            #expect(error?.code == .truncated, "cut at \(length): \(String(describing: error))")
        }
        // Cut inside the last Enhanced Packet Block: the error names that frame.
        var offset = 0
        var packetBlocks: [(start: Int, length: Int)] = []
        while offset + 8 <= original.count {
            let type = original[offset..<offset + 4].reversed().reduce(0) { $0 << 8 | Int($1) }
            let length = original[offset + 4..<offset + 8].reversed().reduce(0) { $0 << 8 | Int($1) }
            guard length >= 12 else { break }
            if type == 6 { packetBlocks.append((offset, length)) }
            offset += length
        }
        let last = try #require(packetBlocks.last)
        #expect(packetBlocks.count == 2)
        let path = try temporaryFile(Array(original.prefix(last.start + last.length / 2)))
        defer { try? FileManager.default.removeItem(atPath: path) }
        let error = readError(path)
        #expect(error?.code == .truncated)
        #expect(error?.frame == 2, "the second record is the incomplete one")
        #expect(error?.description.contains("frame 2") == true)
    }

    @Test("a truncated classic pcap names the frame")
    func truncatedClassic() throws {
        let frame = ethernet(
            type: 0x0800, ipv4(src: [10, 0, 0, 1], dst: [10, 0, 0, 2], proto: 17, payload: udp(1, 2, [1, 2, 3])))
        let file = pcap(linkType: 1, records: [CaptureTestRecord(frame), CaptureTestRecord(frame)])
        let path = try temporaryFile(Array(file.dropLast(5)))
        defer { try? FileManager.default.removeItem(atPath: path) }
        let error = readError(path)
        #expect(error?.code == .truncated)
        #expect(error?.frame == 2)
    }

    @Test("an absurd record length is a typed error")
    func absurdRecordLength() throws {
        var file = pcap(linkType: 1, records: [CaptureTestRecord([1, 2, 3, 4])])
        // Record header at 24: ts_sec, ts_usec, incl_len, orig_len (little-endian).
        file.replaceSubrange(32..<40, with: le32(0x7FFF_FFF0) + le32(0x7FFF_FFF0))
        let path = try temporaryFile(file)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let error = readError(path)
        #expect(error?.code == .malformed || error?.code == .truncated, "\(String(describing: error))")
        #expect(error?.frame == 1)
    }

    @Test("an unsupported link type is rejected with its number")
    func unsupportedLinkType() throws {
        let path = try temporaryFile(pcap(linkType: 147, records: [CaptureTestRecord([1, 2, 3])]))
        defer { try? FileManager.default.removeItem(atPath: path) }
        let error = readError(path)
        #expect(error?.code == .unsupportedLinkType)
        #expect(error?.message.contains("147") == true)
    }

    @Test("random and mutated input never crashes")
    func randomInput() throws {
        var rng = SplitMix64(seed: 0x7475_7361)
        // Random frames behind every supported link type exercise the header bounds checks.
        for linkType: UInt32 in [0, 1, 12, 101, 108, 113, 228, 229, 276] {
            var records: [CaptureTestRecord] = []
            let templates: [[UInt8]] = [
                ethernet(
                    type: 0x8100,
                    [0, 1, 0x08, 0x00]
                        + ipv4(src: [1, 2, 3, 4], dst: [5, 6, 7, 8], proto: 6, payload: tcp(1, 2, seq: 1, flags: 0x18, [9]))),
                ipv6(src: loopback6, dst: loopback6, next: 0, payload: [17, 0, 1, 4, 0, 0, 0, 0] + udp(1, 2, [7])),
                ipv4(src: [1, 2, 3, 4], dst: [5, 6, 7, 8], proto: 17, payload: udp(1, 2, [1, 2])),
            ]
            for _ in 0..<400 {
                var bytes = templates[Int(rng.next() % UInt64(templates.count))]
                let prefix = Int(rng.next() % 24)
                bytes = (0..<prefix).map { _ in UInt8(truncatingIfNeeded: rng.next()) } + bytes
                for _ in 0..<Int(rng.next() % 6) where !bytes.isEmpty {
                    bytes[Int(rng.next() % UInt64(bytes.count))] = UInt8(truncatingIfNeeded: rng.next())
                }
                bytes = Array(bytes.prefix(Int(rng.next() % UInt64(bytes.count + 1))))
                records.append(CaptureTestRecord(bytes))
            }
            let path = try temporaryFile(pcap(linkType: linkType, records: records))
            defer { try? FileManager.default.removeItem(atPath: path) }
            let capture = try Capture.read(path: path)
            #expect(capture.frameCount == 400)
        }
        // Mutated shared captures: either a capture or a typed error.
        guard captureSharedExists else { return }
        let original = try Array(Data(contentsOf: URL(fileURLWithPath: sharedCapturePath("coturn-tcp-control.pcapng"))))
        for _ in 0..<150 {
            var bytes = original
            for _ in 0..<(1 + Int(rng.next() % 8)) {
                let index = 200 + Int(rng.next() % UInt64(bytes.count - 200))
                bytes[index] = UInt8(truncatingIfNeeded: rng.next())
            }
            let path = try temporaryFile(bytes)
            defer { try? FileManager.default.removeItem(atPath: path) }
            do {
                _ = try Capture.read(path: path)
            } catch {
                #expect(!error.message.isEmpty)
            }
        }
    }
}

// MARK: - Hand-written captures

@Suite("Capture reader: hand-written pcap files")
struct CaptureReaderHandWrittenTests: CaptureFixtures {
    @Test("classic pcap, Ethernet: padding, VLAN tags, IPv4 options, fragments, cut frames")
    func classicEthernet() throws {
        let a: [UInt8] = [192, 0, 2, 1]
        let b: [UInt8] = [192, 0, 2, 2]
        var padded = ethernet(type: 0x0800, ipv4(src: a, dst: b, proto: 17, payload: udp(5000, 3478, [0xDE, 0xAD])))
        padded += [UInt8](repeating: 0xEE, count: 60 - padded.count)  // Ethernet minimum frame
        let tagged = ethernet(
            type: 0x0800, vlans: [0x88A8, 0x8100],
            ipv4(src: a, dst: b, proto: 17, payload: udp(5001, 3478, [1, 2, 3]), options: [1, 1, 1, 0]))
        let moreFragments = ethernet(type: 0x0800, ipv4(src: a, dst: b, proto: 17, payload: udp(1, 2, [1]), fragment: 0x2000))
        let laterFragment = ethernet(
            type: 0x0800, ipv4(src: a, dst: b, proto: 17, payload: [1, 2, 3, 4, 5, 6, 7, 8], fragment: 185))
        let arp = ethernet(type: 0x0806, [UInt8](repeating: 0, count: 28))
        let full = ethernet(type: 0x0800, ipv4(src: a, dst: b, proto: 17, payload: udp(1, 2, [UInt8](repeating: 7, count: 40))))
        let icmp = ethernet(type: 0x0800, ipv4(src: a, dst: b, proto: 1, payload: [8, 0, 0, 0, 0, 0, 0, 0]))
        let v6 = ethernet(type: 0x86DD, ipv6(src: loopback6, dst: loopback6, next: 17, payload: udp(5002, 3478, [9, 9])))
        let file = pcap(
            linkType: 1,
            records: [
                CaptureTestRecord(padded, seconds: 1_700_000_000, fraction: 250_000),
                CaptureTestRecord(tagged),
                CaptureTestRecord(moreFragments),
                CaptureTestRecord(laterFragment),
                CaptureTestRecord(arp),
                CaptureTestRecord(Array(full.prefix(30)), originalLength: full.count),
                CaptureTestRecord(icmp),
                CaptureTestRecord(v6),
            ])
        let path = try temporaryFile(file)
        defer { try? FileManager.default.removeItem(atPath: path) }

        let capture = try Capture.read(path: path)
        #expect(capture.linkType == 1)
        #expect(capture.frameCount == 8)
        #expect(capture.udp.map(\.frame) == [1, 2, 8])
        let first = try #require(capture.udp.first)
        #expect(first.payload == [0xDE, 0xAD])
        #expect(first.source == CaptureEndpoint(address: "192.0.2.1", port: 5000))
        #expect(first.destination.description == "192.0.2.2:3478")
        #expect(abs(first.timestamp - 1_700_000_000.25) < 1e-6)
        #expect(capture.udp[1].payload == [1, 2, 3])
        #expect(capture.udp[1].source.port == 5001)
        #expect(capture.udp[2].source.description == "[::1]:5002")
        #expect(capture.udp[2].payload == [9, 9])
        #expect(capture.skipped.map(\.frame) == [3, 4, 6])
        #expect(capture.skipped[0].reason.contains("fragment"))
        #expect(capture.skipped[1].reason.contains("offset 1480"))
        #expect(capture.skipped[2].reason.contains("snapshot"))
        #expect(capture.tcpStreams.isEmpty)
    }

    @Test("LINKTYPE_RAW: IPv6 extension headers, IPv6 fragments, IPv4")
    func rawIP() throws {
        let src: [UInt8] = [0x20, 0x01, 0x0D, 0xB8] + [UInt8](repeating: 0, count: 11) + [1]
        let dst: [UInt8] = [0x20, 0x01, 0x0D, 0xB8, 0, 0, 0, 0, 0, 0x11, 0, 0, 0, 0, 0, 2]
        // Hop-by-hop (8) → routing (8) → destination options (16) → UDP.
        let extensions: [UInt8] =
            [43, 0, 1, 4, 0, 0, 0, 0]
            + [60, 0, 0, 0, 0, 0, 0, 0]
            + [17, 1, 1, 12] + [UInt8](repeating: 0, count: 12)
        let withExtensions = ipv6(src: src, dst: dst, next: 0, payload: extensions + udp(40000, 3478, Array("stun".utf8)))
        let fragment = ipv6(src: src, dst: dst, next: 44, payload: [17, 0, 0x05, 0xC9, 0, 0, 0, 1] + [1, 2, 3, 4])
        let v4 = ipv4(src: [127, 0, 0, 1], dst: [127, 0, 0, 1], proto: 17, payload: udp(1, 2, [5]))
        let path = try temporaryFile(
            pcap(linkType: 101, records: [CaptureTestRecord(withExtensions), CaptureTestRecord(fragment), CaptureTestRecord(v4)]))
        defer { try? FileManager.default.removeItem(atPath: path) }

        let capture = try Capture.read(path: path)
        #expect(capture.frameCount == 3)
        #expect(capture.udp.count == 2)
        let first = try #require(capture.udp.first)
        #expect(first.source.description == "[2001:db8::1]:40000")
        #expect(first.destination.address == "2001:db8::11:0:0:2")  // RFC 5952: first of two equal zero runs
        #expect(first.payload == Array("stun".utf8))
        #expect(capture.udp.last?.source.description == "127.0.0.1:1")
        #expect(capture.skipped.map(\.frame) == [2])
        #expect(capture.skipped.first?.reason.contains("IPv6 fragment at offset 1480") == true)
    }

    @Test("Linux cooked, BSD loopback and LINKTYPE_IPV4/IPV6 link layers")
    func otherLinkTypes() throws {
        let packet4 = ipv4(src: [10, 1, 2, 3], dst: [10, 3, 2, 1], proto: 17, payload: udp(1111, 2222, [0xAB]))
        let packet6 = ipv6(src: loopback6, dst: loopback6, next: 17, payload: udp(1111, 2222, [0xAB]))
        let sll: [UInt8] = be16(0) + be16(772) + be16(0) + [UInt8](repeating: 0, count: 8) + be16(0x0800)
        let sll2: [UInt8] = be16(0x86DD) + be16(0) + be32(1) + be16(772) + [0, 0] + [UInt8](repeating: 0, count: 8)
        let cases: [(UInt32, [UInt8], String)] = [
            (113, sll + packet4, "10.1.2.3:1111"),
            (276, sll2 + packet6, "[::1]:1111"),
            (0, le32(2) + packet4, "10.1.2.3:1111"),  // DLT_NULL, little-endian host
            (0, be32(2) + packet4, "10.1.2.3:1111"),  // DLT_NULL, big-endian host
            (0, le32(30) + packet6, "[::1]:1111"),  // Darwin AF_INET6
            (108, be32(24) + packet6, "[::1]:1111"),  // DLT_LOOP
            (228, packet4, "10.1.2.3:1111"),
            (229, packet6, "[::1]:1111"),
        ]
        for (linkType, frame, source) in cases {
            let path = try temporaryFile(pcap(linkType: linkType, records: [CaptureTestRecord(frame)]))
            defer { try? FileManager.default.removeItem(atPath: path) }
            let capture = try Capture.read(path: path)
            #expect(capture.udp.count == 1, "link type \(linkType)")
            #expect(capture.udp.first?.source.description == source, "link type \(linkType)")
            #expect(capture.udp.first?.payload == [0xAB], "link type \(linkType)")
            #expect(capture.skipped.isEmpty, "link type \(linkType): \(capture.skipped)")
        }
    }

    @Test("nanosecond pcap timestamps")
    func nanosecondTimestamps() throws {
        let frame = ipv4(src: [1, 1, 1, 1], dst: [2, 2, 2, 2], proto: 17, payload: udp(1, 2, []))
        let path = try temporaryFile(
            pcap(
                linkType: 228, records: [CaptureTestRecord(frame, seconds: 1_000, fraction: 123_456_789)], nanosecond: true))
        defer { try? FileManager.default.removeItem(atPath: path) }
        let capture = try Capture.read(path: path)
        #expect(abs((capture.udp.first?.timestamp ?? 0) - 1_000.123456789) < 1e-7)
        #expect(capture.udp.first?.payload == [])
    }

    @Test("TCP reassembly: order, retransmission, overlap, hole, 4-tuple reuse")
    func tcpReassemblyFromFile() throws {
        let c: [UInt8] = [10, 0, 0, 1]
        let s: [UInt8] = [10, 0, 0, 2]
        func up(_ seq: UInt32, _ flags: UInt8, _ payload: String = "") -> CaptureTestRecord {
            CaptureTestRecord(
                ethernet(
                    type: 0x0800,
                    ipv4(src: c, dst: s, proto: 6, payload: tcp(40000, 3478, seq: seq, flags: flags, Array(payload.utf8)))))
        }
        func down(_ seq: UInt32, _ flags: UInt8, _ payload: String = "") -> CaptureTestRecord {
            CaptureTestRecord(
                ethernet(
                    type: 0x0800,
                    ipv4(src: s, dst: c, proto: 6, payload: tcp(3478, 40000, seq: seq, flags: flags, Array(payload.utf8)))))
        }
        let syn: UInt8 = 0x02
        let ack: UInt8 = 0x10
        let fin: UInt8 = 0x01
        let psh: UInt8 = 0x08
        let records = [
            up(1000, syn),  // 1
            down(5000, syn | ack),  // 2
            up(1001, ack),  // 3
            up(1006, psh | ack, "WORLD"),  // 4: out of order
            up(1001, psh | ack, "HELLO"),  // 5
            up(1001, psh | ack, "HELLO"),  // 6: retransmission
            up(1009, psh | ack, "LDxyz"),  // 7: overlaps "LD"
            up(1020, psh | ack, "tail"),  // 8: after a 6-byte hole
            down(5001, psh | ack, "ok"),  // 9
            up(1024, fin | ack),  // 10
            down(5003, fin | ack),  // 11
            up(9000, syn),  // 12: same 4-tuple, new connection
            down(7000, syn | ack),  // 13
            up(9001, psh | ack, "again"),  // 14
        ]
        let path = try temporaryFile(pcap(linkType: 1, records: records))
        defer { try? FileManager.default.removeItem(atPath: path) }
        let capture = try Capture.read(path: path)
        #expect(capture.tcpSegments.count == 14)
        #expect(capture.tcpSegments[1].flags == [.syn, .ack])
        #expect(capture.tcpStreams.count == 4)
        let streams = capture.tcpStreams
        try #require(streams.count == 4)

        let first = streams[0]
        #expect(first.connection == 0)
        #expect(first.source.description == "10.0.0.1:40000")
        #expect(String(decoding: first.data, as: UTF8.self) == "HELLOWORLDxyztail")
        #expect(
            first.chunks == [
                .init(offset: 0, frame: 5), .init(offset: 5, frame: 4), .init(offset: 10, frame: 7),
                .init(offset: 13, frame: 8, missingBefore: 6),
            ])
        #expect(first.gaps == 1 && first.missingBytes == 6)
        #expect(first.synSeen && first.closed)
        #expect(first.frame(at: 0) == 5 && first.frame(at: 9) == 4 && first.frame(at: 12) == 7 && first.frame(at: 16) == 8)
        #expect(first.frame(at: 17) == nil)

        #expect(streams[1].connection == 0)
        #expect(streams[1].source.description == "10.0.0.2:3478")
        #expect(streams[1].data == Array("ok".utf8))
        #expect(streams[1].chunks == [.init(offset: 0, frame: 9)])

        #expect(streams[2].connection == 1)
        #expect(streams[2].data == Array("again".utf8))
        #expect(streams[2].chunks == [.init(offset: 0, frame: 14)])
        #expect(streams[2].gaps == 0 && !streams[2].closed)
        #expect(streams[3].connection == 1 && streams[3].data.isEmpty && streams[3].synSeen)
    }
}

// MARK: - Reassembler directly

@Suite("TCP stream reassembler")
struct TCPStreamReassemblerTests: CaptureFixtures {
    private let a = CaptureEndpoint(address: "::1", port: 1)
    private let b = CaptureEndpoint(address: "::1", port: 2)

    private func segment(_ frame: Int, _ seq: UInt32, _ flags: CapturedSegment.Flags, _ payload: String) -> CapturedSegment {
        CapturedSegment(
            frame: frame, timestamp: 0, source: a, destination: b, sequence: seq, flags: flags,
            payload: Array(payload.utf8))
    }

    @Test("sequence numbers wrap around 2^32")
    func wraparound() {
        let streams = TCPStreamReassembler.reassemble([
            segment(1, 0xFFFF_FFFE, .syn, ""),
            segment(2, 1, .ack, "cd"),
            segment(3, 0xFFFF_FFFF, .ack, "ab"),
        ])
        #expect(streams.count == 1)
        #expect(String(decoding: streams[0].data, as: UTF8.self) == "abcd")
        #expect(streams[0].gaps == 0)
        #expect(streams[0].chunks.map(\.frame) == [3, 2])
    }

    @Test("a stream captured mid-way starts at its lowest sequence number")
    func midStream() {
        let streams = TCPStreamReassembler.reassemble([
            segment(1, 500, .ack, "bb"),
            segment(2, 498, .ack, "aa"),
            segment(3, 499, .ack, "ab"),
        ])
        #expect(String(decoding: streams.first?.data ?? [], as: UTF8.self) == "aabb")
        #expect(streams.first?.synSeen == false)
        #expect(streams.first?.gaps == 0)
    }

    @Test("a lost first segment after the SYN is a leading gap; SYN data is placed after the SYN")
    func leadingGapAndSynData() {
        let lost = TCPStreamReassembler.reassemble([segment(1, 100, .syn, ""), segment(2, 111, .ack, "x")])
        #expect(lost.first?.gaps == 1 && lost.first?.missingBytes == 10)
        #expect(lost.first?.chunks.first?.missingBefore == 10)

        let fastOpen = TCPStreamReassembler.reassemble([segment(1, 100, .syn, "hi"), segment(2, 103, .ack, "!")])
        #expect(fastOpen.first?.data == Array("hi!".utf8))
        #expect(fastOpen.first?.gaps == 0)
    }

    @Test("a SYN with a new initial sequence number starts a new connection; a repeated SYN does not")
    func synHandling() {
        let streams = TCPStreamReassembler.reassemble([
            segment(1, 100, .syn, ""),
            segment(2, 100, .syn, ""),
            segment(3, 101, .ack, "one"),
            segment(4, 900, .syn, ""),
            segment(5, 901, .ack, "two"),
        ])
        #expect(streams.map(\.connection) == [0, 1])
        #expect(streams.map { String(decoding: $0.data, as: UTF8.self) } == ["one", "two"])
    }
}

// MARK: - Helpers

private enum CaptureTsharkFailure: Error { case exit(Int32, String) }

struct CaptureTestRecord {
    var bytes: [UInt8]
    var originalLength: Int?
    var seconds: UInt32 = 1_700_000_000
    var fraction: UInt32 = 0

    init(_ bytes: [UInt8], originalLength: Int? = nil, seconds: UInt32 = 1_700_000_000, fraction: UInt32 = 0) {
        self.bytes = bytes
        self.originalLength = originalLength
        self.seconds = seconds
        self.fraction = fraction
    }
}

/// Helpers shared by the capture-reader suites; members, so they cannot clash with other test files.
protocol CaptureFixtures {}

extension CaptureFixtures {
    func readError(_ path: String) -> CaptureError? {
        do {
            _ = try Capture.read(path: path)
            return nil
        } catch {
            return error
        }
    }

    func temporaryFile(_ bytes: [UInt8]) throws -> String {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("tusa-capture-\(UUID().uuidString).pcap")
        try Data(bytes).write(to: url)
        return url.path
    }

    /// Runs tshark and returns its standard output (waiting off the cooperative pool).
    func runTshark(_ arguments: [String]) async throws -> String {
        try await Harness.offPool {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: captureTsharkPath ?? "/usr/bin/tshark")
            process.arguments = arguments
            let output = Pipe()
            process.standardOutput = output
            process.standardError = FileHandle.nullDevice
            try process.run()
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            let text = String(decoding: data, as: UTF8.self)
            guard process.terminationStatus == 0 else { throw CaptureTsharkFailure.exit(process.terminationStatus, text) }
            return text
        }
    }

    /// Parses `tshark -z follow,tcp,raw,N`: node 0 and node 1, then hex lines (indented by a
    /// tab when sent by node 1).
    func parseFollow(_ text: String) -> (String, String, [UInt8], [UInt8])? {
        var node0: String?
        var node1: String?
        var data0: [UInt8] = []
        var data1: [UInt8] = []
        for line in text.split(separator: "\n", omittingEmptySubsequences: true) {
            if line.hasPrefix("Node 0: ") {
                node0 = String(line.dropFirst(8))
            } else if line.hasPrefix("Node 1: ") {
                node1 = String(line.dropFirst(8))
            } else if node1 != nil, !line.hasPrefix("=") {
                let fromNode1 = line.hasPrefix("\t")
                guard let bytes = unhex(line.trimmingCharacters(in: .whitespaces)) else { return nil }
                if fromNode1 { data1 += bytes } else { data0 += bytes }
            }
        }
        guard let node0, let node1 else { return nil }
        return (node0, node1, data0, data1)
    }

    func hex(_ bytes: [UInt8]) -> String {
        bytes.map { String(format: "%02x", $0) }.joined()
    }

    func unhex(_ text: String) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var result: [UInt8] = []
        result.reserveCapacity(digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let byte = UInt8(String(decoding: digits[index..<index + 2], as: UTF8.self), radix: 16) else { return nil }
            result.append(byte)
            index += 2
        }
        return result
    }

    // Packet and file builders (checksums left zero: the reader does not verify them).

    var loopback6: [UInt8] { [UInt8](repeating: 0, count: 15) + [1] }

    func be16(_ value: UInt16) -> [UInt8] { [UInt8(value >> 8), UInt8(value & 0xFF)] }

    func be32(_ value: UInt32) -> [UInt8] { be16(UInt16(value >> 16)) + be16(UInt16(value & 0xFFFF)) }

    func le16(_ value: UInt16) -> [UInt8] { be16(value).reversed() }

    func le32(_ value: UInt32) -> [UInt8] { be32(value).reversed() }

    func udp(_ source: UInt16, _ destination: UInt16, _ payload: [UInt8]) -> [UInt8] {
        be16(source) + be16(destination) + be16(UInt16(8 + payload.count)) + be16(0) + payload
    }

    func tcp(_ source: UInt16, _ destination: UInt16, seq: UInt32, flags: UInt8, _ payload: [UInt8]) -> [UInt8] {
        be16(source) + be16(destination) + be32(seq) + be32(0) + [0x50, flags] + be16(65535) + be16(0) + be16(0) + payload
    }

    func ipv4(src: [UInt8], dst: [UInt8], proto: UInt8, payload: [UInt8], options: [UInt8] = [], fragment: UInt16 = 0) -> [UInt8]
    {
        let headerLength = 20 + options.count
        let versionIHL = UInt8(0x40 | (headerLength / 4))
        return [versionIHL, 0] + be16(UInt16(headerLength + payload.count)) + be16(0x1234) + be16(fragment)
            + [64, proto] + be16(0) + src + dst + options + payload
    }

    func ipv6(src: [UInt8], dst: [UInt8], next: UInt8, payload: [UInt8]) -> [UInt8] {
        [0x60, 0, 0, 0] + be16(UInt16(payload.count)) + [next, 64] + src + dst + payload
    }

    func ethernet(type: UInt16, vlans: [UInt16] = [], _ payload: [UInt8]) -> [UInt8] {
        var frame: [UInt8] = [2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1]
        for (index, tpid) in vlans.enumerated() {
            frame += be16(tpid) + be16(UInt16(100 + index))
        }
        return frame + be16(type) + payload
    }

    /// A classic little-endian pcap file.
    func pcap(linkType: UInt32, records: [CaptureTestRecord], nanosecond: Bool = false) -> [UInt8] {
        var file =
            le32(nanosecond ? 0xA1B2_3C4D : 0xA1B2_C3D4) + le16(2) + le16(4) + le32(0) + le32(0) + le32(65535) + le32(linkType)
        for record in records {
            file +=
                le32(record.seconds) + le32(record.fraction) + le32(UInt32(record.bytes.count))
                + le32(UInt32(record.originalLength ?? record.bytes.count)) + record.bytes
        }
        return file
    }
}
