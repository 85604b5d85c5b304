import Testing

@testable import Secure

struct RTPHeaderTests {
    @Test func writesAndParsesThePlainHeader() throws {
        let h = RTPHeader(marker: true, payloadType: 111, sequenceNumber: 0xBEEF, timestamp: 0x0102_0304, ssrc: 0xCAFE_BABE)
        var out = [UInt8](repeating: 0, count: 12)
        #expect(try out.withUnsafeMutableBytes { try h.write(into: $0) } == 12)
        #expect(Hex.encode(out) == "80efbeef01020304cafebabe")
        #expect(try RTPHeader.parse(out) == h)
        #expect(throws: SecureError.bufferTooSmall(needed: 12, have: 11)) {
            var small = [UInt8](repeating: 0, count: 11)
            _ = try small.withUnsafeMutableBytes { try h.write(into: $0) }
        }
    }

    @Test func csrcsAndExtensionCountTowardsTheHeaderLength() throws {
        // CC=2, X=1, extension of 1 word.
        var p: [UInt8] = [0x92, 0x00, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3]
        p += [0, 0, 0, 4, 0, 0, 0, 5]  // CSRCs
        p += [0xBE, 0xDE, 0, 1, 1, 2, 3, 4]  // extension header + 1 word
        let h = try RTPHeader.parse(p + [0xAA])
        #expect(h.headerLength == 28 && h.csrcCount == 2 && h.hasExtension)
        for n in 0..<28 { #expect(throws: SecureError.truncated) { try RTPHeader.parse(Array(p.prefix(n))) } }
        #expect(throws: SecureError.self) { try h.write(into: UnsafeMutableRawBufferPointer(start: nil, count: 0)) }
    }

    @Test func versionMustBeTwo() {
        for b0: UInt8 in [0x00, 0x40, 0xC0] {
            #expect(throws: SecureError.self) { try RTPHeader.parse([b0] + [UInt8](repeating: 0, count: 11)) }
        }
    }
}

struct MediaCipherTests {
    let key = SecretKey.random()
    let header = RTPHeader(payloadType: 111, sequenceNumber: 7, timestamp: 960, ssrc: 0x1234_5678)
    let payload = [UInt8](repeating: 0x5A, count: 160)

    @Test func sealOpenRoundTripWithHeaderAsAD() throws {
        let cipher = MediaCipher(key: key)
        let packet = try cipher.sealMedia(header: header, payload: payload, extendedSequence: 7)
        #expect(packet.count == 12 + 160 + 16)
        #expect(Array(packet.prefix(12)) == Hex.decode("806f0007000003c012345678"))
        #expect(Array(packet[12..<172]) != payload)
        #expect(try MediaCipher(key: key).openMedia(packet, extendedSequence: 7) == payload)
        // Another index (the nonce) or any altered byte fails.
        #expect(throws: SecureError.authenticationFailed) { try cipher.openMedia(packet, extendedSequence: 7 + 65536) }
        for i in packet.indices {
            var bad = packet
            bad[i] ^= 0x01
            #expect(throws: SecureError.self, "byte \(i)") { try cipher.openMedia(bad, extendedSequence: 7) }
        }
    }

