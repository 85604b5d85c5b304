import Foundation
import STUN

/// Checks captured STUN/TURN/ICE traffic: every STUN message and ChannelData
/// frame in a pcap/pcapng capture (UDP datagrams and TCP streams) or a raw
/// message file must decode, round-trip, and verify its FINGERPRINT and
/// MESSAGE-INTEGRITY with the credentials given.
public struct InteropChecker: Sendable {
    public var credentials: InteropCredentials

    public init(credentials: InteropCredentials = InteropCredentials()) {
        self.credentials = credentials
    }

    /// Checks one file; problems with the file itself are failures of the report, not throws.
    public func check(path: String) -> InteropReport {
        var report = InteropReport(file: path)
        guard let head = FileHandle(forReadingAtPath: path) else {
            let exists = FileManager.default.fileExists(atPath: path)
            report.failures.append(InteropFailure(packet: 0, reason: exists ? "cannot open the file" : "no such file"))
            report.failed = 1
            return report
        }
        let magic = (try? head.read(upToCount: 4)).map { Array($0) } ?? []
        try? head.close()
        if Self.isCapture(magic) {
            do {
                let capture = try Capture.read(path: path)
                var state = State(checker: self)
                state.checkCapture(capture, into: &report)
            } catch {
                report.failures.append(InteropFailure(packet: error.frame ?? 0, reason: "capture unreadable: \(error.message)"))
                report.failed += 1
            }
        } else {
            guard let data = FileManager.default.contents(atPath: path) else {
                report.failures.append(InteropFailure(packet: 0, reason: "cannot read the file"))
                report.failed = 1
                return report
            }
            var state = State(checker: self)
            state.checkUnit(Array(data), packet: 1, channelDataAllowed: true, padded: nil, into: &report)
        }
        return report
    }

    /// pcap (both byte orders, micro and nano) and pcapng magic numbers.
    static func isCapture(_ magic: [UInt8]) -> Bool {
        let known: [[UInt8]] = [
            [0xD4, 0xC3, 0xB2, 0xA1], [0xA1, 0xB2, 0xC3, 0xD4], [0x4D, 0x3C, 0xB2, 0xA1], [0xA1, 0xB2, 0x3C, 0x4D],
            [0x0A, 0x0D, 0x0D, 0x0A],
        ]
        return known.contains(magic)
    }

    /// Per-file state: the keys of requests seen, so responses verify with the
    /// same key, and the flows that carry TURN (where ChannelData may appear).
    struct State {
        let checker: InteropChecker
        var keysByTransaction: [TransactionID: [(label: String, key: IntegrityKey)]] = [:]
        /// Requests seen in the file (with credentials known or not).
        var requestsSeen: Set<TransactionID> = []

        init(checker: InteropChecker) { self.checker = checker }

        static let turnMethods: Set<STUN.Method> = [.allocate, .refresh, .send, .data, .createPermission, .channelBind]

        struct Flow: Hashable {
            let a: CaptureEndpoint
            let b: CaptureEndpoint
            init(_ x: CaptureEndpoint, _ y: CaptureEndpoint) {
                if x < y {
                    a = x
                    b = y
                } else {
                    a = y
                    b = x
                }
            }
        }

