#!/usr/bin/env bash
# `make demo`: an end-to-end encrypted call on loopback, then a party. Starts `tusa relay`
# with its rendezvous, `tusa answer` writing what it hears to a WAV file, and
# `tusa call` playing real speech (Debian's pocketsphinx-testdata) to it;
# prints both call reports, the PESQ score of the received speech (when the
# .venv has pesq) and where the files are. IMPAIR="loss=10%,jitter=30ms" runs
# the same call over the project's own network impairment layer (both ways).
# The party: `tusa relay --party-port`, four `tusa party` members speaking in
# turn (PESQ of each speaker as each member heard it), then a room where members
# leave and the others rekey.
# Then the relay's other jobs: `tusa stun`, RFC 5780 behaviour discovery, a
# TURN allocation with `tusa turn`, and `tusa interop check` of the shared
# corpus. Every process started is stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

SPEECH=${SPEECH:-/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.wav}
IMPAIR=${IMPAIR:-}
out=out/demo
mkdir -p "$out"
impair=()
[ -n "$IMPAIR" ] && impair=(--impair "$IMPAIR")

echo "== an encrypted call on loopback: tusa relay (rendezvous), tusa answer, tusa call${IMPAIR:+ (impaired: $IMPAIR)}"
# A REST secret: registered peers get TURN credentials, so each side also offers a
# relayed candidate (ICE still picks the direct pair on loopback).
start_relay call --listen 127.0.0.1:0 --rendezvous-port 0 --use-auth-secret --static-auth-secret "demo-$$" \
  --realm tusa.demo --allow-loopback-peers
rendezvous=$(sed -n 's/^rendezvous tcp \(.*\)$/\1/p' "$work/call.out" | head -1)
for _ in $(seq 100); do
  [ -n "$rendezvous" ] && break
  sleep 0.05
  rendezvous=$(sed -n 's/^rendezvous tcp \(.*\)$/\1/p' "$work/call.out" | head -1)
done
[ -n "$rendezvous" ] || { echo "tusa relay did not report its rendezvous" >&2; exit 1; }
echo "   relay on 127.0.0.1:$PORT, rendezvous on $rendezvous"
"$TUSA" answer --rendezvous "$rendezvous" --out "$out/heard.wav" --timeout 30 --quiet "${impair[@]}" \
  >"$out/answer.txt" 2>"$work/answer.log" &
answer_pid=$!
pids+=($answer_pid)
key=""
for _ in $(seq 200); do
  key=$(sed -n 's/^answering as \(.*\)$/\1/p' "$out/answer.txt" | head -1)
  [ -n "$key" ] && break
  kill -0 "$answer_pid" 2>/dev/null || { cat "$work/answer.log"; exit 1; }
  sleep 0.05
done
[ -n "$key" ] || { echo "tusa answer did not register" >&2; exit 1; }
echo "   callee registered as $key"
echo "   calling it with $(basename "$SPEECH") ..."
"$TUSA" call "$key" --rendezvous "$rendezvous" --in "$SPEECH" --quiet "${impair[@]}" >"$out/call.txt"
wait "$answer_pid"
rest=(); for p in "${pids[@]}"; do [ "$p" != "$answer_pid" ] && rest+=("$p"); done; pids=("${rest[@]}")
echo "-- caller's report"
sed 's/^/   /' "$out/call.txt"
echo "-- callee's report"
sed -n '/^call with/,$p' "$out/answer.txt" | sed 's/^/   /'
"$TUSA" voice simulate --in "$SPEECH" --out "$out/sent-8k.wav" --codec l16 --playout ideal >/dev/null
if [ -x .venv/bin/python ] && .venv/bin/python -c "import pesq, numpy" 2>/dev/null; then
  .venv/bin/python - "$out/sent-8k.wav" "$out/heard.wav" <<'PY'
import sys
sys.path.insert(0, "Benchmarks")
from quality import score
print(f"   PESQ (P.862 narrowband) of what the callee heard against what was sent: {score(sys.argv[1], sys.argv[2]):.2f}")
PY
else
  echo "   (PESQ skipped: .venv with pesq not installed; make test installs it)"
fi
echo "   files: $out/heard.wav (what the callee heard), $out/sent-8k.wav (what was sent, 8 kHz), $out/call.txt, $out/answer.txt"

echo "== a party on loopback: tusa relay --party-port, four members speaking in turn (tusa party create/join)"
start_relay party --listen 127.0.0.1:0 --party-port 0
party=$(sed -n 's/^party udp \([^ ]*\) key \(.*\)$/\1 \2/p' "$work/party.out" | head -1)
for _ in $(seq 100); do
  [ -n "$party" ] && break
  sleep 0.05
  party=$(sed -n 's/^party udp \([^ ]*\) key \(.*\)$/\1 \2/p' "$work/party.out" | head -1)