    @Test func nonceLayoutIsDomainThenBigEndianIndex() throws {
        // Recompute the media nonce by hand and open with the bare AEAD.
        let cipher = MediaCipher(key: key)
        let ext: UInt64 = 3 << 16 | 7
        let packet = try cipher.sealMedia(header: header, payload: payload, extendedSequence: ext)
        let nonce: [UInt8] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 7]
        #expect(
            try AEAD.open(key: key, nonce: nonce, ad: Array(packet.prefix(12)), ciphertext: Array(packet.dropFirst(12)))
                == payload)
    }

    @Test func inPlaceSealAndPreWrittenHeader() throws {
        let cipher = MediaCipher(key: key)
        var buffer = [UInt8](repeating: 0, count: 12 + 160 + 16)
        _ = try buffer.withUnsafeMutableBytes { try header.write(into: $0) }
        buffer.replaceSubrange(12..<172, with: payload)
        let n = try buffer.withUnsafeMutableBytes { out in
            try cipher.sealMedia(
                headerLength: 12, payload: UnsafeRawBufferPointer(rebasing: out[12..<172]), extendedSequence: 7, into: out)
        }
        #expect(n == 188)
        #expect(buffer == (try cipher.sealMedia(header: header, payload: payload, extendedSequence: 7)))
        #expect(throws: SecureError.self) { try cipher.sealMedia(header: header, payload: payload, extendedSequence: 8) }
    }

    @Test func retiredCipherRefusesWork() throws {
        let cipher = MediaCipher(key: key)
        let packet = try cipher.sealMedia(header: header, payload: payload, extendedSequence: 7)
        cipher.retire()
        #expect(cipher.isRetired)
        #expect(throws: SecureError.keyRetired) { try cipher.openMedia(packet, extendedSequence: 7) }
        #expect(throws: SecureError.keyRetired) { try cipher.sealMedia(header: header, payload: payload, extendedSequence: 7) }
        var receiver = MediaReceiver()
        #expect(receiver.receive(packet, with: cipher).failure == .wrongEpoch)
    }

    @Test func tooShortPacketsAreTruncated() throws {
        let cipher = MediaCipher(key: key)
        let packet = try cipher.sealMedia(header: header, payload: [], extendedSequence: 7)
        #expect(packet.count == 28)
        #expect(try cipher.openMedia(packet, extendedSequence: 7) == [])
        var receiver = MediaReceiver()
        for n in 0..<28 {
            #expect(receiver.receive(Array(packet.prefix(n)), with: cipher).failure == .truncated, "length \(n)")
        }
    }
}

struct MediaReceiverTests {
    let sender = MediaCipher(key: SecretKey.random())

    func packet(_ ext: UInt64, _ body: [UInt8] = [1, 2, 3]) throws -> [UInt8] {
        try sender.sealMedia(
            header: RTPHeader(
                payloadType: 96, sequenceNumber: UInt16(truncatingIfNeeded: ext),
                timestamp: UInt32(truncatingIfNeeded: ext * 960), ssrc: 42),
            payload: body, extendedSequence: ext)
    }

    @Test func acceptsInOrderAndReorderedDropsReplays() throws {
        var r = MediaReceiver()
        let p5 = try packet(5)
        let p3 = try packet(3)
        let got = try #require(r.receive(p5, with: sender).success)
        #expect(got.payload == [1, 2, 3] && got.header.sequenceNumber == 5)
        #expect(r.receive(p3, with: sender).success != nil)
        #expect(r.receive(p5, with: sender).failure == .replayed)
        #expect(r.receive(p3, with: sender).failure == .replayed)
        #expect(r.highestExtendedSequence == 5)
    }

    @Test func forgedPacketsDoNotMoveTheWindow() throws {
        var r = MediaReceiver()
        _ = r.receive(try packet(10), with: sender)
        var forged = try packet(5000)
        forged[20] ^= 0xFF
        #expect(r.receive(forged, with: sender).failure == .authenticationFailed)
        #expect(r.highestExtendedSequence == 10)
        #expect(r.receive(try packet(5000), with: sender).success != nil)
    }

    @Test func followsTheRolloverAndRejectsTooOld() throws {
        var r = MediaReceiver()
        for ext: UInt64 in stride(from: 65000, to: 70000, by: 7) {
            let got = r.receive(try packet(ext), with: sender)
            #expect(got.success != nil, "ext \(ext)")
        }
        #expect(r.highestExtendedSequence == 69998)
        #expect(r.receive(try packet(69998 - 2048), with: sender).failure == .tooOld)
    }

