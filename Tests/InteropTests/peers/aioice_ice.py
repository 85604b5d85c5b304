#!/usr/bin/env python3
"""Interop peer: an aioice ICE agent that a test drives over stdin/stdout.

Usage:
    aioice_ice.py controlling|controlled [--timeout SECONDS]

1. Gathers host candidates on 127.0.0.1 only (aioice drops loopback from
   get_host_addresses(); this peer monkeypatches that module-level function,
   which Connection.gather_candidates looks up at call time) and prints one
   JSON line: {"ufrag": ..., "pwd": ..., "candidates": ["<candidate-attribute>", ...]}.
2. Reads one JSON line of the same shape from stdin: the other agent.
3. Runs aioice's connectivity checks (connect()); prints
   {"connected": true, "local": "ip:port", "remote": "ip:port"} for the
   nominated pair.
4. Sends b"hello from aioice", waits up to 5 s for one datagram, prints
   {"received": "<text>"}; if it was "hello from tusa", answers b"bye from aioice".

Any failure prints {"error": "..."} and exits 1. AIOICE_DEBUG=1 logs aioice's
debug output to stderr.
"""

import argparse
import asyncio
import json
import logging
import os
import sys

import aioice
import aioice.ice


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main(role, timeout):
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]
    conn = aioice.Connection(ice_controlling=(role == "controlling"), components=1,
                             use_ipv4=True, use_ipv6=False)
    try:
        await conn.gather_candidates()
        emit({"ufrag": conn.local_username, "pwd": conn.local_password,
              "candidates": [c.to_sdp() for c in conn.local_candidates]})
        line = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline), timeout)
        remote = json.loads(line)
        conn.remote_username = remote["ufrag"]
        conn.remote_password = remote["pwd"]
        for sdp in remote["candidates"]:
            if sdp.startswith("candidate:"):
                sdp = sdp[len("candidate:"):]
            await conn.add_remote_candidate(aioice.Candidate.from_sdp(sdp))
        await conn.add_remote_candidate(None)
        await asyncio.wait_for(conn.connect(), timeout)
        pair = conn._nominated.get(1)
        local = "%s:%d" % tuple(pair.local_addr[:2]) if pair else None
        remote_addr = "%s:%d" % tuple(pair.remote_addr[:2]) if pair else None
        emit({"connected": True, "local": local, "remote": remote_addr})
        await conn.send(b"hello from aioice")
        data = await asyncio.wait_for(conn.recv(), 5)
        text = data.decode("utf-8", "replace")
        emit({"received": text})
        if text == "hello from tusa":
            await conn.send(b"bye from aioice")
            await asyncio.sleep(0.2)
        return 0
    except Exception as e:  # any failure is reported, not raised
        emit({"error": "%s: %s" % (type(e).__name__, e)})
        return 1
    finally:
        await conn.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["controlling", "controlled"])
    parser.add_argument("--timeout", type=float, default=20)
    args = parser.parse_args()
    if os.environ.get("AIOICE_DEBUG") == "1":
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    sys.exit(asyncio.run(main(args.role, args.timeout)))
