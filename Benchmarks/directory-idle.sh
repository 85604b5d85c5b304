#!/usr/bin/env bash
# One directory node holding idle users (issue 16: 20,000 in under 1 GiB).
# `tusa directory` (release build) on SQLite and on PostgreSQL, one after the
# other; two `directory-bench --idle` processes register USERS between them from
# 127.0.0.1, 127.0.0.2, … (a directory takes 1,000 from one address) and hold them
# HOLD seconds, a keepalive round (clients ping every 30 s). The directory's
# resident memory and descriptors before and with them, per user, and the 20,000
# at that rate. The descriptor limit (ulimit -n, hard; a process cannot raise it)
# bounds USERS: the directory holds one per user, and a few of its own.
# Of the USERS, 200 (half, below 400) are not idle: while the rest are held, they
# signal each other (`directory-bench --signal`: each a contact of the one before it,
# a call offer's size) at SIGNAL_RATE a second in all (2,000) for SIGNAL_SECONDS (10),
# every signal acknowledged and delivered, and their latency.
#
#   bash Benchmarks/directory-idle.sh [USERS] [HOLD]     (default: 20,000 or the limit less 100, and 40)
#   BUILD=debug bash Benchmarks/directory-idle.sh 100 1  (make test's smoke: debug builds)
set -euo pipefail
cd "$(dirname "$0")/.."
source Benchmarks/bench-lib.sh
hard=$(ulimit -Hn)
[[ $hard =~ ^[0-9]+$ ]] || hard=20000
USERS=${1:-$((hard > 20000 ? 20000 : hard - 100))}
HOLD=${2:-40}
SIGNAL_RATE=${SIGNAL_RATE:-2000}
SIGNAL_SECONDS=${SIGNAL_SECONDS:-10}
SIGNALLERS=$((USERS >= 400 ? 200 : USERS / 2))
IDLE=$((USERS - SIGNALLERS))
bench_setup directory-idle

BUILD=${BUILD:-release}
swift build -c "$BUILD" --product tusa >"$TMP/build.log" 2>&1 || { cat "$TMP/build.log"; exit 1; }
swift build -c "$BUILD" --product directory-bench >>"$TMP/build.log" 2>&1 || { cat "$TMP/build.log"; exit 1; }
BIN=$(swift build -c "$BUILD" --show-bin-path)

# kib PID NAME: the process's VmRSS (or another /proc status line) in KiB.
kib() { awk -v n="$2:" '$1 == n { print $2 }' "/proc/$1/status"; }
fds() { ls "/proc/$1/fd" | wc -l; }

postgres_url=""
chmod 711 "$TMP"  # as root the server runs as the postgres user, who must reach $TMP/pg
if bash scripts/postgres.sh start "$TMP/pg" "$(free_port)" >"$TMP/pg.log" 2>&1; then
  postgres_url=$(grep '^postgres://' "$TMP/pg.log" | tail -1)
else
  # (The server's own reason, where it logged one, before its last words.)
  echo "(PostgreSQL not run: $( (grep -E 'FATAL|ERROR|could not' "$TMP/pg.log" || tail -1 "$TMP/pg.log") | head -3 | tr '\n' ' '))"
fi
stop_postgres() { [ -z "$postgres_url" ] || bash scripts/postgres.sh stop "$TMP/pg" >/dev/null 2>&1 || true; }
trap 'stop_postgres; cleanup' EXIT

