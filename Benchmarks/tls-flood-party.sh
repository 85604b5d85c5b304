#!/usr/bin/env bash
# A party beside a TLS handshake flood on the same relay's party TLS port (issues 15 and
# 18): two `tusa party` members on loopback UDP, each sending a tone, for --seconds;
# first without a flood, then with tls-handshake-flood.py completing handshakes as fast
# as its --workers can from 2 s in until 2 s before the end. The relay runs alone on
# SERVER_CPU; the members (nice -10 when root) and the flood (nice 10) share LOAD_CPU,
# so that the flood takes the relay's CPU, not the members'. Per phase: what each member heard
# (lost %, buffer delay p95 and max), the relay's CPU (while the flood ran, in the flood
# phase), and the flood's handshakes/s.
# The certificate is RSA 4096 unless --key says otherwise (rsa:2048, ec): the costliest
# handshake a relay commonly signs, so that a flood from one core fills the relay's core.
#
# usage: Benchmarks/tls-flood-party.sh [--seconds S] [--workers N] [--key rsa:4096|rsa:2048|ec] [--smoke]
#   --smoke: 6 s per phase, 2 workers, debug build (make test runs it).
# env: TUSA (default <repo>/.build/release/tusa; --smoke: .build/debug/tusa),
#      SERVER_CPU (1), LOAD_CPU (0).
# exit: 0 when both phases ran, each member heard the other in both and the flood completed
#       handshakes; 1 otherwise;
#       2 on a usage error.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
SECONDS_PER_PHASE=12 WORKERS=4 KEY=rsa:4096 SMOKE=0
while (($#)); do
  case $1 in
    --seconds) SECONDS_PER_PHASE=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --key) KEY=$2; shift 2 ;;
    --smoke) SMOKE=1 SECONDS_PER_PHASE=6 WORKERS=2; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tls-flood-party: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $SECONDS_PER_PHASE =~ ^[0-9]+$ ]] && ((SECONDS_PER_PHASE >= 6)) \
  || { echo "tls-flood-party: --seconds must be a whole number, at least 6" >&2; exit 2; }
[[ $WORKERS =~ ^[1-9][0-9]*$ ]] || { echo "tls-flood-party: --workers must be a positive integer" >&2; exit 2; }
[[ $KEY == ec || $KEY == rsa:2048 || $KEY == rsa:4096 ]] || { echo "tls-flood-party: --key must be rsa:4096, rsa:2048 or ec" >&2; exit 2; }
if [[ -n ${TUSA:-} ]]; then TUSA=$(realpath -m -- "$TUSA")
elif ((SMOKE)); then TUSA=$ROOT/.build/debug/tusa
else TUSA=$ROOT/.build/release/tusa; fi
[[ -x $TUSA ]] || { echo "tls-flood-party: $TUSA is not built" >&2; exit 1; }
command -v openssl >/dev/null || { echo "tls-flood-party: openssl is not installed" >&2; exit 1; }
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}

source "$HERE/bench-lib.sh"
bench_setup tls-flood-party
pin_cpus tls-flood-party
flood_pins
MEMBER_PIN=("${AHEAD_PIN[@]}")

self_signed "$KEY" "$TMP" || { echo "tls-flood-party: openssl could not make a $KEY certificate" >&2; exit 1; }
"$TUSA" keygen --out "$TMP/relay.key" >/dev/null

echo "tls-flood-party: $TUSA; two members, ${SECONDS_PER_PHASE}s per phase; flood: $WORKERS workers, $KEY certificate;" \
  "relay on CPU $SERVER_CPU, members and flood on CPU $LOAD_CPU"

# quiet_port: a free port (bench-lib's free_port: below the kernel's ephemeral range,
# which the flood's thousands of connections fill) not handed out before (the relay
# binds its ports after all three are drawn). Sets PORT (not printed: a subshell would
# forget the ports given).
GIVEN=" "
quiet_port() {
  local p _
  for _ in $(seq 100); do
    p=$(free_port) || return 1
    [[ $GIVEN == *" $p "* ]] && continue
    GIVEN+="$p "
    PORT=$p
    return 0
  done
  return 1
}

