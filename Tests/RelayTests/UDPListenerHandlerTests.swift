import Logging
import NIOCore
import NIOEmbedded
import NIOPosix
import STUN
import Testing
import TusaBase

@testable import Relay
@testable import Transport

/// The UDP driver on an EmbeddedChannel: what a read burst turns into.
struct UDPListenerHandlerTests {
    static let a = try! SocketAddress(ipAddress: "127.0.0.1", port: 40001)
    static let b = try! SocketAddress(ipAddress: "127.0.0.1", port: 40002)

    static func request(_ attributes: [Attribute] = []) -> (Message, ByteBuffer) {
        let m = Message(type: .bindingRequest, attributes: attributes)
        return (m, ByteBuffer(bytes: m.encode()))
    }

    /// Feeds a burst of requests and returns every outbound envelope after read-complete.
    static func burst(_ requests: [(SocketAddress, ByteBuffer)], gso: Bool = true) throws -> (
        outbound: [AddressedEnvelope<ByteBuffer>], stats: BindingStatistics
    ) {
        let channel = EmbeddedChannel()
        let totals = StatisticsBox()
        let handler = UDPListenerHandler(
            core: BindingServer(), origin: .primary, routes: UDPRoutes(channels: [:]), lane: 0, totals: totals,
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }), gso: gso)
        try channel.pipeline.syncOperations.addHandler(handler)
        for (from, data) in requests {
            channel.pipeline.syncOperations.fireChannelRead(NIOAny(AddressedEnvelope(remoteAddress: from, data: data)))
        }
        channel.pipeline.syncOperations.fireChannelReadComplete()
        var out: [AddressedEnvelope<ByteBuffer>] = []
        while let e = try channel.readOutbound(as: AddressedEnvelope<ByteBuffer>.self) { out.append(e) }
        _ = try channel.finish()
        return (out, totals.snapshot)
    }

    /// Splits a GSO write back into the datagrams the kernel would send.
    static func datagrams(_ e: AddressedEnvelope<ByteBuffer>) -> [[UInt8]] {
        let bytes = Array(e.data.readableBytesView)
        guard let size = e.metadata?.segmentSize else { return [bytes] }
        return stride(from: 0, to: bytes.count, by: size).map { Array(bytes[$0..<min($0 + size, bytes.count)]) }
    }

    @Test(.enabled(if: System.supportsUDPSegmentationOffload, "no UDP GSO on this system"))
    func aBurstBecomesOneGSOWritePerDestinationAndSize() throws {
        var sent: [(SocketAddress, Message)] = []
        var input: [(SocketAddress, ByteBuffer)] = []
        for i in 0..<10 {
            let from = i % 3 == 0 ? Self.b : Self.a
            let (m, bytes) = Self.request()
            sent.append((from, m))
            input.append((from, bytes))
        }
        // A different answer size for A: PADDING is mirrored.
        let (padded, paddedBytes) = Self.request([.padding([0, 0, 0, 0])])
        sent.append((Self.a, padded))
        input.append((Self.a, paddedBytes))

        let (out, stats) = try Self.burst(input)
        // A ×6 plain, B ×4 plain, A ×1 padded: two GSO writes and one datagram.
        #expect(out.count == 3)
        #expect(out.filter { $0.metadata?.segmentSize != nil }.count == 2)
        #expect(stats.responses == 11 && stats.gsoWrites == 2 && stats.gsoSegments == 10)
        // Every answer arrives as its own valid datagram, to the right client.
        var answered: [TransactionID: SocketAddress] = [:]
        for e in out {
            for d in Self.datagrams(e) {
                let m = try Message(decoding: d)
                #expect(m.type == .bindingSuccess)
                #expect(m.checkFingerprint() == .valid)
                #expect(try m.value(.xorMappedAddress) == .xorMappedAddress(try #require(TransportAddress(e.remoteAddress))))
                answered[m.transactionID] = e.remoteAddress
            }
        }
        #expect(answered.count == sent.count)
        for (from, m) in sent { #expect(answered[m.transactionID] == from) }
    }

    @Test(.enabled(if: System.supportsUDPSegmentationOffload, "no UDP GSO on this system"))
    func moreThanTheSegmentLimitSplitsIntoSeveralWrites() throws {
        let n = UDPListenerHandler.maxSegments * 2 + 5
        let (out, stats) = try Self.burst((0..<n).map { _ in (Self.a, Self.request().1) })
        #expect(out.reduce(0) { $0 + Self.datagrams($1).count } == n)
        #expect(out.allSatisfy { Self.datagrams($0).count <= UDPListenerHandler.maxSegments })
        #expect(stats.responses == n && stats.gsoWrites == 3 && stats.gsoSegments == n)
    }

    /// Answers too large for every path MTU (a mirrored PADDING) are never
    /// segmented: Linux would refuse the write and NIO close the socket.
    @Test func largeAnswersAreSentOneByOne() throws {
        let big = [UInt8](repeating: 0, count: UDPListenerHandler.maxSegmentSize)
        let (out, stats) = try Self.burst((0..<5).map { _ in (Self.a, Self.request([.padding(big)]).1) })
        #expect(out.count == 5)
        #expect(out.allSatisfy { $0.metadata?.segmentSize == nil })
        #expect(stats.responses == 5 && stats.gsoWrites == 0)
    }

    @Test func withoutGSOEveryAnswerIsItsOwnDatagram() throws {
        let (out, stats) = try Self.burst((0..<10).map { _ in (Self.a, Self.request().1) }, gso: false)
        #expect(out.count == 10)
        #expect(out.allSatisfy { $0.metadata?.segmentSize == nil })
        #expect(stats.responses == 10 && stats.gsoWrites == 0)
    }

    @Test func aSingleAnswerIsAPlainDatagram() throws {
        let (out, stats) = try Self.burst([(Self.a, Self.request().1)])
        #expect(out.count == 1)
        #expect(out.first?.metadata?.segmentSize == nil)
        #expect(stats.gsoWrites == 0)
    }
}