done
[ -n "$party" ] || { echo "tusa relay did not report its party port" >&2; exit 1; }
read -r party_address party_key <<<"$party"
echo "   party service on udp $party_address, relay key $party_key"
pdir="$out/party"
rm -rf "$pdir"
mkdir -p "$pdir"
librivox=$(dirname "$SPEECH")
pscorer=Tests/InteropTests/peers/party_pesq.py
have_pesq=0
if [ -x .venv/bin/python ] && .venv/bin/python -c "import pesq, numpy" 2>/dev/null; then have_pesq=1; fi
if ((have_pesq)); then
  .venv/bin/python "$pscorer" prepare "$pdir" "$TUSA" "$librivox"/sense_and_sensibility_01_austen_64kb-0{880,930,890,920}.wav >"$pdir/plan.json"
  total=$(.venv/bin/python -c "import json,sys; print(json.load(open(sys.argv[1]))['total'] + 1.5)" "$pdir/plan.json")
else
  for k in 0 1 2 3; do cp "$SPEECH" "$pdir/in-$k.wav"; done
  total=9
fi
member() {  # member K create|join ARG
  "$TUSA" party "$2" "$3" --relay "$party_address" --relay-key "$party_key" --in "$pdir/in-$1.wav" \
    --out "$pdir/out-$1.wav" --duration "$total" >"$pdir/report-$1.txt" 2>"$pdir/events-$1.txt"
}
member 0 create Hearthstone &
mpids=($!)
room=""
for _ in $(seq 200); do
  room=$(sed -n 's/^party \([a-z0-9]*\) .*/\1/p' "$pdir/report-0.txt" | head -1)
  [ -n "$room" ] && break
  sleep 0.05
done
[ -n "$room" ] || { cat "$pdir/events-0.txt"; echo "tusa party create did not report a room" >&2; exit 1; }
echo "   created party $room; three friends join it (tusa party join $room); each speaks in turn, over ${total%.*} s"
for k in 1 2 3; do member "$k" join "$room" & mpids+=($!); done
for p in "${mpids[@]}"; do wait "$p"; done
for k in 0 1 2 3; do sed -n '/^party .* frames sent/,$p' "$pdir/report-$k.txt" | sed 's/^/   /'; done
if ((have_pesq)); then
  .venv/bin/python - "$pscorer" "$pdir" <<'PY'
import json, subprocess, sys
scores = json.loads(subprocess.run([sys.executable, sys.argv[1], "score", sys.argv[2], "4"], check=True,
                                   capture_output=True, text=True).stdout)
print("   PESQ (P.862 narrowband) of each speaker as each member heard it (listener <- speaker):")
for pair, s in sorted(scores.items()):
    l, k = pair.split(",")
    print(f"     #{int(l) + 1} <- #{int(k) + 1}: {s:.2f}")
PY
fi
echo "   a member over TCP, a leave and the rekey: in a new room one friend joins over TCP (--transport tcp,"
echo "   RFC 4571 framing on the party port, as where UDP is blocked), another leaves after 2 s: fresh keys"
"$TUSA" party create "Dota 2" --relay "$party_address" --relay-key "$party_key" --in tone --duration 6 \
  >"$pdir/rekey-0.txt" 2>"$pdir/rekey-events-0.txt" &
rk=($!)
room=""
for _ in $(seq 200); do
  room=$(sed -n 's/^party \([a-z0-9]*\) .*/\1/p' "$pdir/rekey-0.txt" | head -1)
  [ -n "$room" ] && break
  sleep 0.05
done
"$TUSA" party join "$room" --relay "$party_address" --relay-key "$party_key" --in tone --duration 5 --transport tcp \
  >"$pdir/rekey-1.txt" 2>/dev/null &
rk+=($!)
"$TUSA" party join "$room" --relay "$party_address" --relay-key "$party_key" --in silence --duration 2 >/dev/null 2>&1 &
rk+=($!)
for p in "${rk[@]}"; do wait "$p"; done
sed 's/^/     creator: /' "$pdir/rekey-events-0.txt"
sed -n 's/^party [a-z0-9]* "[^"]*": \(.*\)$/     the member over TCP: \1/p; s/^ *\(heard #[0-9].*\)$/     the member over TCP \1/p' "$pdir/rekey-1.txt"
echo "   files: $pdir (in-K.wav what member K played, out-K.wav what it heard, report-K.txt, events-K.txt)"

echo "== tusa relay on loopback: STUN, behaviour discovery, TURN, interop"
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
