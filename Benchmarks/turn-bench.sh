#!/usr/bin/env bash
# TURN side by side: `tusa relay` and coturn `turnserver -m 0`, same load generator
# (turn-load), each server pinned to one CPU and the generator to the other. Per round and
# server, on a fresh server each time:
#   relay     N clients allocate and bind a channel to their own peer socket; relayed
#             ChannelData packets/s client->peer (up), peer->client (down), both at once;
#             loss, kernel UDP drops, server CPU per 1000 relayed packets.
#   allocate  A allocations (401 challenge + authenticated Allocate, a window in
#             progress): allocations/s, server CPU per allocation, and with all A alive
#             the server's RSS, open fds and the machine's slab growth per allocation.
# The server order alternates between rounds; medians and per-round ratios are reported.
# Loopback only, random free ports; every process started here is stopped on exit.
#
# usage: Benchmarks/turn-bench.sh [--rounds N] [--duration S] [--warmup S] [--clients N]
#                                 [--allocations N] [--servers "tusa coturn"]
#                                 [--quiet-wait S] [--smoke] [--no-build]
#                                 [-- turn-load relay options]
#        --smoke: 1 round, tusa only, 10 clients, 0.2 s per phase, 200 allocations, no
#        quiet wait, about 3 s; passes when every allocation and channel worked and
#        packets came through each way with < 1 % loss (a bounded check, not a measurement).
#        --no-build: use the turn-load already built (swift build's no-op check alone
#        takes ~10 s here).
# env:   TUSA (default <repo>/.build/release/tusa; with --smoke <repo>/.build/debug/tusa),
#        SERVER_CPU (1), LOAD_CPU (0), COTURN_THREADS (coturn -m, default 0 = single
#        thread), CONFIG (release; debug with --smoke: how this package is built), SWIFT,
#        and ROUNDS, DURATION, WARMUP, CLIENTS, ALLOCATIONS, SERVERS, QUIET_WAIT.
# exit:  0 if every server started, answered and relayed; 1 if one did not (or, with
#        --smoke, the check failed); 2 on a usage error.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
SMOKE=0
for a in "$@"; do [[ $a == --smoke ]] && SMOKE=1; [[ $a == -- ]] && break; done
if ((SMOKE)); then
  ROUNDS=${ROUNDS:-1} DURATION=${DURATION:-0.2} WARMUP=${WARMUP:-0.05} CLIENTS=${CLIENTS:-10}
  ALLOCATIONS=${ALLOCATIONS:-200} SERVERS=${SERVERS:-tusa} QUIET_WAIT=${QUIET_WAIT:-0} CONFIG=${CONFIG:-debug}
fi
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-3}
WARMUP=${WARMUP:-0.5}
CLIENTS=${CLIENTS:-100}
ALLOCATIONS=${ALLOCATIONS:-10000}
SERVERS=${SERVERS:-tusa coturn}
QUIET_WAIT=${QUIET_WAIT:-10}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
COTURN_THREADS=${COTURN_THREADS:-0}
CONFIG=${CONFIG:-release}
NO_BUILD=${NO_BUILD:-0}
LOAD_ARGS=()

while (($#)); do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --allocations) ALLOCATIONS=$2; shift 2 ;;
    --servers) SERVERS=$2; shift 2 ;;
    --quiet-wait) QUIET_WAIT=$2; shift 2 ;;
    --smoke) shift ;;
    --no-build) NO_BUILD=1; shift ;;
    --) shift; LOAD_ARGS=("$@"); break ;;
    -h|--help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "turn-bench: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in ROUNDS CLIENTS ALLOCATIONS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "turn-bench: ${v,,} must be a positive integer" >&2; exit 2; }
done

if [[ -n ${TUSA:-} ]]; then
  TUSA=$(realpath -m -- "$TUSA")
elif ((SMOKE)); then
  TUSA=$ROOT/.build/debug/tusa
else
  TUSA=$ROOT/.build/release/tusa
fi

# --- build the generator (a separate package: never touches the main package's .build) ---
T_START=$(date +%s)
SWIFT=${SWIFT:-$(command -v swift || echo /opt/swift/usr/bin/swift)}
LOAD=$HERE/.build/$CONFIG/turn-load
if ((NO_BUILD)); then
  [[ -x $LOAD ]] || { echo "turn-bench: --no-build but $LOAD is not built" >&2; exit 1; }