        mutating func checkCapture(_ capture: Capture, into report: inout InteropReport) {
            // First pass: what each flow carries. A flow with a STUN message
            // on it is a STUN/TURN flow, where every datagram must be STUN (or
            // ChannelData, once TURN was seen on it), unless it carries ICE
            // checks: there STUN shares the 5-tuple with the application's
            // data (DTLS, RTP, Tusa's own packets; RFC 7983), which is counted
            // as other, not checked.
            var stunFlows = Set<Flow>()
            var turnFlows = Set<Flow>()
            var iceFlows = Set<Flow>()
            for d in capture.udp where Self.looksLikeSTUN(d.payload) {
                let flow = Flow(d.source, d.destination)
                stunFlows.insert(flow)
                guard let m = try? Message(decoding: d.payload) else { continue }
                if Self.turnMethods.contains(m.type.method) { turnFlows.insert(flow) }
                if Self.isICECheck(m) { iceFlows.insert(flow) }
            }
            for d in capture.udp {
                let p = d.payload
                let flow = Flow(d.source, d.destination)
                if Self.looksLikeSTUN(p) {
                    checkUnit(p, packet: d.frame, channelDataAllowed: false, padded: nil, into: &report)
                } else if Self.looksLikeChannelData(p), turnFlows.contains(flow) {
                    checkUnit(p, packet: d.frame, channelDataAllowed: true, padded: nil, into: &report)
                } else if stunFlows.contains(flow) && !iceFlows.contains(flow) {
                    report.packets += 1
                    report.failed += 1
                    report.failures.append(
                        InteropFailure(
                            packet: d.frame,
                            reason:
                                "\(d.source) → \(d.destination): neither STUN nor ChannelData on a STUN/TURN flow: \(ForeignDatagram.describe(p))"
                        ))
                } else {
                    report.other += 1
                }
            }
            // A TCP connection is STUN/TURN when either direction opens with
            // STUN; the other direction must then be framed STUN too.
            let stunConnections = Set(
                capture.tcpStreams.filter { Self.looksLikeSTUN($0.data) }.map { Flow($0.source, $0.destination) })
            for stream in capture.tcpStreams where !stream.data.isEmpty {
                if Self.looksLikeSTUN(stream.data) {
                    checkStream(stream, into: &report)
                } else if stunConnections.contains(Flow(stream.source, stream.destination)) {
                    report.packets += 1
                    report.failed += 1
                    report.failures.append(
                        InteropFailure(
                            packet: stream.frame(at: 0) ?? stream.firstFrame,
                            reason:
                                "TCP \(stream.source) → \(stream.destination): does not open with STUN on a STUN/TURN connection: \(ForeignDatagram.describe(Array(stream.data.prefix(64))))"
                        ))
                }
            }
        }

        /// A Binding request with ICE's attributes (RFC 8445 §7.1): the flow is an ICE candidate pair's.
        static func isICECheck(_ m: Message) -> Bool {
            m.type.method == .binding && m.type.messageClass == .request
                && (m.attribute(.priority) != nil || m.attribute(.iceControlling) != nil
                    || m.attribute(.iceControlled) != nil || m.attribute(.useCandidate) != nil)
        }

        mutating func checkStream(_ stream: TCPStream, into report: inout InteropReport) {
            // Only streams that open with a STUN message are TURN/STUN streams.
            guard Self.looksLikeSTUN(stream.data) else { return }
            var framer = StreamFramer()
            framer.append(stream.data)
            var offset = 0
            while true {
                let frame: StreamFrame?
                do {
                    frame = try framer.next()
                } catch {
                    report.failures.append(
                        InteropFailure(
                            packet: stream.frame(at: offset) ?? stream.firstFrame,
                            reason: "TCP \(stream.source) → \(stream.destination): cannot frame at byte \(offset): \(error)"))
                    report.failed += 1
                    return
                }
                guard let frame else { break }
                let bytes: [UInt8]
                switch frame {
                case .stun(let b), .channelData(let b): bytes = b
                }
                checkUnit(
                    bytes, packet: stream.frame(at: offset) ?? stream.firstFrame, channelDataAllowed: true, padded: true,
                    into: &report)
                offset += bytes.count
            }
            if framer.bufferedByteCount > 0 {
                report.failures.append(
                    InteropFailure(
                        packet: stream.frame(at: offset) ?? stream.firstFrame,
                        reason:
                            "TCP \(stream.source) → \(stream.destination): \(framer.bufferedByteCount) bytes at the end are not a whole frame"
                    ))
                report.failed += 1
            }
            if stream.missingBytes > 0 {
                report.failures.append(
                    InteropFailure(
                        packet: stream.firstFrame,
                        reason:
                            "TCP \(stream.source) → \(stream.destination): \(stream.missingBytes) bytes missing from the capture")
                )
                report.failed += 1
            }
        }

