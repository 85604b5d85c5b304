/// Decodes one captured frame down to a UDP datagram or TCP segment.
///
/// Pure and bounds-checked: any header that does not fit, or is inconsistent, turns into
/// a `.skipped` verdict with a reason rather than a trap.
struct PacketDecoder: Sendable {
    let link: LinkLayer

    /// What a frame turned out to be.
    enum Verdict {
        case udp(CapturedDatagram)
        case tcp(CapturedSegment)
        /// Not UDP or TCP over IP: nothing to report.
        case ignored
        /// IP that could not be decoded; the reason says why.
        case skipped(String)
    }

    /// The parts of an IP header the transport decoders need.
    private struct Network {
        var source: String
        var destination: String
        var proto: UInt8
        var payload: ByteWindow
    }

    /// Decodes `bytes` (the captured part of a frame whose length on the wire was
    /// `originalLength`).
    func decode(frame: Int, timestamp: Double, bytes: [UInt8], originalLength: Int) -> Verdict {
        let cut = bytes.count < originalLength
        func short(_ what: String) -> Verdict {
            cut
                ? .skipped("\(what): frame cut by the snapshot length (\(bytes.count) of \(originalLength) bytes captured)")
                : .skipped("malformed: \(what)")
        }

        let network: Network
        switch link.payload(of: ByteWindow(bytes)) {
        case .other:
            return .ignored
        case .bad(let what):
            return short(what)
        case .ipv4(let window):
            switch Self.ipv4(window) {
            case .success(let n): network = n
            case .failure(let problem): return problem.fragment ? .skipped(problem.what) : short(problem.what)
            }
        case .ipv6(let window):
            switch Self.ipv6(window) {
            case .success(let n): network = n
            case .failure(let problem): return problem.fragment ? .skipped(problem.what) : short(problem.what)
            }
        }

        let isV6 = network.source.contains(":")
        let w = network.payload
        switch network.proto {
        case 17:
            guard let sport = w.u16(0), let dport = w.u16(2), let length = w.u16(4) else {
                return short("UDP header shorter than 8 bytes")
            }
            // A zero length is legal only for IPv6 jumbograms; take what the IP layer carries.
            let udpLength = length == 0 && isV6 ? w.count : Int(length)
            guard udpLength >= 8 else { return .skipped("malformed: UDP length \(udpLength) < 8") }
            guard let payload = w.copy(8, length: udpLength - 8) else {
                return short("UDP length \(udpLength) exceeds the \(w.count) bytes of IP payload")
            }
            return .udp(
                CapturedDatagram(
                    frame: frame, timestamp: timestamp,
                    source: CaptureEndpoint(address: network.source, port: sport),
                    destination: CaptureEndpoint(address: network.destination, port: dport),
                    payload: payload))
        case 6:
            guard let sport = w.u16(0), let dport = w.u16(2), let seq = w.u32(4), let ack = w.u32(8),
                let offsetByte = w.u8(12), let flagByte = w.u8(13), let window = w.u16(14), w.count >= 20
            else {
                return short("TCP header shorter than 20 bytes")
            }
            let headerLength = Int(offsetByte >> 4) * 4
            guard headerLength >= 20 else { return .skipped("malformed: TCP data offset \(headerLength) < 20") }
            guard let payload = w.dropping(headerLength) else {
                return short("TCP header length \(headerLength) exceeds the \(w.count) bytes of IP payload")
            }
            let flags = CapturedSegment.Flags(rawValue: UInt16(offsetByte & 1) << 8 | UInt16(flagByte))
            return .tcp(
                CapturedSegment(
                    frame: frame, timestamp: timestamp,
                    source: CaptureEndpoint(address: network.source, port: sport),
                    destination: CaptureEndpoint(address: network.destination, port: dport),
                    sequence: seq, acknowledgment: ack, flags: flags, window: window,
                    payload: payload.array()))
        default:
            return .ignored
        }
    }

    /// A reason an IP header could not be used. `fragment` problems are reported as they
    /// are; other problems are "malformed" or "cut by the snapshot length".
    private struct Problem: Error {
        var what: String
        var fragment = false
    }

