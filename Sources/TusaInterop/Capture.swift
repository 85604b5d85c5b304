/// The UDP datagrams and TCP streams in a pcap or pcapng file.
///
/// ```swift
/// let capture = try Capture.read(path: "captures/coturn-binding.pcapng")
/// for datagram in capture.udp { print(datagram.frame, datagram.source, datagram.payload.count) }
/// ```
///
/// Supported link types: Ethernet (with up to two VLAN tags), Linux cooked (SLL, SLL2),
/// raw IP (DLT_RAW, LINKTYPE_RAW, LINKTYPE_IPV4, LINKTYPE_IPV6) and BSD loopback
/// (NULL, LOOP). IPv4 options and IPv6 hop-by-hop, routing, destination-options and
/// authentication headers are walked; IP fragments are not reassembled but listed in
/// ``skipped``. Protocols other than UDP and TCP are ignored.
public struct Capture: Sendable {
    /// The path the capture was read from.
    public var path: String
    /// The libpcap DLT value of the file's link layer (e.g. 1 for Ethernet).
    public var linkType: Int32
    /// The number of packet records in the file (the last frame number).
    public var frameCount: Int
    /// Every UDP datagram, in frame order.
    public var udp: [CapturedDatagram]
    /// Every TCP segment, in frame order, as captured (before reassembly).
    public var tcpSegments: [CapturedSegment]
    /// Reassembled TCP byte streams, one per direction of each connection.
    public var tcpStreams: [TCPStream]
    /// IP frames that could not be decoded, with the reason (fragments, malformed or cut headers).
    public var skipped: [SkippedFrame]

    /// Creates a capture from already decoded parts.
    public init(
        path: String, linkType: Int32, frameCount: Int, udp: [CapturedDatagram], tcpSegments: [CapturedSegment],
        tcpStreams: [TCPStream], skipped: [SkippedFrame]
    ) {
        self.path = path
        self.linkType = linkType
        self.frameCount = frameCount
        self.udp = udp
        self.tcpSegments = tcpSegments
        self.tcpStreams = tcpStreams
        self.skipped = skipped
    }

    /// Reads a whole pcap or pcapng file.
    ///
    /// - Throws: ``CaptureError`` when the file is missing or unreadable, is not a capture,
    ///   has an unsupported link type, or is truncated or malformed at some record. Problems
    ///   within a single packet do not throw; they are reported in ``skipped``.
    public static func read(path: String) throws(CaptureError) -> Capture {
        let reader = try CaptureReader(path: path)
        guard let link = LinkLayer(dlt: reader.linkType) else {
            throw CaptureError(
                code: .unsupportedLinkType, path: path,
                message: "unsupported link type \(reader.linkType)"
                    + " (supported: Ethernet 1, Linux SLL 113/SLL2 276, raw IP 12/14/101/228/229, BSD loopback 0/108)")
        }
        let decoder = PacketDecoder(link: link)
        var udp: [CapturedDatagram] = []
        var segments: [CapturedSegment] = []
        var skipped: [SkippedFrame] = []
        var reassembler = TCPStreamReassembler()
        while let record = try reader.next() {
            switch decoder.decode(
                frame: record.frame, timestamp: record.timestamp, bytes: record.bytes,
                originalLength: record.originalLength)
            {
            case .udp(let datagram):
                udp.append(datagram)
            case .tcp(let segment):
                segments.append(segment)
                reassembler.add(segment)
            case .ignored:
                break
            case .skipped(let reason):
                skipped.append(SkippedFrame(frame: record.frame, reason: reason))
            }
        }
        return Capture(
            path: path, linkType: reader.linkType, frameCount: reader.framesRead, udp: udp, tcpSegments: segments,
            tcpStreams: reassembler.streams(), skipped: skipped)
    }
}
