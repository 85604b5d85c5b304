#!/usr/bin/env python3
"""tls-handshake-flood: complete TLS handshakes against a listener as fast as WORKERS
processes can, for SECONDS (issue 18's "TLS handshake flood"; Benchmarks/tls-flood-party.sh
runs it against a relay's party TLS port while a party talks). Each worker connects,
completes a handshake (no certificate check: the flood is after the server's CPU, not
its identity), closes, and starts again. Loopback only; standard library only.

prints: 'flood seconds= workers= handshakes= per_second= failed= workers_lost='
exit: 0, or 2 on a usage error.
"""
import argparse
import multiprocessing
import queue
import socket
import ssl
import time


def worker(host: str, port: int, seconds: float, counts) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    done = failed = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=2) as raw:
                with context.wrap_socket(raw, server_hostname=None) as tls:
                    tls.do_handshake()
            done += 1
        except OSError:
            failed += 1
            time.sleep(0.01)
    counts.put((done, failed))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="127.x.x.x:PORT of the TLS listener")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    if args.seconds <= 0 or args.workers < 1:
        parser.error("--seconds must be positive and --workers at least 1")
    host, port = args.target.rsplit(":", 1)
    if not host.startswith("127."):
        parser.error("loopback only")
    counts = multiprocessing.Queue()
    # Daemons: a worker that hangs is not waited for at exit.
    workers = [multiprocessing.Process(target=worker, args=(host, int(port), args.seconds, counts), daemon=True)
               for _ in range(args.workers)]
    for w in workers:
        w.start()
    results = []
    for _ in workers:
        try:
            # A worker ends within 2 s (its connect timeout) after the deadline.
            results.append(counts.get(timeout=args.seconds + 10))
        except queue.Empty:
            break
    for w in workers:
        w.join(timeout=1)
    missing = args.workers - len(results)
    done = sum(r[0] for r in results)
    failed = sum(r[1] for r in results)
    print(f"flood seconds={args.seconds:g} workers={args.workers} handshakes={done} "
          f"per_second={done / args.seconds:.0f} failed={failed} workers_lost={missing}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