else
  "$SWIFT" build -c "$CONFIG" --package-path "$HERE" --product turn-load >"$HERE/.build/turn-load-build.log" 2>&1 || {
    tail -n 20 "$HERE/.build/turn-load-build.log" >&2
    echo "turn-bench: building turn-load failed; run: $SWIFT build -c $CONFIG --package-path $HERE --product turn-load" >&2
    exit 1
  }
fi

# Every allocation is a socket in the generator and one in the server.
need=$((ALLOCATIONS + CLIENTS * 2 + 256))
hard=$(ulimit -Hn)
want=65536
[[ $hard != unlimited ]] && ((hard < want)) && want=$hard
ulimit -n "$want" 2>/dev/null || true
if (($(ulimit -n) < need)); then
  fit=$(($(ulimit -n) - CLIENTS * 2 - 256))
  echo "turn-bench: open-file limit $(ulimit -n) (hard $hard) is below the $need that $ALLOCATIONS" \
    "allocations need; allocating $fit instead (raise the hard limit for more)"
  ALLOCATIONS=$fit
fi

source "$HERE/bench-lib.sh"
bench_setup turn-bench

busy_ticks() { awk '/^cpu[0-9]/ {s += $2 + $3 + $4 + $7 + $8} END {print s}' /proc/stat; }
MIN_PORT=20000
MAX_PORT=65000
pin_cpus turn-bench

# start_server NAME PORT: starts it pinned to SERVER_CPU, sets SPID.
start_server() {
  local name=$1 port=$2 log=$TMP/$1.$2
  case $name in
    tusa)
      # Quotas off (coturn's defaults are unlimited); loopback peers allowed (the
      # generator's peers live on 127.0.0.1). Logs (one line per allocation) go to a file.
      "${SERVER_PIN[@]}" "$TUSA" relay --listen "127.0.0.1:$port" \
        -u alice:wonderland -r example.org --allow-loopback-peers \
        --min-port "$MIN_PORT" --max-port "$MAX_PORT" --user-quota 0 --total-quota 0 \
        >"$log.out" 2>"$log.err" &
      ;;
    coturn)
      start_coturn "$log" "$port" "$COTURN_THREADS"
      ;;
  esac
  SPID=$!
  PIDS+=("$SPID")
}

FAILED=0
ACTIVE=()
for s in $SERVERS; do
  case $s in
    tusa)
      if [[ -x $TUSA ]]; then ACTIVE+=(tusa); else
        echo "tusa: not built ($TUSA); build it, e.g. swift build -c release --product tusa, or set TUSA"
        FAILED=1
      fi
      ;;
    coturn)
      if command -v turnserver >/dev/null; then ACTIVE+=(coturn); else
        echo "coturn: turnserver not installed (scripts/setup.sh installs it)"
        FAILED=1
      fi
      ;;
    *) echo "turn-bench: unknown server '$s' (tusa, coturn)" >&2; exit 2 ;;
  esac
