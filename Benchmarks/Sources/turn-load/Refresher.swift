import BenchSupport
import CMultiMsg
import Glibc
import STUN
import TusaBase

/// Keeps paced flows' allocations alive past their lifetimes (`--refresh S`), as a voice
/// client on a long call does: every S seconds each sending flow asks a ChannelBind (which
/// refreshes its channel and its peer's permission, RFC 8656 §12) and a Refresh (the
/// allocation's lifetime, §7), staggered over the period, from its own source address
/// through the shared client socket. A 438 (stale nonce) is asked again under the new
/// nonce; a request unanswered for a second is sent again, at most five times, then
/// counted as failed. At the end, ``release(deadline:receive:)`` deletes the allocations
/// it kept (a Refresh with LIFETIME 0), so the server frees them at once.
final class Refresher {
    let clients: [Client]
    let shared: Int32
    let server: (ip: UInt32, port: UInt16)
    let username: String
    let period: Double
    let rto = 1.0
    let maxTries = 5

    enum Kind { case bind, refresh, release }
    struct Pending {
        var flow: Int
        var kind: Kind
        var bytes: [UInt8]
        var sentAt: Double
        var tries: Int
    }
    private var pending: [TransactionID: Pending] = [:]
    /// Per kept flow (the first `due.count`), when its next pair of requests is due.
    private var due: [Double] = []
    /// Looks at the schedule at most this often: the send loop turns far faster.
    private var nextLook = 0.0
    private(set) var sent = 0, answered = 0, staleNonces = 0, retransmits = 0, failed = 0
    private(set) var failures: [String: Int] = [:]

    init(clients: [Client], shared: Int32, server: (ip: UInt32, port: UInt16), username: String, period: Double) {
        self.clients = clients
        self.shared = shared
        self.server = server
        self.username = username
        self.period = period
    }

    /// Keeps the first `flows` flows alive from `now` on (each first due within one period, staggered).
    func keep(flows: Int, now: Double) {
        let n = min(flows, clients.count)
        for i in due.count..<max(n, due.count) { due.append(now + period * Double(i + 1) / Double(n)) }
    }

    /// Sends what is due and what waited too long for its answer (looking every 10 ms).
    func tick(now: Double) {
        guard now >= nextLook else { return }
        nextLook = now + 0.01
        for i in due.indices where due[i] <= now {
            due[i] = now + period
            start(flow: i, kind: .bind, now: now)
            start(flow: i, kind: .refresh, now: now)
        }
        for (id, p) in pending where now - p.sentAt > rto {
            if p.tries >= maxTries {
                pending[id] = nil
                fail("\(p.kind)-timeout")
            } else {
                retransmits += 1
                var q = p
                q.tries += 1
                q.sentAt = now
                pending[id] = q
                transmit(q)
            }
        }
    }

    /// Whether `bytes` (a datagram on the shared socket) answered one of ours; handles it if so.
    func handle(_ bytes: UnsafeRawBufferPointer, now: Double) -> Bool {
        guard let first = bytes.first, first & 0xC0 == 0,
            let m = try? Message(decoding: [UInt8](bytes)), let p = pending[m.transactionID]
        else { return false }
        pending[m.transactionID] = nil
        switch m.type.messageClass {
        case .successResponse:
            answered += 1
        case .errorResponse:
            guard case .errorCode(let e)? = try? m.value(.errorCode) else {
                fail("\(p.kind)-error")
                return true
            }
            if e.code == 437, p.kind == .release, p.tries > 1 {
                // The release's first answer was lost: the allocation is gone, as asked.
                answered += 1
            } else if e.code == 438, case .nonce(let nonce)? = try? m.value(.nonce), p.tries < maxTries {
                staleNonces += 1
                clients[p.flow].nonce = nonce
                start(flow: p.flow, kind: p.kind, now: now, tries: p.tries)
            } else {
                fail("\(p.kind)-\(e.code)")
            }
        default:
            fail("\(p.kind)-not-a-response")
        }
        return true
    }

    /// Deletes every allocation kept alive; waits for the answers until `deadline`, reading with `receive`.
    func release(deadline: Double, receive: (Int32) -> Void) {
        let now = monotonicSeconds()
        pending.removeAll()
        for i in due.indices { start(flow: i, kind: .release, now: now) }
        due.removeAll()
        while !pending.isEmpty && monotonicSeconds() < deadline {
            receive(10)
            tick(now: monotonicSeconds())
        }
        for p in pending.values { fail("\(p.kind)-deadline") }
        pending.removeAll()
    }

    /// What the requests did, one line.
    var summary: String {
        let reasons =
            failures.isEmpty ? "none" : failures.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: ",")
        return
            "refresh period_s=\(fmt(period, 1)) sent=\(sent) answered=\(answered) stale_nonces=\(staleNonces) "
            + "retransmits=\(retransmits) failed=\(failed) failures=\(reasons)"
    }

    private func fail(_ why: String) {
        failed += 1
        failures[why, default: 0] += 1
    }

    private func start(flow: Int, kind: Kind, now: Double, tries: Int = 0) {
        let c = clients[flow]
        let id = TransactionID.random()
        let bytes: [UInt8]
        switch kind {
        case .bind: bytes = channelBindRequest(c, username: username, transactionID: id)
        case .refresh: bytes = refreshRequest(c, lifetime: nil, transactionID: id)
        case .release: bytes = refreshRequest(c, lifetime: 0, transactionID: id)
        }
        let p = Pending(flow: flow, kind: kind, bytes: bytes, sentAt: now, tries: tries + 1)
        pending[id] = p
        sent += 1
        transmit(p)
    }

    /// A Refresh of `c`'s allocation (LIFETIME 0 deletes it) under its long-term credentials.
    private func refreshRequest(_ c: Client, lifetime: UInt32?, transactionID: TransactionID) -> [UInt8] {
        let m = Message(
            type: MessageType(method: .refresh, class: .request), transactionID: transactionID,
            attributes: (lifetime.map { [.lifetime($0)] } ?? []) + [.username(username), .realm(c.realm), .nonce(c.nonce)])
        return m.encode(integrity: c.key)
    }

    /// One request from its flow's source address (IP_PKTINFO) to the server.
    private func transmit(_ p: Pending) {
        let source = clients[p.flow].sourceIP
        var name = sockaddrIn(server.ip, server.port)
        let control = UnsafeMutableRawPointer.allocate(byteCount: Int(bench_PKTINFO_SPACE), alignment: 16)
        defer { control.deallocate() }
        var bytes = p.bytes
        bytes.withUnsafeMutableBytes { raw in
            withUnsafeMutablePointer(to: &name) { namePointer in
                var iov = iovec(iov_base: raw.baseAddress, iov_len: raw.count)
                withUnsafeMutablePointer(to: &iov) { iovPointer in
                    var m = bench_mmsghdr()
                    m.msg_hdr.msg_name = UnsafeMutableRawPointer(namePointer)
                    m.msg_hdr.msg_namelen = socklen_t(MemoryLayout<sockaddr_in>.size)
                    m.msg_hdr.msg_iov = iovPointer
                    m.msg_hdr.msg_iovlen = 1
                    m.msg_hdr.msg_control = control
                    m.msg_hdr.msg_controllen = Int(bench_pktinfo(control, source))
                    // Lost to a full buffer: the retransmission sends it again.
                    _ = bench_sendmmsg(shared, &m, 1, Int32(MSG_DONTWAIT))
                }
            }
        }
    }
}
