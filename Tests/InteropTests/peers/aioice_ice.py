#!/usr/bin/env python3
"""Interop peer: an aioice ICE agent that a test drives over stdin/stdout.

Usage:
    aioice_ice.py controlling|controlled [--timeout SECONDS] [--stdin-timeout SECONDS]

1. Gathers host candidates on 127.0.0.1 only (aioice 0.13's
   get_host_addresses() drops loopback; this peer monkeypatches that
   module-level function, which Connection.gather_candidates looks up in
   aioice.ice at call time), no STUN/TURN server, and prints one JSON line:
       {"ufrag": ..., "pwd": ..., "candidates": ["<candidate-attribute>", ...]}
   Candidate strings are aioice's Candidate.to_sdp(): the RFC 8839
   candidate-attribute value WITHOUT the "candidate:" prefix, e.g.
       "<md5 foundation> 1 udp 2130706431 127.0.0.1 50000 typ host"
2. Reads one JSON line of the same shape from stdin: the other agent (a
   leading "candidate:" on its strings is tolerated), then signals
   end-of-candidates, and prints {"read": "<seconds it waited>"}.
3. Runs aioice's connectivity checks (connect(), bounded by --timeout) and
   prints {"connected": true, "local": "ip:port", "remote": "ip:port"} for the
   nominated pair of component 1.
4. Sends b"hello from aioice", waits up to --timeout for one datagram, prints
   {"received": "<text>"}; if it was "hello from tusa", answers
   b"bye from aioice". Then closes and exits 0.

Any failure prints {"error": "..."} and exits 1 (2 on usage errors).
AIOICE_DEBUG=1 logs aioice's debug output (every STUN message) to stderr.
"""

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
import time

import aioice
import aioice.ice



def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def read_line_async() -> "asyncio.Future[str]":
    """Read one line from stdin in a daemon thread.

    Unlike run_in_executor, a daemon thread still blocked in readline() after
    a timeout does not hold up interpreter shutdown.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[str] = loop.create_future()

    def reader() -> None:
        try:
            line = sys.stdin.readline()
        except BaseException as exc:  # noqa: BLE001 - handed to the loop
            loop.call_soon_threadsafe(lambda: future.done() or future.set_exception(exc))
            return
        loop.call_soon_threadsafe(lambda: future.done() or future.set_result(line))

    threading.Thread(target=reader, name="stdin", daemon=True).start()
    return future


def hostport(addr) -> str:
    return f"{addr[0]}:{addr[1]}"


async def run(role: str, timeout: float, stdin_timeout: float) -> int:
    # Host candidates on loopback only (signature: (use_ipv4, use_ipv6) -> list[str]).
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]
    conn = aioice.Connection(ice_controlling=(role == "controlling"), components=1,
                             use_ipv4=True, use_ipv6=False)
    step = "gathering candidates"
    try:
        await conn.gather_candidates()
        if not conn.local_candidates:
            raise RuntimeError("no local candidate (could not bind 127.0.0.1)")
        emit({"ufrag": conn.local_username, "pwd": conn.local_password,
              "candidates": [c.to_sdp() for c in conn.local_candidates]})

        step = "reading the remote description from stdin"
        waited = time.monotonic()
        try:
            line = await asyncio.wait_for(read_line_async(), stdin_timeout)
        except asyncio.TimeoutError:
            raise RuntimeError(f"no remote description on stdin after {time.monotonic() - waited:.1f} s") from None
        emit({"read": f"{time.monotonic() - waited:.3f}"})
        if not line.strip():
            raise RuntimeError("stdin closed before the remote description arrived")
        remote = json.loads(line)
        conn.remote_username = remote["ufrag"]
        conn.remote_password = remote["pwd"]
        step = "adding remote candidates"
        for sdp in remote["candidates"]:
            sdp = sdp.strip()
            if sdp.startswith("a="):
                sdp = sdp[2:]
            if sdp.startswith("candidate:"):
                sdp = sdp[len("candidate:"):]
            # add_remote_candidate is a coroutine in aioice 0.13.
            await conn.add_remote_candidate(aioice.Candidate.from_sdp(sdp))
        await conn.add_remote_candidate(None)  # end-of-candidates

        step = "connecting"
        await asyncio.wait_for(conn.connect(), timeout)
        pair = conn._nominated.get(1)  # aioice keeps the selected pair per component here
        if pair is None:
            raise RuntimeError("connect() returned without a nominated pair")
        emit({"connected": True, "local": hostport(pair.local_addr),
              "remote": hostport(pair.remote_addr)})

        step = "exchanging data"
        await conn.send(b"hello from aioice")
        step = "waiting for a datagram"
        data = await asyncio.wait_for(conn.recv(), timeout)
        text = data.decode("utf-8", "replace")
        emit({"received": text})
        if text == "hello from tusa":
            await conn.send(b"bye from aioice")
            await asyncio.sleep(0.2)  # let the datagram leave before the socket closes
        return 0
    except asyncio.TimeoutError:
        emit({"error": f"timed out {step}"})
        return 1
    except Exception as exc:  # noqa: BLE001 - any failure is reported as JSON
        emit({"error": f"{step}: {type(exc).__name__}: {exc}"})
        return 1
    finally:
        await conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["controlling", "controlled"])
    ap.add_argument("--timeout", type=float, default=20.0,
                    help="limit in seconds for connect() and for the datagram after it (default 20)")
    ap.add_argument("--stdin-timeout", type=float, default=120.0,
                    help="limit in seconds for the other agent's description on stdin (default 120:"
                         " the driving test may be slow to answer on a loaded machine, and kills this peer anyway)")
    args = ap.parse_args()
    if os.environ.get("AIOICE_DEBUG") == "1":
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                            format="%(asctime)s %(name)s %(message)s")
    return asyncio.run(run(args.role, args.timeout, args.stdin_timeout))


if __name__ == "__main__":
    sys.exit(main())