echo "## Directory: idle users on one node (Benchmarks/directory-idle.sh $USERS $HOLD; ulimit -n $(ulimit -Hn))"
echo
echo "| store | users held | registered in | RSS before / with them (MiB) | per user (KiB) | descriptors with them | 20,000 at that rate (MiB) | signals beside them: offered / acknowledged a second, ack and delivery p95 (ms) |"
echo "|---|---|---|---|---|---|---|---|"
failed=0
for database in "sqlite:$TMP/directory.sqlite" ${postgres_url:+"$postgres_url"}; do
  name=SQLite
  [[ $database == postgres* ]] && name=PostgreSQL
  "$BIN/tusa" directory --listen 127.0.0.1:0 --database "$database" --max-connections $((USERS + 100)) \
    >"$TMP/directory.out" 2>"$TMP/directory.err" &
  pid=$!
  PIDS+=("$pid")
  address=$(wait_line "$TMP/directory.out" 's/^directory tcp //p') || {
    cat "$TMP/directory.err"
    exit 1
  }
  sleep 1
  before=$(kib "$pid" VmRSS)
  # Two clients, each within its own descriptor limit; the second's users from the
  # next source address on.
  first=$(((IDLE / 2 + 899) / 900 * 900))
  ((first <= IDLE)) || first=$IDLE
  clients=()
  parts=()
  counts=()
  for part in 0 1; do
    if ((part == 0)); then count=$first from=0; else count=$((IDLE - first)) from=$first; fi
    ((count > 0)) || continue
    "$BIN/directory-bench" --idle "$count" --from-user "$from" --server "$address" --hold "$HOLD" \
      >"$TMP/idle.$part.out" 2>&1 &
    clients+=("$!")
    PIDS+=("$!")
    parts+=("$part")
    counts[part]=$count
  done
  held=0
  took=0
  for part in "${parts[@]}"; do
    registered=$(wait_line "$TMP/idle.$part.out" 's/^idle: \([0-9]*\) registered.* in \([0-9.]*\) s$/\1 \2/p' 2400) || {
      cat "$TMP/idle.$part.out"
      exit 1
    }
    held=$((held + ${registered%% *}))
    took=$(awk -v a="$took" -v b="${registered#* }" 'BEGIN { print (b > a ? b : a) }')
  done
  took="$took s"
  # The signalling users, beside the idle ones (numbered after them).
  "$BIN/directory-bench" --signal "$SIGNAL_RATE" --clients "$SIGNALLERS" --seconds "$SIGNAL_SECONDS" --from-user "$IDLE" \
    --server "$address" >"$TMP/signal.out" 2>&1 &
  signaller=$!
  PIDS+=("$signaller")
  # Half the hold in: past the first keepalives.
  sleep $((HOLD / 2 + 1))
  with=$(kib "$pid" VmRSS)
  descriptors=$(fds "$pid")
  status=0
  wait "$signaller" || status=$?
  forget "$signaller"
  signals=$(sed -n 's/^signal: //p' "$TMP/signal.out")
  if ((status != 0)) || [[ -z $signals ]]; then
    echo "directory-bench --signal exited $status: $(tail -n 3 "$TMP/signal.out" | tr '\n' ' ')"
    failed=1
  fi
  held=$((held + SIGNALLERS))
  for i in "${!clients[@]}"; do
    # (A client's status, and what it said, when it failed: a failure must name its cause.)
    status=0
    wait "${clients[i]}" || status=$?
    forget "${clients[i]}"
    if ((status != 0)); then
      echo "directory-bench --idle (part ${parts[i]}) exited $status: $(tail -n 3 "$TMP/idle.${parts[i]}.out" | tr '\n' ' ')"
      failed=1
    fi
  done
  per=$(((with - before) / (held > 0 ? held : 1)))
  signalled="$(field offered "$signals") / $(field acknowledged_per_s "$signals"), $(field ack_p95_ms "$signals") and $(field delivered_p95_ms "$signals")"
  awk -v n="$name" -v h="$held" -v t="$took" -v b="$before" -v w="$with" -v p="$per" -v d="$descriptors" -v s="$signalled" \
    'BEGIN { printf "| %s | %s | %s | %.1f / %.1f | %d | %s | %.0f | %s |\n", n, h, t, b / 1024, w / 1024, p, d, (h > 0 ? (b + 20000 * (w - b) / h) / 1024 : 0), s }'
  for part in "${parts[@]}"; do
    grep -q "^idle: held .* ${counts[part]} still registered" "$TMP/idle.$part.out" || { cat "$TMP/idle.$part.out"; failed=1; }
    rm -f "$TMP/idle.$part.out"
  done
  stop_server "$pid" 50
done
exit $failed