FAILED=0
# phase NAME FLOOD(0|1): one party on a fresh relay; prints its line.
phase() {
  local name=$1 flood=$2 port party tls key room relay creator joiner fpid="" t0 t1 w0 w1 r cpu
  quiet_port && port=$PORT && quiet_port && party=$PORT && quiet_port && tls=$PORT \
    || { echo "tls-flood-party: no free port" >&2; return 1; }
  "${SERVER_PIN[@]}" "$TUSA" relay --listen "127.0.0.1:$port" --no-tcp --party-port "$party" --party-tls-port "$tls" \
    --cert "$TMP/cert.pem" --pkey "$TMP/key.pem" --no-tls --identity "$TMP/relay.key" \
    >"$TMP/relay.$name.out" 2>"$TMP/relay.$name.err" &
  relay=$!
  PIDS+=("$relay")
  key=$(wait_line "$TMP/relay.$name.out" 's/^party udp [^ ]* key \(.*\)$/\1/p' 200) \
    || { echo "$name: the relay did not start: $(tail -3 "$TMP/relay.$name.err")"; stop_server "$relay" 5; return 1; }
  local common=(--relay "127.0.0.1:$party" --relay-key "$key" --transport udp --json --quiet --in tone)
  "${MEMBER_PIN[@]}" "$TUSA" party create Flood "${common[@]}" --duration "$SECONDS_PER_PHASE" \
    >"$TMP/a.$name.out" 2>"$TMP/a.$name.err" &
  creator=$!
  PIDS+=("$creator")
  room=$(wait_line "$TMP/a.$name.out" 's/^party \([a-z0-9]*\) "Flood" as .*/\1/p') \
    || {
      echo "$name: tusa party create did not start: $(tail -3 "$TMP/a.$name.err")"
      stop_server "$creator" 5
      stop_server "$relay" 5
      return 1
    }
  "${MEMBER_PIN[@]}" "$TUSA" party join "$room" "${common[@]}" --duration "$SECONDS_PER_PHASE" \
    >"$TMP/b.$name.out" 2>"$TMP/b.$name.err" &
  joiner=$!
  PIDS+=("$joiner")
  # The relay's CPU over the phase (the flood's time in the flood phase), by the clock.
  t0=$(proc_ticks "$relay") w0=$(now)
  if ((flood)); then
    sleep 2
    t0=$(proc_ticks "$relay") w0=$(now)
    "${FLOOD_PIN[@]}" python3 "$HERE/tls-handshake-flood.py" --target "127.0.0.1:$tls" \
      --seconds "$((SECONDS_PER_PHASE - 4))" --workers "$WORKERS" >"$TMP/flood.out" 2>"$TMP/flood.err" &
    fpid=$!
    PIDS+=("$fpid")
  fi
  r=0
  if [[ -n $fpid ]]; then
    wait "$fpid" || true
    forget "$fpid"
    t1=$(proc_ticks "$relay") w1=$(now)
  fi
  wait "$joiner" || r=1
  wait "$creator" || r=1
  forget "$joiner"
  forget "$creator"
  [[ -n $fpid ]] || { t1=$(proc_ticks "$relay") w1=$(now); }
  if [[ -n $t0 && -n $t1 ]]; then
    cpu=$(awk -v t="$((t1 - t0))" -v hz="$HZ" -v a="$w0" -v b="$w1" 'BEGIN {printf "%.0f", 100 * t / hz / (b - a)}')
  else
    cpu=gone  # the relay died
  fi
  stop_server "$relay" 30
  ((r == 0)) || { echo "$name: a member failed: $(tail -2 "$TMP/a.$name.err") / $(tail -2 "$TMP/b.$name.err")"; return 1; }
  [[ $cpu != gone ]] || { echo "$name: the relay died: $(tail -3 "$TMP/relay.$name.err")"; return 1; }
  python3 - "$name" "$TMP/a.$name.out" "$TMP/b.$name.out" "$cpu" \
    "$( ((flood)) && cat "$TMP/flood.out")" <<'PY'
import json, sys
name, a, b, cpu, flood = sys.argv[1:6]
def report(path):
    lines = open(path).read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("{")), None)
    if start is None:
        raise SystemExit(f"{name}: no report in {path}")
    return json.loads("\n".join(lines[start:]))
heard = []
ok = True
for who, path in (("a", a), ("b", b)):
    r = report(path)
    s = r.get("speakers") or []
    if not s or s[0]["packets"] < 100:
        ok = False
        heard.append(f"{who}_heard=nothing")
        continue
    s = s[0]
    heard.append(f"{who}_lost_pct={s['lostPercent']} {who}_delay_p95_ms={s['delayP95Milliseconds']} "
                 f"{who}_delay_max_ms={s['delayMaxMilliseconds']}")
rate = flood.split("per_second=")[1].split()[0] if "per_second=" in flood else "0"
print(f"phase={name} handshakes_per_s={rate} relay_cpu={cpu}% " + " ".join(heard), flush=True)
if name == "flood" and float(rate) <= 0:
    print(f"{name}: the flood completed no handshake (is the TLS port serving?): {flood!r}", flush=True)
    ok = False
sys.exit(0 if ok else 1)
PY
}

phase quiet 0 || FAILED=1
phase flood 1 || FAILED=1
exit "$FAILED"
