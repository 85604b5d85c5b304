#!/usr/bin/env bash
# Room forwarding under voice traffic (issues 15 and 17): `tusa relay --party-port` against
# coturn `turnserver -m 0` carrying the same conversation as a mesh of TURN allocations,
# side by side with generators of the project's own, each server pinned to one CPU and the
# generator to the other.
#   tusa    party-load: rooms of --size members, --speakers of them talking in each room,
#           one voiced frame (60 bytes of audio) every 20 ms each, speakers interleaved;
#           every member a real party member (its own Noise IK session with the relay,
#           the room core's keys). The relay reads each frame once and writes it to the
#           room's other members: --size - 1 deliveries per frame.
#   coturn  turn-load --phases up: every speaker relays its own N-1 copies, one flow per
#           copy (speakers x (size - 1) flows per room, one ChannelData packet each every
#           20 ms, interleaved), payload as long as the party's delivered datagram. The
#           same deliveries per second, one read and one write each.
#   ref     party-load --reference against room-forward (Benchmarks/Sources/room-forward),
#           a C forwarder doing the relay's work per frame with none of its checks: one
#           read and one ChaCha20-Poly1305 open, then one seal and one datagram per other
#           member, sendmmsg. The machine's limit (issue 17: tusa within 75 % of its rate).
# Per round and server, on a fresh server: a fixed load (--rooms, a load both carry),
# then a ramp (--ramp, rooms talking; coturn's stops at --coturn-max rooms, past where it
# loses): loss, server CPU per 1000 delivered packets, the highest rate delivered without
# loss (no loss, nothing skipped, and at least 99 % of the offered rate delivered within
# the step: a server that falls behind queues before it drops). The party generators open
# one delivery in --open-every (8) and count the others by the phase their clear header
# shows, so that they out-run the servers. The order rotates between rounds; medians and
# per-round ratios are reported. Loopback only, random free ports; every process started
# here is stopped on exit.
#
# usage: Benchmarks/party-relay-bench.sh [--rounds N] [--rooms N] [--ramp LIST] [--size N]
#            [--speakers N] [--duration S] [--servers "tusa coturn ref"] [--quiet-wait S]
#            [--coturn-max N] [--open-every N]
#            [--smoke] [--no-build]
#   --smoke: tusa only, one round, 2 rooms of 6 for 0.5 s, no ramp; passes when every
#            frame reached every other member (a bounded check, not a measurement).
# env: TUSA (default <repo>/.build/release/tusa; --smoke: .build/debug/tusa),
#      SERVER_CPU (1), LOAD_CPU (0), CONFIG (release; debug with --smoke), SWIFT.
# exit: 0 if every server started and carried the fixed load; 1 otherwise; 2 on a usage error.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
SMOKE=0
for a in "$@"; do [[ $a == --smoke ]] && SMOKE=1; done
ROUNDS=3 ROOMS=12 SIZE=25 SPEAKERS=3 DURATION=3 WARMUP=0.5 SERVERS="tusa coturn ref" QUIET_WAIT=10 NO_BUILD=0
RAMP=20,28,36,40,44,48,56,64,72,80,88 COTURN_MAX=72 OPEN_EVERY=8
CONFIG=${CONFIG:-release}
if ((SMOKE)); then
  ROUNDS=1 ROOMS=2 SIZE=6 DURATION=0.5 WARMUP=0.2 SERVERS=tusa QUIET_WAIT=0 RAMP= CONFIG=debug OPEN_EVERY=1
fi
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
while (($#)); do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --rooms) ROOMS=$2; shift 2 ;;
    --ramp) RAMP=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --speakers) SPEAKERS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --servers) SERVERS=$2; shift 2 ;;
    --quiet-wait) QUIET_WAIT=$2; shift 2 ;;
    --coturn-max) COTURN_MAX=$2; shift 2 ;;
    --open-every) OPEN_EVERY=$2; shift 2 ;;
    --smoke) shift ;;
    --no-build) NO_BUILD=1; shift ;;
    -h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "party-relay-bench: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for n in "$ROUNDS" "$ROOMS" "$SIZE" "$SPEAKERS" "$COTURN_MAX" "$OPEN_EVERY"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "party-relay-bench: --rounds, --rooms, --size, --speakers, --coturn-max and --open-every must be positive integers" >&2; exit 2; }
