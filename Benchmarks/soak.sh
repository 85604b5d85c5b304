#!/usr/bin/env bash
# Reliability (issue 18): `tusa relay` held under load, floods and time, each case with
# its figure for BENCHMARKS.md's "Reliability" table. `make soak` runs the long
# versions (release build); `--short` runs a bounded few seconds of each (debug build,
# from `make test` through Benchmarks/smoke.sh): a check that each case holds, not a
# measurement.
#
# Cases (any subset, in order given; default: all):
#   flood        unauthenticated UDP against the relay's listener and party port
#                (Benchmarks/Sources/udp-flood: Binding, random STUN, Allocate without
#                credentials, ChannelData for unbound channels, garbage, Noise
#                initiations under a valid mac1), first beside F paced voice flows
#                through the relay (their loss and delay against the same flows on a
#                quiet relay), then alone at full rate, twice: the relay's RSS and fds
#                after each (no state per packet: the second flood adds nothing), and
#                the answer bytes per class against the request bytes.
#   allocations  A allocations alive, F of them relaying voice (one 100-byte packet
#                each way every 20 ms) for D seconds, refreshing their allocations,
#                channels and permissions as a long call does: loss, the relay's RSS and
#                fds sampled every few seconds (growth per hour after warm-up), and, in
#                the long run (10 minutes and more), the A - F idle allocations gone
#                within 3 s of their 600 s lifetime while the voice goes on, then the
#                flows' own, deleted by the generator as it ends (the relay's fds).
#   tcp          the relay's TCP and TLS listeners under abuse (Benchmarks/tcp-abuse.py):
#                idle connections from one address (past the per-address cap), slowloris
#                (a STUN header a byte at a time), a 65,000-byte announced frame, random
#                bytes, stalled TLS handshakes, and a flood of completed TLS handshakes
#                (Benchmarks/tls-handshake-flood.py, an RSA 2048 certificate); a legitimate
#                client's Binding-over-TCP latency (p95) beside it against a quiet relay's,
#                and when each abusive connection was closed.
#   directory    `tusa directory` (SQLite) under the same abuse on its TCP listener (the
#                rendezvous's, which `tusa relay --rendezvous-port` runs too; tcp-abuse.py
#                --protocol rendezvous): idle connections from one address past its cap,
#                opened again as the listener closes them for not registering; slowloris
#                (a register frame a byte at a time); frames announced past 16 KiB; whole
#                frames of random bytes. A legitimate user (`directory-bench --legit`)
#                connecting, registering with its key's proof and asking a lookup every
#                20 ms: its p95 beside the abuse against the quiet directory's.
#   metrics      the relay's Prometheus port under the same abuse (--protocol http: a
#                request trickled, a 200 KB header, bytes that are no request), a scraper
#                asking GET /metrics every 20 ms beside it.
#   memory       the relay in a memory cgroup of its own (root; else skipped), F voice flows
#                through it, its limit then set so that M MiB more reach 90 % of it, and
#                more allocations asked for than fit: the relay refuses the rest (508,
#                its log naming the cgroup's limit) and is not killed, the voice flows lose
#                nothing, and once the limit is raised it allocates again.
#   call         `tusa call` between two hosts behind real kernel NATs (scripts/nat-matrix.sh,
#                case roam; root and network namespaces, else skipped) for C seconds with
#                20 % loss in bursts and 20 ms of jitter both ways, A's NAT rebinding every
#                R seconds: the call never drops, loss against what was imposed, ICE
#                restarts, and the RSS and fds of the relay and both peers (growth per hour).
#                The caller plays real speech over and over; PESQ of what the callee heard,
#                one 8 s window a minute (Benchmarks/pesq-windows.py), stays level.
#   party        a four-member party through the same NATs for C seconds (nat-matrix.sh
#                party4): A1 plays the speech over and over, A2 (behind A's NAT), B1 and
#                B2 (behind B's) listen; the same loss and jitter on every member's media
#                and A's NAT rebinding every R seconds: nobody drops, each hears A1 with the
#                loss imposed, PESQ a minute at A2 and B1 stays level, RSS and fds of the
#                relay and the four members flat.
#   faults       on loopback, a relay-only `tusa call` (tone in, the callee recording) through
#                K rounds of: the relay SIGKILLed and started again (same identity and
#                ports), the system clock stepped back an hour (or forward again; every
#                process under Benchmarks/Sources/ClockStep), the rendezvous connections
#                cut (ss -K), the caller frozen with SIGSTOP for 10 s; then a party (one
#                member sends a tone, the other records) through K rounds of relay SIGKILL
#                and restart and a member frozen for 10 s. Benchmarks/audio-gaps.py finds
#                the outages in each recording: one per restart (heard again within 3 s of
#                the relay's return) and one per freeze (within 3 s of the resume; 6 s in
#                --short), no other.
#   devices      a call on sound devices for 600 s (--short: 20 s; Benchmarks/device-call.sh):
#                a private PulseAudio, the caller's null sinks at 48 kHz and the callee's at
#                44.1 kHz (a few hundred ppm apart), speech into both microphones: each
#                side's jitter buffer delay stays level, no microphone queue runs dry and
#                no speaker plays a gap (5 ms or more of digital silence in its sink's
#                recording) (--short, a debug build on a shared machine: five in all,
#                against hundreds for a queue that stopped), both ends exit 0. Skipped
#                without PulseAudio.
#
# usage: Benchmarks/soak.sh [--short] [--no-build] [case ...]
# env: TUSA (default <repo>/.build/release/tusa; --short: .build/debug/tusa), SWIFT,
#      SOAK_FLOWS (the allocations case's voice flows, 1000), SOAK_CALL_SECONDS (1800),
#      SOAK_FAULT_ROUNDS (5; --short: 1).
# exit: 0 when every case held; 1 when one did not; 2 on a usage error.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
SHORT=0 NO_BUILD=0 CASES=()
while (($#)); do
  case $1 in
    --short) SHORT=1; shift ;;
    --no-build) NO_BUILD=1; shift ;;
    -h|--help) sed -n '2,81p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    flood|allocations|tcp|directory|metrics|memory|call|party|faults|devices) CASES+=("$1"); shift ;;
    *) echo "soak: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
