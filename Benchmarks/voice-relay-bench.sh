#!/usr/bin/env bash
# The TURN relay under voice traffic (issue 17): `tusa relay`, coturn `turnserver -m 0`
# and a minimal C forwarder (Benchmarks/Sources/udp-forward: the same syscalls and one
# lookup per packet, none of TURN's checks: the machine's limit; with --servers "... uring",
# the same forwarder with its relay sockets on io_uring, what a relay could gain from it), side by side with the
# same generator, each server pinned to one CPU and the generator (turn-load --rate) to
# the other. Every flow is one allocation sending one 100-byte ChannelData packet each
# 20 ms, flows spread evenly and interleaved (no two consecutive packets of one flow),
# both ways; per round and server, on a fresh server:
#   fixed     --flows flows (default 500, a load every server carries) phase up, down,
#             both: loss, server CPU per 1000 relayed packets, one-way delay through
#             the server;
#   ramp      phase both with more and more flows (--ramp): the highest rate each
#             server carries without losing a packet;
#   mallocs   (--mallocs, root and perf): malloc calls per relayed packet in the
#             servers at the fixed load, phase both, counted with a uprobe on libc's
#             malloc for 2 s of steady traffic.
# The server order rotates between rounds; medians and per-round ratios are reported.
# Loopback only, random free ports; every process started here is stopped on exit.
#
# usage: Benchmarks/voice-relay-bench.sh [--rounds N] [--flows N] [--ramp LIST]
#            [--duration S] [--servers "tusa coturn ref"] [--batch-window US]
#            [--quiet-wait S] [--mallocs] [--smoke] [--no-build]
#   --smoke: tusa only, one round, 50 flows for 0.3 s, no ramp; passes when every
#            phase relayed with no loss (a bounded check, not a measurement).
# env: TUSA (default <repo>/.build/release/tusa; --smoke: .build/debug/tusa),
#      SERVER_CPU (1), LOAD_CPU (0), CONFIG (release; debug with --smoke), SWIFT.
# exit: 0 if every server started and relayed; 1 otherwise; 2 on a usage error.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
SMOKE=0
for a in "$@"; do [[ $a == --smoke ]] && SMOKE=1; done
ROUNDS=3 FLOWS=500 DURATION=3 WARMUP=0.5 SERVERS="tusa coturn ref" QUIET_WAIT=10 NO_BUILD=0 MALLOCS=0
RAMP=1400,1550,1700,1850,2000,2150,2300,2450,2600,2750
WINDOW=
CONFIG=${CONFIG:-release}
if ((SMOKE)); then
  ROUNDS=1 FLOWS=50 DURATION=0.3 WARMUP=0.1 SERVERS=tusa QUIET_WAIT=0 RAMP= CONFIG=${CONFIG:-debug}
  [[ $CONFIG == release ]] && CONFIG=debug
fi
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
while (($#)); do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --flows) FLOWS=$2; shift 2 ;;
    --ramp) RAMP=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --servers) SERVERS=$2; shift 2 ;;
    --batch-window) WINDOW=$2; shift 2 ;;
    --quiet-wait) QUIET_WAIT=$2; shift 2 ;;
    --smoke) shift ;;
    --mallocs) MALLOCS=1; shift ;;
    --no-build) NO_BUILD=1; shift ;;
    -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "voice-relay-bench: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $FLOWS =~ ^[1-9][0-9]*$ ]] \
  || { echo "voice-relay-bench: --rounds and --flows must be positive integers" >&2; exit 2; }
