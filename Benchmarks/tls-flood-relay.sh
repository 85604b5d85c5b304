#!/usr/bin/env bash
# The TURN relay beside a TLS handshake flood on its own TLS listener (issue 18): voice
# flows relayed over UDP (turn-load, 50 packets/s each way per flow) and a legitimate
# client asking one Binding over a fresh TCP connection every 50 ms (tcp-abuse.py
# --role legit), first on a quiet relay, then while tls-handshake-flood.py completes
# handshakes against --tls-listening-port as fast as its --workers can. Twice, side by
# side: the relay signing its handshakes on its event loops (TUSA_TLS_SIGN_ON_LOOP=1,
# how it was) and on its low-priority signing threads (the default). The relay runs
# alone on SERVER_CPU (its signing threads too); the generators share LOAD_CPU (the
# legitimate client at nice -10 when root, the flood at nice 10).
# Per signing mode and phase: voice loss and delay (p50, p99), the TCP client's latency
# (p50, p95), the relay's CPU and the flood's handshakes/s.
#
# usage: Benchmarks/tls-flood-relay.sh [--seconds S] [--workers N] [--flows F] [--key rsa:4096|rsa:2048|ec] [--debug]
#   --debug: the debug build (default: release).
# env: TUSA (default <repo>/.build/release/tusa), SERVER_CPU (1), LOAD_CPU (0).
# exit: 0 when every phase ran, no voice packet was lost, every legitimate request was
#       answered and each flood completed handshakes; 1 otherwise; 2 on a usage error.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
SECONDS_PER_PHASE=8 WORKERS=4 FLOWS=100 KEY=rsa:4096 CONFIG=release
while (($#)); do
  case $1 in
    --seconds) SECONDS_PER_PHASE=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --flows) FLOWS=$2; shift 2 ;;
    --key) KEY=$2; shift 2 ;;
    --debug) CONFIG=debug; shift ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tls-flood-relay: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $SECONDS_PER_PHASE =~ ^[0-9]+$ ]] && ((SECONDS_PER_PHASE >= 3)) \
  || { echo "tls-flood-relay: --seconds must be a whole number, at least 3" >&2; exit 2; }
[[ $WORKERS =~ ^[1-9][0-9]*$ ]] || { echo "tls-flood-relay: --workers must be a positive integer" >&2; exit 2; }
[[ $FLOWS =~ ^[1-9][0-9]*$ ]] || { echo "tls-flood-relay: --flows must be a positive integer" >&2; exit 2; }
[[ $KEY == ec || $KEY == rsa:2048 || $KEY == rsa:4096 ]] || { echo "tls-flood-relay: --key must be rsa:4096, rsa:2048 or ec" >&2; exit 2; }
TUSA=$(realpath -m -- "${TUSA:-$ROOT/.build/$CONFIG/tusa}")
[[ -x $TUSA ]] || { echo "tls-flood-relay: $TUSA is not built" >&2; exit 1; }
command -v openssl >/dev/null || { echo "tls-flood-relay: openssl is not installed" >&2; exit 1; }
swift build -c release --package-path "$HERE" --product turn-load >/dev/null 2>&1 \
  || { echo "tls-flood-relay: cannot build turn-load" >&2; exit 1; }
LOAD=$HERE/.build/release/turn-load
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}

source "$HERE/bench-lib.sh"
bench_setup tls-flood-relay
pin_cpus tls-flood-relay
flood_pins

self_signed "$KEY" "$TMP" || { echo "tls-flood-relay: openssl could not make a $KEY certificate" >&2; exit 1; }
echo "tls-flood-relay: $TUSA; $FLOWS voice flows and a TCP Binding client, ${SECONDS_PER_PHASE}s per phase;" \
  "flood: $WORKERS workers, $KEY certificate; relay on CPU $SERVER_CPU, generators on CPU $LOAD_CPU"

FAILED=0
# voice PORT RELAY OUT: the flows through the relay for the phase.
voice() {
  "${LOAD_PIN[@]}" "$LOAD" --target "127.0.0.1:$1" --mode relay --rate 50 --clients "$FLOWS" --flows "$FLOWS" \
    --clients-per-ip 50 --phases both --duration "$((SECONDS_PER_PHASE - 1))" --warmup 0.5 --server-pid "$2" \
    --setup-timeout 60 >"$3" 2>"$3.err"
}