    @Test func rekeyOverlapTriesTheSecondKeyWithoutDamage() throws {
        let other = MediaCipher(key: SecretKey.random())
        var r = MediaReceiver()
        var wire = try packet(1)
        let got = wire.withUnsafeMutableBytes { r.receive($0, with: other, orElse: sender) }
        let opened = try #require(got.success, "\(got)")
        #expect(opened.openedWithFallback && Array(wire[opened.payload]) == [1, 2, 3])
        let first = r.receive(try packet(2), with: sender, orElse: other).success
        #expect(first?.payload == [1, 2, 3])
        // Neither key: dropped, window untouched.
        #expect(r.receive(try packet(3), with: other, orElse: MediaCipher(key: .random())).failure == .authenticationFailed)
        #expect(r.highestExtendedSequence == 2)
        // A retired first key falls through to the second.
        other.retire()
        #expect(r.receive(try packet(4), with: other, orElse: sender).success != nil)
        // Control packets the same way.
        var c = ControlReceiver()
        let report = ControlReport(kind: .keepalive)
        #expect(
            c.receive(try sender.sealControl(report, ssrc: 1, index: 1), with: other, orElse: sender).success?.report == report)
    }

    @Test func verifyOnlyAndOutOfPlaceOpensLeaveThePacketAlone() throws {
        let wire = try packet(9, [7, 7, 7, 7])
        let other = MediaCipher(key: SecretKey.random())
        var out = [UInt8](repeating: 0, count: 4)
        let checks: (Bool, Bool, Int) = try wire.withUnsafeBytes { p in
            let good = try sender.authenticatesMedia(packet: p, headerLength: 12, extendedSequence: 9)
            let bad = try other.authenticatesMedia(packet: p, headerLength: 12, extendedSequence: 9)
            let failed =
                (try? out.withUnsafeMutableBytes {
                    try other.openMedia(packet: p, headerLength: 12, extendedSequence: 9, into: $0)
                }) == nil
            #expect(failed)
            let n = try out.withUnsafeMutableBytes {
                try sender.openMedia(packet: p, headerLength: 12, extendedSequence: 9, into: $0)
            }
            return (good, bad, n)
        }
        #expect(checks.0 && !checks.1 && checks.2 == 4)
        #expect(out == [7, 7, 7, 7])
        #expect(wire == (try packet(9, [7, 7, 7, 7])))
    }

    @Test func mediaAndControlAndOtherAreTellApart() throws {
        let media = try packet(1)
        let control = try sender.sealControl(ControlReport(), ssrc: 1, index: 1)
        #expect(media.withUnsafeBytes { SecurePacketKind.classify($0) } == .media)
        #expect(control.withUnsafeBytes { SecurePacketKind.classify($0) } == .control)
        #expect([UInt8]([0x00, 0x01, 0, 0]).withUnsafeBytes { SecurePacketKind.classify($0) } == .other)
        #expect([UInt8]([0x80]).withUnsafeBytes { SecurePacketKind.classify($0) } == .other)
    }
}

struct ControlTests {
    let cipher = MediaCipher(key: SecretKey.random())
    let report = ControlReport(
        kind: .report, highestSequence: 0x1_2345, cumulativeLost: 17, fractionLost: 12,
        jitter: 480, lastReportTimestamp: 0xABCD_0001, delaySinceLastReport: 0x8000,
        lossHint: 5, timestamp: 0x1234_5678, meanBurstLength: 48)

    @Test func reportEncodingRoundTripsAndIsVersioned() throws {
        let bytes = report.encoded()
        #expect(bytes.count == 36 && bytes[0] == 2 && bytes[32] == 48)
        #expect(try ControlReport.decode(bytes) == report)
        var v3 = bytes
        v3[0] = 3
        #expect(throws: SecureError.unsupportedVersion(3)) { try ControlReport.decode(v3) }
        // Version 1 (32 bytes, before the burst length) still reads, as no burst known.
        var v1 = Array(bytes.prefix(32))
        v1[0] = 1
        var withoutBurst = report
        withoutBurst.meanBurstLength = 0
        withoutBurst.version = 1
        #expect(try ControlReport.decode(v1) == withoutBurst)
        // Written as version 1 (a keepalive, or a report to an older peer): the same 32 bytes.
        #expect(withoutBurst.encoded() == v1)
        let sealed = try cipher.sealControl(withoutBurst, ssrc: 7, index: 3)
        #expect(sealed.count == 64 && Hex.encode(sealed.prefix(4)) == "80cc000a")
        #expect(try cipher.openControl(sealed).report == withoutBurst)
        #expect(throws: SecureError.truncated) { try ControlReport.decode(Array(bytes.prefix(35))) }
        #expect(throws: SecureError.truncated) { try ControlReport.decode([]) }
        #expect(throws: SecureError.self) { try ControlReport.decode(bytes + [0]) }
        var kind = bytes
        kind[1] = 9
        #expect(throws: SecureError.self) { try ControlReport.decode(kind) }
        var hint = bytes
        hint[3] = 101
        #expect(throws: SecureError.self) { try ControlReport.decode(hint) }
    }

