#!/usr/bin/env bash
# Binding responses per second on one core: the trivial echo (reference), `tusa relay` and
# coturn `turnserver -m 0`, side by side with the same load generator (binding-load).
# Every server is pinned to one CPU, the load generator to another; the rounds are
# interleaved (echo, tusa, coturn, echo, ...) and the median per server is reported.
# Whether the generator out-runs a server shows in each run: the server at ~100 % CPU
# while the generator still sits idle part of the time (waiting for answers). The
# generator sends each batch as one UDP GSO write (binding-load --no-gso to compare).
# Loopback and random high ports only; every process started here is stopped on exit.
#
# usage: Benchmarks/binding-rps.sh [--rounds N] [--duration S] [--warmup S]
#                                  [--servers "echo tusa coturn"] [--quiet-wait S]
#                                  [-- binding-load options]
#        --quiet-wait S: before each run, wait up to S s (default 10) for other processes
#        to leave the CPUs alone; runs disturbed anyway are flagged with '!'.
# env:   TUSA (default <repo>/.build/release/tusa), SERVER_CPU (1), LOAD_CPU (0),
#        ROUNDS, DURATION, WARMUP, SERVERS, QUIET_WAIT (same as the options),
#        SWIFT (swift binary used to build this package).
# exit:  0 if every server started and answered, 1 if one did not (a missing tusa binary
#        only prints 'tusa: not built' and is skipped), 2 on a usage error.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
WARMUP=${WARMUP:-1}
SERVERS=${SERVERS:-echo tusa coturn}
QUIET_WAIT=${QUIET_WAIT:-10}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
LOAD_ARGS=()

while (($#)); do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --servers) SERVERS=$2; shift 2 ;;
    --quiet-wait) QUIET_WAIT=$2; shift 2 ;;
    --) shift; LOAD_ARGS=("$@"); break ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "binding-rps: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "binding-rps: --rounds must be a positive integer" >&2; exit 2; }

if [[ -n ${TUSA:-} ]]; then
  TUSA=$(realpath -m -- "$TUSA")
else
  TUSA=$ROOT/.build/release/tusa
fi

# --- build the tools (a separate package: never touches the main package's .build) ---
T_START=$(date +%s)
SWIFT=${SWIFT:-$(command -v swift || echo /opt/swift/usr/bin/swift)}
BIN=$HERE/.build/release
"$SWIFT" build -c release --package-path "$HERE" >/dev/null 2>&1 || {
  echo "binding-rps: building $HERE failed; run: $SWIFT build -c release --package-path $HERE" >&2
  exit 1
}
LOAD=$BIN/binding-load
ECHO=$BIN/udp-echo

source "$HERE/bench-lib.sh"
bench_setup binding-rps

# Busy ticks (user+nice+system) of every CPU, summed.
busy_ticks() { awk '/^cpu[0-9]/ {s += $2 + $3 + $4} END {print s}' /proc/stat; }

# start_server NAME PORT: starts it pinned to SERVER_CPU, sets SPID.
start_server() {
  local name=$1 port=$2 log=$TMP/$1.$2.log
  case $name in
    echo)
      taskset -c "$SERVER_CPU" "$ECHO" --listen "127.0.0.1:$port" >"$log" 2>&1 &
      ;;
    tusa)
      taskset -c "$SERVER_CPU" "$TUSA" relay --listen "127.0.0.1:$port" >"$log" 2>&1 &
      ;;
    coturn)
      # -n: no config file; UDP on loopback only; no TCP/TLS/DTLS listeners, no CLI;
      # STUN Binding needs no credentials. RFC 5780 and the old-STUN MAPPED-ADDRESS are
      # off (as in Debian's default turnserver.conf), so Binding answers carry
      # XOR-MAPPED-ADDRESS (+ SOFTWARE) only.
      taskset -c "$SERVER_CPU" turnserver -n -m 0 \
        --listening-ip 127.0.0.1 --listening-port "$port" --relay-ip 127.0.0.1 \
        --no-tcp --no-tls --no-dtls --no-cli \
        --no-rfc5780 --no-stun-backward-compatibility --response-origin-only-with-rfc5780 \
        --userdb "$TMP/coturn.$port.db" \
        --log-file "$TMP/coturn.$port.turn.log" --simple-log --no-stdout-log \
        --pidfile "$TMP/coturn.$port.pid" >"$log" 2>&1 &
      ;;
  esac
  SPID=$!
  PIDS+=("$SPID")
}