    private static func ipv4(_ w: ByteWindow) -> Result<Network, Problem> {
        guard let first = w.u8(0) else { return .failure(Problem(what: "empty IPv4 packet")) }
        guard first >> 4 == 4 else { return .failure(Problem(what: "IPv4 header with version \(first >> 4)")) }
        let headerLength = Int(first & 0x0F) * 4
        guard headerLength >= 20 else { return .failure(Problem(what: "IPv4 header length \(headerLength) < 20")) }
        guard w.count >= headerLength, let total = w.u16(2), let fragmentField = w.u16(6), let proto = w.u8(9),
            let src = w.copy(12, length: 4), let dst = w.copy(16, length: 4)
        else {
            return .failure(Problem(what: "IPv4 header (\(headerLength) bytes) longer than the \(w.count) bytes present"))
        }
        // Total length 0 is what segmentation offload leaves in locally captured packets.
        let totalLength = total == 0 ? w.count : Int(total)
        guard totalLength >= headerLength else {
            return .failure(Problem(what: "IPv4 total length \(totalLength) < header length \(headerLength)"))
        }
        // Trimming to the total length drops Ethernet padding.
        guard let datagram = w.prefix(totalLength), let payload = datagram.dropping(headerLength) else {
            return .failure(Problem(what: "IPv4 total length \(totalLength) exceeds the \(w.count) bytes present"))
        }
        let offset = Int(fragmentField & 0x1FFF) * 8
        if offset != 0 {
            return .failure(Problem(what: "IPv4 fragment at offset \(offset) (non-first fragment)", fragment: true))
        }
        if fragmentField & 0x2000 != 0 {
            return .failure(Problem(what: "IPv4 fragmented datagram (first fragment; not reassembled)", fragment: true))
        }
        return .success(
            Network(
                source: IPAddressText.ipv4(src), destination: IPAddressText.ipv4(dst), proto: proto, payload: payload))
    }

    private static func ipv6(_ w: ByteWindow) -> Result<Network, Problem> {
        guard let first = w.u8(0) else { return .failure(Problem(what: "empty IPv6 packet")) }
        guard first >> 4 == 6 else { return .failure(Problem(what: "IPv6 header with version \(first >> 4)")) }
        guard let payloadLength = w.u16(4), var next = w.u8(6),
            let src = w.copy(8, length: 16), let dst = w.copy(24, length: 16)
        else {
            return .failure(Problem(what: "IPv6 header shorter than 40 bytes"))
        }
        // Payload length 0: a jumbogram or an offloaded segment; use what is present.
        let total = payloadLength == 0 ? w.count : 40 + Int(payloadLength)
        guard let packet = w.prefix(total) else {
            return .failure(Problem(what: "IPv6 payload length \(payloadLength) exceeds the \(w.count - 40) bytes present"))
        }
        var offset = 40
        while true {
            switch next {
            case 0, 43, 60:  // hop-by-hop, routing, destination options
                guard let nextHeader = packet.u8(offset), let units = packet.u8(offset + 1) else {
                    return .failure(Problem(what: "IPv6 extension header \(next) cut short"))
                }
                let length = (Int(units) + 1) * 8
                guard packet.contains(offset, length: length) else {
                    return .failure(Problem(what: "IPv6 extension header \(next) (\(length) bytes) cut short"))
                }
                next = nextHeader
                offset += length
            case 51:  // authentication header: length in 4-byte units, minus 2
                guard let nextHeader = packet.u8(offset), let units = packet.u8(offset + 1) else {
                    return .failure(Problem(what: "IPv6 authentication header cut short"))
                }
                let length = (Int(units) + 2) * 4
                guard packet.contains(offset, length: length) else {
                    return .failure(Problem(what: "IPv6 authentication header (\(length) bytes) cut short"))
                }
                next = nextHeader
                offset += length
            case 44:
                let fragmentOffset = packet.u16(offset + 2).map { Int($0 >> 3) * 8 } ?? 0
                return .failure(
                    Problem(
                        what: "IPv6 fragment at offset \(fragmentOffset) (fragments are not reassembled)", fragment: true))
            default:
                guard let payload = packet.dropping(offset) else {
                    return .failure(Problem(what: "IPv6 extension headers exceed the packet"))
                }
                return .success(
                    Network(
                        source: IPAddressText.ipv6(src), destination: IPAddressText.ipv6(dst), proto: next, payload: payload))
            }
        }
    }
}
