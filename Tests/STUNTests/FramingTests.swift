import Testing
import TusaBase

@testable import STUN

struct ChannelDataTests {
    @Test func roundTripsPaddedAndUnpadded() throws {
        let c = ChannelData(channel: 0x4001, data: [1, 2, 3, 4, 5])
        #expect(c.encode() == [0x40, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5])
        #expect(c.encode(padded: true) == [0x40, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5, 0, 0, 0])
        #expect(try ChannelData(decoding: c.encode()) == c)
        #expect(try ChannelData(decoding: c.encode(padded: true)) == c)
    }

    @Test(arguments: [
        [UInt8]([0x40, 0x01, 0x00]),  // short header
        [0x40, 0x01, 0x00, 0x08, 1, 2],  // length overruns
        [0x80, 0x00, 0x00, 0x00],  // 10 bits: RTP, not ChannelData
        [0x3F, 0xFF, 0x00, 0x00],  // not 01 bits
        [0x40, 0x00, 0x00, 0x01, 1, 0, 0, 0, 0],  // more than padding after the data
    ])
    func malformedFramesAreTypedErrors(bytes: [UInt8]) {
        #expect(throws: STUNError.self) { try ChannelData(decoding: bytes) }
    }

    @Test func rfc5766ChannelsAboveTheRFC8656RangeStillDecode() throws {
        // coturn binds channels like 0x5C7E (RFC 5766 allowed up to 0x7FFF).
        #expect(try ChannelData(decoding: [0x5C, 0x7E, 0x00, 0x01, 9, 0, 0, 0]).channel == 0x5C7E)
    }

    @Test func channelNumberRange() {
        #expect(ChannelNumber(rawValue: 0x4000) != nil)
        #expect(ChannelNumber(rawValue: 0x4FFF) != nil)
        #expect(ChannelNumber(rawValue: 0x3FFF) == nil)
        #expect(ChannelNumber(rawValue: 0x5000) == nil)
    }
}

struct StreamFramerTests {
    static func stream() throws -> (bytes: [UInt8], frames: [StreamFrame]) {
        let key = try IntegrityKey.shortTerm(password: "pw")
        let a = Message(type: .bindingRequest, attributes: [.software("tusa")]).encode(integrity: key, fingerprint: true)
        let b = ChannelData(channel: 0x4000, data: [1, 2, 3]).encode(padded: true)
        let c = Message(type: .bindingSuccess, attributes: [.xorMappedAddress(TransportAddress("10.0.0.1:9")!)]).encode()
        let d = ChannelData(channel: 0x4FFF, data: []).encode(padded: true)
        return (a + b + c + d, [.stun(a), .channelData(b), .stun(c), .channelData(d)])
    }

    @Test func cutsFramesAtEverySegmentBoundary() throws {
        let (bytes, frames) = try Self.stream()
        // Every split into two segments, and byte-by-byte.
        for cut in 0...bytes.count {
            var f = StreamFramer()
            var got: [StreamFrame] = []
            f.append(bytes[..<cut])
            while let x = try f.next() { got.append(x) }
            f.append(bytes[cut...])
            while let x = try f.next() { got.append(x) }
            #expect(got == frames, "cut at \(cut)")
            #expect(f.bufferedByteCount == 0)
        }
        var f = StreamFramer()
        var got: [StreamFrame] = []
        for byte in bytes {
            f.append([byte])
            while let x = try f.next() { got.append(x) }
        }
        #expect(got == frames)
    }

    @Test func garbageOnTheStreamIsAnError() {
        var f = StreamFramer()
        // A TLS ClientHello looks like STUN by its top bits, but has no magic cookie.
        f.append([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03])
        #expect(throws: STUNError.self) {
            var x = f
            _ = try x.next()
        }
        var e = StreamFramer()
        e.append([0xC0, 0, 0, 0])
        #expect(throws: STUNError.self) {
            var x = e
            _ = try x.next()
        }
        var g = StreamFramer()
        g.append(MessageDecodingTests.header(length: 0, cookie: 0))
        #expect(throws: STUNError.self) {
            var x = g
            _ = try x.next()
        }
        var h = StreamFramer(maximumFrameSize: 100)
        h.append([0x40, 0x00, 0x10, 0x00])
        #expect(throws: STUNError.self) {
            var x = h
            _ = try x.next()
        }
    }
}

