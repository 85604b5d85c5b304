#!/usr/bin/env python3
"""Interop peer: relay UDP through a TURN server with aioice's TURN client.

Usage:
    aioice_turn.py --turn HOST:PORT --user NAME --password PW --peer HOST:PORT
                   [--transport udp|tcp|tls] [--count N] [--timeout SECONDS]

Allocates with aioice.turn.create_turn_endpoint, sends N numbered datagrams
to the peer (an echo server, such as coturn's turnutils_peer) through the
relay, and waits for the echoes. aioice binds a channel on first send.
With --transport tls the control connection is TCP inside TLS; the server's
certificate is not verified (tests use a self-signed one).

Prints exactly one JSON line on stdout:
    {"relayed": "127.0.0.1:50000", "sent": 20, "received": 20}
Exit status: 0 if every datagram came back, 1 otherwise (reason on stderr),
2 on usage errors.
"""

import argparse
import asyncio
import json
import ssl
import sys

import aioice.turn


def parse_hostport(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


class Echoes(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: set[bytes] = set()
        self.all_back = asyncio.Event()
        self.expected = 0

    def datagram_received(self, data: bytes, addr) -> None:
        self.received.add(data)
        if len(self.received) >= self.expected:
            self.all_back.set()


async def run(args) -> dict:
    context = None
    if args.transport == "tls":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    transport, protocol = await aioice.turn.create_turn_endpoint(
        Echoes, server_addr=args.turn, username=args.user, password=args.password,
        transport="udp" if args.transport == "udp" else "tcp", ssl=context)
    protocol.expected = args.count
    try:
        relayed = transport.get_extra_info("sockname")
        for i in range(args.count):
            transport.sendto(b"tusa-interop-%04d" % i + bytes(80), args.peer)
            await asyncio.sleep(0.01)
        try:
            await asyncio.wait_for(protocol.all_back.wait(), timeout=3)
        except asyncio.TimeoutError:
            pass
        return {"relayed": f"{relayed[0]}:{relayed[1]}", "sent": args.count, "received": len(protocol.received)}
    finally:
        transport.close()
        await asyncio.sleep(0.2)  # let the Refresh(lifetime 0) go out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turn", required=True, type=parse_hostport)
    ap.add_argument("--user", required=True)
    ap.add_argument("--password", required=True)
    ap.add_argument("--peer", required=True, type=parse_hostport)
    ap.add_argument("--transport", choices=["udp", "tcp", "tls"], default="udp")
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=15.0)
    args = ap.parse_args()
    try:
        result = asyncio.run(asyncio.wait_for(run(args), timeout=args.timeout))
    except Exception as e:  # noqa: BLE001 - report any failure as one line
        print(f"aioice_turn: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    if result["received"] != result["sent"]:
        print(f"aioice_turn: {result['sent'] - result['received']} datagrams not echoed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