FAILED=0
ACTIVE=()
for s in $SERVERS; do
  case $s in
    echo) ACTIVE+=(echo) ;;
    tusa)
      if [[ -x $TUSA ]]; then ACTIVE+=(tusa); else echo "tusa: not built ($TUSA); skipping"; fi
      ;;
    coturn)
      if command -v turnserver >/dev/null; then ACTIVE+=(coturn); else
        echo "coturn: turnserver not installed (scripts/setup.sh installs it)"
        FAILED=1
      fi
      ;;
    *) echo "binding-rps: unknown server '$s' (echo, tusa, coturn)" >&2; exit 2 ;;
  esac
done
((${#ACTIVE[@]})) || { echo "binding-rps: nothing to run" >&2; exit 1; }

echo "binding-rps: ${ACTIVE[*]}; $ROUNDS round(s) x ${DURATION}s (+${WARMUP}s warmup);" \
  "servers on CPU $SERVER_CPU, load generator on CPU $LOAD_CPU"
echo "binding-load options: ${LOAD_ARGS[*]:-(defaults)}"
DISTURBED=0

# wait_ready PID PORT: up to 5 s for the server to answer a Binding request.
wait_ready() {
  local i
  for i in $(seq 20); do
    kill -0 "$1" 2>/dev/null || return 1
    "$LOAD" --target "127.0.0.1:$2" --probe --duration 0.25 >/dev/null 2>"$TMP/probe.err" && return 0
  done
  return 1
}

# run_one PREFIX LABEL NAME [binding-load options...]: one run against a fresh server; appends
# "rps send lost idle server_cpu other_cpu PREFIX" to $TMP/results.LABEL. Returns 1 on failure.
run_one() {
  local prefix=$1 label=$2 name=$3 port out lpid t0 t1 s0 s1 b0 b1 alive rps send lost idle gcpu scpu other mark
  shift 3
  wait_quiet
  port=$(free_port) || { echo "binding-rps: no free port" >&2; exit 1; }
  start_server "$name" "$port"
  if ! wait_ready "$SPID" "$port"; then
    echo "$prefix $name: FAILED to start or answer on 127.0.0.1:$port"
    sed 's/^/  | /' "$TMP/$name.$port.log" "$TMP/probe.err" 2>/dev/null | tail -n 15
    stop_server "$SPID" 30  # SIGKILL after 3 s
    return 1
  fi
  t0=$(now) s0=$(proc_ticks "$SPID") b0=$(busy_ticks)
  # In the background + wait, so that a SIGTERM to this script is handled at once.
  taskset -c "$LOAD_CPU" "$LOAD" --target "127.0.0.1:$port" \
    --duration "$DURATION" --warmup "$WARMUP" "$@" >"$TMP/load.out" 2>"$TMP/load.err" &
  lpid=$!
  PIDS+=("$lpid")
  out=""
  wait "$lpid" && out=$(cat "$TMP/load.out")
  forget "$lpid"
  t1=$(now) s1=$(proc_ticks "$SPID") b1=$(busy_ticks)
  alive=1
  kill -0 "$SPID" 2>/dev/null || alive=0
  stop_server "$SPID" 30  # SIGKILL after 3 s
  if [[ -z $out || $alive == 0 ]]; then
    echo "$prefix $name: FAILED (server exited or load generator failed)"
    sed 's/^/  | /' "$TMP/$name.$port.log" "$TMP/load.err" 2>/dev/null | tail -n 15
    return 1
  fi
  rps=$(field rps "$out") send=$(field send_rps "$out") lost=$(field lost "$out")
  idle=$(field idle "$out") gcpu=$(field cpu "$out")
  # Server CPU share of one core, and CPU used by everything else on the machine
  # (busy time of all CPUs minus the server and the generator): high = disturbed run.
  read -r scpu other < <(awk -v s0="$s0" -v s1="$s1" -v b0="$b0" -v b1="$b1" \
    -v t0="$t0" -v t1="$t1" -v hz="$HZ" -v g="$gcpu" 'BEGIN {
      w = t1 - t0; sc = 100 * (s1 - s0) / hz / w; all = 100 * (b1 - b0) / hz / w
      o = all - sc - g; if (o < 0) o = 0; printf "%.0f %.0f\n", sc, o }')
  echo "$rps $send $lost $idle $scpu $other $prefix" >>"$TMP/results.$label"
  mark=""
  if ((other > 15)); then mark=" !"; DISTURBED=$((DISTURBED + 1)); fi
  printf '%s %-6s rps=%-7s send/s=%-7s lost=%-6s gen_idle=%s%% server_cpu=%s%% other_cpu=%s%%%s\n' \
    "$prefix" "$name" "$rps" "$send" "$lost" "$idle" "$scpu" "$other" "$mark"
}

for round in $(seq "$ROUNDS"); do
  for name in "${ACTIVE[@]}"; do
    run_one "round $round" "$name" "$name" "${LOAD_ARGS[@]}" || FAILED=1
  done
done

# --- summary ---
# rows NAME: that server's result rows, without the disturbed runs unless all were.
rows() {
  local f=$TMP/results.$1
  if awk '$6 <= 15 {found = 1} END {exit !found}' "$f"; then awk '$6 <= 15' "$f"; else cat "$f"; fi
}
# stats NAME COLUMN -> "median min max" of that column over the rows.
stats() {
  rows "$1" | awk -v c="$2" '{print $c}' | sort -n | awk '
    {v[NR] = $1} END {
      if (NR == 0) exit
      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "%.0f %.0f %.0f\n", m, v[1], v[NR] }'
}
declare -A MED
echo
echo "| server | median rps | min | max | runs | generator send/s | generator idle | server CPU |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for name in "${ACTIVE[@]}"; do
  [[ -s $TMP/results.$name ]] || { echo "| $name | failed | | | | | | |"; continue; }
  read -r med min max < <(stats "$name" 1)
  read -r smed _ < <(stats "$name" 2)
  read -r imed _ < <(stats "$name" 4)
  read -r cmed _ < <(stats "$name" 5)
  MED[$name]=$med
  used=$(rows "$name" | wc -l) all=$(wc -l <"$TMP/results.$name")
  runs=$used
  ((used < all)) && runs="$used of $all"
  echo "| $name | $med | $min | $max | $runs | $smed | ${imed}% | ${cmed}% |"
done
echo "(medians over the runs not marked '!'; generator send/s, idle and server CPU are medians too)"
echo
ratio() {
  if [[ -n ${MED[$1]:-} && -n ${MED[$2]:-} && ${MED[$2]} != 0 ]]; then
    awk -v a="${MED[$1]}" -v b="${MED[$2]}" 'BEGIN {printf "%.2f", a / b}'
  else
    echo "n/a"
  fi
}
# paired A B: A/B within each round where both ran undisturbed, and their median. Robust
# against the machine's speed drifting between rounds.
paired() {
  [[ -s $TMP/results.$1 && -s $TMP/results.$2 ]] || return 0
  awk 'NR == FNR {if ($6 <= 15) a[$8] = $1; next}
       $6 <= 15 && ($8 in a) && $1 > 0 {printf "%.2f\n", a[$8] / $1}' \
    "$TMP/results.$1" "$TMP/results.$2" | sort -n | awk '
      {v[NR] = $1; list = list " " $1} END {
        if (NR == 0) exit
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf " (per-round ratios, sorted:%s; median %.2f)", list, m }'
}
echo "tusa/coturn = $(ratio tusa coturn)$(paired tusa coturn) (target >= 1.5)"
echo "echo/coturn = $(ratio echo coturn)$(paired echo coturn)"
# The generator out-runs a server when, in the median run, the server is busy (>= 90 %
# CPU) and the generator still waits for it (idle >= 5 %): the server sets the rate.
for name in "${ACTIVE[@]}"; do
  [[ -s $TMP/results.$name ]] || continue
  read -r idle _ < <(stats "$name" 4)
  read -r cpu _ < <(stats "$name" 5)
  verdict=$(awk -v i="${idle%\%}" -v c="${cpu%\%}" 'BEGIN {print (i >= 5 && c >= 90) ? "yes" : "NO"}')
  echo "generator out-runs $name: $verdict (generator idle ${idle}%, $name CPU ${cpu}%)"
done
echo "took $(($(date +%s) - T_START))s, of which ${WAITED:-0}s waiting for other processes to go quiet"
((DISTURBED)) && echo "warning: $DISTURBED run(s) marked '!' shared the CPUs with other processes" \
  "(other_cpu > 15%); rerun on an idle machine for trustworthy numbers"
exit "$FAILED"