done
((SPEAKERS < SIZE)) || { echo "party-relay-bench: --speakers must be below --size" >&2; exit 2; }
[[ -z $RAMP || $RAMP =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "party-relay-bench: --ramp must be N1,N2,..." >&2; exit 2; }
if [[ -n ${TUSA:-} ]]; then TUSA=$(realpath -m -- "$TUSA")
elif ((SMOKE)); then TUSA=$ROOT/.build/debug/tusa
else TUSA=$ROOT/.build/release/tusa; fi

# The most rooms any step has talking: every one of them is set up.
MAXROOMS=$ROOMS
for n in ${RAMP//,/ }; do ((n > MAXROOMS)) && MAXROOMS=$n; done
COPIES=$((SPEAKERS * (SIZE - 1)))  # deliveries per frame period in one room = mesh flows per room
# coturn's mesh: the fixed load and the ramp's steps up to --coturn-max rooms.
COTURN_ROOMS=$ROOMS COTURN_RAMP=()
for n in ${RAMP//,/ }; do ((n <= COTURN_MAX)) && COTURN_RAMP+=("$n") && ((n > COTURN_ROOMS)) && COTURN_ROOMS=$n; done
MAXFLOWS=$((COTURN_ROOMS * COPIES))
hard=$(ulimit -Hn)
[[ $hard == unlimited ]] || ((hard >= 2 * MAXFLOWS + 256)) \
  || { echo "party-relay-bench: ulimit -Hn $hard is below the $((2 * MAXFLOWS + 256)) descriptors the mesh needs" >&2; exit 2; }
ulimit -n "$hard" 2>/dev/null || true

T_START=$(date +%s)
SWIFT=${SWIFT:-$(command -v swift || echo /opt/swift/usr/bin/swift)}
BIN=$HERE/.build/$CONFIG
if ((!NO_BUILD)); then
  mkdir -p "$HERE/.build"
  for product in party-load turn-load room-forward; do
    "$SWIFT" build -c "$CONFIG" --package-path "$HERE" --product "$product" >"$HERE/.build/$product-build.log" 2>&1 || {
      tail -n 20 "$HERE/.build/$product-build.log" >&2
      echo "party-relay-bench: building $product failed" >&2
      exit 1
    }
  done
fi
PARTY_LOAD=$BIN/party-load
TURN_LOAD=$BIN/turn-load
ROOM_FORWARD=$BIN/room-forward
LOAD=$TURN_LOAD  # wait_turn_ready probes with it
[[ -x $PARTY_LOAD ]] || { echo "party-relay-bench: $PARTY_LOAD is not built" >&2; exit 1; }

source "$HERE/bench-lib.sh"
bench_setup party-relay-bench
busy_ticks() { awk '/^cpu[0-9]/ {s += $2 + $3 + $4 + $7 + $8} END {print s}' /proc/stat; }
pin_cpus party-relay-bench

ACTIVE=()
for s in $SERVERS; do
  case $s in
    tusa) [[ -x $TUSA ]] && ACTIVE+=(tusa) || echo "tusa: not built ($TUSA)" ;;
    coturn)
      if ! command -v turnserver >/dev/null; then echo "coturn: not installed (scripts/setup.sh installs it)"
      elif [[ ! -x $TURN_LOAD ]]; then echo "coturn: $TURN_LOAD not built"
      else ACTIVE+=(coturn); fi ;;
    ref) [[ -x $ROOM_FORWARD ]] && ACTIVE+=(ref) || echo "ref: $ROOM_FORWARD not built" ;;
    *) echo "party-relay-bench: unknown server '$s' (tusa, coturn, ref)" >&2; exit 2 ;;
  esac
