# Shared by binding-rps.sh, turn-bench.sh, voice-relay-bench.sh, party-relay-bench.sh, soak.sh, party-starvation.sh, directory-idle.sh, tls-flood-party.sh, tls-flood-relay.sh and scripts/nat-matrix.sh
# (sourced, not run): a scratch folder
# $TMP, the started processes $PIDS stopped on exit, free ports, CPU accounting,
# waiting for a quiet machine, and a TURN server's readiness. Each script defines busy_ticks (which CPU
# states count as busy) and sets QUIET_WAIT; bench_setup NAME starts it all.

# bench_setup NAME: makes $TMP (NAME.XXXXXX) and installs the cleanup traps.
bench_setup() {
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
  PIDS=()
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}

cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  sleep 0.2
  for pid in "${PIDS[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$TMP"
}

# forget PID: drop a reaped process from the cleanup list (its number may be reused).
forget() {
  local keep=() p
  for p in "${PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

# stop_server PID GRACE: SIGTERM, then SIGKILL after GRACE tenths of a second.
stop_server() {
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq "$2"); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  forget "$pid"
}

# A random port that nothing listens on (UDP or TCP), from 10000 up to the kernel's
# ephemeral range (not into it: a client connection's own port there, or a flood's
# thousands of them, would take it between the look and the bind).
EPHEMERAL_LOW=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
((EPHEMERAL_LOW > 12000)) || EPHEMERAL_LOW=60000
free_port() {
  local p _
  for _ in $(seq 100); do
    p=$((10000 + (RANDOM * 32768 + RANDOM) % (EPHEMERAL_LOW - 10000)))
    if [[ -z $(ss -Hlnu "sport = :$p" 2>/dev/null) && -z $(ss -Hlnt "sport = :$p" 2>/dev/null) ]]; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# CPU time (clock ticks) used so far by a process and all its threads.
proc_ticks() { sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | awk '{print $12 + $13}'; }
now() { date +%s.%N; }
HZ=$(getconf CLK_TCK)

# wait_line FILE SED-EXPR [TRIES]: the first line SED-EXPR prints from FILE, waiting
# up to TRIES × 50 ms (default 200) for one; fails when none came.
wait_line() {
  local file=$1 expr=$2 tries=${3:-200} line
  for _ in $(seq "$tries"); do
    line=$(sed -n "$expr" "$file" 2>/dev/null | head -1)
    [ -n "$line" ] && { echo "$line"; return 0; }
    sleep 0.05
  done
  return 1
}

# field NAME LINE: the number after NAME= in a generator's output line.
field() { sed -n "s/.*\\b$1=\\([0-9.]*\\).*/\\1/p" <<<"$2" | head -1; }

# Busy share of one CPU over the last half second, from everything on the machine.
machine_busy() {
  local a b
  a=$(busy_ticks); sleep 0.5; b=$(busy_ticks)
  awk -v a="$a" -v b="$b" -v hz="$HZ" 'BEGIN {printf "%.0f", 100 * (b - a) / hz / 0.5}'
}

# Waits up to QUIET_WAIT seconds for the machine to be idle (< 15% of a CPU busy);
# adds the time waited to WAITED.
wait_quiet() {
  local start busy
  start=$(now)
  while busy=$(machine_busy); ((busy > 15)); do
    if awk -v t="$(now)" -v s="$start" -v w="$QUIET_WAIT" 'BEGIN {exit !(t - s >= w)}'; then
      echo "  warning: machine still busy (${busy}% of a CPU) after waiting ${QUIET_WAIT}s"
      return
    fi
  done
  WAITED=$(awk -v t="$(now)" -v s="$start" -v w="${WAITED:-0}" 'BEGIN {printf "%.1f", w + t - s - 0.5}')
}

# wait_turn_ready PID PORT: up to 5 s for a TURN server to grant one allocation to
# turn-load's probe ($LOAD; its errors in $TMP/probe.err).
wait_turn_ready() {
  local i
  for i in $(seq 20); do
    kill -0 "$1" 2>/dev/null || return 1
    "$LOAD" --target "127.0.0.1:$2" --probe --duration 0.25 --source-net 127.3 >/dev/null 2>"$TMP/probe.err" && return 0
  done
  return 1
}

# pin_cpus NAME: SERVER_PIN and LOAD_PIN (taskset to SERVER_CPU and LOAD_CPU) where the
# machine has two CPUs; on one, everything shares it (a smoke check still works).
pin_cpus() {
  if (($(nproc) >= 2)); then
    SERVER_PIN=(taskset -c "$SERVER_CPU") LOAD_PIN=(taskset -c "$LOAD_CPU")
  else
    echo "$1: one CPU only; not pinning (rates mean nothing here)"
    SERVER_PIN=() LOAD_PIN=()
  fi
}

# flood_pins: after pin_cpus, AHEAD_PIN (LOAD_PIN at nice -10 where root: raising a
# priority takes root) for what measures, FLOOD_PIN (LOAD_PIN at nice 10) for a flood
# beside it on the same CPU.
flood_pins() {
  AHEAD_PIN=("${LOAD_PIN[@]}")
  if ((EUID == 0)); then AHEAD_PIN+=(nice -n -10); fi
  FLOOD_PIN=("${LOAD_PIN[@]}" nice -n 10)
}

# self_signed KEY DIR: DIR/cert.pem and DIR/key.pem for CN=localhost, a day, with a key
# of KEY (rsa:2048, rsa:4096, or ec: P-256).
self_signed() {
  local kind=(-newkey "$1")
  [[ $1 == ec ]] && kind=(-newkey ec -pkeyopt ec_paramgen_curve:P-256)
  openssl req -x509 "${kind[@]}" -nodes -days 1 -subj /CN=localhost -keyout "$2/key.pem" -out "$2/cert.pem" \
    >/dev/null 2>&1
}

# start_coturn LOG PORT [THREADS] [--no-tcp]: coturn in the background, pinned with
# SERVER_PIN, on 127.0.0.1:PORT for relayed loads: -n (no config file), -m THREADS (0:
# listener and relay in one thread), TLS/DTLS/CLI off, long-term credentials
# alice:wonderland, loopback peers allowed, relay ports 20000-65000, its log (a line per
# allocation event) in LOG.turn.log. Its pid is $! afterwards.
start_coturn() {
  local log=$1 port=$2 threads=${3:-0} tcp=()
  [[ ${4:-} == --no-tcp ]] && tcp=(--no-tcp)
  "${SERVER_PIN[@]}" turnserver -n -m "$threads" -L 127.0.0.1 -p "$port" --relay-ip 127.0.0.1 \
    --no-tls --no-dtls --no-cli "${tcp[@]}" --log-file "$log.turn.log" --simple-log --no-stdout-log \
    -b "$log.db" --pidfile "$log.pid" -a -u alice:wonderland -r example.org --allow-loopback-peers \
    --min-port 20000 --max-port 65000 >"$log.out" 2>"$log.err" &
}

# median_values: the median of the numbers on standard input, one per line (nothing when none).
median_values() { sort -g | awk '{v[NR] = $1} END { if (NR == 0) exit; print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# has NAME: whether NAME is one of the servers that run ($ACTIVE).
has() { [[ " ${ACTIVE[*]} " == *" $1 "* ]]; }

# finish_generator NAME ROUND: waits for the load generator ($lpid) and stops the server
# ($SPID); 1, with the generator's last lines, when it failed or never printed 'done'.
finish_generator() {
  local rc=0
  wait "$lpid" || rc=$?
  forget "$lpid"
  stop_server "$SPID" 50
  if ((rc != 0)) || ! grep -q '^done' "$TMP/load.out"; then
    echo "round $2 $1: FAILED (generator exit $rc)"
    tail -n 5 "$TMP/load.out" "$TMP/load.err" | sed 's/^/  | /'
    return 1
  fi
}
