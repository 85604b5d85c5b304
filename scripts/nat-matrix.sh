#!/usr/bin/env bash
# The NAT matrix: `tusa call` between two peers behind real kernel NAT (network
# namespaces, veth links, nftables), with `tusa relay` (rendezvous + TURN) on the
# "internet" between them.
#
#   pub   the internet: a bridge on 203.0.113.0/24, the relay on 203.0.113.1
#   ra    A's router: WAN 203.0.113.2, LAN 10.0.1.1/24, NAT (nftables)
#   rb    B's router: WAN 203.0.113.3, LAN 10.0.2.1/24, NAT (nftables)
#   a     peer A (10.0.1.2): `tusa answer`, sends a tone
#   b     peer B (10.0.2.2): `tusa call`, sends speech
# (namespace names are prefixed with tzPID-, so runs never share them; all are
# deleted on exit.)
#
# Routers drop unsolicited inbound packets (a NAT's filtering); their mapping is
# endpoint-independent (`masquerade`: the source port is kept for every
# destination) or symmetric (`masquerade random`: a new port per destination).
#
# Cases (any subset, in order given; default: all):
#   eim    endpoint-independent mapping on both sides: expect a direct path
#   sym1   symmetric NAT at A: direct through a peer-reflexive pair, or relayed
#   sym2   symmetric NAT on both sides: expect relayed
#   roam   eim, and mid-call A's NAT rebinds: its UDP mappings are forgotten and
#          new ones get other ports (what an idle timeout or a NAT reboot does to a
#          roaming phone); the call goes on: after 100 ms of silence each side
#          learns its address from the relay and tells the other, whose probe
#          reopens the path (an ICE restart at 2 s if it does not). With
#          REBIND_EVERY=S, A's NAT rebinds every S seconds instead, for the whole
#          call (CALL_SECONDS), and the processes' RSS and fds are sampled each time;
#          with LOOP_SPEECH=FILE the caller plays FILE over and over (--loop) and
#          the callee records what it hears to OUT/roam-callee.wav
#   udp-blocked  A's network lets no UDP out (TCP only): A allocates over TURN/TCP,
#          the relay talks UDP to B; expect relayed
#   relay-restart  sym2, and mid-call the relay is killed and started again: the
#          peers register again, allocate anew, and the call goes on relayed
#   move   eim, and mid-call A moves: its host gets a new address (10.0.1.3) and
#          loses the old one (a new network, DHCP renumbering); A sees its addresses
#          change, restarts ICE at once and the call goes on (A logs at info level)
#   party  a party on the relay (`tusa relay --party-port`): A, behind a symmetric
#          NAT, creates it; B, whose network lets no UDP out and drops 5 % of TCP
#          segments both ways, joins with --transport auto (so over TCP, RFC 4571);
#          both speak and hear each other. Writes OUT/party-caller.json (A's
#          report) and OUT/party-callee.json (B's).
#   party-stall  the party case without the random loss, A's speech looped, and B's
#          network passing no TCP at all for STALL_SECONDS (1.5) from 3 s after B
#          joined, as a Wi-Fi link that hangs does; the party goes on 6 s after it.
#          B's report says how long its packets waited at most and over the last
#          50 played (delay back down), and how much audio it dropped to catch up.
#   party4 (not run by default: `make soak` runs it) four members through two EIM
#          NATs for CALL_SECONDS: A1 creates the room and plays LOOP_SPEECH over and
#          over (a tone without it), A2 (behind A's NAT too), B1 and B2 join and send
#          silence; every member records what it hears (OUT/party4-MEMBER.wav) and
#          writes its report (OUT/party4-MEMBER.json); IMPAIR on every member's
#          media; with REBIND_EVERY, A's NAT rebinds every S seconds and the RSS and
#          fds of the relay and A1, A2, B1, B2 go to OUT/party4-resources.txt.
#
# Each case writes OUT/CASE-caller.json and OUT/CASE-callee.json (the call
# reports) and their standard error (.log; TUSA_LOG=info says more), and prints
# one line: CASE path=… pair=… connect=…ms audio=…ms sent=… received=….
# Exit status: 0 when every call ran, 1 when one failed, 77 when the matrix cannot
# run here (not root, no `ip netns`, no `nft`, no `conntrack`).
#
# Usage: scripts/nat-matrix.sh [--probe] [-o OUT] [case ...]   (TUSA: the binary; default .build/debug/tusa)
#   IMPAIR="loss=20%,burst=3,jitter=20ms": both sides' media through the impairment layer.
#   --probe: only say whether this machine can run the matrix (exit 0 or 77).
#   NAT_MATRIX_TRACE=FILE: a shell trace (set -x) of the run into FILE.
set -uo pipefail
[ -n "${NAT_MATRIX_TRACE:-}" ] && { exec 2>>"$NAT_MATRIX_TRACE"; set -x; }
cd "$(dirname "$0")/.."
# wait_line (its cleanup is replaced by this script's own, below).
# shellcheck source=Benchmarks/bench-lib.sh
source Benchmarks/bench-lib.sh

