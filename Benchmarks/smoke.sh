#!/usr/bin/env bash
# The short, bounded bench runs inside `make test`: the Binding load generator
# against a debug `tusa relay` on loopback for one second, then the TURN one. Passes when answers
# came back, none invalid, and at most 0.1 % lost (a kernel whose
# net.core.rmem_max caps the relay's 4 MiB socket buffer may drop a few under
# bursts); the full side-by-side run is `make bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
swift build --package-path Benchmarks --product binding-load >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
load=$(swift build --package-path Benchmarks --show-bin-path)/binding-load
start_relay smoke --listen 127.0.0.1:0 --no-tcp
# --timeout-ms 500: a debug relay on a busy 2-core CI machine can pause past the default 20 ms,
# and a window written off that way is late, not lost (a CI run saw received == sent, lost=256).
line=$("$load" --target "127.0.0.1:$PORT" --duration 1 --warmup 0.2 --timeout-ms 500)
echo "bench-smoke: $line"
received=$(sed -n 's/.*received=\([0-9]*\).*/\1/p' <<<"$line")
invalid=$(sed -n 's/.*invalid=\([0-9]*\).*/\1/p' <<<"$line")
lost=$(sed -n 's/.*lost=\([0-9]*\).*/\1/p' <<<"$line")
sent=$(sed -n 's/^sent=\([0-9]*\).*/\1/p' <<<"$line")
if [ "${received:-0}" -gt 0 ] && [ "${invalid:-1}" -eq 0 ] && [ $((${lost:-1} * 1000)) -le "${sent:-0}" ]; then
  echo "bench-smoke: ok"
else
  echo "bench-smoke: FAILED (received=$received invalid=$invalid lost=$lost)"; exit 1
fi

# TURN: a debug tusa relay relays ChannelData both ways for a fraction of a second
# (turn-bench.sh --smoke: tusa only, every allocation and channel must work, <1 % loss).
swift build --package-path Benchmarks --product turn-load >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
TUSA="$TUSA" bash Benchmarks/turn-bench.sh --smoke --no-build
# The same relay under voice-paced flows (50 flows, 20 ms apart each, interleaved), every phase without loss.
TUSA="$TUSA" bash Benchmarks/voice-relay-bench.sh --smoke --no-build
# Rooms at voice pacing: two rooms of six real members (sessions, room cores, keys), three
# speaking in each, every frame delivered to every other member.
swift build --package-path Benchmarks --product party-load >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
TUSA="$TUSA" bash Benchmarks/party-relay-bench.sh --smoke --no-build
# A party of two beside a TLS handshake flood on the same relay's party TLS port: both
# members hear each other with and without it.
TUSA="$TUSA" bash Benchmarks/tls-flood-party.sh --smoke
# Reliability: a few seconds of each soak case (a flood beside voice flows, allocations alive
# with voice, TCP abuse, a call through rebindings, one round of faults): voice without loss,
# nothing kept per flood packet, every fault survived (`make soak`: the long runs).
TUSA="$TUSA" bash Benchmarks/soak.sh --short

# The encrypted transport: a fraction of a second of handshakes, the flood paths
# and sealed media through the NIO driver (secure-bench exits non-zero if a
# handshake fails or a flood packet is handled unexpectedly).
swift build --product secure-bench >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
line=$("$(swift build --show-bin-path)/secure-bench" --seconds 0.3)
echo "$line" | sed 's/^/bench-smoke: /'
grep -q "secure / plain" <<<"$line" && ! grep -q "payloads: 0 packets/s" <<<"$line" || { echo "bench-smoke: secure-bench FAILED"; exit 1; }

# Parties: forwarding and hop sealing in the room core, joins and rekeys on
# loopback (party-bench exits non-zero if a frame is dropped as spoofed, a join
# or a rekey does not happen).
swift build --product party-bench >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
line=$("$(swift build --show-bin-path)/party-bench" --seconds 0.3 --joins 3)
echo "$line" | sed 's/^/bench-smoke: /'
grep -q "forward / bare" <<<"$line" && grep -q "rekey after a leave" <<<"$line" || { echo "bench-smoke: party-bench FAILED"; exit 1; }

# The directory: invitations acknowledged once stored, in memory, SQLite and
# PostgreSQL, for a second each (directory-bench exits non-zero if a post is
# refused or a store fails; PostgreSQL must run here, as setup.sh installs it).
swift build --product directory-bench >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$(swift build --show-bin-path)/directory-bench" --clients 20 --rate 200 --friend-rate 100 --placements 50 --seconds 1 >"$work/directory.md" 2>&1 \
  && grep -q "^| PostgreSQL | 200 | [0-9]" "$work/directory.md" \
  || { cat "$work/directory.md"; echo "bench-smoke: directory-bench FAILED"; exit 1; }
sed 's/^/bench-smoke: /' "$work/directory.md"
# One node holding idle users (directory-idle.sh): 100 users for a second, 50 of them signalling
# 200 a second, SQLite and PostgreSQL.
BUILD=debug SIGNAL_RATE=200 SIGNAL_SECONDS=1 bash Benchmarks/directory-idle.sh 100 1 >"$work/idle.md" 2>&1 \
  && grep -q "^| PostgreSQL | 100 |" "$work/idle.md" \
  || { cat "$work/idle.md"; echo "bench-smoke: directory-idle FAILED"; exit 1; }
sed 's/^/bench-smoke: /' "$work/idle.md"

# The voice engine: a few seconds of each voice benchmark in a debug build (the
# figures mean nothing here; the runs must complete and report), and make
# quality's tooling on two utterances.
swift build --product voice-bench >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
vb="$(swift build --show-bin-path)/voice-bench"
"$vb" jitter --seeds 1 --seconds 10 >"$work/jitter.md" && grep -q "^- spiky" "$work/jitter.md" \
  || { cat "$work/jitter.md"; echo "bench-smoke: voice-bench jitter FAILED"; exit 1; }
"$vb" echo --seconds 6 >"$work/echo.md" && grep -q "ERLE" "$work/echo.md" \
  || { cat "$work/echo.md"; echo "bench-smoke: voice-bench echo FAILED"; exit 1; }
"$vb" cpu --seconds 2 --rounds 1 >"$work/cpu.md" && grep -q "calls per core" "$work/cpu.md" \
  || { cat "$work/cpu.md"; echo "bench-smoke: voice-bench cpu FAILED"; exit 1; }
echo "bench-smoke: voice-bench jitter, echo and cpu ran"
TUSA="$TUSA" bash Benchmarks/quality.sh --quick | sed 's/^/bench-smoke: /'

# Calls: two short real calls on loopback in one process (20 and 10 ms frames);
# call-bench exits non-zero if a call fails (its delay verdicts mean little in a
# debug build on a busy machine, so only completion and the report are checked).
swift build --product call-bench >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$(swift build --show-bin-path)/call-bench" 2 >"$work/call.md" 2>/dev/null || true
grep -q "^| 20 ms | [0-9]" "$work/call.md" && grep -q "^| 10 ms | [0-9]" "$work/call.md" \
  || { cat "$work/call.md"; echo "bench-smoke: call-bench FAILED"; exit 1; }
sed 's/^/bench-smoke: /' "$work/call.md"