done
((${#ACTIVE[@]})) || { echo "party-relay-bench: nothing to run" >&2; exit 1; }

# Steps: the fixed load first, then the ramp (rooms talking).
STEPS=$ROOMS${RAMP:+,$RAMP}
"$TUSA" keygen --out "$TMP/relay.key" >/dev/null
FAILED=0
echo "party-relay-bench: ${ACTIVE[*]}; $ROUNDS round(s); rooms of $SIZE, $SPEAKERS speaking at 50 frames/s each;" \
  "fixed load $ROOMS rooms ($((ROOMS * COPIES * 50)) deliveries/s), ramp ${RAMP:-none} rooms (${DURATION}s per step);" \
  "servers on CPU $SERVER_CPU, generators on CPU $LOAD_CPU"
[[ " ${ACTIVE[*]} " == *" tusa "* ]] && echo "tusa: $TUSA"
[[ " ${ACTIVE[*]} " == *" coturn "* ]] && echo "coturn: $(turnserver --version 2>/dev/null | head -1) -m 0, a mesh of $COPIES allocations per room"
[[ " ${ACTIVE[*]} " == *" ref "* ]] && echo "ref: $ROOM_FORWARD (C, one read, one open, a seal and a datagram per copy)"

# wait_udp PID PORT: until something listens on udp PORT (10 s), while PID lives.
wait_udp() {
  local i
  for i in $(seq 100); do
    kill -0 "$1" 2>/dev/null || return 1
    [[ -n $(ss -Hlnu "sport = :$2" 2>/dev/null) ]] && return 0
    sleep 0.1
  done
  return 1
}

# party_load PORT ARGS...: party-load against 127.0.0.1:PORT in the background ($lpid), the rooms and ramp of the run.
party_load() {
  local port=$1
  shift
  "${LOAD_PIN[@]}" "$PARTY_LOAD" --target "127.0.0.1:$port" --server-pid "$SPID" "$@" \
    --rooms "$MAXROOMS" --size "$SIZE" --speakers "$SPEAKERS" --ramp "$STEPS" --duration "$DURATION" --warmup "$WARMUP" \
    --open-every "$OPEN_EVERY" --join-rate 100 >"$TMP/load.out" 2>"$TMP/load.err" &
  lpid=$!
  PIDS+=("$lpid")
}

# collect NAME ROUND: waits for the generator ($lpid), stops the server ($SPID) and appends
# one line per step to runs.NAME: round, rooms, delivered/s, loss %, server CPU ms per 1000
# delivered, server CPU %, skipped sends, kernel receive-buffer drops, offered/s. 1 when
# the generator failed.
collect() {
  local name=$1 round=$2 line rooms delivered
  finish_generator "$name" "$round" || return 1
  grep '^phase=' "$TMP/load.out" | while read -r line; do
    if [[ $name == coturn ]]; then  # turn-load: a step is a flow count, its rate the total relayed
      rooms=$(($(field flows "$line") / COPIES)) delivered=$(field total_pps "$line")
    else
      rooms=$(field rooms "$line") delivered=$(field delivered_pps "$line")
    fi
    echo "$round $rooms $delivered $(field loss_pct "$line") $(field server_ms_per_1000 "$line") $(field server_cpu "$line" | tr -d %) $(field skipped "$line") $(field kernel_rcvbuf_errors "$line") $(field offered_pps "$line")"
  done >>"$TMP/runs.$name"
  report_steps "$name" "$round"
}

DATAGRAM=
run_tusa() { # ROUND
  local round=$1 port party log
  port=$(free_port) && party=$(free_port) || { echo "party-relay-bench: no free port" >&2; exit 1; }
  log=$TMP/tusa.$party
  "${SERVER_PIN[@]}" "$TUSA" relay --listen "127.0.0.1:$port" --no-tcp --party-port "$party" \
    --identity "$TMP/relay.key" --max-party-size "$((SIZE > 50 ? SIZE : 50))" >"$log.out" 2>"$log.err" &
  SPID=$!
  PIDS+=("$SPID")
  if ! wait_udp "$SPID" "$party"; then
    echo "round $round tusa: FAILED to start"
    tail -n 5 "$log.err" | sed 's/^/  | /'
    stop_server "$SPID" 50
    return 1
  fi
  party_load "$party" --relay-identity "$TMP/relay.key"
  collect tusa "$round" || return 1
  DATAGRAM=$(sed -n 's/^setup .* datagram=\([0-9]*\).*/\1/p' "$TMP/load.out")
  grep '^setup' "$TMP/load.out" | sed 's/^/  /'
}

run_coturn() { # ROUND
  local round=$1 port log flows ramp=() n
  port=$(free_port) || { echo "party-relay-bench: no free port" >&2; exit 1; }
  log=$TMP/coturn.$port
  start_coturn "$log" "$port" 0 --no-tcp
  SPID=$!
  PIDS+=("$SPID")
  if ! wait_turn_ready "$SPID" "$port"; then
    echo "round $round coturn: FAILED to start or grant an allocation"
    tail -n 5 "$log.err" "$TMP/probe.err" 2>/dev/null | sed 's/^/  | /'
    stop_server "$SPID" 50
    return 1
  fi
  for n in "${COTURN_RAMP[@]}"; do ramp+=("$((n * COPIES))"); done
  flows=$((ROOMS * COPIES))
  "${LOAD_PIN[@]}" "$TURN_LOAD" --target "127.0.0.1:$port" --server-pid "$SPID" --mode relay --rate 50 \
    --clients "$MAXFLOWS" --clients-per-ip 1 --phases up --flows "$flows" \
    ${ramp[0]:+--ramp "$(IFS=,; echo "${ramp[*]}")" --ramp-phase up} --payload "${DATAGRAM:-120}" \
    --duration "$DURATION" --warmup "$WARMUP" >"$TMP/load.out" 2>"$TMP/load.err" &
  lpid=$!
  PIDS+=("$lpid")
  collect coturn "$round"
}

run_ref() { # ROUND
  local round=$1 port log i
  log=$TMP/ref.$round
  "${SERVER_PIN[@]}" "$ROOM_FORWARD" --listen 127.0.0.1:0 >"$log.out" 2>"$log.err" &
  SPID=$!
  PIDS+=("$SPID")
  for i in $(seq 100); do
    port=$(sed -n 's/^listening .*:\([0-9]*\)$/\1/p' "$log.out")
    [[ -n $port ]] && break
    kill -0 "$SPID" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z $port ]]; then
    echo "round $round ref: FAILED to start"
    tail -n 5 "$log.err" | sed 's/^/  | /'
    stop_server "$SPID" 50
    return 1
  fi
  party_load "$port" --reference --datagram "${DATAGRAM:-120}"
  collect ref "$round"
}

report_steps() { # NAME ROUND
  awk -v n="$1" -v r="$2" '$1 == r {printf "round %s %-6s rooms=%-3s delivered/s=%-7s loss=%s%% cpu=%s%% ms/1000=%s skipped=%s kernel_rcvbuf_errors=%s\n", r, n, $2, $3, $4, $6, $5, $7, $8}' \
    "$TMP/runs.$1"
}

for round in $(seq "$ROUNDS"); do
  order=("${ACTIVE[@]}")
  shift_by=$(((round - 1) % ${#order[@]}))
  order=("${order[@]:shift_by}" "${order[@]:0:shift_by}")
  # coturn's payload follows the party's datagram: tusa runs first when it can.
  [[ -z $DATAGRAM && " ${order[*]} " == *" tusa "* ]] && order=(tusa "${order[@]/tusa/}")
  for name in ${order[*]}; do
    ((QUIET_WAIT > 0)) && wait_quiet
    "run_$name" "$round" || FAILED=1
  done
done

# at NAME ROUND ROOMS COLUMN: the first step of ROUND with ROOMS rooms (the fixed load comes first).
at() { awk -v r="$2" -v k="$3" -v c="$4" '$1 == r && $2 == k {print $c; exit}' "$TMP/runs.$1" 2>/dev/null; }
best_free() { # NAME ROUND: the highest delivered rate of a step without loss or skipped sends, 99 % of its offer delivered
  # (a step delivering more than it offered caught up on the one before: it counts as its offer)
  awk -v r="$2" '$1 == r && $4 + 0 == 0 && $7 + 0 == 0 && $3 + 0 >= 0.99 * $9 {d = $3 + 0 > $9 + 0 ? $9 + 0 : $3 + 0; if (d > best) best = d} END {if (best > 0) print best}' \
    "$TMP/runs.$1" 2>/dev/null
}

if ((!SMOKE)); then
  echo
  echo "| $ROOMS rooms of $SIZE, $SPEAKERS speakers each (median of rounds) | $(printf '%s | ' "${ACTIVE[@]}")"
  echo "|---|$(printf -- '---:|%.0s' "${ACTIVE[@]}")"
  for spec in "delivered pkt/s:3" "loss %:4" "server CPU %:6" "server CPU ms per 1000 delivered:5"; do
    IFS=: read -r label col <<<"$spec"
    printf '| %s |' "$label"
    for n in "${ACTIVE[@]}"; do printf ' %s |' "$(for r in $(seq "$ROUNDS"); do at "$n" "$r" "$ROOMS" "$col"; done | median_values)"; done
    echo
  done
  printf '| highest loss-free delivered pkt/s (fixed load and ramp, median) |'
  for n in "${ACTIVE[@]}"; do printf ' %s |' "$(for r in $(seq "$ROUNDS"); do best_free "$n" "$r"; done | median_values)"; done
  echo
  echo
  if has tusa && has coturn; then
    list=() free=()
    for r in $(seq "$ROUNDS"); do
      a=$(at tusa "$r" "$ROOMS" 5) b=$(at coturn "$r" "$ROOMS" 5)
      [[ -n $a && -n $b ]] && list+=("$(awk -v a="$a" -v b="$b" 'BEGIN { if (a > 0) printf "%.2f", b / a }')")
      a=$(best_free tusa "$r") b=$(best_free coturn "$r")
      [[ -n $a && -n $b ]] && free+=("$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", a / b}')")
    done
    ((${#list[@]})) && echo "CPU per delivered packet at $ROOMS rooms, coturn/tusa (how many times cheaper tusa is): $(printf '%s\n' "${list[@]}" | median_values) ($(IFS=,; echo "${list[*]}" | sed 's/,/, /g')) (issue 15 target >= 1.5)"
    ((${#free[@]})) && echo "highest loss-free delivered rate, tusa/coturn: $(printf '%s\n' "${free[@]}" | median_values) ($(IFS=,; echo "${free[*]}" | sed 's/,/, /g'))"
  fi
  if has tusa && has ref; then
    list=() free=()
    for r in $(seq "$ROUNDS"); do
      a=$(at tusa "$r" "$ROOMS" 5) b=$(at ref "$r" "$ROOMS" 5)
      [[ -n $a && -n $b ]] && list+=("$(awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.2f", a / b }')")
      a=$(best_free tusa "$r") b=$(best_free ref "$r")
      [[ -n $a && -n $b ]] && free+=("$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", a / b}')")
    done
    ((${#list[@]})) && echo "CPU per delivered packet at $ROOMS rooms, tusa/ref (times the C reference's): $(printf '%s\n' "${list[@]}" | median_values) ($(IFS=,; echo "${list[*]}" | sed 's/,/, /g'))"
    ((${#free[@]})) && echo "highest loss-free delivered rate, tusa/ref: $(printf '%s\n' "${free[@]}" | median_values) ($(IFS=,; echo "${free[*]}" | sed 's/,/, /g')) (issue 17 target >= 0.75)"
  fi
  has tusa && echo "tusa's highest loss-free delivered rate per round: $(for r in $(seq "$ROUNDS"); do best_free tusa "$r" || true; done | tr '\n' ' ')(issue 15 target >= 100000 on one core)"
  echo "(a ramp's top step without loss may be the ramp's end: then the server carries more than shown)"
else
  read -r _ _ pps loss _ <<<"$(head -1 "$TMP/runs.tusa" 2>/dev/null || echo "x x 0 100 x")"
  if ((!FAILED)) && awk -v l="${loss:-100}" -v t="${pps:-0}" 'BEGIN {exit !(l == 0 && t > 0)}'; then
    echo "party-relay-bench smoke: ok"
  else
    echo "party-relay-bench smoke: FAILED (delivered ${pps:-0}/s, loss ${loss:-?}%)"
    FAILED=1
  fi
fi
echo "took $(($(date +%s) - T_START))s"
exit "$FAILED"