[[ -z $RAMP || $RAMP =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "voice-relay-bench: --ramp must be N1,N2,..." >&2; exit 2; }
if [[ -n ${TUSA:-} ]]; then TUSA=$(realpath -m -- "$TUSA")
elif ((SMOKE)); then TUSA=$ROOT/.build/debug/tusa
else TUSA=$ROOT/.build/release/tusa; fi

# Every flow needs a socket in the server (and one while it allocates in the generator).
MAX=$FLOWS
for n in ${RAMP//,/ }; do ((n > MAX)) && MAX=$n; done
hard=$(ulimit -Hn)
[[ $hard == unlimited ]] || ((hard >= 2 * MAX + 256)) \
  || { echo "voice-relay-bench: ulimit -Hn $hard is below the $((2 * MAX + 256)) descriptors $MAX flows need" >&2; exit 2; }
ulimit -n "$hard" 2>/dev/null || true

T_START=$(date +%s)
SWIFT=${SWIFT:-$(command -v swift || echo /opt/swift/usr/bin/swift)}
BIN=$HERE/.build/$CONFIG
if ((!NO_BUILD)); then
  for product in turn-load udp-forward; do
    "$SWIFT" build -c "$CONFIG" --package-path "$HERE" --product "$product" >"$HERE/.build/$product-build.log" 2>&1 || {
      tail -n 20 "$HERE/.build/$product-build.log" >&2
      echo "voice-relay-bench: building $product failed" >&2
      exit 1
    }
  done
fi
LOAD=$BIN/turn-load
REF=${REF:-$BIN/udp-forward}
[[ -x $LOAD ]] || { echo "voice-relay-bench: $LOAD is not built" >&2; exit 1; }

source "$HERE/bench-lib.sh"
bench_setup voice-relay-bench
busy_ticks() { awk '/^cpu[0-9]/ {s += $2 + $3 + $4 + $7 + $8} END {print s}' /proc/stat; }
pin_cpus voice-relay-bench

ACTIVE=()
for s in $SERVERS; do
  case $s in
    tusa) [[ -x $TUSA ]] && ACTIVE+=(tusa) || echo "tusa: not built ($TUSA)" ;;
    coturn) command -v turnserver >/dev/null && ACTIVE+=(coturn) || echo "coturn: not installed (scripts/setup.sh installs it)" ;;
    ref | uring) [[ -x $REF ]] && ACTIVE+=("$s") || echo "$s: $REF not built" ;;
    *) echo "voice-relay-bench: unknown server '$s' (tusa, coturn, ref, uring)" >&2; exit 2 ;;
  esac
done
((${#ACTIVE[@]})) || { echo "voice-relay-bench: nothing to run" >&2; exit 1; }

start_server() { # NAME PORT: starts it pinned, sets SPID
  local log=$TMP/$1.$2
  case $1 in
    tusa)
      "${SERVER_PIN[@]}" "$TUSA" relay --listen "127.0.0.1:$2" --no-tcp \
        -u alice:wonderland -r example.org --allow-loopback-peers --min-port 20000 --max-port 65000 \
        --user-quota 0 --total-quota 0 ${WINDOW:+--batch-window "$WINDOW"} >"$log.out" 2>"$log.err" &
      ;;
    coturn)
      start_coturn "$log" "$2" 0 --no-tcp
      ;;
    ref) "${SERVER_PIN[@]}" "$REF" --listen "127.0.0.1:$2" >"$log.out" 2>"$log.err" & ;;
    uring) "${SERVER_PIN[@]}" "$REF" --uring --listen "127.0.0.1:$2" >"$log.out" 2>"$log.err" & ;;
  esac
  SPID=$!
  PIDS+=("$SPID")
}

FAILED=0
echo "voice-relay-bench: ${ACTIVE[*]}; $ROUNDS round(s); $FLOWS flows at 50 packets/s each way" \
  "(${DURATION}s per phase); ramp: ${RAMP:-none}; servers on CPU $SERVER_CPU, generator on CPU $LOAD_CPU"
[[ " ${ACTIVE[*]} " == *" tusa "* ]] && echo "tusa: $TUSA ${WINDOW:+--batch-window $WINDOW}"
[[ " ${ACTIVE[*]} " == *" coturn "* ]] && echo "coturn: $(turnserver --version 2>/dev/null | head -1) -m 0"

run_one() { # NAME ROUND
  local name=$1 round=$2 port lpid
  ((QUIET_WAIT > 0)) && wait_quiet
  port=$(free_port) || { echo "voice-relay-bench: no free port" >&2; exit 1; }
  start_server "$name" "$port"
  if ! wait_turn_ready "$SPID" "$port"; then
    echo "round $round $name: FAILED to start or grant an allocation"
    tail -n 5 "$TMP/$name.$port.err" "$TMP/probe.err" 2>/dev/null | sed 's/^/  | /'
    stop_server "$SPID" 50
    return 1
  fi
  "${LOAD_PIN[@]}" "$LOAD" --target "127.0.0.1:$port" --server-pid "$SPID" --mode relay --rate 50 \
    --clients "$MAX" --clients-per-ip 1 --flows "$FLOWS" ${RAMP:+--ramp "$RAMP"} --duration "$DURATION" \
    --warmup "$WARMUP" >"$TMP/load.out" 2>"$TMP/load.err" &
  lpid=$!
  PIDS+=("$lpid")
  finish_generator "$name" "$round" || return 1
  grep '^phase=' "$TMP/load.out" | sed "s/^/$round /" >>"$TMP/runs.$name"
  while read -r line; do
    [[ $line == phase=* ]] || continue
    printf 'round %s %-6s %-4s flows=%-5s relayed/s=%-7s loss=%s%% cpu=%s%% ms/1000=%s delay p50/p99=%s/%s us late=%sms skipped=%s\n' \
      "$round" "$name" "$(sed 's/phase=\([a-z]*\).*/\1/' <<<"$line")" "$(field flows "$line")" "$(field total_pps "$line")" \
      "$(field loss_pct "$line")" "$(field server_cpu "$line")" "$(field server_ms_per_1000 "$line")" \
      "$(field delay_p50_us "$line")" "$(field delay_p99_us "$line")" "$(field late_max_ms "$line")" "$(field skipped "$line")"
  done <"$TMP/load.out"
}

