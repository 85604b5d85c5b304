// udp-echo: the "trivial server" ceiling for the Binding benchmark.
//
// One thread, one UDP socket: recvmmsg up to 64 datagrams, turn every STUN Binding
// request into a bare 20-byte Binding success header (type 0x0101, length 0, same
// cookie and transaction id) and sendmmsg them back to their senders. No attributes,
// no parsing beyond the header: whatever a real server does costs more than this.

import BenchSupport
import CMultiMsg

#if canImport(Glibc)
    import Glibc
#endif

let usage = """
    usage: udp-echo --listen HOST:PORT [--batch N]
      --listen HOST:PORT   loopback address to bind (127.0.0.0/8 or [::1])
      --batch N            datagrams per recvmmsg/sendmmsg (default 64)
    Runs until killed (SIGTERM/SIGINT).
    """

let args = Arguments(Array(CommandLine.arguments.dropFirst()), options: ["listen", "batch"], usage: usage)
guard let listenText = args.string("listen") else { fail("--listen is required\n\(usage)") }
guard let address = SocketAddress.parse(listenText) else {
    fail("--listen '\(listenText)': expected IPV4:PORT or [IPV6]:PORT")
}
guard address.isLoopback else { fail("--listen \(address) refused: loopback only") }
let batch = args.int("batch", default: 64, range: 1...1024)

let fd = udpSocket(family: address.family, nonBlocking: false)
if address.withSockaddr({ bind(fd, $0, $1) }) != 0 { fail("bind \(address): \(errnoText())") }
printError("udp-echo: listening on \(address)")

let bufferSize = 2048
let nameSize = socklen_t(MemoryLayout<sockaddr_storage>.size)
let buffers = UnsafeMutableRawPointer.allocate(byteCount: batch * bufferSize, alignment: 16)
let names = UnsafeMutablePointer<sockaddr_storage>.allocate(capacity: batch)
let recvIov = UnsafeMutablePointer<iovec>.allocate(capacity: batch)
let recvMsgs = UnsafeMutablePointer<bench_mmsghdr>.allocate(capacity: batch)
let sendIov = UnsafeMutablePointer<iovec>.allocate(capacity: batch)
let sendMsgs = UnsafeMutablePointer<bench_mmsghdr>.allocate(capacity: batch)
for i in 0..<batch {
    recvIov[i] = iovec(iov_base: buffers + i * bufferSize, iov_len: bufferSize)
    var m = bench_mmsghdr()
    m.msg_hdr.msg_name = UnsafeMutableRawPointer(names + i)
    m.msg_hdr.msg_iov = recvIov + i
    m.msg_hdr.msg_iovlen = 1
    recvMsgs[i] = m
    sendMsgs[i] = bench_mmsghdr()
}

while true {
    for i in 0..<batch { recvMsgs[i].msg_hdr.msg_namelen = nameSize }
    let r = Int(bench_recvmmsg(fd, recvMsgs, UInt32(batch), bench_MSG_WAITFORONE, nil))
    if r < 0 {
        if errno == EINTR { continue }
        fail("recvmmsg: \(errnoText())")
    }
    var out = 0
    for i in 0..<r {
        let p = buffers + i * bufferSize
        guard recvMsgs[i].msg_len >= UInt32(STUNWire.headerLength),
            loadBE16(p, 0) == STUNWire.bindingRequest,
            loadBE32(p, 4) == STUNWire.magicCookie
        else { continue }
        storeBE16(p, 0, STUNWire.bindingSuccess)
        storeBE16(p, 2, 0)
        sendIov[out] = iovec(iov_base: p, iov_len: STUNWire.headerLength)
        sendMsgs[out].msg_hdr.msg_name = UnsafeMutableRawPointer(names + i)
        sendMsgs[out].msg_hdr.msg_namelen = recvMsgs[i].msg_hdr.msg_namelen
        sendMsgs[out].msg_hdr.msg_iov = sendIov + out
        sendMsgs[out].msg_hdr.msg_iovlen = 1
        out += 1
    }
    var done = 0
    while done < out {
        let s = Int(bench_sendmmsg(fd, sendMsgs + done, UInt32(out - done), 0))
        if s < 0 {
            if errno == EINTR { continue }
            done += 1  // e.g. ECONNREFUSED from an earlier ICMP error: skip that datagram
            continue
        }
        done += s
    }
}
