#!/usr/bin/env python3
"""tcp-abuse: a TCP listener under abuse, and a legitimate client's latency beside it
(the soak's tcp and directory cases, Benchmarks/soak.sh). Loopback only; standard
library only. --protocol says what the listener speaks: stun (the relay's TURN
listener, the default), rendezvous (a directory's or a relay's rendezvous port:
2-byte length, then a JSON message; its legitimate client, which must register with
a key's proof, is `directory-bench --legit`) or http (the relay's Prometheus port:
the legitimate client scrapes GET /metrics).

While the abuse runs, a legitimate client (its own source address, 127.20.0.1) opens a
connection every 50 ms, sends one STUN Binding request (RFC 4571-style framing is not
needed: STUN over TCP is self-delimiting), or one scrape, and times the answer; the
same client runs first against the quiet listener. The abuse, each from its own source address:

  idle       --idle N connection attempts from one address (127.10.0.1), 200 at a
             time, held open and silent: how many the listener admitted (open after
             1 s) and refused (closed at once); with --reopen, an admitted connection
             the listener closes later (a rendezvous closes one that does not register
             within 10 s) is opened again at once, so the listener keeps holding them
  slowloris  --slow N connections (127.11.0.1) that send a frame's header one byte
             every --slow-interval seconds: when the listener closed each (seconds after
             connecting; a frame begun must complete within the listener's deadline)
  oversized  --bad N connections (127.12.0.1) announcing a message longer than the
             protocol allows (STUN: 65,000 bytes, sent slowly; rendezvous: 65,535, past
             its 16,384), and N sending bytes that are no message (STUN: random; rendezvous:
             a whole frame of random bytes): closed how fast
  tls        --tls-port P: --tls N connections (127.13.0.1) that start a TLS handshake
             (a ClientHello's first bytes) and stop

prints: 'legit phase=quiet|abuse requests= answered= p50_ms= p95_ms= max_ms=' and one
line per abuse kind; exit 0 when every legitimate request was answered.
"""
import argparse
import asyncio
import os
import resource
import statistics
import struct
import time


def binding_request() -> bytes:
    return struct.pack("!HHI", 0x0001, 0, 0x2112A442) + os.urandom(12)


# What each protocol's abusers send: a frame to trickle, one announced too long, bytes
# that are no message.
def slow_frame(protocol):
    if protocol == "rendezvous":
        body = b'{"type":"register","key":"' + b"A" * 43 + b'=","proof":"'
        return struct.pack("!H", len(body) + 90) + body
    if protocol == "http":
        return b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slowloris\r\n"
    return struct.pack("!HHI", 0x0001, 8, 0x2112A442) + os.urandom(12) + b"\x00\x80\x00\x04abcd"


def oversized_frame(protocol):
    if protocol == "rendezvous":
        return b"\xff\xff" + os.urandom(1000)
    if protocol == "http":
        # A header past any server's limit (SwiftNIO's parser takes 80 KiB).
        return b"GET /metrics HTTP/1.1\r\nX-Filler: " + b"a" * 200_000 + b"\r\n\r\n"
    return struct.pack("!HHI", 0x0001, 65000, 0x2112A442) + os.urandom(12) + os.urandom(1000)


def garbage(protocol):
    if protocol == "rendezvous":
        return struct.pack("!H", 200) + os.urandom(200)
    if protocol == "http":
        return b"\x00\xff" + os.urandom(200) + b"\r\n\r\n"
    return b"\xff" + os.urandom(200)


async def open_from(host, port, source, timeout=2.0):
    return await asyncio.wait_for(
        asyncio.open_connection(host, port, local_addr=(source, 0)), timeout=timeout)