        /// Checks one STUN message or ChannelData frame.
        /// - Parameter padded: for ChannelData, whether padding is required (streams), or nil to keep what came.
        mutating func checkUnit(
            _ bytes: [UInt8], packet: Int, channelDataAllowed: Bool, padded: Bool?, into report: inout InteropReport
        ) {
            report.packets += 1
            var problems: [String] = []
            defer {
                if !problems.isEmpty {
                    report.failed += 1
                    for p in problems { report.failures.append(InteropFailure(packet: packet, reason: p)) }
                }
            }
            if channelDataAllowed, Self.looksLikeChannelData(bytes) {
                do {
                    let c = try ChannelData(decoding: bytes)
                    report.decoded += 1
                    let wasPadded = bytes.count > 4 + c.data.count
                    if padded == true && bytes.count % 4 != 0 {
                        problems.append("ChannelData on a stream is not padded to a multiple of 4")
                    }
                    var expected = bytes
                    for i in (4 + c.data.count)..<expected.count { expected[i] = 0 }
                    if c.encode(padded: wasPadded) == expected {
                        report.roundTrip += 1
                    } else {
                        problems.append("ChannelData does not round-trip")
                    }
                } catch {
                    problems.append("ChannelData: \(error)")
                }
                return
            }
            let m: Message
            do {
                m = try Message(decoding: bytes)
                _ = try m.typedAttributes()
                report.decoded += 1
            } catch {
                problems.append("\(error)")
                return
            }
            if m.roundTrips() == true {
                report.roundTrip += 1
            } else {
                problems.append("\(m.type) does not round-trip")
            }
            var checked = 0
            var unverifiable = false
            if m.attribute(.fingerprint) != nil {
                checked += 1
                let r = m.checkFingerprint()
                if r != .valid { problems.append("\(m.type): FINGERPRINT \(r)") }
            }
            let hasMI = m.attribute(.messageIntegrity) != nil
            let hasMI256 = m.attribute(.messageIntegritySHA256) != nil
            let isResponse = m.type.messageClass == .successResponse || m.type.messageClass == .errorResponse
            var keys: [(label: String, key: IntegrityKey)] = []
            // A response to a request not in the file is tried with every credential
            // given: a guess, so a mismatch is not verified rather than failed. One to a
            // request seen is checked with that request's keys only (none known: a note).
            var guessed = false
            if isResponse {
                if requestsSeen.contains(m.transactionID) {
                    keys = keysByTransaction[m.transactionID] ?? []
                } else {
                    keys = checker.credentials.fallbackKeys()
                    guessed = true
                }
            } else {
                keys = checker.credentials.keys(for: m)
                if m.type.messageClass == .request { requestsSeen.insert(m.transactionID) }
                if !keys.isEmpty { keysByTransaction[m.transactionID] = keys }
            }
            for (present, name, check) in [
                (hasMI, "MESSAGE-INTEGRITY", { (k: IntegrityKey) in m.checkMessageIntegrity(key: k) }),
                (hasMI256, "MESSAGE-INTEGRITY-SHA256", { (k: IntegrityKey) in m.checkMessageIntegritySHA256(key: k) }),
            ] where present {
                checked += 1
                if keys.isEmpty {
                    unverifiable = true
                    report.notes.append(
                        InteropFailure(
                            packet: packet,
                            reason: "\(m.type): \(name) not verified: no credentials (\(Self.who(m, isResponse: isResponse)))"))
                } else if !keys.contains(where: { check($0.key) == .valid }) {
                    if guessed {
                        unverifiable = true
                        report.notes.append(
                            InteropFailure(
                                packet: packet,
                                reason:
                                    "\(m.type): \(name) not verified: its request was not seen, and none of the credentials given fits"
                            ))
                    } else {
                        problems.append("\(m.type): \(name) invalid with \(keys.map(\.label).joined(separator: ", "))")
                    }
                }
            }
            if checked > 0 && problems.isEmpty && !unverifiable { report.verified += 1 }
        }

        /// A first byte of 0–3 and the magic cookie: meant as STUN, so it must decode.
        static func looksLikeSTUN(_ p: [UInt8]) -> Bool {
            p.count >= 8 && PacketKind.classify(p) == .stun && p[4] == 0x21 && p[5] == 0x12 && p[6] == 0xA4 && p[7] == 0x42
        }

        /// First bits 01: ChannelData, channels 0x4000–0x7FFF (RFC 5766's range, which coturn uses).
        static func looksLikeChannelData(_ p: [UInt8]) -> Bool {
            p.count >= 4 && p[0] & 0xC0 == 0x40
        }

        static func who(_ m: Message, isResponse: Bool) -> String {
            if isResponse { return "its request was not seen or had no known credentials" }
            if case .username(let u)? = try? m.value(.username) { return "username '\(u)'; give --user, --secret or --ice" }
            return "no USERNAME; give --user for USERHASH"
        }
    }
}