((${#CASES[@]})) || CASES=(flood allocations tcp directory metrics memory call party faults devices)
CONFIG=release
((SHORT)) && CONFIG=debug
SWIFT=${SWIFT:-swift}
TUSA=${TUSA:-$ROOT/.build/$CONFIG/tusa}
BIN=$HERE/.build/$CONFIG

if ((SHORT)); then
  FLOWS=20 FLOOD_SECONDS=2 FLOOD_RATE=5000 VOICE_SECONDS=2 ALLOCATIONS=200 ALLOC_FLOWS=20 ALLOC_SECONDS=4 ALLOC_REFRESH=1 SAMPLE=1
  TCP_SECONDS=2 TCP_INTERVAL=0.01 TCP_FLOOR_MS=3 TCP_IDLE=200 TCP_PER_IP=50 TCP_ABUSERS=10 TCP_WATCH=3 TCP_FLOODERS=1
  CALL_SECONDS=12 REBIND=4 FAULT_ROUNDS=1 FREEZE_BACK_MS=6000 PESQ_EVERY=4 PESQ_WINDOW=4
  MEM_FLOWS=20 MEM_BUDGET_MIB=6 MEM_ALLOCATIONS=4000
  DEVICE_SECONDS=20 DEVICE_UNDERRUNS=5
else
  FLOWS=200 FLOOD_SECONDS=20 FLOOD_RATE=20000 VOICE_SECONDS=20 ALLOCATIONS=10000 ALLOC_FLOWS=${SOAK_FLOWS:-1000} ALLOC_SECONDS=620 ALLOC_REFRESH=120 SAMPLE=10
  TCP_SECONDS=10 TCP_INTERVAL=0.02 TCP_FLOOR_MS=1 TCP_IDLE=10000 TCP_PER_IP=1000 TCP_ABUSERS=200 TCP_WATCH=40 TCP_FLOODERS=2
  CALL_SECONDS=${SOAK_CALL_SECONDS:-1800} REBIND=60 FAULT_ROUNDS=${SOAK_FAULT_ROUNDS:-5} FREEZE_BACK_MS=3000 PESQ_EVERY=60 PESQ_WINDOW=8
  MEM_FLOWS=200 MEM_BUDGET_MIB=8 MEM_ALLOCATIONS=15000
  DEVICE_SECONDS=600 DEVICE_UNDERRUNS=0
fi

# shellcheck source=Benchmarks/bench-lib.sh
source "$HERE/bench-lib.sh"
bench_setup tusa-soak
# The NAT matrix runs of the call and party cases (see start_matrix), stopped before
# the rest on an early exit.
declare -A MATRIX_PID=()
trap 'for m in "${MATRIX_PID[@]}"; do [[ -n $m ]] && stop_matrix "$m"; done; cleanup; remove_memcg' EXIT
busy_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
QUIET_WAIT=0

if ((!NO_BUILD)); then
  if ((SHORT)); then
    [[ -x $TUSA ]] || "$SWIFT" build --package-path "$ROOT" --product tusa >/dev/null
  else
    "$SWIFT" build --package-path "$ROOT" -c release --product tusa >/dev/null
  fi
  for product in turn-load udp-flood ClockStep; do
    "$SWIFT" build --package-path "$HERE" -c "$CONFIG" --product "$product" >/dev/null
  done
  "$SWIFT" build --package-path "$ROOT" -c "$CONFIG" --product directory-bench >/dev/null
fi
LOAD=$BIN/turn-load
FLOOD=$BIN/udp-flood
DIRECTORY_BENCH=$ROOT/.build/$CONFIG/directory-bench
for tool in "$TUSA" "$LOAD" "$FLOOD" "$BIN/libClockStep.so" "$DIRECTORY_BENCH"; do
  [[ -x $tool ]] || { echo "soak: $tool is missing (build it, or drop --no-build)" >&2; exit 1; }
done

# The relay on one CPU, the generators on the other (as in voice-relay-bench.sh).
SERVER_PIN=() LOAD_PIN=()
if (($(nproc) >= 2)) && command -v taskset >/dev/null; then SERVER_PIN=(taskset -c 1) LOAD_PIN=(taskset -c 0); fi

FAILED=0
fail() { echo "  FAILED: $*"; FAILED=1; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# fds PID: its open descriptors, the least of three looks 30 ms apart (a file the process
# opens for a moment, as the relay's memory guard reads /proc and cgroup files four
# times a second, is not a descriptor it holds; one that stays open is counted).
fds() {
  local n least=
  for _ in 1 2 3; do
    n=$(find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    [[ -z $least ]] || ((n < least)) && least=$n
    sleep 0.03
  done
  echo "$least"
}

# start_relay PORT [ARGS...]: `tusa relay` with TURN (alice), loopback peers allowed; RPID, ROUT.
start_relay() {
  local port=$1
  shift
  ROUT=$TMP/relay.$port.out
  "${SERVER_PIN[@]}" "$TUSA" relay --listen "127.0.0.1:$port" -r example.org -u alice:wonderland --allow-loopback-peers "$@" \
    >"$ROUT" 2>"$TMP/relay.$port.err" &
  RPID=$!
  PIDS+=("$RPID")
  wait_turn_ready "$RPID" "$port" || { tail -n 5 "$TMP/relay.$port.err" | sed 's/^/  | /'; return 1; }
}

# voice PORT FLOWS CLIENTS SECONDS OUT [ARGS...]: paced flows through the relay, phase both
# (ARGS: more of turn-load's options).
voice() {
  "${LOAD_PIN[@]}" "$LOAD" --target "127.0.0.1:$1" --mode relay --rate 50 --clients "$3" --flows "$2" --clients-per-ip 50 \
    --phases both --duration "$4" --warmup 0.5 --server-pid "$RPID" --setup-timeout 120 "${@:6}" >"$5" 2>"$5.err"
}

case_flood() {
  echo "flood: unauthenticated UDP against the listener and the party port"
  local port party key line quiet flooded before mid after fd0 fd1 fd2 fpid
  port=$(free_port) && party=$(free_port) || { fail "no free port"; return; }
  start_relay "$port" --party-port "$party" || { fail "the relay did not start"; return; }
  key=$(sed -n 's/^party udp .* key \(.*\)$/\1/p' "$ROUT")
  [[ -n $key ]] || { fail "the relay printed no party key"; return; }
  voice "$port" "$FLOWS" "$FLOWS" "$VOICE_SECONDS" "$TMP/quiet.out" || { fail "voice on a quiet relay"; return; }
  quiet=$(grep '^phase=both' "$TMP/quiet.out")
  "${LOAD_PIN[@]}" "$FLOOD" --target "127.0.0.1:$port" --party "127.0.0.1:$party" --party-key "$key" --rate "$FLOOD_RATE" \
    --duration "$(awk -v s="$VOICE_SECONDS" 'BEGIN {print s + 4}')" >"$TMP/flood-beside.out" &
  fpid=$!
  PIDS+=("$fpid")
  voice "$port" "$FLOWS" "$FLOWS" "$VOICE_SECONDS" "$TMP/flooded.out" || { fail "voice beside the flood"; return; }
  wait "$fpid" || true
  forget "$fpid"
  flooded=$(grep '^phase=both' "$TMP/flooded.out")
  printf '  voice, %s flows, quiet:           loss=%s%% delay p50/p99=%s/%s us\n' "$FLOWS" \
    "$(field loss_pct "$quiet")" "$(field delay_p50_us "$quiet")" "$(field delay_p99_us "$quiet")"
  printf '  voice beside a %s/s flood:      loss=%s%% delay p50/p99=%s/%s us\n' "$FLOOD_RATE" \
    "$(field loss_pct "$flooded")" "$(field delay_p50_us "$flooded")" "$(field delay_p99_us "$flooded")"
  sed 's/^flood /  beside: /' "$TMP/flood-beside.out"
  [[ $(field loss_pct "$flooded") == 0.000 ]] || fail "voice lost packets beside the flood"
  [[ $(field loss_pct "$quiet") == 0.000 ]] || fail "voice lost packets on a quiet relay"

  # Full rate, twice: what the second flood adds is state kept per packet.
  sleep 1
  before=$(rss_kib "$RPID") fd0=$(fds "$RPID")
  "${LOAD_PIN[@]}" "$FLOOD" --target "127.0.0.1:$port" --party "127.0.0.1:$party" --party-key "$key" --duration "$FLOOD_SECONDS" \
    >"$TMP/flood1.out"
  sleep 1
  mid=$(rss_kib "$RPID") fd1=$(fds "$RPID")
  "${LOAD_PIN[@]}" "$FLOOD" --target "127.0.0.1:$port" --party "127.0.0.1:$party" --party-key "$key" --duration "$FLOOD_SECONDS" \
    >"$TMP/flood2.out"
  sleep 1
  after=$(rss_kib "$RPID") fd2=$(fds "$RPID")
  sed 's/^flood /  full rate: /' "$TMP/flood2.out"
  printf '  relay RSS %s -> %s -> %s KiB, fds %s -> %s -> %s (before, after flood 1, after flood 2)\n' \
    "$before" "$mid" "$after" "$fd0" "$fd1" "$fd2"
  kill -0 "$RPID" 2>/dev/null || fail "the relay died under the flood"
  ((fd2 == fd0)) || fail "the relay's fds changed under the flood ($fd0 -> $fd2)"
  # Buffers and caches may grow once; a second flood as long may not add 1 MiB.
  ((after - mid < 1024)) || fail "the second flood grew the relay by $((after - mid)) KiB"
  # Every class but Binding (a 20-byte request is answered with 40 bytes: RFC 8489's
  # XOR-MAPPED-ADDRESS and FINGERPRINT) and the rate-limited 401 challenges must be
  # answered with fewer bytes than it sent, from every source.
  while read -r line; do
    local class ratio
    class=$(sed -n 's/.*class=\([a-z]*\).*/\1/p' <<<"$line")
    ratio=$(field worst_source_ratio "$line")
    case $class in binding|allocate) continue ;; esac
    awk -v r="$ratio" 'BEGIN {exit !(r <= 1)}' || fail "class $class: answers $ratio times the request bytes"
  done < <(grep 'class=' "$TMP/flood2.out")
  stop_server "$RPID" 50
}

case_allocations() {
  echo "allocations: $ALLOCATIONS alive, $ALLOC_FLOWS relaying voice for ${ALLOC_SECONDS}s (refreshed every ${ALLOC_REFRESH}s)"
  local port lpid line first=0 last=0 fd_first=0 fd_last=0 t=0 last_t=0 start warm gone="" refresh
  # Whether the voice outlasts the idle allocations' 600 s lifetime (the long run).
  local through=$((ALLOC_SECONDS > 600))
  port=$(free_port) || { fail "no free port"; return; }
  # One user holds them all: no per-user quota (the default, 1000, would refuse the rest).
  # The short run's nonces go stale every 2 s, so that its refreshes meet a 438 too.
  local stale=()
  ((SHORT)) && stale=(--stale-nonce 2)
  start_relay "$port" --user-quota 0 "${stale[@]}" || { fail "the relay did not start"; return; }
  local fd_idle setup_seconds=0
  fd_idle=$(fds "$RPID")
  voice "$port" "$ALLOC_FLOWS" "$ALLOCATIONS" "$ALLOC_SECONDS" "$TMP/alloc.out" --refresh "$ALLOC_REFRESH" &
  lpid=$!
  PIDS+=("$lpid")
  start=$(now)
  # Sample RSS and fds while the phase runs; the first sample after warm-up (the
  # allocations made and the traffic flowing) is the baseline. The flows keep their
  # allocations (and channels and permissions) alive as a long call does; nothing keeps
  # the others, which end 600 s after they were made, while the voice goes on: RSS and fds
  # are judged flat before that, and the idle allocations' relay sockets must be gone
  # within 3 s of their lifetime (the set-up's length added: the last were made then).
  warm=$((through ? 120 : ALLOC_SECONDS / 5 + SAMPLE))
  while kill -0 "$lpid" 2>/dev/null; do
    # (Every second near the lifetime's end, to see when the idle ones go.)
    if ((through && t >= 585)) && [[ -z $gone ]]; then sleep 1; else sleep "$SAMPLE"; fi
    t=$(awk -v s="$start" -v n="$(now)" 'BEGIN {printf "%.0f", n - s}')
    local n
    n=$(fds "$RPID")
    # (Not before 590 s: a slow set-up's first samples have few allocations too.)
    if ((through && t >= 590)) && [[ -z $gone ]] && ((n <= fd_idle + ALLOC_FLOWS + 2)); then gone=$t; fi
    # (Before the idle allocations' lifetime ends, and before the generator deletes its own.)
    ((t >= (through ? 590 : ALLOC_SECONDS))) && continue
    if ((t >= warm && first == 0)); then first=$(rss_kib "$RPID") fd_first=$n warm=$t; fi
    if ((first > 0)); then last=$(rss_kib "$RPID") fd_last=$n last_t=$t; fi
  done
  if ! wait "$lpid"; then
    forget "$lpid"
    fail "the generator failed: $(grep '^setup' "$TMP/alloc.out") $(grep '^refresh' "$TMP/alloc.out") $(tail -n 2 "$TMP/alloc.out.err")"
    stop_server "$RPID" 50
    return
  fi
  forget "$lpid"
  setup_seconds=$(awk -v s="$(field seconds "$(grep '^setup' "$TMP/alloc.out")")" 'BEGIN {printf "%.0f", s + 1}')
  line=$(grep '^phase=both' "$TMP/alloc.out" || true)
  refresh=$(grep '^refresh' "$TMP/alloc.out" || true)
  grep '^setup' "$TMP/alloc.out" | sed 's/^/  /'
  printf '  voice: loss=%s%% delay p50/p99=%s/%s us relayed/s=%s\n' "$(field loss_pct "$line")" \
    "$(field delay_p50_us "$line")" "$(field delay_p99_us "$line")" "$(field total_pps "$line")"
  echo "  $refresh"
  [[ $(field loss_pct "$line") == 0.000 ]] || fail "voice lost packets"
  [[ $(field failed "$refresh") == 0 && $(field answered "$refresh") -gt 0 ]] || fail "refreshes failed: $refresh"
  ((!SHORT)) || [[ $(field stale_nonces "$refresh") -gt 0 ]] || fail "no refresh met a stale nonce: $refresh"
  if ((first > 0 && last_t > warm)); then
    awk -v a="$first" -v b="$last" -v fa="$fd_first" -v fb="$fd_last" -v s="$((last_t - warm))" 'BEGIN {
      printf "  relay after warm-up: RSS %d -> %d KiB (%+.0f KiB/hour), fds %d -> %d, over %d s\n",
        a, b, (b - a) * 3600 / s, fa, fb, s }'
    ((fd_last == fd_first)) || fail "the relay's fds changed while the allocations lived ($fd_first -> $fd_last)"
  fi
  if ((through)); then
    if [[ -n $gone ]]; then
      printf '  the idle allocations gone %s s after the set-up began (lifetime 600 s; set-up took %s s), the voice flowing on\n' \
        "$gone" "$setup_seconds"
      awk -v g="$gone" -v u="$setup_seconds" 'BEGIN {exit !(g <= 600 + u + 4)}' \
        || fail "idle allocations outlived their lifetime"
      awk -v g="$gone" 'BEGIN {exit !(g >= 600)}' || fail "idle allocations ended before their lifetime ($gone s)"
    else
      fail "idle allocations still held $(($(fds "$RPID") - fd_idle - ALLOC_FLOWS)) relay sockets after their lifetime"
    fi
  fi
  # The generator deleted the allocations it kept (LIFETIME 0) as it ended; in a run
  # shorter than their lifetime the idle ones are still there.
  local i left=$((through ? 0 : ALLOCATIONS - ALLOC_FLOWS))
  for i in $(seq 30); do (($(fds "$RPID") <= fd_idle + left + 2)) && break; sleep 0.1; done
  (($(fds "$RPID") <= fd_idle + left + 2)) \
    || fail "the deleted allocations still held $(($(fds "$RPID") - fd_idle - left)) relay sockets"
  stop_server "$RPID" 50
}

# make_memcg: a memory cgroup (v1's memory hierarchy or v2's with the memory controller;
# root) in MEMCG, removed on exit; fails where none can be made.
MEMCG=""
make_memcg() {
  ((EUID == 0)) || return 1
  if [[ -w /sys/fs/cgroup/memory && -e /sys/fs/cgroup/memory/memory.limit_in_bytes ]]; then
    MEMCG=/sys/fs/cgroup/memory/tusa-soak-$$ MEMCG_LIMIT=memory.limit_in_bytes MEMCG_USE=memory.usage_in_bytes
    MEMCG_CACHE=total_inactive_file
  elif grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
    MEMCG=/sys/fs/cgroup/tusa-soak-$$ MEMCG_LIMIT=memory.max MEMCG_USE=memory.current MEMCG_CACHE=inactive_file
  else
    return 1
  fi
  mkdir "$MEMCG" || { MEMCG=""; return 1; }
}
remove_memcg() {
  [[ -n $MEMCG ]] || return 0
  local _
  for _ in $(seq 50); do rmdir "$MEMCG" 2>/dev/null && break; sleep 0.1; done
  MEMCG=""
}
# The group's use less the page cache it can drop (as the relay counts it), bytes.
memcg_working_set() {
  awk -v u="$(cat "$MEMCG/$MEMCG_USE")" -v name="$MEMCG_CACHE" '$1 == name {c = $2} END {print (u > c ? u - c : 0)}' \
    "$MEMCG/memory.stat"
}
memcg_oom_kills() {
  local file=$MEMCG/memory.events
  [[ -e $file ]] || file=$MEMCG/memory.oom_control
  awk '$1 == "oom_kill" {k = $2} END {print k + 0}' "$file"
}

case_memory() {
  echo "memory: the relay in a memory cgroup, $MEM_FLOWS voice flows, then ${MEM_BUDGET_MIB} MiB to its 90 % mark and $MEM_ALLOCATIONS allocations asked for"
  make_memcg || { echo "  skipped: needs root and a memory cgroup hierarchy to make a group in"; return; }
  echo $((1 << 30)) >"$MEMCG/$MEMCG_LIMIT"
  local port lpid ws limit line alloc refused peak=0 w err
  port=$(free_port) || { fail "no free port"; remove_memcg; return; }
  err=$TMP/memory.relay.err
  # The relay enters the group before it starts (sh execs it), so all it uses counts there.
  "${SERVER_PIN[@]}" sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$MEMCG" \
    "$TUSA" relay --listen "127.0.0.1:$port" -r example.org -u alice:wonderland --allow-loopback-peers --user-quota 0 \
    >"$TMP/memory.relay.out" 2>"$err" &
  RPID=$!
  PIDS+=("$RPID")
  wait_turn_ready "$RPID" "$port" || { fail "the relay did not start: $(tail -n 3 "$err")"; stop_server "$RPID" 50; remove_memcg; return; }
  voice "$port" "$MEM_FLOWS" "$MEM_FLOWS" $((SHORT ? 8 : 60)) "$TMP/memory.out" &
  lpid=$!
  PIDS+=("$lpid")
  wait_line "$TMP/memory.out" '/^setup/p' 1200 >/dev/null || { fail "the voice flows did not start"; stop_server "$RPID" 50; remove_memcg; return; }
  sleep 1
  ws=$(memcg_working_set)
  limit=$(((ws + (MEM_BUDGET_MIB << 20)) * 10 / 9))
  echo "$limit" >"$MEMCG/$MEMCG_LIMIT"
  "${LOAD_PIN[@]}" "$LOAD" --target "127.0.0.1:$port" --mode allocate --clients "$MEM_ALLOCATIONS" --clients-per-ip 50 \
    --source-net 127.6 --setup-timeout 120 >"$TMP/memory.alloc.out" 2>&1 &
  local apid=$!
  PIDS+=("$apid")
  while kill -0 "$apid" 2>/dev/null; do
    w=$(memcg_working_set)
    ((w > peak)) && peak=$w
    sleep 0.2
  done
  wait "$apid" || true
  forget "$apid"
  line=$(grep '^allocate' "$TMP/memory.alloc.out" || true)
  alloc=$(field allocated "$line")
  refused=$(sed -n 's/.*Allocate-508:\([0-9]*\).*/\1/p' <<<"$line")
  printf '  working set %d KiB with the flows; limit %d KiB; %s more allocations made, %s refused (508); peak %d KiB (%d %% of the limit)\n' \
    $((ws >> 10)) $((limit >> 10)) "${alloc:-?}" "${refused:-0}" $((peak >> 10)) $((peak * 100 / limit))
  { grep -m1 'memory short' "$err" || true; } | sed 's/^.*memory short/  relay: memory short/'
  kill -0 "$RPID" 2>/dev/null || fail "the relay died (OOM killer: $(memcg_oom_kills))"
  (($(memcg_oom_kills) == 0)) || fail "the OOM killer ended a process of the relay's group"
  ((${refused:-0} > 0)) || fail "nothing was refused: $line"
  ((${alloc:-0} > 0)) || fail "no allocation was made below the mark: $line"
  grep -q "allocation refused (508): memory short, .* limit (cgroup $MEMCG/" "$err" || fail "no refusal in the relay's log names the cgroup's limit"
  if wait "$lpid"; then
    line=$(grep '^phase=both' "$TMP/memory.out" || true)
    printf '  voice meanwhile: loss=%s%% delay p50/p99=%s/%s us\n' "$(field loss_pct "$line")" \
      "$(field delay_p50_us "$line")" "$(field delay_p99_us "$line")"
    [[ $(field loss_pct "$line") == 0.000 ]] || fail "voice lost packets while memory was short"
  else
    fail "the voice generator failed: $(tail -n 2 "$TMP/memory.out.err")"
  fi
  forget "$lpid"
  echo $((1 << 30)) >"$MEMCG/$MEMCG_LIMIT"
  if wait_line "$err" '/taking new allocations/p' 100 >/dev/null && wait_turn_ready "$RPID" "$port"; then
    echo "  limit raised: allocating again"
  else
    fail "no allocation after the limit was raised: $(tail -n 2 "$err")"
  fi
  stop_server "$RPID" 50
  remove_memcg
}

case_tcp() {
  echo "tcp: the TCP and TLS listeners under abuse, a legitimate client beside it"
  local port tls line
  port=$(free_port) && tls=$(free_port) || { fail "no free port"; return; }
  # RSA 2048, the usual certificate: each handshake a millisecond of the relay's CPU.
  self_signed rsa:2048 "$TMP" || { fail "openssl could not make a certificate"; return; }
  # Room for every connection on both sides (the abuse holds thousands).
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  start_relay "$port" --cert "$TMP/cert.pem" --pkey "$TMP/key.pem" --tls-listening-port "$tls" \
    --max-tcp-connections-per-ip "$TCP_PER_IP" || { fail "the relay did not start"; return; }
  # The legitimate client in a process of its own (the abuse's event loop would delay it),
  # ahead of the abuse generator in the scheduler (as root), so what it measures is the
  # relay's service and not its own wait for a core; the abuse starts when its quiet phase
  # ends. A p95 needs samples: 100 or more per phase.
  local ahead=()
  ((EUID == 0)) && ahead=(nice -n -10)
  "${ahead[@]}" python3 "$HERE/tcp-abuse.py" --role legit --target "127.0.0.1:$port" --seconds "$TCP_SECONDS" \
    --interval "$TCP_INTERVAL" --gap 2 \
    >"$TMP/tcp-legit.out" 2>"$TMP/tcp-legit.err" &
  local legit_pid=$!
  PIDS+=("$legit_pid")
  sleep "$TCP_SECONDS"
  # Completed handshakes as fast as the flooders can, through the gap and the loaded phase.
  "${LOAD_PIN[@]}" python3 "$HERE/tls-handshake-flood.py" --target "127.0.0.1:$tls" --seconds "$((TCP_SECONDS + 2))" \
    --workers "$TCP_FLOODERS" >"$TMP/tcp-flood.out" 2>"$TMP/tcp-flood.err" &
  local flood_pid=$!
  PIDS+=("$flood_pid")
  "${LOAD_PIN[@]}" python3 "$HERE/tcp-abuse.py" --role abuse --target "127.0.0.1:$port" --tls-port "$tls" \
    --idle "$TCP_IDLE" --slow "$TCP_ABUSERS" --bad "$TCP_ABUSERS" --tls "$TCP_ABUSERS" --deadline "$TCP_WATCH" \
    >"$TMP/tcp-abuse.out" 2>"$TMP/tcp-abuse.err" || fail "the abuse failed: $(tail -n 3 "$TMP/tcp-abuse.err")"
  wait "$legit_pid" || fail "a legitimate request went unanswered: $(tail -n 3 "$TMP/tcp-legit.err")"
  forget "$legit_pid"
  wait "$flood_pid" || fail "the handshake flood failed: $(tail -n 3 "$TMP/tcp-flood.err")"
  forget "$flood_pid"
  cat "$TMP/tcp-legit.out" "$TMP/tcp-abuse.out" "$TMP/tcp-flood.out" >"$TMP/tcp.out"
  sed 's/^/  /' "$TMP/tcp.out"
  local quiet abuse admitted
  quiet=$(field p95_ms "$(grep 'phase=quiet' "$TMP/tcp.out")")
  abuse=$(field p95_ms "$(grep 'phase=abuse' "$TMP/tcp.out")")
  admitted=$(field admitted "$(grep 'kind=idle' "$TMP/tcp.out")")
  [[ -n $quiet && -n $abuse ]] || { fail "no latency measured"; return; }
  awk -v q="$quiet" -v a="$abuse" 'BEGIN {printf "  p95 beside the abuse / quiet: %.2f\n", a / q}'
  # 2x a quiet relay's p95, over a floor: a loopback request takes a millisecond or two, and
  # the scheduler's own wait on a busy machine (the short run's quiet p95 ranged 2-4.5 ms
  # beside two CPU hogs) is not the relay's; the short run's abuse is a small one, too.
  awk -v q="$quiet" -v a="$abuse" -v f="$TCP_FLOOR_MS" 'BEGIN {exit !(a <= 2 * (q > f ? q : f))}' ||
    fail "p95 $abuse ms beside the abuse, $quiet ms quiet (floor $TCP_FLOOR_MS ms)"
  local handshakes
  handshakes=$(field handshakes "$(grep '^flood ' "$TMP/tcp.out")")
  ((${handshakes:-0} > 0)) || fail "the handshake flood completed no handshake: $(cat "$TMP/tcp-flood.out")"
  ((admitted <= TCP_PER_IP)) || fail "one address held $admitted connections (cap $TCP_PER_IP)"
  ((admitted >= TCP_PER_IP * 9 / 10)) || fail "one address got only $admitted connections of its $TCP_PER_IP"
  if ((!SHORT)); then
    # Every slowloris, oversized, garbage and stalled-TLS connection closed within the
    # listener's 30 s deadline (trickled bytes do not extend it), garbage at once.
    grep -q 'kind=garbage .*closed_after_s_max=0\.' "$TMP/tcp.out" || fail "random bytes were not refused at once"
    for kind in slowloris oversized tls; do
      line=$(grep "kind=$kind" "$TMP/tcp.out")
      [[ $(field still_open "$line") == 0 ]] && awk -v m="$(field closed_after_s_max "$line")" 'BEGIN {exit !(m <= 32)}' \
        || fail "$kind connections outlived the 30 s deadline: $line"
    done
  fi
  kill -0 "$RPID" 2>/dev/null || fail "the relay died under the abuse"
  stop_server "$RPID" 50
}

case_directory() {
  echo "directory: the directory's TCP listener under abuse, a legitimate user beside it"
  local port dpid
  port=$(free_port) || { fail "no free port"; return; }
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  "${SERVER_PIN[@]}" "$TUSA" directory --listen "127.0.0.1:$port" --database "sqlite:$TMP/directory.sqlite" \
    --max-connections-per-ip "$TCP_PER_IP" >"$TMP/directory.out" 2>"$TMP/directory.err" &
  dpid=$!
  PIDS+=("$dpid")
  wait_line "$TMP/directory.out" '/^directory tcp/p' 600 >/dev/null ||
    { fail "the directory did not start: $(tail -n 3 "$TMP/directory.err")"; return; }
  abuse_beside_legit dir "127.0.0.1:$port" rendezvous \
    "$DIRECTORY_BENCH" --legit --server "127.0.0.1:$port" --seconds "$TCP_SECONDS" --interval "$TCP_INTERVAL" --gap 2
  judge_listener_abuse "$TMP/dir.out" "$TCP_PER_IP" 10
  if ((!SHORT)); then
    # Idle connections closed for not registering, and opened again.
    (($(field reopened "$(grep 'kind=idle' "$TMP/dir.out")") >= $(field admitted "$(grep 'kind=idle' "$TMP/dir.out")"))) ||
      fail "the idle connections were not closed for not registering: $(grep 'kind=idle' "$TMP/dir.out")"
  fi
  kill -0 "$dpid" 2>/dev/null || fail "the directory died under the abuse"
  stop_server "$dpid" 50
}

# abuse_beside_legit NAME TARGET PROTOCOL LEGIT...: the directory and metrics cases'
# run. LEGIT (a legitimate client printing its quiet and its loaded phase, a --gap of 2 s
# between them) in a process of its own, ahead of the abuse in the scheduler (as root),
# as the tcp case's; once its quiet phase is over, tcp-abuse.py's abuse in PROTOCOL
# against TARGET. Both outputs in $TMP/NAME.out.
abuse_beside_legit() {
  local name=$1 target=$2 protocol=$3
  shift 3
  local ahead=()
  ((EUID == 0)) && ahead=(nice -n -10)
  "${ahead[@]}" "$@" >"$TMP/$name-legit.out" 2>"$TMP/$name-legit.err" &
  local legit_pid=$!
  PIDS+=("$legit_pid")
  sleep "$TCP_SECONDS"
  "${LOAD_PIN[@]}" python3 "$HERE/tcp-abuse.py" --role abuse --protocol "$protocol" --target "$target" \
    --idle "$TCP_IDLE" --reopen --slow "$TCP_ABUSERS" --bad "$TCP_ABUSERS" --deadline "$TCP_WATCH" \
    >"$TMP/$name-abuse.out" 2>"$TMP/$name-abuse.err" || fail "the abuse failed: $(tail -n 3 "$TMP/$name-abuse.err")"
  wait "$legit_pid" ||
    fail "a legitimate request went unanswered: $(cat "$TMP/$name-legit.out") $(tail -n 3 "$TMP/$name-legit.err")"
  forget "$legit_pid"
  cat "$TMP/$name-legit.out" "$TMP/$name-abuse.out" >"$TMP/$name.out"
}

# judge_listener_abuse OUT CAP DEADLINE: the directory and metrics cases' lines (a
# legitimate client's two phases, tcp-abuse.py's kinds) against what the listener must
# hold: the legitimate p95 within 2x the quiet one (over a floor, as the tcp case's), one
# address admitted up to its CAP, frames announced too long and bytes that are no
# message closed at once, and (long run) trickled frames closed DEADLINE s after their
# first byte, whatever the trickle.
judge_listener_abuse() {
  local out=$1 per_ip=$2 deadline=$3 quiet abuse admitted line kind
  sed 's/^/  /' "$out"
  quiet=$(field p95_ms "$(grep 'phase=quiet' "$out")")
  abuse=$(field p95_ms "$(grep 'phase=abuse' "$out")")
  admitted=$(field admitted "$(grep 'kind=idle' "$out")")
  [[ -n $quiet && -n $abuse && -n $admitted ]] || { fail "no latency measured"; return; }
  awk -v q="$quiet" -v a="$abuse" 'BEGIN {printf "  p95 beside the abuse / quiet: %.2f\n", a / q}'
  awk -v q="$quiet" -v a="$abuse" -v f="$TCP_FLOOR_MS" 'BEGIN {exit !(a <= 2 * (q > f ? q : f))}' ||
    fail "p95 $abuse ms beside the abuse, $quiet ms quiet (floor $TCP_FLOOR_MS ms)"
  local cap=$((TCP_IDLE < per_ip ? TCP_IDLE : per_ip))
  ((admitted <= per_ip)) || fail "one address held $admitted connections (cap $per_ip)"
  ((admitted >= cap * 9 / 10)) || fail "one address got only $admitted connections of its $cap"
  for kind in oversized garbage; do
    line=$(grep "kind=$kind" "$out")
    [[ $(field still_open "$line") == 0 ]] && awk -v m="$(field closed_after_s_max "$line")" 'BEGIN {exit !(m < 1)}' ||
      fail "$kind frames were not refused at once: $line"
  done
  if ((!SHORT)); then
    line=$(grep "kind=slowloris" "$out")
    [[ $(field still_open "$line") == 0 ]] &&
      awk -v m="$(field closed_after_s_max "$line")" -v d="$deadline" 'BEGIN {exit !(m <= d + 1)}' ||
      fail "slowloris connections outlived the $deadline s deadline: $line"
  fi
}

case_metrics() {
  echo "metrics: the relay's Prometheus port under abuse, a scraper beside it"
  local port metrics
  port=$(free_port) && metrics=$(free_port) || { fail "no free port"; return; }
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  start_relay "$port" --prometheus --prometheus-address 127.0.0.1 --prometheus-port "$metrics" ||
    { fail "the relay did not start"; return; }
  # The scraper asks every 20 ms (a Prometheus asks every 15 s: this is to have a p95).
  abuse_beside_legit metrics "127.0.0.1:$metrics" http \
    python3 "$HERE/tcp-abuse.py" --role legit --protocol http --target "127.0.0.1:$metrics" \
    --seconds "$TCP_SECONDS" --interval "$TCP_INTERVAL" --gap 2
  # 16 connections from one address (MetricsEndpoint.connectionLimits), a request whole
  # within 10 s of its first byte.
  judge_listener_abuse "$TMP/metrics.out" 16 10
  kill -0 "$RPID" 2>/dev/null || fail "the relay died under the abuse"
  stop_server "$RPID" 50
}

case_devices() {
  echo "devices: a ${DEVICE_SECONDS} s call on sound devices (caller 48 kHz, callee 44.1 kHz)"
  if ! command -v pulseaudio >/dev/null || ! command -v pactl >/dev/null || [[ ! -d $SPEECH_CLIPS ]]; then
    echo "  skipped: needs PulseAudio and pocketsphinx-testdata (bash scripts/setup.sh installs them)"
    return
  fi
  TUSA=$TUSA MAX_UNDERRUNS=$DEVICE_UNDERRUNS bash "$HERE/device-call.sh" "$DEVICE_SECONDS" >"$TMP/devices.out" 2>&1 ||
    fail "the call on devices: $(tail -n 1 "$TMP/devices.out")"
  sed 's/^/  /' "$TMP/devices.out"
}

CALL_IMPAIR="loss=20%,burst=3,jitter=20ms"
# make_speech_reference OUT: the speech the long voice cases play over and over (Debian's
# pocketsphinx test clips joined, 8 kHz); false, with the reason, when it cannot be made.
PESQ_PY=$ROOT/.venv/bin/python
SPEECH_CLIPS=/usr/share/pocketsphinx/test/data/librivox
make_speech_reference() {
  local clips=("$SPEECH_CLIPS"/*.wav)
  if [[ ! -x $PESQ_PY ]] || [[ ! -f ${clips[0]} ]]; then
    echo "  (PESQ over time skipped: needs .venv and pocketsphinx-testdata: bash scripts/setup.sh)"
    return 1
  fi
  "$PESQ_PY" "$HERE/pesq-windows.py" make "$1" "${clips[@]}" >/dev/null 2>"$1.err" \
    || { echo "  (PESQ over time skipped: no reference: $(tail -n 1 "$1.err"))"; return 1; }
}

# judge_pesq_windows REFERENCE RECORDING WHO: PESQ of RECORDING in a window every
# PESQ_EVERY seconds; fails when nothing was heard in a window, or (long runs, 6
# windows or more) when the last third's mean fell more than 0.3 below the first third's.
judge_pesq_windows() {
  local out=$2.pesq
  "$PESQ_PY" "$HERE/pesq-windows.py" score "$1" "$2" --every "$PESQ_EVERY" --window "$PESQ_WINDOW" --json "$out.json" \
    >"$out" 2>"$out.err" || { fail "$3: no PESQ: $(tail -n 2 "$out.err")"; return; }
  echo "  $3 PESQ every ${PESQ_EVERY}s: $(tail -n 1 "$out")"
  python3 - "$out.json" "$3" <<'PY' || FAILED=1
import json, sys
s, who = json.load(open(sys.argv[1])), sys.argv[2]
scores = [r["pesq"] for r in s["rows"]]
ok = True
if min(scores) <= 1.0:
    print(f"  FAILED: {who} heard nothing in a window: {scores}"); ok = False
if len(scores) >= 6:
    third = len(scores) // 3
    first, last = sum(scores[:third]) / third, sum(scores[-third:]) / third
    print(f"  {who}: PESQ first third {first:.2f}, last third {last:.2f}")
    if last < first - 0.3:
        print(f"  FAILED: {who}'s PESQ fell over time ({first:.2f} -> {last:.2f})"); ok = False
sys.exit(0 if ok else 1)
PY
}

# judge_resources FILE RELAY_FDS WHO...: the RSS and fds sampled at each rebinding
# (nat-matrix.sh's "seconds rss fds rss fds ..." lines, one pair per WHO, the relay
# first), from a fifth of the run on: growth per hour; fails when a process's fds
# moved by more than 2 (the relay's by more than RELAY_FDS).
judge_resources() {
  python3 - "$@" <<'PY' || FAILED=1
import sys
path, relay_fds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = [list(map(int, l.split())) for l in open(path) if l.strip()]
ok = True
if len(rows) >= 2:
    first, last = rows[len(rows) // 5] if len(rows) >= 5 else rows[0], rows[-1]
    span = max(1, last[0] - first[0])
    for i, who in enumerate(names):
        rss = (last[1 + 2 * i] - first[1 + 2 * i]) * 3600 / span
        fds = last[2 + 2 * i] - first[2 + 2 * i]
        print(f"  {who}: RSS {first[1 + 2 * i]} -> {last[1 + 2 * i]} KiB ({rss:+.0f} KiB/hour), fds {first[2 + 2 * i]} -> {last[2 + 2 * i]} over {span} s")
        allowed = relay_fds if i == 0 else 2
        if abs(fds) > allowed:
            print(f"  FAILED: the {who}'s fds moved by {fds} (at most {allowed})"); ok = False
sys.exit(0 if ok else 1)
PY
}

# The call and the party run side by side, each in its own namespaces (so the soak
# keeps to its hour): start_matrix CASE OUTDIR starts nat-matrix.sh's CASE in the
# background with the soak's length, impairment and rebinding, the looped speech when
# it can be made; MATRIX_PID[CASE] (empty when the matrix cannot run here).
SPEECH_REFERENCE=""
start_matrix() {
  if ! bash "$ROOT/scripts/nat-matrix.sh" --probe >/dev/null 2>&1; then
    MATRIX_PID[$1]=""
    return
  fi
  if [[ -z $SPEECH_REFERENCE ]] && make_speech_reference "$TMP/speech.wav"; then SPEECH_REFERENCE=$TMP/speech.wav; fi
  CALL_SECONDS=$CALL_SECONDS REBIND_EVERY=$REBIND IMPAIR=$CALL_IMPAIR TUSA=$TUSA LOOP_SPEECH=$SPEECH_REFERENCE \
    bash "$ROOT/scripts/nat-matrix.sh" -o "$2" "$1" >"$2.out" 2>&1 &
  MATRIX_PID[$1]=$!
}

# stop_matrix PID: ends a NAT matrix run early (an interrupted soak): its processes
# first, so that it is not held waiting for them, then the script, whose own cleanup
# deletes its namespaces (SIGKILL after 15 s).
descendants() {
  local c
  for c in $(pgrep -P "$1"); do
    descendants "$c"
    echo "$c"
  done
}
stop_matrix() {
  kill -0 "$1" 2>/dev/null || return 0
  # shellcheck disable=SC2046
  kill -TERM $(descendants "$1") 2>/dev/null || true
  stop_server "$1" 150
}

# wait_matrix CASE OUTDIR WHAT: waits for it and prints its lines; false when it could not run.
wait_matrix() {
  if [[ -z ${MATRIX_PID[$1]} ]]; then
    echo "  skipped: the NAT matrix cannot run here (it needs root, ip netns, nftables and conntrack)"
    return 1
  fi
  wait "${MATRIX_PID[$1]}" || fail "the $3 failed: $(tail -n 3 "$2.out")"
  MATRIX_PID[$1]=""
  sed 's/^/  /' "$2.out" | grep -v '(rebinding A' || true
}

start_call() { start_matrix roam "$TMP/nm"; }
judge_call() {
  echo "call: ${CALL_SECONDS}s through real NATs, $CALL_IMPAIR both ways, A's NAT rebinding every ${REBIND}s"
  wait_matrix roam "$TMP/nm" call || return 0
  # Real speech, played over and over by the caller, scored window by window at the callee.
  [[ -n $SPEECH_REFERENCE ]] && judge_pesq_windows "$SPEECH_REFERENCE" "$TMP/nm/roam-callee.wav" "the callee"
  [[ -s $TMP/nm/roam-caller.json && -s $TMP/nm/roam-callee.json ]] || { fail "no call reports"; return; }
  python3 - "$TMP/nm" <<'PY' || FAILED=1
import json, sys
out = sys.argv[1]
caller, callee = (json.load(open(f"{out}/roam-{side}.json")) for side in ("caller", "callee"))
ok = True
for name, r in (("caller", caller), ("callee", callee)):
    print(f"  {name}: {r['durationSeconds']:.0f} s, ended {r['ended']}, sent {r['packetsSent']}, received "
          f"{r['packetsReceived']}, loss {r['lossPercent']:.1f} %, concealed {r['framesConcealed']}, "
          f"MOS {r.get('estimatedMOS') or 0:.2f}, ICE restarts {r['iceRestarts']}, address changes {r['addressChanges']}")
if caller["ended"] != "time-limit":
    print(f"  FAILED: the call ended by {caller['ended']}, not its time limit"); ok = False
rows = [list(map(int, l.split())) for l in open(f"{out}/roam-resources.txt") if l.strip()]
# 20 % imposed in each direction, give or take three standard deviations of the
# draw (bursts of mean 3 count as a third as many independent draws: 7 points in the
# short run's 900 frames, 0.2 in the long one's), late frames 1 % more at most; each
# rebinding may cost 15 frames more (about 5 on a clean path; loss bursts hide the
# silence and lose the probe's first packets).
for name, r in (("caller", caller), ("callee", callee)):
    sent = max(1, r["packetsSent"])
    allowed = 21 + 300 * (0.2 * 0.8 * 3 / sent) ** 0.5 + 100 * 15 * len(rows) / sent
    if r["lossPercent"] > allowed:
        print(f"  FAILED: {name} lost {r['lossPercent']:.1f} % (20 % imposed, {len(rows)} rebindings: {allowed:.1f} % allowed)")
        ok = False
sys.exit(0 if ok else 1)
PY
  # The relay holds one socket per allocation: each ICE restart makes one per side, and
  # the rebound side cannot delete its old one (its 5-tuple changed), which expires
  # after 600 s: up to 600 / REBIND of them at a time, not a leak.
  judge_resources "$TMP/nm/roam-resources.txt" $((2 * (600 / REBIND + 1) + 2)) relay callee caller
}

start_party() { start_matrix party4 "$TMP/np"; }
judge_party() {
  echo "party: four members for ${CALL_SECONDS}s through real NATs, $CALL_IMPAIR on every member's media, A's NAT rebinding every ${REBIND}s"
  wait_matrix party4 "$TMP/np" party || return 0
  local m
  for m in a1 a2 b1 b2; do [[ -s $TMP/np/party4-$m.json ]] || { fail "no report from $m"; return; }; done
  # What A1 said, heard behind the same NAT (A2) and across both (B1).
  if [[ -n $SPEECH_REFERENCE ]]; then
    judge_pesq_windows "$SPEECH_REFERENCE" "$TMP/np/party4-a2.wav" "A2"
    judge_pesq_windows "$SPEECH_REFERENCE" "$TMP/np/party4-b1.wav" "B1"
  fi
  python3 - "$TMP/np" "$CALL_SECONDS" <<'PY' || FAILED=1
import json, sys
out, seconds = sys.argv[1], int(sys.argv[2])
r = {m: json.load(open(f"{out}/party4-{m}.json")) for m in ("a1", "a2", "b1", "b2")}
rows = [list(map(int, l.split())) for l in open(f"{out}/party4-resources.txt") if l.strip()]
ok = True
creator = r["a1"]["me"]
sent = max(1, r["a1"]["framesSent"])
if sent < seconds * 50 * 0.95:
    print(f"  FAILED: A1 sent {sent} frames in {seconds} s"); ok = False
# As the call case: 20 % imposed on A1's media, three standard deviations of the draw,
# each rebinding up to 15 frames more; and the first 2 s (100 frames), while the
# listeners join a room already speaking and their buffers settle (a 12 s run counts
# about 30 % lost of 20 % imposed; 30 minutes, 20.1 %).
allowed = 21 + 300 * (0.2 * 0.8 * 3 / sent) ** 0.5 + 100 * (15 * len(rows) + 100) / sent
for m in ("a2", "b1", "b2"):
    s = next((s for s in r[m]["speakers"] if s["member"] == creator), None)
    if s is None:
        print(f"  FAILED: {m} never heard A1"); ok = False
        continue
    if s["packets"] < sent * 0.6:
        print(f"  FAILED: {m} heard {s['packets']} of A1's {sent} frames"); ok = False
    if s["lostPercent"] > allowed:
        print(f"  FAILED: {m} lost {s['lostPercent']} % of A1's frames ({allowed:.1f} % allowed)"); ok = False
sys.exit(0 if ok else 1)
PY
  judge_resources "$TMP/np/party4-resources.txt" 2 relay A1 A2 B1 B2
}

# The faults case's relay: rendezvous with TURN credentials, a party port, an identity
# kept across restarts, under the stepped clock; FRPID. On 127.0.0.2, not the peers'
# 127.0.0.1: TURN permissions are per IP, and a relay on the peers' own address
# would let one peer's socket reach the other's allocation around the relay.
start_fault_relay() {
  : >"$TMP/fault-relay.out"
  "${CLOCK[@]}" "$TUSA" relay --listen "127.0.0.2:$FPORT" --rendezvous-port "$FRV" --party-port "$FPARTY" \
    --identity "$TMP/relay.key" --use-auth-secret --static-auth-secret "soak-$$" --realm tusa.test \
    --allow-loopback-peers >"$TMP/fault-relay.out" 2>>"$TMP/fault-relay.err" &
  FRPID=$!
  PIDS+=("$FRPID")
  local i
  for i in $(seq 100); do
    grep -q '^rendezvous tcp' "$TMP/fault-relay.out" && grep -q '^party udp' "$TMP/fault-relay.out" && return 0
    kill -0 "$FRPID" 2>/dev/null || break
    sleep 0.1
  done
  tail -n 3 "$TMP/fault-relay.err" | sed 's/^/  | /'
  return 1
}

# restart_fault_relay LABEL: SIGKILL, then the same relay again; the seconds it was
# away go to DOWNS, and LABEL says so (a failure when it does not come back).
restart_fault_relay() {
  local t0 down
  t0=$(now)
  kill -KILL "$FRPID" 2>/dev/null
  wait "$FRPID" 2>/dev/null || true
  forget "$FRPID"
  sleep 0.5
  start_fault_relay || { fail "the relay did not start again"; return 1; }
  down=$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')
  DOWNS+=("$down")
  echo "  $1relay killed and started again (down $down s)"
}

# judge_outages WHO: the outages (GAPS, ms) of WHO's recording, against the relay's
# times away (DOWNS): one of a freeze's length (9 s or more) heard again within
# FREEZE_BACK_MS of the resume, any other within 3 s of the relay's return; counted
# in FREEZES and RESTARTS.
judge_outages() {
  local g
  FREEZES=0 RESTARTS=0
  for g in $GAPS; do
    if ((g >= 9000)); then
      FREEZES=$((FREEZES + 1))
      ((g <= 10000 + FREEZE_BACK_MS)) || fail "$1: heard again $((g - 10000)) ms after the resume"
    else
      RESTARTS=$((RESTARTS + 1))
      awk -v g="$g" -v d="${DOWNS[0]:-1}" 'BEGIN {exit !(g <= 1000 * d + 3000)}' \
        || fail "$1: an outage of $g ms (the relay was down ${DOWNS[*]} s)"
    fi
  done
}

# gaps WAV: audio-gaps.py's lines for a recording, indented; GAPS holds the lengths (ms).
gaps() {
  python3 "$HERE/audio-gaps.py" "$1" >"$1.gaps" || { cat "$1.gaps"; return 1; }
  sed 's/^/    /' "$1.gaps"
  GAPS=$(sed -n 's/^gap .* ms=\([0-9]*\)$/\1/p' "$1.gaps" | tr '\n' ' ')
}

case_faults() {
  echo "faults: a call and a party through the relay, through relay SIGKILLs, rendezvous cuts, a frozen peer and clock steps"
  FPORT=$(free_port) && FRV=$(free_port) && FPARTY=$(free_port) || { fail "no free port"; return; }
  "$TUSA" keygen --out "$TMP/relay.key" >/dev/null && "$TUSA" keygen --out "$TMP/caller.key" >/dev/null \
    && "$TUSA" keygen --out "$TMP/callee.key" >/dev/null || { fail "tusa keygen"; return; }
  # The system clock as every process sees it: Benchmarks/Sources/ClockStep, preloaded,
  # steps CLOCK_REALTIME (never the monotonic clock, sleeps or timers) by the seconds
  # in $TMP/clock.
  echo 0 >"$TMP/clock"
  CLOCK=(env "LD_PRELOAD=$BIN/libClockStep.so" "TUSA_CLOCK_STEP_FILE=$TMP/clock")
  start_fault_relay || { fail "the relay did not start"; return; }

  # The call: relay-only, so that its media goes through the relay; the callee records the caller's tone.
  local round=0 seconds=$((FAULT_ROUNDS * 32 + 16)) key offset=0
  DOWNS=()
  "${CLOCK[@]}" "$TUSA" answer --rendezvous "127.0.0.2:$FRV" --identity "$TMP/callee.key" --relay-only --in tone \
    --out "$TMP/heard.wav" --timeout 20 --json --quiet >"$TMP/callee.out" 2>"$TMP/callee.err" &
  local callee=$!
  PIDS+=("$callee")
  key=$(wait_line "$TMP/callee.out" 's/^answering as \(.*\)$/\1/p' 100) \
    || { fail "tusa answer did not register: $(tail -n 3 "$TMP/callee.err")"; return; }
  "${CLOCK[@]}" "$TUSA" call "$key" --rendezvous "127.0.0.2:$FRV" --identity "$TMP/caller.key" --relay-only --in tone \
    --duration "$seconds" --json --quiet >"$TMP/caller.out" 2>"$TMP/caller.err" &
  local caller=$!
  PIDS+=("$caller")
  sleep 4
  while ((round < FAULT_ROUNDS)); do
    round=$((round + 1))
    restart_fault_relay "round $round: " || break
    sleep 6
    # The clock steps back an hour, then forward again next round.
    offset=$((offset == 0 ? -3600 : 0))
    echo "$offset" >"$TMP/clock"
    echo "  round $round: the clock stepped to $offset s"
    sleep 2
    ss -K "( sport = :$FRV or dport = :$FRV )" >/dev/null 2>&1 || true
    echo "  round $round: rendezvous connections cut"
    sleep 6
    kill -STOP "$caller"
    sleep 10
    kill -CONT "$caller"
    echo "  round $round: the caller frozen (SIGSTOP) for 10 s"
    sleep 8
  done
  # Once more after the last freeze: whatever path the call found since, it is the
  # relay's (a relay-only call has no audio while its relay is down).
  restart_fault_relay "the " || true
  local rc=0
  wait "$caller" || rc=$?
  forget "$caller"
  wait "$callee" || true
  forget "$callee"
  ((rc == 0)) || fail "tusa call exited $rc: $(tail -n 3 "$TMP/caller.err")"
  python3 - "$TMP/caller.out" "$TMP/callee.out" <<'PY' || FAILED=1
import json, sys
ok = True
for name, path in (("caller", sys.argv[1]), ("callee", sys.argv[2])):
    text = open(path).read()
    r = json.loads(text[text.find("{"):]) if "{" in text else None
    if r is None:
        print(f"  FAILED: no {name} report"); ok = False; continue
    print(f"  {name}: {r['durationSeconds']:.0f} s, ended {r['ended']}, loss {r['lossPercent']:.1f} %, "
          f"ICE restarts {r['iceRestarts']}, path {r['path']}")
    if r["ended"] not in ("time-limit", "remote-hangup"):
        print(f"  FAILED: the {name}'s call ended by {r['ended']}"); ok = False
sys.exit(0 if ok else 1)
PY
  echo "  what the callee heard:"
  if gaps "$TMP/heard.wav"; then
    # One outage per freeze, and one per relay restart (the media is relayed); nothing else.
    judge_outages "the call"
    ((FREEZES == FAULT_ROUNDS)) || fail "$FREEZES outages of a freeze's length, $FAULT_ROUNDS freezes"
    ((RESTARTS == ${#DOWNS[@]})) || fail "$RESTARTS outages for ${#DOWNS[@]} relay restarts (audio that went on is audio not relayed)"
  else
    fail "the callee's recording"
  fi

  # The party: the joiner sends a tone, the creator records the room; the relay is
  # killed and started again, then the joiner is frozen for 10 s.
  local party_key room creator joiner party_seconds=$((FAULT_ROUNDS * 24 + 8))
  party_key=$(sed -n 's/^party udp [^ ]* key \(.*\)$/\1/p' "$TMP/fault-relay.out")
  local common=(--relay "127.0.0.2:$FPARTY" --relay-key "$party_key" --duration "$party_seconds" --json)
  "${CLOCK[@]}" "$TUSA" party create Valheim --identity "$TMP/caller.key" --in silence --out "$TMP/room.wav" \
    "${common[@]}" >"$TMP/creator.out" 2>"$TMP/creator.err" &
  creator=$!
  PIDS+=("$creator")
  room=$(wait_line "$TMP/creator.out" 's/^party \([a-z0-9]\{12\}\) .*/\1/p' 200) || {
    fail "tusa party create printed no room: $(tail -n 3 "$TMP/creator.err")"
    stop_server "$FRPID" 50
    return
  }
  "${CLOCK[@]}" "$TUSA" party join "$room" --identity "$TMP/callee.key" --in tone "${common[@]}" \
    >"$TMP/joiner.out" 2>"$TMP/joiner.err" &
  joiner=$!
  PIDS+=("$joiner")
  sleep 4
  round=0
  DOWNS=()
  while ((round < FAULT_ROUNDS)); do
    round=$((round + 1))
    restart_fault_relay "party round $round: " || break
    sleep 6
    kill -STOP "$joiner"
    sleep 10
    kill -CONT "$joiner"
    echo "  party round $round: the joiner frozen (SIGSTOP) for 10 s"
    sleep 8
  done
  for pid in "$creator" "$joiner"; do
    wait "$pid" || fail "a member exited $?: $(tail -n 2 "$TMP/creator.err" "$TMP/joiner.err")"
    forget "$pid"
  done
  { grep -h "rejoined\|lost the relay\|left: \|joined: " "$TMP/creator.err" "$TMP/joiner.err" || true; } | sed 's/^/    /'
  echo "  what the creator heard:"
  if gaps "$TMP/room.wav"; then
    judge_outages "the party"
    ((FREEZES == FAULT_ROUNDS)) || fail "$FREEZES party outages of a freeze's length, $FAULT_ROUNDS freezes"
    ((FREEZES + RESTARTS <= 2 * FAULT_ROUNDS)) || fail "$((FREEZES + RESTARTS)) party outages for $((2 * FAULT_ROUNDS)) faults"
  else
    fail "the creator's recording"
  fi
  stop_server "$FRPID" 50
}

# The call and the party start together at the first of them and are judged in turn.
VOICE_CASES=()
for c in "${CASES[@]}"; do [[ $c == call || $c == party ]] && VOICE_CASES+=("$c"); done
for c in "${CASES[@]}"; do
  case $c in
    call|party)
      if [[ $c == "${VOICE_CASES[0]}" ]]; then
        for v in "${VOICE_CASES[@]}"; do "start_$v"; done
        for v in "${VOICE_CASES[@]}"; do "judge_$v"; done
      fi ;;
    *) "case_$c" ;;
  esac
done
exit $FAILED