struct PacketKindTests {
    @Test func classifiesByFirstByte() {
        #expect(PacketKind.classify([UInt8]()) == .empty)
        #expect(PacketKind.classify([0x00, 1]) == .stun)
        #expect(PacketKind.classify([0x03]) == .stun)
        #expect(PacketKind.classify([0x04]) == .unassigned)
        #expect(PacketKind.classify([17]) == .zrtp)
        #expect(PacketKind.classify([22]) == .dtls)
        #expect(PacketKind.classify([0x40]) == .channelData)
        #expect(PacketKind.classify([0x4F]) == .channelData)
        #expect(PacketKind.classify([0x50]) == .unassigned)
        #expect(PacketKind.classify([0x80]) == .rtp)
        #expect(PacketKind.classify([0xBF]) == .rtp)
        #expect(PacketKind.classify([0xC0]) == .unassigned)
        #expect(PacketKind.isRTCP([0x80, 200]))
        #expect(!PacketKind.isRTCP([0x80, 0x60]))
    }
}

struct ClientTransactionTests {
    static func ms(_ t: Timestamp) -> Int { Int(t.nanoseconds / 1_000_000) }

    @Test func unreliableScheduleFollowsRFC8489() {
        let id = TransactionID.random()
        var t = ClientTransaction(transactionID: id, request: [1, 2, 3])
        var sends: [Int] = []
        var now = Timestamp.zero
        t.handle(.start, now: now)
        while true {
            for action in t.drainActions() {
                switch action {
                case .send(let bytes):
                    #expect(bytes == [1, 2, 3])
                    sends.append(Self.ms(now))
                case .timedOut:
                    #expect(sends == [0, 500, 1500, 3500, 7500, 15500, 31500])
                    #expect(Self.ms(now) == 39500)
                    #expect(t.state == .timedOut)
                    #expect(t.nextDeadline == nil)
                    return
                case .answered:
                    Issue.record("answered without a response")
                    return
                }
            }
            guard let next = t.nextDeadline else {
                Issue.record("transaction ended without timing out")
                return
            }
            now = next
            t.handleTimeout(now: now)
        }
    }

    @Test func earlyTimerWaitsAndResponseEndsIt() throws {
        let id = TransactionID.random()
        var t = ClientTransaction(transactionID: id, request: [])
        t.handle(.start, now: .zero)
        #expect(t.drainActions() == [.send([])])
        t.handleTimeout(now: .zero + .milliseconds(100))
        #expect(t.drainActions().isEmpty)
        #expect(t.nextDeadline == .zero + .milliseconds(500))
        t.handle(.response(Message(type: .bindingSuccess)), now: .zero)  // another transaction
        t.handle(.response(Message(type: .bindingRequest, transactionID: id)), now: .zero)  // not a response
        #expect(t.drainActions().isEmpty)
        let answer = Message(type: .bindingError, transactionID: id)
        t.handle(.response(answer), now: .zero)
        #expect(t.drainActions() == [.answered(answer)])
        #expect(t.state == .answered)
        #expect(t.nextDeadline == nil)
        t.handleTimeout(now: .zero + .seconds(100))
        #expect(t.drainActions().isEmpty)
        let again = t.receive(answer)
        #expect(!again, "a transaction is answered once")
    }

    @Test func reliableSendsOnceThenTimesOut() {
        var t = ClientTransaction(transactionID: .random(), request: [9], reliability: .reliable())
        t.handle(.start, now: .zero)
        #expect(t.drainActions() == [.send([9])])
        guard let wake = t.nextDeadline else {
            Issue.record("no deadline")
            return
        }
        #expect(Self.ms(wake) == 39500)
        t.handleTimeout(now: wake)
        #expect(t.drainActions() == [.timedOut])
        #expect(t.transmissions == 1)
    }
}