done
((${#ACTIVE[@]})) || { echo "turn-bench: nothing to run" >&2; exit 1; }

echo "turn-bench: ${ACTIVE[*]}; $ROUNDS round(s); relay: $CLIENTS clients, ${DURATION}s per phase" \
  "(+${WARMUP}s warmup); allocate: $ALLOCATIONS; servers on CPU $SERVER_CPU, generator on CPU $LOAD_CPU"
[[ " ${ACTIVE[*]} " == *" tusa "* ]] && echo "tusa: $TUSA"
[[ " ${ACTIVE[*]} " == *" coturn "* ]] && echo "coturn: $(turnserver --version 2>/dev/null | head -1) -m $COTURN_THREADS"
echo "turn-load relay options: ${LOAD_ARGS[*]:-(defaults)}"
DISTURBED=0

# run_one KIND NAME ROUND: KIND relay|allocate against a fresh server. Appends the
# generator's lines, prefixed with "ROUND OTHER_CPU", to $TMP/KIND.NAME. Returns 1 on failure.
run_one() {
  local kind=$1 name=$2 round=$3 port lpid t0 t1 s0 s1 b0 b1 alive out rc other mark gcpu summary
  if ((QUIET_WAIT > 0)); then wait_quiet; fi
  port=$(free_port) || { echo "turn-bench: no free port" >&2; exit 1; }
  start_server "$name" "$port"
  if ! wait_turn_ready "$SPID" "$port"; then
    echo "round $round $kind $name: FAILED to start or grant an allocation on 127.0.0.1:$port"
    sed 's/^/  | /' "$TMP/$name.$port.err" "$TMP/$name.$port.out" "$TMP/probe.err" 2>/dev/null | tail -n 15
    stop_server "$SPID" 50  # SIGKILL after 5 s: 10,000 allocations take a moment to delete
    return 1
  fi
  t0=$(now) s0=$(proc_ticks "$SPID") b0=$(busy_ticks)
  local args=(--target "127.0.0.1:$port" --server-pid "$SPID")
  if [[ $kind == relay ]]; then
    args+=(--mode relay --clients "$CLIENTS" --duration "$DURATION" --warmup "$WARMUP" "${LOAD_ARGS[@]}")
  else
    args+=(--mode allocate --clients "$ALLOCATIONS")
  fi
  # In the background + wait, so that a SIGTERM to this script is handled at once.
  "${LOAD_PIN[@]}" "$LOAD" "${args[@]}" >"$TMP/load.out" 2>"$TMP/load.err" &
  lpid=$!
  PIDS+=("$lpid")
  rc=0
  wait "$lpid" || rc=$?
  forget "$lpid"
  t1=$(now) s1=$(proc_ticks "$SPID") b1=$(busy_ticks)
  out=$(cat "$TMP/load.out")
  alive=1
  kill -0 "$SPID" 2>/dev/null || alive=0
  stop_server "$SPID" 50  # SIGKILL after 5 s: 10,000 allocations take a moment to delete
  summary=$(grep -h '^turn:' "$TMP/$name.$port.out" 2>/dev/null || true)
  if ((rc != 0)) || [[ $alive == 0 ]] || ! grep -q '^done' <<<"$out"; then
    echo "round $round $kind $name: FAILED (server exited, or the generator failed: exit $rc)"
    sed 's/^/  | /' "$TMP/load.out" "$TMP/load.err" 2>/dev/null | tail -n 8
    sed 's/^/  | server: /' "$TMP/$name.$port.err" 2>/dev/null | grep -iv ' info ' | tail -n 5
    return 1
  fi
  # CPU used by everything else (all CPUs' busy time minus the server and the generator).
  gcpu=$(field cpu_seconds "$(grep '^done' <<<"$out")")
  other=$(awk -v s0="$s0" -v s1="$s1" -v b0="$b0" -v b1="$b1" -v t0="$t0" -v t1="$t1" \
    -v hz="$HZ" -v g="$gcpu" 'BEGIN {
      w = t1 - t0; o = 100 * ((b1 - b0) / hz - (s1 - s0) / hz - g) / w
      if (o < 0) o = 0; printf "%.0f", o }')
  mark=""
  if ((other > 15)); then mark=" !"; DISTURBED=$((DISTURBED + 1)); fi
  grep -v '^done' <<<"$out" | sed "s/^/$round $other /" >>"$TMP/$kind.$name"
  if [[ $kind == relay ]]; then
    while read -r line; do
      [[ $line == phase=* ]] || continue
      printf 'round %s %-6s %-5s up/s=%-7s down/s=%-7s total/s=%-7s loss=%s%% server_cpu=%s%% ms/1000=%s gen_idle=%s%% kernel_drops=%s other_cpu=%s%%%s\n' \
        "$round" "$name" "$(sed 's/phase=\([a-z]*\).*/\1/' <<<"$line")" "$(field up_pps "$line")" \
        "$(field down_pps "$line")" "$(field total_pps "$line")" "$(field loss_pct "$line")" \
        "$(field server_cpu "$line")" "$(field server_ms_per_1000 "$line")" "$(field idle "$line")" \
        "$(field kernel_in_errors "$line")" "$other" "$mark"
    done <<<"$out"
  else
    line=$(grep '^allocate' <<<"$out")
    printf 'round %s %-6s alloc allocs/s=%-6s server_cpu=%s%% us/alloc=%s rss/alloc=%sB slab/alloc=%sB fds %s->%s gen_idle=%s%% other_cpu=%s%%%s\n' \
      "$round" "$name" "$(field aps "$line")" "$(field server_cpu "$line")" "$(field server_us_per_alloc "$line")" \
      "$(field rss_bytes_per_alloc "$line")" "$(field slab_bytes_per_alloc "$line")" "$(field fds_before "$line")" \
      "$(field fds_after "$line")" "$(field idle "$line")" "$other" "$mark"
  fi
  [[ -n $summary ]] && echo "  $name: $summary"
  return 0
}

for round in $(seq "$ROUNDS"); do
  order=("${ACTIVE[@]}")
  # Alternate who goes first, so that a drift in the machine's speed favours nobody.
  if ((round % 2 == 0)) && ((${#order[@]} == 2)); then order=("${order[1]}" "${order[0]}"); fi
  for name in "${order[@]}"; do run_one relay "$name" "$round" || FAILED=1; done
  for name in "${order[@]}"; do run_one allocate "$name" "$round" || FAILED=1; done
done

# --- summary ---
# values KIND NAME SELECTOR FIELD: "round value" per undisturbed run (all runs if every one
# was disturbed); SELECTOR is the line's first word (phase=up, phase=both, allocate).
values() {
  local f=$TMP/$1.$2
  [[ -s $f ]] || return 0
  local all
  all=$(awk -v sel="$3" '$3 == sel' "$f")
  if awk '$2 <= 15 {found = 1} END {exit !found}' <<<"$all"; then all=$(awk '$2 <= 15' <<<"$all"); fi
  while read -r r _ rest; do
    [[ -n ${r:-} ]] || continue
    v=$(field "$4" "$rest")
    [[ -n $v ]] && echo "$r $v"
  done <<<"$all"
}
median() {
  awk '{print $2}' | sort -g | awk '{v[NR] = $1} END {
    if (NR == 0) {print ""; exit}
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    print m }'
}
# ratios KIND SELECTOR FIELD: tusa/coturn per round where both ran, sorted, and their median.
ratios() {
  local a b
  a=$(values "$1" tusa "$2" "$3") b=$(values "$1" coturn "$2" "$3")
  [[ -n $a && -n $b ]] || return 0
  awk 'NR == FNR {t[$1] = $2; next} ($1 in t) && $2 > 0 {printf "%.2f\n", t[$1] / $2}' \
    <(echo "$a") <(echo "$b") | sort -g | awk '{v[NR] = $1; l = l (NR > 1 ? ", " : "") $1} END {
      if (NR == 0) exit
      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "%.2f (%s)\n", m, l }'
}
fmtnum() { awk -v x="$1" -v d="${2:-0}" 'BEGIN { if (x == "") {print "—"; exit} printf "%\047.*f\n", d, x }'; }

row() { # row LABEL KIND SELECTOR FIELD DIGITS [TARGET]
  local t c r
  t=$(values "$2" tusa "$3" "$4" | median) c=$(values "$2" coturn "$3" "$4" | median)
  r=$(ratios "$2" "$3" "$4")
  echo "| $1 | $(fmtnum "$t" "$5") | $(fmtnum "$c" "$5") | ${r:-—} | ${6:-} |"
}
# row3 LABEL FIELD DIGITS: the relay phases up / down / both in one cell per server.
row3() {
  local n cells=()
  for n in tusa coturn; do
    cells+=("$(fmtnum "$(values relay $n phase=up "$2" | median)" "$3") / $(fmtnum "$(values relay $n phase=down "$2" | median)" "$3") / $(fmtnum "$(values relay $n phase=both "$2" | median)" "$3")")
  done
  echo "| $1 | ${cells[0]} | ${cells[1]} | | |"
}

if ((!SMOKE)); then
echo
echo "| metric (medians) | tusa | coturn | tusa/coturn: median (per round) | target |"
echo "|---|---:|---:|---|---|"
row "relayed pkt/s, client→peer (up)" relay phase=up up_pps 0 "≥ 1.5"
row "relayed pkt/s, peer→client (down)" relay phase=down down_pps 0 "≥ 1.5"
row "relayed pkt/s, both at once: total" relay phase=both total_pps 0 "≥ 1.5"
row "… of which up" relay phase=both up_pps 0
row "… of which down" relay phase=both down_pps 0
row "server CPU ms per 1000 relayed, up" relay phase=up server_ms_per_1000 2 "lower is better"
row "server CPU ms per 1000 relayed, down" relay phase=down server_ms_per_1000 2
row "server CPU ms per 1000 relayed, both" relay phase=both server_ms_per_1000 2
row3 "loss %, up / down / both" loss_pct 3
row3 "kernel UDP drops (InErrors), up / down / both" kernel_in_errors 0
row3 "server CPU %, up / down / both" server_cpu 0
row3 "generator idle %, up / down / both" idle 0
row "allocations/s (challenge + Allocate)" allocate allocate aps 0
row "server CPU µs per allocation" allocate allocate server_us_per_alloc 1 "lower is better"
row "server RSS bytes per live allocation" allocate allocate rss_bytes_per_alloc 0 "tusa < 2048"
row "kernel slab bytes per allocation (machine)" allocate allocate slab_bytes_per_alloc 0
row "server fds per allocation" allocate allocate fds_per_alloc 2
row "server CPU % while allocating" allocate allocate server_cpu 0
row "generator idle % while allocating" allocate allocate idle 0
echo "(medians over the runs not marked '!'; loss, drops, CPU and idle rows are medians too;"
echo " RSS is VmRSS with every allocation alive, minus VmRSS before; kernel socket memory is"
echo " not in RSS: the slab row is /proc/meminfo Slab growth over the same span, machine-wide)"
echo
for spec in "up up_pps" "down down_pps" "both total_pps"; do
  read -r phase f <<<"$spec"
  r=$(ratios relay "phase=$phase" "$f")
  [[ -n $r ]] || continue
  m=${r%% *}
  verdict=$(awk -v m="$m" 'BEGIN {if (m >= 1.5) print "met"; else printf "MISSED (%.0f%% short of 1.5)", 100 * (1.5 - m) / 1.5}')
  echo "relay $phase: tusa/coturn = $r; target >= 1.5: $verdict"
done
if has tusa; then
  m=$(values allocate tusa allocate rss_bytes_per_alloc | median)
  if [[ -n $m ]]; then
    verdict=$(awk -v m="$m" 'BEGIN {if (m < 2048) print "met"; else printf "MISSED (%.1fx the 2048 B target)", m / 2048}')
    echo "tusa memory per allocation: $(fmtnum "$m") B (RSS); target < 2048 B: $verdict"
  fi
fi
# The generator out-runs a server when, in the median run, the server is busy (>= 90 %
# CPU) and the generator still waits for it (idle >= 5 %): the server sets the rate.
for name in "${ACTIVE[@]}"; do
  for phase in up down both; do
    c=$(values relay "$name" "phase=$phase" server_cpu | median)
    i=$(values relay "$name" "phase=$phase" idle | median)
    [[ -n $c && -n $i ]] || continue
    verdict=$(awk -v i="$i" -v c="$c" 'BEGIN {print (i >= 5 && c >= 90) ? "yes" : "NO"}')
    echo "generator out-runs $name ($phase): $verdict (generator idle ${i}%, $name CPU ${c}%)"
  done
done
fi

if ((SMOKE)); then
  ok=1
  for name in "${ACTIVE[@]}"; do
    for phase in up down both; do
      for f in up_pps down_pps; do
        [[ $phase == up && $f == down_pps || $phase == down && $f == up_pps ]] && continue
        v=$(values relay "$name" "phase=$phase" "$f" | median)
        awk -v v="${v:-0}" 'BEGIN {exit !(v > 0)}' || { echo "smoke: $name $phase $f = ${v:-none}"; ok=0; }
      done
      l=$(values relay "$name" "phase=$phase" loss_pct | median)
      awk -v l="${l:-100}" 'BEGIN {exit !(l < 1)}' || { echo "smoke: $name $phase loss ${l:-?}%"; ok=0; }
    done
    a=$(values allocate "$name" allocate allocated | median)
    [[ ${a:-0} == "$ALLOCATIONS" ]] || { echo "smoke: $name allocated ${a:-0} of $ALLOCATIONS"; ok=0; }
  done
  if ((ok && !FAILED)); then echo "turn-bench smoke: ok"; else echo "turn-bench smoke: FAILED"; FAILED=1; fi
fi
echo "took $(($(date +%s) - T_START))s, of which ${WAITED:-0}s waiting for other processes to go quiet"
((DISTURBED)) && echo "warning: $DISTURBED run(s) marked '!' shared the CPUs with other processes" \
  "(other_cpu > 15%); rerun on an idle machine for trustworthy numbers"
exit "$FAILED"
