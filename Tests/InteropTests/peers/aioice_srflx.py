#!/usr/bin/env python3
"""Interop peer: gather ICE candidates with aioice against a STUN server.

Usage:
    aioice_srflx.py --stun HOST:PORT [--timeout SECONDS] [--host ADDR ...]

Prints exactly one JSON line on stdout:
    {"host": ["127.0.0.1:40001"], "srflx": ["127.0.0.1:40001"], "stun": "127.0.0.1:3478"}
Exit status: 0 if at least one server-reflexive candidate was gathered,
1 otherwise (reason on stderr), 2 on usage errors.

Loopback note (aioice 0.13): aioice.ice.get_host_addresses() enumerates the
interfaces with ifaddr and deliberately drops 127.0.0.1 and ::1, so a plain
Connection would gather from e.g. eth0 only and send its STUN request from a
non-loopback source. This test peer monkeypatches that module-level function
(Connection.gather_candidates looks it up in aioice.ice at call time) so that
host candidates are bound to the addresses given with --host (default
127.0.0.1) only. aioice queries the STUN server only from IPv4 host
candidates and resolves the server with socket.gethostbyname (IPv4 only), so
an IPv6 STUN server cannot yield srflx candidates with aioice.
"""

import argparse
import asyncio
import json
import sys

import aioice
import aioice.ice


def parse_hostport(value: str) -> tuple[str, int]:
    if value.startswith("["):  # [v6]:port
        host, _, port = value[1:].partition("]:")
    else:
        host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


async def gather(stun: tuple[str, int], hosts: list[str]) -> aioice.Connection:
    # Restrict host candidate gathering to the requested (loopback) addresses.
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: list(hosts)
    conn = aioice.Connection(ice_controlling=True, components=1, stun_server=stun)
    try:
        await conn.gather_candidates()
    except BaseException:
        await conn.close()
        raise
    return conn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stun", required=True, type=parse_hostport, help="STUN server HOST:PORT")
    ap.add_argument("--timeout", type=float, default=8.0,
                    help="overall time limit in seconds (default 8; aioice itself waits "
                         "at most 5 s for STUN answers)")
    ap.add_argument("--host", action="append", dest="hosts",
                    help="local address to gather host candidates from (repeatable; "
                         "default 127.0.0.1)")
    args = ap.parse_args()
    hosts = args.hosts or ["127.0.0.1"]

    async def run() -> dict:
        conn = await asyncio.wait_for(gather(args.stun, hosts), args.timeout)
        try:
            cands = conn.local_candidates
            return {
                "host": [f"{c.host}:{c.port}" for c in cands if c.type == "host"],
                "srflx": [f"{c.host}:{c.port}" for c in cands if c.type == "srflx"],
                "stun": f"{args.stun[0]}:{args.stun[1]}",
            }
        finally:
            await conn.close()

    try:
        result = asyncio.run(run())
    except asyncio.TimeoutError:
        result = {"host": [], "srflx": [], "stun": f"{args.stun[0]}:{args.stun[1]}",
                  "error": f"timeout after {args.timeout}s"}
    except Exception as exc:  # noqa: BLE001 - report any failure as JSON + exit 1
        result = {"host": [], "srflx": [], "stun": f"{args.stun[0]}:{args.stun[1]}",
                  "error": f"{type(exc).__name__}: {exc}"}

    print(json.dumps(result), flush=True)
    if result["srflx"]:
        return 0
    reason = result.get("error") or (
        "no server-reflexive candidate (no usable STUN Binding response within aioice's 5 s "
        f"gathering window; host candidates: {result['host']})")
    print(f"aioice_srflx: {reason}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