OUT=out/nat-matrix
PROBE=0
if [ "${1:-}" = "--probe" ]; then PROBE=1; shift; fi
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
CASES=("$@")
[ ${#CASES[@]} -eq 0 ] && CASES=(eim sym1 sym2 udp-blocked roam relay-restart move party party-stall)
TUSA=${TUSA:-$PWD/.build/debug/tusa}
SPEECH=${SPEECH:-/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.wav}
SECONDS_OF_CALL=${CALL_SECONDS:-4}
STALL_SECONDS=${STALL_SECONDS:-1.5}
P=tz$$   # namespace prefix: several runs never share namespaces

skip() { echo "nat-matrix: skipped: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces and nftables)"
command -v ip >/dev/null || skip "no ip (iproute2)"
command -v nft >/dev/null || skip "no nft (nftables)"
command -v conntrack >/dev/null || skip "no conntrack (conntrack-tools)"
ip netns add "$P-probe" 2>/dev/null || skip "ip netns add is not permitted here"
ip netns exec "$P-probe" nft list ruleset >/dev/null 2>&1 || { ip netns del "$P-probe"; skip "nftables is not usable in a namespace here"; }
ip netns del "$P-probe"
[ $PROBE -eq 1 ] && { echo "nat-matrix: namespaces and nftables are usable"; exit 0; }
[ -x "$TUSA" ] || { echo "nat-matrix: $TUSA is not built" >&2; exit 1; }

mkdir -p "$OUT"
work=$(mktemp -d)
pids=()
NS=()

cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  for n in "${NS[@]}"; do ip netns del "$n" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

ns() { local n=$1; shift; ip netns exec "$P-$n" "$@"; }
# In the background, `ip netns exec` itself (it execs the program), so that $! is the program's pid.
bg() { local n=$1; shift; exec ip netns exec "$P-$n" "$@"; }

addns() {
  ip netns add "$P-$1"
  NS+=("$P-$1")
  ns "$1" ip link set lo up
}

# The internet.
build_internet() {
  addns pub
  ns pub ip link add br0 type bridge
  ns pub ip addr add 203.0.113.1/24 dev br0
  ns pub ip link set br0 up
}

block_udp() {
  ns "$1" nft add rule inet filter forward iifname lan meta l4proto udp drop
}

# router NAME WAN-HOST-BYTE LAN-NET-BYTE MODE(eim|sym)
build_router() {
  local r=$1 wan=$2 lan=$3 mode=$4
  addns "$r"
  ip link add "$P$r-w" type veth peer name "$P$r-p"
  ip link set "$P$r-w" netns "$P-$r"
  ip link set "$P$r-p" netns "$P-pub"
  ns pub ip link set "$P$r-p" master br0 up
  ns "$r" ip link set "$P$r-w" name wan
  ns "$r" ip addr add "203.0.113.$wan/24" dev wan
  ns "$r" ip link set wan up
  ns "$r" sysctl -qw net.ipv4.ip_forward=1
  ip link add "$P$r-l" type veth peer name "$P$r-h"
  ip link set "$P$r-l" netns "$P-$r"
  ns "$r" ip link set "$P$r-l" name lan
  ns "$r" ip addr add "10.0.$lan.1/24" dev lan
  ns "$r" ip link set lan up
  nat_rules "$r" "$mode"
}

nat_rules() {
  local r=$1 mode=$2 flags=""
  [ "$mode" = sym ] && flags="random"
  ns "$r" nft -f - <<EOF
flush ruleset
table ip nat {
  chain post { type nat hook postrouting priority srcnat; policy accept; oifname "wan" masquerade $flags; }
}
table inet filter {
  chain input { type filter hook input priority 0; policy accept; iifname "wan" ct state new drop; }
  chain forward { type filter hook forward priority 0; policy accept; iifname "wan" ct state new drop; }
}
EOF
}

# host NAME ROUTER LAN-NET-BYTE: a peer behind ROUTER, 10.0.LAN.2
build_host() {
  local h=$1 r=$2 lan=$3
  addns "$h"
  ip link set "$P$r-h" netns "$P-$h"
  ns "$h" ip link set "$P$r-h" name eth0
  ns "$h" ip addr add "10.0.$lan.2/24" dev eth0
  ns "$h" ip link set eth0 up
  ns "$h" ip route add default via "10.0.$lan.1"
}

# A's NAT rebinds: UDP mappings dropped, new ones from another port range (rebinding
# K, default 0, takes the range 61000+1000*(K%3): each one moves the ports).
rebind_a() {
  local first=$((61000 + 1000 * (${1:-0} % 3)))
  ns ra nft flush chain ip nat post
  # (Above the kernel's ephemeral range, 32768-60999: never the port the host chose, which EIM keeps.)
  ns ra nft add rule ip nat post oifname wan meta l4proto udp masquerade to ":$first-$((first + 999))"
  ns ra nft add rule ip nat post oifname wan masquerade
  ns ra conntrack -D -p udp 2>&1 | sed "s/^/   (rebinding A: /; s/$/)/"
}

# rebind_while FILE WATCHED PID...: A's NAT rebinds every REBIND_EVERY seconds while
# WATCHED runs; each time, a line "seconds rss fds rss fds ..." (KiB, open fds) of
# the PIDs goes to FILE. Prints how many rebindings there were.
rebind_while() {
  local file=$1 watched=$2 k=0 t=0 p line rss
  shift 2
  : >"$file"
  while kill -0 "$watched" 2>/dev/null; do
    sleep "$REBIND_EVERY"
    kill -0 "$watched" 2>/dev/null || break
    t=$((t + REBIND_EVERY))
    k=$((k + 1))
    rebind_a "$k" >/dev/null
    line="$t"
    for p in "$@"; do
      rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null)
      line="$line ${rss:-0} $(ls "/proc/$p/fd" 2>/dev/null | wc -l)"
    done
    echo "$line" >>"$file"
  done
  echo "$k"
}

# A moves to a new address on its LAN; the old one goes.
move_a() {
  ns a sysctl -qw net.ipv4.conf.eth0.promote_secondaries=1
  ns a ip addr add 10.0.1.3/24 dev eth0
  ns a ip addr del 10.0.1.2/24 dev eth0
  ns a ip route replace default via 10.0.1.1 src 10.0.1.3
}

# new_network MODE-A MODE-B: the internet, A's and B's routers (eim|sym) and hosts, afresh.
new_network() {
  for n in "${NS[@]}"; do ip netns del "$n" 2>/dev/null; done
  NS=()
  build_internet
  build_router ra 2 1 "$1"
  build_router rb 3 2 "$2"
  build_host a ra 1
  build_host b rb 2
}

# collect NAME: both sides' standard error (.log) and JSON reports into OUT.
collect() {
  local side
  for side in caller callee; do
    cp "$work/$1-$side.err" "$OUT/$1-$side.log"
    sed -n '/^{/,$p' "$work/$1-$side.out" >"$OUT/$1-$side.json"
  done
}

# stop_all: every process the case started.
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  pids=()
}

start_relay() {
  (bg pub "$TUSA" relay --listen 203.0.113.1:3478 --rendezvous-port 3480 --use-auth-secret \
    --static-auth-secret "nat-matrix-$$" --realm tusa.test >"$work/relay.out" 2>"$work/relay.err") &
  relay_pid=$!
  pids+=($relay_pid)
  wait_line "$work/relay.out" '/^rendezvous tcp/p' 100 >/dev/null && return 0
  echo "nat-matrix: the relay did not start: $(cat "$work/relay.err")" >&2
  return 1
}

# start_party_relay NAME: `tusa relay` with a party port (203.0.113.1:3481) on the
# internet; relay_pid, and party_key, the relay's key (or says why it did not start, failing).
start_party_relay() {
  (bg pub "$TUSA" relay --listen 203.0.113.1:3478 --party-port 3481 >"$work/relay.out" 2>"$work/relay.err") &
  relay_pid=$!
  pids+=($relay_pid)
  party_key=$(wait_line "$work/relay.out" 's/^party udp [^ ]* key \(.*\)$/\1/p' 100) \
    || { echo "$1: the relay did not start: $(cat "$work/relay.err")"; return 1; }
}

# A party: A behind a symmetric NAT creates it, B (UDP blocked, 5 % TCP loss) joins.
# party-stall: B's network (UDP blocked) passes no TCP at all for STALL_SECONDS, from
# 3 s after B joined; the party goes on 6 s past the stall.
run_party_case() {
  local name=${1:-party}
  new_network sym eim
  block_udp rb
  local duration=$((SECONDS_OF_CALL + 3)) loop=()
  if [ "$name" = party-stall ]; then
    duration=$((3 + ${STALL_SECONDS%.*} + 7)) loop=(--loop)
  else
    ns rb nft add rule inet filter forward meta l4proto tcp numgen random mod 100 \< 5 drop
  fi
  start_party_relay "$name" || return 1
  local key=$party_key
  local input=tone
  [ -f "$SPEECH" ] && input=$SPEECH
  local common=(--relay 203.0.113.1:3481 --relay-key "$key" --json --duration "$duration")
  (bg a "$TUSA" party create Matrix "${common[@]}" --in "$input" "${loop[@]}" >"$work/$name-caller.out" 2>"$work/$name-caller.err") &
  local creator=$!
  pids+=($creator)
  local room
  room=$(wait_line "$work/$name-caller.out" 's/^party \([a-z0-9]*\) "Matrix" as .*/\1/p') \
    || { echo "party: tusa party create did not start: $(cat "$work/$name-caller.err")"; return 1; }
  (bg b "$TUSA" party join "$room" "${common[@]}" --in tone >"$work/$name-callee.out" 2>"$work/$name-callee.err") &
  local joiner=$!
  pids+=($joiner)
  if [ "$name" = party-stall ]; then
    wait_line "$work/$name-callee.out" 's/^party [a-z0-9]* "Matrix" as .*/&/p' >/dev/null \
      || { echo "$name: tusa party join did not join: $(cat "$work/$name-callee.err")"; return 1; }
    sleep 3
    ns rb nft add table inet stall
    ns rb nft add chain inet stall forward '{ type filter hook forward priority -10; policy accept; }'
    ns rb nft add rule inet stall forward meta l4proto tcp drop
    echo "$name: B's TCP stalled for ${STALL_SECONDS} s" >&2
    sleep "$STALL_SECONDS"
    ns rb nft delete table inet stall
  fi
  local rc=0
  wait "$joiner" || rc=$?
  wait "$creator" || rc=$?
  collect "$name"
  if [ $rc -ne 0 ] || [ ! -s "$OUT/$name-caller.json" ] || [ ! -s "$OUT/$name-callee.json" ]; then
    echo "$name: FAILED (tusa party exit $rc): $(tail -3 "$work/$name-caller.err") / $(tail -3 "$work/$name-callee.err")"
    return 1
  fi
  python3 - "$OUT/$name-caller.json" "$OUT/$name-callee.json" "$name" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
def heard(r):
    s = r["speakers"]
    return (f"{s[0]['packets']} pkts {s[0]['lostPercent']}% lost p95 {s[0]['delayP95Milliseconds']} ms"
            f" max {s[0]['delayMaxMilliseconds']} ms at the end {s[0]['delayAtEndMilliseconds']} ms"
            f" caught up by dropping {s[0]['catchUpDroppedMilliseconds']} ms") if s else "nothing"
print(f"{sys.argv[3]}: A over {a['transport']} heard {heard(a)}; B over {b['transport']} heard {heard(b)}; "
      f"sent {a['framesSent']}/{b['framesSent']}")
PY
  stop_all
}

# A four-member party through two EIM NATs, for CALL_SECONDS (the soak's party case).
run_party4_case() {
  local name=party4 m
  new_network eim eim
  start_party_relay "$name" || return 1
  local key=$party_key
  local input=tone loop=() impair=()
  [ -n "${LOOP_SPEECH:-}" ] && input=$LOOP_SPEECH loop=(--loop)
  [ -n "${IMPAIR:-}" ] && impair=(--impair "$IMPAIR")
  local common=(--relay 203.0.113.1:3481 --relay-key "$key" --json --quiet --duration "$SECONDS_OF_CALL" "${impair[@]}")
  local -A member_pid=()
  (bg a "$TUSA" party create Matrix "${common[@]}" --in "$input" "${loop[@]}" --out "$OUT/$name-a1.wav" \
    >"$work/$name-a1.out" 2>"$work/$name-a1.err") &
  member_pid[a1]=$!
  pids+=("${member_pid[a1]}")
  local room
  room=$(wait_line "$work/$name-a1.out" 's/^party \([a-z0-9]*\) "Matrix" as .*/\1/p') \
    || { echo "$name: tusa party create did not start: $(cat "$work/$name-a1.err")"; return 1; }
  for m in a2 b1 b2; do
    (bg "${m:0:1}" "$TUSA" party join "$room" "${common[@]}" --in silence --out "$OUT/$name-$m.wav" \
      >"$work/$name-$m.out" 2>"$work/$name-$m.err") &
    member_pid[$m]=$!
    pids+=("${member_pid[$m]}")
  done
  if [ -n "${REBIND_EVERY:-}" ]; then
    echo "$name: $(rebind_while "$OUT/$name-resources.txt" "${member_pid[a1]}" \
      "$relay_pid" "${member_pid[a1]}" "${member_pid[a2]}" "${member_pid[b1]}" "${member_pid[b2]}") rebindings of A's NAT, every ${REBIND_EVERY}s"
  fi
  local rc=0
  for m in a1 a2 b1 b2; do
    wait "${member_pid[$m]}" || { rc=$?; echo "$name: $m exited $rc: $(tail -n 3 "$work/$name-$m.err")"; }
    cp "$work/$name-$m.err" "$OUT/$name-$m.log"
    sed -n '/^{/,$p' "$work/$name-$m.out" >"$OUT/$name-$m.json"
  done
  stop_all
  [ $rc -eq 0 ] || return 1
  python3 - "$OUT" "$name" <<'PY'
import json, sys
out, name = sys.argv[1], sys.argv[2]
for m in ("a1", "a2", "b1", "b2"):
    r = json.load(open(f"{out}/{name}-{m}.json"))
    heard = "; ".join(f"#{s['member']} {s['packets']} pkts {s['lostPercent']}% lost" for s in r["speakers"]) or "nobody"
    print(f"{name}: {m} (#{r['me']}) over {r['transport']}, {r['seconds']:.0f} s, sent {r['framesSent']}, heard {heard}")
PY
}

# run_case NAME MODE-A MODE-B
run_case() {
  local name=$1
  new_network "$2" "$3"
  [ "$name" = udp-blocked ] && block_udp ra
  : >"$work/relay.out"
  start_relay || return 1
  local rv=203.0.113.1:3480 extra=() long=0
  case $name in roam|relay-restart|move) long=1 ;; esac
  [ $long -eq 1 ] && extra=(--duration $((SECONDS_OF_CALL + 8)))
  local level=${TUSA_LOG:-}
  [ "$name" = move ] && level=info
  [ -n "${IMPAIR:-}" ] && extra+=(--impair "$IMPAIR")
  # roam with LOOP_SPEECH: the caller plays that file over and over, the callee records
  # what it hears to OUT/roam-callee.wav (for PESQ over time: Benchmarks/pesq-windows.py).
  local looping=0
  [ "$name" = roam ] && [ -n "${LOOP_SPEECH:-}" ] && looping=1
  [ $looping -eq 1 ] && extra+=(--out "$OUT/roam-callee.wav")
  (TUSA_LOG=$level bg a "$TUSA" answer --rendezvous "$rv" --in tone --timeout 20 --json --quiet "${extra[@]}" \
    >"$work/$name-callee.out" 2>"$work/$name-callee.err") &
  local answer=$!
  pids+=($answer)
  local key
  key=$(wait_line "$work/$name-callee.out" 's/^answering as \(.*\)$/\1/p') \
    || { echo "$name: tusa answer did not register: $(cat "$work/$name-callee.err")"; return 1; }
  local input=tone
  [ -f "$SPEECH" ] && [ $long -eq 0 ] && input=$SPEECH   # (the long cases outlast the speech)
  local duration=$SECONDS_OF_CALL
  [ $long -eq 1 ] && duration=$((SECONDS_OF_CALL + 6))
  local sending=()
  [ -n "${IMPAIR:-}" ] && sending=(--impair "$IMPAIR")
  [ $looping -eq 1 ] && input=$LOOP_SPEECH sending+=(--loop)
  (bg b "$TUSA" call "$key" --rendezvous "$rv" --in "$input" --duration "$duration" --json --quiet "${sending[@]}" \
    >"$work/$name-caller.out" 2>"$work/$name-caller.err") &
  local call=$!
  pids+=($call)
  # roam with REBIND_EVERY: A's NAT rebinds every REBIND_EVERY seconds until the call
  # ends; each time, the RSS (KiB) and open fds of the relay, the callee and the caller
  # go to OUT/roam-resources.txt ("seconds relay_rss relay_fds callee_rss ...").
  if [ "$name" = roam ] && [ -n "${REBIND_EVERY:-}" ]; then
    echo "roam: $(rebind_while "$OUT/roam-resources.txt" "$call" "$relay_pid" "$answer" "$call") rebindings, every ${REBIND_EVERY}s"
  # The long cases' mid-call event.
  elif [ $long -eq 1 ]; then
    sleep $((SECONDS_OF_CALL / 2 + 1))
    case $name in
      roam) rebind_a ;;
      move) move_a ;;
      relay-restart)
        kill -9 "$relay_pid"
        wait "$relay_pid" 2>/dev/null
        sleep 0.5
        : >"$work/relay.out"
        start_relay || return 1 ;;
    esac
  fi
  local rc=0
  wait "$call" || rc=$?
  wait "$answer" || true
  collect "$name"
  if [ $rc -ne 0 ] || [ ! -s "$OUT/$name-caller.json" ]; then
    echo "$name: FAILED (tusa call exit $rc): $(tail -3 "$work/$name-caller.err")"
    echo "   callee: $(tail -3 "$work/$name-callee.err")"
    return 1
  fi
  python3 - "$name" "$OUT/$name-caller.json" "$OUT/$name-callee.json" <<'PY'