for round in $(seq "$ROUNDS"); do
  order=("${ACTIVE[@]}")
  shift_by=$(((round - 1) % ${#order[@]}))
  order=("${order[@]:shift_by}" "${order[@]:0:shift_by}")
  for name in "${order[@]}"; do run_one "$name" "$round" || FAILED=1; done
done

# count_mallocs NAME: malloc calls per relayed packet at the fixed load, phase both.
count_mallocs() {
  local name=$1 port lpid calls
  port=$(free_port) || return 1
  start_server "$name" "$port"
  wait_turn_ready "$SPID" "$port" || { stop_server "$SPID" 50; return 1; }
  "${LOAD_PIN[@]}" "$LOAD" --target "127.0.0.1:$port" --mode relay --rate 50 --clients "$FLOWS" --clients-per-ip 1 \
    --phases both --duration 6 --warmup 0.5 >"$TMP/mallocs.out" 2>&1 &
  lpid=$!
  PIDS+=("$lpid")
  sleep 4  # allocations made, traffic steady
  # Per thread: tusa relays on its NIO event loops (NIO-ELT-*); its other threads
  # sample memory and serve metrics, whatever the traffic.
  perf stat --per-thread -x, -e probe_libc:malloc -p "$SPID" -- sleep 2 2>"$TMP/mallocs.threads" >/dev/null || true
  calls=$(awk -F, '/probe_libc:malloc/ && $2 ~ /^[0-9]+$/ {s += $2} END {print s + 0}' "$TMP/mallocs.threads")
  loops=$(awk -F, '/probe_libc:malloc/ && $1 ~ /^NIO-ELT/ && $2 ~ /^[0-9]+$/ {s += $2} END {print s + 0}' "$TMP/mallocs.threads")
  wait "$lpid" || true
  forget "$lpid"
  stop_server "$SPID" 50
  [[ $calls =~ ^[0-9]+$ ]] || return 1
  awk -v c="$calls" -v l="$loops" -v n="$1" -v p="$((2 * FLOWS * 50 * 2))" 'BEGIN {
    printf "%.4f (%d calls in 2 s, %d packets relayed", c / p, c, p
    if (n == "tusa") printf "; on the event loops that relay: %.4f, %d calls", l / p, l
    print ")" }'
}
if ((MALLOCS)); then
  if command -v perf >/dev/null && perf probe -x "$(ldconfig -p | awk '/libc.so.6 .*x86-64/ {print $NF; exit}')" --add malloc \
    >/dev/null 2>&1 || perf probe -l 2>/dev/null | grep -q 'probe_libc:malloc'; then
    for name in "${ACTIVE[@]}"; do
      echo "mallocs per relayed packet, $name, $FLOWS flows both ways: $(count_mallocs "$name" || echo "not counted")"
    done
  else
    echo "mallocs: not counted (needs perf and uprobes, as root)"
  fi
fi

# value NAME ROUND PHASE FLOWS FIELD
value() { awk -v r="$2" -v p="phase=$3" -v f="flows=$4" '$1 == r && $2 == p && index($0, " " f " ")' "$TMP/runs.$1" 2>/dev/null \
  | head -1 | sed -n "s/.*\\b$5=\\([0-9.]*\\).*/\\1/p"; }
# best_free NAME ROUND: the highest relayed rate of a ramp step without loss (the fixed load counts too).
best_free() {
  awk -v r="$2" '$1 == r && $2 == "phase=both" {
      l = $0; sub(/.*loss_pct=/, "", l); sub(/ .*/, "", l)
      t = $0; sub(/.*total_pps=/, "", t); sub(/ .*/, "", t)
      s = $0; sub(/.*skipped=/, "", s); sub(/ .*/, "", s)
      if (l + 0 == 0 && s + 0 == 0 && t + 0 > best) best = t + 0 }
    END { if (best > 0) print best }' "$TMP/runs.$1" 2>/dev/null
}
# ratio A B PHASE FIELD: per round A/B at the fixed load, "median (r1, r2, ...)".
ratio() {
  local r a b list=()
  for r in $(seq "$ROUNDS"); do
    a=$(value "$1" "$r" "$3" "$FLOWS" "$4") b=$(value "$2" "$r" "$3" "$FLOWS" "$4")
    [[ -n $a && -n $b ]] && list+=("$(awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.2f", a / b }')")
  done
  ((${#list[@]})) || return 0
  echo "$(printf '%s\n' "${list[@]}" | median_values) ($(IFS=,; echo "${list[*]}" | sed 's/,/, /g'))"
}
med() { local r; for r in $(seq "$ROUNDS"); do value "$1" "$r" "$2" "$FLOWS" "$3"; done | median_values; }

if ((!SMOKE)); then
  echo
  echo "| at $FLOWS flows (median of rounds) | $(printf '%s | ' "${ACTIVE[@]}")"
  echo "|---|$(printf -- '---:|%.0s' "${ACTIVE[@]}")"
  for spec in "relayed pkt/s, up:up:total_pps" "relayed pkt/s, down:down:total_pps" "relayed pkt/s, both:both:total_pps" \
    "loss %, up:up:loss_pct" "loss %, down:down:loss_pct" "loss %, both:both:loss_pct" \
    "server CPU ms per 1000 relayed, up:up:server_ms_per_1000" "server CPU ms per 1000 relayed, down:down:server_ms_per_1000" \
    "server CPU ms per 1000 relayed, both:both:server_ms_per_1000" "server CPU %, both:both:server_cpu" \
    "one-way delay p50 µs, both:both:delay_p50_us" "one-way delay p99 µs, both:both:delay_p99_us"; do
    IFS=: read -r label phase f <<<"$spec"
    printf '| %s |' "$label"
    for n in "${ACTIVE[@]}"; do printf ' %s |' "$(med "$n" "$phase" "$f")"; done
    echo
  done
  if [[ -n $RAMP ]]; then
    printf '| highest loss-free relayed pkt/s (ramp, median) |'
    for n in "${ACTIVE[@]}"; do
      printf ' %s |' "$(for r in $(seq "$ROUNDS"); do best_free "$n" "$r"; done | median_values)"
    done
    echo
  fi
  echo
    for phase in up down both; do
    for pair in "tusa coturn 0.67" "tusa ref -" "uring ref -" "uring coturn -"; do
      read -r a b target <<<"$pair"
      has "$a" && has "$b" || continue
      suffix=""
      [[ $target == - ]] || suffix=" (target <= $target)"
      echo "CPU per relayed packet at $FLOWS flows, $phase: $a/$b $(ratio "$a" "$b" "$phase" server_ms_per_1000)$suffix"
    done
  done
  if [[ -n $RAMP ]]; then
    for pair in "tusa coturn 1.5" "tusa ref 0.75" "ref coturn -" "uring coturn -" "uring ref -"; do
      read -r a b target <<<"$pair"
      suffix=""
      [[ $target == - ]] || suffix=" (target >= $target)"
      has "$a" && has "$b" || continue
      list=()
      for r in $(seq "$ROUNDS"); do
        x=$(best_free "$a" "$r") y=$(best_free "$b" "$r")
        [[ -n $x && -n $y ]] && list+=("$(awk -v a="$x" -v b="$y" 'BEGIN {printf "%.2f", a / b}')")
      done
      ((${#list[@]})) && echo "highest loss-free rate, $a/$b: $(printf '%s\n' "${list[@]}" | median_values) ($(IFS=,; echo "${list[*]}" | sed 's/,/, /g'))$suffix"
    done
    echo "(a ramp's top step without loss may be the ramp's end: then the server carries more than shown)"
  fi
else
  ok=1
  for phase in up down both; do
    l=$(value tusa 1 "$phase" "$FLOWS" loss_pct) t=$(value tusa 1 "$phase" "$FLOWS" total_pps)
    awk -v l="${l:-100}" -v t="${t:-0}" 'BEGIN {exit !(l == 0 && t > 0)}' || { echo "smoke: $phase relayed ${t:-0}/s, loss ${l:-?}%"; ok=0; }
  done
  if ((ok && !FAILED)); then echo "voice-relay-bench smoke: ok"; else echo "voice-relay-bench smoke: FAILED"; FAILED=1; fi
fi
echo "took $(($(date +%s) - T_START))s"
exit "$FAILED"