    @Test func wireLayout() throws {
        let p = try cipher.sealControl(report, ssrc: 0xDEAD_BEEF, index: 5)
        #expect(p.count == 68)
        // V=2 P=0 subtype 0, PT 204, length = (48 / 4) − 1 = 11, SSRC, "TUSA".
        #expect(Hex.encode(p.prefix(12)) == "80cc000bdeadbeef" + Hex.encode(Array("TUSA".utf8)))
        #expect(Hex.encode(p[48..<52]) == "80000005")
        #expect(Array(p[12..<48]) != report.encoded())
        let got = try cipher.openControl(p)
        #expect(got == ReceivedControl(ssrc: 0xDEAD_BEEF, index: 5, report: report))
    }

    @Test func everyAlteredByteIsRejected() throws {
        let p = try cipher.sealControl(report, ssrc: 9, index: 77)
        for i in p.indices {
            var bad = p
            bad[i] ^= 0x04
            #expect(throws: SecureError.self, "byte \(i)") { try cipher.openControl(bad) }
        }
        // Media and control nonces differ even for the same index.
        #expect(try cipher.openControl(p).index == 77)
    }

    @Test func receiverReplayWindowOnTheIndex() throws {
        var r = ControlReceiver()
        let p1 = try cipher.sealControl(report, ssrc: 9, index: 1)
        let p3000 = try cipher.sealControl(report, ssrc: 9, index: 3000)
        #expect(r.receive(p1, with: cipher).success?.index == 1)
        #expect(r.receive(p1, with: cipher).failure == .replayed)
        #expect(r.receive(p3000, with: cipher).success != nil)
        #expect(r.receive(try cipher.sealControl(report, ssrc: 9, index: 2), with: cipher).failure == .tooOld)
        #expect(r.receive(Array(p1.prefix(59)), with: cipher).failure == .truncated)
        #expect(r.receive(p1 + [0], with: cipher).failure == .malformed)
        let other = MediaCipher(key: SecretKey.random())
        #expect(r.receive(try other.sealControl(report, ssrc: 9, index: 3001), with: cipher).failure == .authenticationFailed)
        #expect(throws: SecureError.nonceExhausted) { try cipher.sealControl(report, ssrc: 9, index: 0x8000_0000) }
    }

    @Test func roundTripTimeFromCompactTimestamps() {
        let sent = ControlReport.compactTimestamp(nanoseconds: 10_000_000_000)
        let now = ControlReport.compactTimestamp(nanoseconds: 10_250_000_000)
        let dlsr = ControlReport.compactTimestamp(nanoseconds: 200_000_000)
        let rtt = ControlReport.roundTrip(now: now, lastReportTimestamp: sent, delaySinceLastReport: dlsr)
        let ms = rtt.map { Double($0.components.attoseconds) / 1e15 + Double($0.components.seconds) * 1000 } ?? -1
        #expect(abs(ms - 50) < 0.1)
        #expect(ControlReport.roundTrip(now: now, lastReportTimestamp: 0, delaySinceLastReport: 0) == nil)
        #expect(ControlReport.roundTrip(now: sent, lastReportTimestamp: now, delaySinceLastReport: 0) == nil)
    }
}

extension Result {
    var success: Success? { if case .success(let s) = self { s } else { nil } }
    var failure: Failure? { if case .failure(let f) = self { f } else { nil } }
}
