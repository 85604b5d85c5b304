#!/usr/bin/env bash
# `make demo` (until calls exist): start `tusa relay` on loopback, ask it for
# the mapped address with `tusa stun`, classify the (absent) NAT with RFC 5780
# discovery against a relay with an alternate address, relay packets through a
# TURN allocation with `tusa turn`, check the shared interop
# corpus with `tusa interop check`, and stop every relay cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

echo "== tusa relay on loopback"
start_relay plain --listen 127.0.0.1:0
echo "   listening on 127.0.0.1:$PORT (UDP and TCP)"
echo "== tusa stun 127.0.0.1:$PORT"
echo "   mapped address: $("$TUSA" stun "127.0.0.1:$PORT")"

# RFC 5780 needs a second IP: all of 127/8 is loopback on Linux.
alt_port=$(( (RANDOM % 20000) + 30000 ))
main_port=$(( alt_port + 1 ))
echo "== tusa relay with an alternate address (RFC 5780), and tusa stun --behavior"
start_relay rfc5780 --listen "127.0.0.1:$main_port" --alt-address "127.0.0.2:$alt_port" --no-tcp
"$TUSA" stun --behavior "127.0.0.1:$main_port" | sed 's/^/   /'

echo "== TURN: tusa relay with a user, tusa turn relaying to an echo peer (coturn's turnutils_peer)"
start_relay turn --listen 127.0.0.1:0 -u alice:wonderland -r example.org --allow-loopback-peers
peer_port=$(( (RANDOM % 20000) + 30000 ))
turnutils_peer -L 127.0.0.1 -p "$peer_port" >/dev/null 2>&1 &
peer_pid=$!
pids+=($peer_pid)
sleep 0.3
"$TUSA" turn "127.0.0.1:$PORT" --user alice:wonderland --peer "127.0.0.1:$peer_port" --count 10 | sed 's/^/   /'

echo "== tusa interop check: ../shared/interop (coturn, aioice, browsers, RFC vectors) and Interop/ (Tusa's own captures)"
TUSA=$TUSA bash scripts/interop-check.sh --quiet | sed 's/^/   /'

echo "== stopping relays (SIGTERM)"
for p in "${pids[@]}"; do kill -TERM "$p"; done
# Every relay must exit 0; the echo peer just dies of the signal.
for p in "${pids[@]}"; do
  if [ "$p" = "$peer_pid" ]; then wait "$p" || true; else wait "$p"; fi
done
pids=()
echo "demo: done"