import json, sys
name, c, a = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
print(f"{name}: path={c['path']} pair={c.get('candidatePair')} connect={c.get('connectMilliseconds', 0):.0f}ms "
      f"audio={c.get('dialToFirstAudioMilliseconds') or 0:.0f}ms sent={c['packetsSent']}/{a['packetsSent']} "
      f"received={c['packetsReceived']}/{a['packetsReceived']} moves={a['addressChanges']}")
PY
  stop_all
}

failed=0
for c in "${CASES[@]}"; do
  case $c in
    eim) run_case eim eim eim || failed=1 ;;
    sym1) run_case sym1 sym eim || failed=1 ;;
    sym2) run_case sym2 sym sym || failed=1 ;;
    roam) run_case roam eim eim || failed=1 ;;
    udp-blocked) run_case udp-blocked eim eim || failed=1 ;;
    relay-restart) run_case relay-restart sym sym || failed=1 ;;
    move) run_case move eim eim || failed=1 ;;
    party) run_party_case || failed=1 ;;
    party-stall) run_party_case party-stall || failed=1 ;;
    party4) run_party4_case || failed=1 ;;
    *) echo "nat-matrix: unknown case $c (eim, sym1, sym2, udp-blocked, roam, relay-restart, move, party, party-stall, party4)" >&2; failed=1 ;;
  esac
done
exit $failed