# run MODE: a fresh relay signing on its loops (loop) or its signing threads (threads).
run() {
  local mode=$1 port tls relay legit flood t0 t1 w0 w1 env=()
  [[ $mode == loop ]] && env=(env TUSA_TLS_SIGN_ON_LOOP=1)
  port=$(free_port) && tls=$(free_port) || { echo "$mode: no free port"; return 1; }
  "${SERVER_PIN[@]}" "${env[@]}" "$TUSA" relay --listen "127.0.0.1:$port" -r example.org -u alice:wonderland \
    --allow-loopback-peers --cert "$TMP/cert.pem" --pkey "$TMP/key.pem" --tls-listening-port "$tls" \
    >"$TMP/relay.$mode.out" 2>"$TMP/relay.$mode.err" &
  relay=$!
  PIDS+=("$relay")
  wait_turn_ready "$relay" "$port" || { echo "$mode: the relay did not start: $(tail -3 "$TMP/relay.$mode.err")"; stop_server "$relay" 5; return 1; }
  # The legitimate client: a quiet phase, a 1 s gap (the flood starts), a loaded phase.
  "${AHEAD_PIN[@]}" python3 "$HERE/tcp-abuse.py" --role legit --target "127.0.0.1:$port" --seconds "$SECONDS_PER_PHASE" \
    --interval 0.05 --gap 1 >"$TMP/legit.$mode.out" 2>"$TMP/legit.$mode.err" &
  legit=$!
  PIDS+=("$legit")
  voice "$port" "$relay" "$TMP/voice.$mode.quiet" || { echo "$mode: quiet voice failed: $(tail -3 "$TMP/voice.$mode.quiet.err")"; }
  sleep 1
  t0=$(proc_ticks "$relay") w0=$(now)
  "${FLOOD_PIN[@]}" python3 "$HERE/tls-handshake-flood.py" --target "127.0.0.1:$tls" \
    --seconds "$((SECONDS_PER_PHASE + 1))" --workers "$WORKERS" >"$TMP/flood.$mode.out" 2>&1 &
  flood=$!
  PIDS+=("$flood")
  sleep 1
  voice "$port" "$relay" "$TMP/voice.$mode.flood" || { echo "$mode: voice beside the flood failed: $(tail -3 "$TMP/voice.$mode.flood.err")"; }
  wait "$flood" || true
  forget "$flood"
  t1=$(proc_ticks "$relay") w1=$(now)
  local answered=0
  wait "$legit" && answered=1
  forget "$legit"
  stop_server "$relay" 30
  python3 - "$mode" "$TMP/voice.$mode.quiet" "$TMP/voice.$mode.flood" "$TMP/legit.$mode.out" "$TMP/flood.$mode.out" \
    "$(awk -v t="$((${t1:-0} - ${t0:-0}))" -v hz="$HZ" -v a="$w0" -v b="$w1" 'BEGIN {printf "%.0f", 100 * t / hz / (b - a)}')" \
    "$answered" <<'PY'
import re, sys
mode, quiet, flood, legit, floodout, cpu, answered = sys.argv[1:8]
def fields(text, prefix):
    line = next((l for l in text.splitlines() if l.startswith(prefix)), "")
    return dict(re.findall(r"(\w+)=([^ ]+)", line))
ok = answered == "1"
legit_text = open(legit).read()
flood_text = open(floodout).read()
rate = fields(flood_text, "flood").get("per_second", "0")
for phase, path in (("quiet", quiet), ("flood", flood)):
    v = fields(open(path).read(), "phase=both")
    l = fields(legit_text, f"legit phase={'quiet' if phase == 'quiet' else 'abuse'}")
    if not v or not l:
        print(f"signing={mode} phase={phase}: no figures", flush=True)
        ok = False
        continue
    lost = float(v.get("loss_pct", "100"))
    ok = ok and lost == 0
    extra = f" handshakes_per_s={rate} relay_cpu={cpu}%" if phase == "flood" else ""
    print(f"signing={mode} phase={phase} voice_loss_pct={v['loss_pct']} voice_delay_p50_ms={int(v['delay_p50_us']) / 1000:g} "
          f"voice_delay_p99_ms={int(v['delay_p99_us']) / 1000:g} tcp_answered={l.get('answered')}/{l.get('requests')} "
          f"tcp_p50_ms={l.get('p50_ms')} tcp_p95_ms={l.get('p95_ms')}{extra}", flush=True)
if float(rate) <= 0:
    print(f"signing={mode}: the flood completed no handshake: {flood_text.strip()!r}", flush=True)
    ok = False
sys.exit(0 if ok else 1)
PY
}

run loop || FAILED=1
run threads || FAILED=1
exit "$FAILED"