async def legit(host, port, seconds, interval, protocol, out):
    """One Binding request (or one scrape) per fresh connection every `interval` seconds;
    latencies in ms."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        try:
            reader, writer = await open_from(host, port, "127.20.0.1")
            if protocol == "http":
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                await writer.drain()
                response = await asyncio.wait_for(reader.read(-1), timeout=2.0)
                if not response.startswith(b"HTTP/1.1 200"):
                    raise OSError(f"scrape answered {response[:40]!r}")
            else:
                writer.write(binding_request())
                await writer.drain()
                header = await asyncio.wait_for(reader.readexactly(20), timeout=2.0)
                length = struct.unpack("!H", header[2:4])[0]
                await asyncio.wait_for(reader.readexactly(length), timeout=2.0)
            out.append((time.perf_counter() - started) * 1000)
            writer.close()
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            out.append(None)
        await asyncio.sleep(max(0.0, interval - (time.perf_counter() - started)))


async def closed_within(reader, limit):
    """Seconds until the peer closed the connection, or None if it stayed open for `limit`."""
    started = time.monotonic()
    try:
        while True:
            data = await asyncio.wait_for(reader.read(4096), timeout=max(0.01, limit - (time.monotonic() - started)))
            if not data:
                return time.monotonic() - started
    except asyncio.TimeoutError:
        return None
    except OSError:
        return time.monotonic() - started


async def idle(host, port, attempts, hold, reopen, result):
    """`attempts` connections from one address, at most 200 connecting at once (more
    would only overflow the listener's accept queue, which is not what is measured),
    each then held open and silent: admitted if still open after 1 s. With `reopen`,
    an admitted connection the listener closes during the hold is opened again."""
    writers = []
    gate = asyncio.Semaphore(200)
    ends = time.monotonic() + hold
    reopened = [0]

    async def keep(reader):
        while reopen:
            left = ends - time.monotonic()
            if left <= 0 or await closed_within(reader, left) is None:
                return
            try:
                reader, writer = await open_from(host, port, "127.10.0.1", timeout=10.0)
            except (OSError, asyncio.TimeoutError):
                return
            writers.append(writer)
            reopened[0] += 1

    async def one():
        async with gate:
            try:
                reader, writer = await open_from(host, port, "127.10.0.1", timeout=10.0)
            except (OSError, asyncio.TimeoutError):
                return "failed", None
        writers.append(writer)
        if await closed_within(reader, 1.0) is not None:
            return "refused", None
        return "admitted", reader

    outcomes = await asyncio.gather(*(one() for _ in range(attempts)))
    kinds = [k for k, _ in outcomes]
    result["idle"] = {k: kinds.count(k) for k in ("admitted", "refused", "failed")}
    await asyncio.gather(*(keep(r) for _, r in outcomes if r is not None), asyncio.sleep(max(0.0, ends - time.monotonic())))
    result["idle"]["reopened"] = reopened[0]
    for w in writers:
        w.close()


async def slowloris(host, port, count, interval, limit, protocol, result):
    async def one():
        try:
            reader, writer = await open_from(host, port, "127.11.0.1")
        except (OSError, asyncio.TimeoutError):
            return None
        header = slow_frame(protocol)
        started = time.monotonic()
        closed = asyncio.ensure_future(closed_within(reader, limit))
        for byte in header:
            if closed.done():
                break
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except OSError:
                break
            await asyncio.wait([closed], timeout=interval)
        seconds = await closed
        writer.close()
        return None if seconds is None else time.monotonic() - started

    times = await asyncio.gather(*(one() for _ in range(count)))
    result["slowloris"] = times


async def send_and_watch(host, port, source, payload, limit):
    """Seconds until the listener closed a connection that sent `payload` and then
    nothing more; None if it stayed open for `limit` (or could not connect)."""
    try:
        reader, writer = await open_from(host, port, source)
    except (OSError, asyncio.TimeoutError):
        return None
    writer.write(payload)
    seconds = await closed_within(reader, limit)
    writer.close()
    return seconds


async def oversized(host, port, count, limit, protocol, result):
    # A frame announced longer than the protocol allows, and its first thousand bytes; then
    # bytes that are no message.
    result["oversized"] = await asyncio.gather(
        *(send_and_watch(host, port, "127.12.0.1", oversized_frame(protocol), limit) for _ in range(count)))
    result["garbage"] = await asyncio.gather(
        *(send_and_watch(host, port, "127.12.0.1", garbage(protocol), limit) for _ in range(count)))


async def tls_stall(host, port, count, limit, result):
    # A TLS record header for a handshake message, then nothing more.
    hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
    result["tls"] = await asyncio.gather(*(send_and_watch(host, port, "127.13.0.1", hello, limit) for _ in range(count)))


def latency_line(phase, samples):
    answered = [s for s in samples if s is not None]
    if answered:
        ordered = sorted(answered)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return (f"legit phase={phase} requests={len(samples)} answered={len(answered)} "
                f"p50_ms={statistics.median(ordered):.2f} p95_ms={p95:.2f} max_ms={ordered[-1]:.2f}")
    return f"legit phase={phase} requests={len(samples)} answered=0"


def closes_line(kind, times, limit):
    closed = sorted(t for t in times if t is not None)
    left = sum(1 for t in times if t is None)
    if not closed:
        return f"abuse kind={kind} connections={len(times)} closed=0 still_open={left} watched_s={limit:.0f}"
    return (f"abuse kind={kind} connections={len(times)} closed={len(closed)} "
            f"closed_after_s_min={closed[0]:.2f} closed_after_s_max={closed[-1]:.2f} still_open={left} watched_s={limit:.0f}")


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True, help="IPV4:PORT of the TCP listener (loopback)")
    parser.add_argument("--protocol", choices=("stun", "rendezvous", "http"), default="stun")
    parser.add_argument("--reopen", action="store_true", help="idle: open again what the listener closes")
    parser.add_argument("--tls-port", type=int)
    parser.add_argument("--seconds", type=float, default=10, help="legit client, per phase")
    parser.add_argument("--interval", type=float, default=0.05, help="legit client, seconds between requests")
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--slow", type=int, default=50)
    parser.add_argument("--slow-interval", type=float, default=2.0)
    parser.add_argument("--bad", type=int, default=50)
    parser.add_argument("--tls", type=int, default=50)
    parser.add_argument("--deadline", type=float, default=40, help="how long to watch abusive connections")
    parser.add_argument(
        "--role", choices=("both", "legit", "abuse"), default="both",
        help="legit: the quiet phase, a --gap pause for another process's abuse, the loaded phase; "
        "abuse: the abuse only; both: one process (the legitimate client then shares its loop with the abuse)")
    parser.add_argument("--gap", type=float, default=2.0)
    args = parser.parse_args()
    host, port = args.target.rsplit(":", 1)
    port = int(port)
    assert host.startswith("127."), "loopback only"
    if args.protocol == "rendezvous" and args.role != "abuse":
        parser.error("a rendezvous's legitimate client registers with a key: use directory-bench --legit")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    quiet, loaded = [], []
    if args.role in ("legit", "both"):
        await legit(host, port, args.seconds, args.interval, args.protocol, quiet)
        print(latency_line("quiet", quiet), flush=True)
        if args.role == "legit":
            # The abuse, another process, starts now; its connections are in place after the gap.
            await asyncio.sleep(args.gap)
            await legit(host, port, args.seconds, args.interval, args.protocol, loaded)
            print(latency_line("abuse", loaded), flush=True)
            return 0 if all(s is not None for s in quiet + loaded) else 1

    result = {}
    abuse = [
        asyncio.ensure_future(idle(host, port, args.idle, args.deadline, args.reopen, result)),
        asyncio.ensure_future(slowloris(host, port, args.slow, args.slow_interval, args.deadline, args.protocol, result)),
        asyncio.ensure_future(oversized(host, port, args.bad, args.deadline, args.protocol, result)),
    ]
    if args.tls_port:
        abuse.append(asyncio.ensure_future(tls_stall(host, args.tls_port, args.tls, args.deadline, result)))
    if args.role == "both":
        await asyncio.sleep(args.gap)  # the abuse is in place
        await legit(host, port, args.seconds, args.interval, args.protocol, loaded)
        print(latency_line("abuse", loaded), flush=True)
    await asyncio.gather(*abuse)
    i = result.get("idle", {})
    print(f"abuse kind=idle attempts={args.idle} admitted={i.get('admitted', 0)} refused={i.get('refused', 0)} "
          f"failed={i.get('failed', 0)} reopened={i.get('reopened', 0)}")
    for kind in ("slowloris", "oversized", "garbage", "tls"):
        if kind in result:
            print(closes_line(kind, result[kind], args.deadline))
    return 0 if all(s is not None for s in quiet + loaded) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
