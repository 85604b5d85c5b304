#!/usr/bin/env bash
# Records Tusa's own traffic against real peers into Interop/ (pcapng, with tshark
# on lo; needs root). `make record` runs it; tests check the committed files with
# `tusa interop check`. Everything on loopback, every process stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
out=Interop
mkdir -p "$out"
source scripts/lib.sh

pick_port() { echo $(( (RANDOM % 15000) + 40000 )); }

start_capture() { # filter
  tshark -i lo -f "$1" -w "$work/cap.pcapng" -q -a duration:120 2>"$work/tshark.err" &
  TSHARK=$!
  for _ in $(seq 200); do grep -q "^Capturing on" "$work/tshark.err" && return 0; sleep 0.05; done
  echo "record: tshark did not start"; cat "$work/tshark.err"; exit 1
}
stop_capture() { # file
  sleep 0.3
  kill -INT "$TSHARK"; wait "$TSHARK" || true
  cp "$work/cap.pcapng" "$out/$1"
  chmod 644 "$out/$1"
  echo "record: $out/$1: $(capinfos -c -M "$out/$1" | awk -F: '/Number of packets/ {gsub(/ /,"",$2); print $2}') packets"
}
start_tusa() { # port args...
  local port=$1; shift
  start_relay relay --listen "127.0.0.1:$port" "$@"
}
start_coturn() { # port
  turnserver -n -p "$1" -L 127.0.0.1 -L 127.0.0.2 -m 0 --no-tls --no-dtls --no-cli -z -S \
    --log-file "$work/turn.log" --simple-log --no-stdout-log -b "$work/turndb" --pidfile "$work/turn.pid" \
    >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 50); do
    timeout 0.3 turnutils_stunclient -p "$1" 127.0.0.1 2>/dev/null | grep -q "reflexive addr" && return 0
  done
  echo "record: turnserver did not start"; exit 1
}

# 1. coturn's turnutils_stunclient (plain and RFC 5780 -f) against tusa relay.
p=$(pick_port)
start_capture "udp portrange $p-$((p + 1))"
start_tusa "$p" --alt-address "127.0.0.2:$((p + 1))" --no-tcp
timeout 8 turnutils_stunclient -p "$p" 127.0.0.1 >/dev/null
timeout 8 turnutils_stunclient -f -p "$p" 127.0.0.1 >/dev/null
stop_capture turnutils-stunclient-vs-tusa-relay.pcapng

# 2. aioice gathering a server-reflexive candidate from tusa relay.
p=$(pick_port)
start_capture "udp port $p"
start_tusa "$p" --no-tcp
"$PY" Tests/InteropTests/peers/aioice_srflx.py --stun "127.0.0.1:$p" >/dev/null
stop_capture aioice-srflx-vs-tusa-relay.pcapng

# 3. tusa stun (plain and --behavior) against coturn's turnserver.
p=$(pick_port)
start_capture "udp portrange $p-$((p + 1))"
start_coturn "$p"
"$TUSA" stun "127.0.0.1:$p" >/dev/null
"$TUSA" stun --behavior --timeout 1 "127.0.0.1:$p" >/dev/null
stop_capture tusa-stun-vs-coturn.pcapng

# 4. coturn's turnutils_uclient and aioice's TURN client relaying through tusa
#    relay to turnutils_peer (credentials as in ../shared/interop: alice /
#    wonderland / example.org, REST secret northwind).
turn_auth=(-r example.org -u alice:wonderland --use-auth-secret --static-auth-secret northwind --allow-loopback-peers)
peer=$(pick_port)
turnutils_peer -L 127.0.0.1 -p "$peer" >/dev/null 2>&1 &
pids+=($!)
uclient() { timeout 30 turnutils_uclient "$@" -p "$p" -e 127.0.0.1 -r "$peer" -n 5 -m 1 -l 120 127.0.0.1 >/dev/null; }
for run in channels send-indications tcp-control rest-credentials dont-fragment-padding aioice-udp aioice-tcp; do
  p=$(pick_port)
  start_capture "host 127.0.0.1 and (port $p or port $peer)"
  start_tusa "$p" "${turn_auth[@]}"
  case $run in
    channels) uclient -u alice -w wonderland ;;
    send-indications) uclient -s -u alice -w wonderland ;;
    tcp-control) uclient -t -u alice -w wonderland ;;
    rest-credentials) uclient -W northwind -u bob ;;
    dont-fragment-padding) uclient -g -D -u alice -w wonderland ;;
    aioice-*) "$PY" Tests/InteropTests/peers/aioice_turn.py --turn "127.0.0.1:$p" --user alice --password wonderland \
                --peer "127.0.0.1:$peer" --transport "${run#aioice-}" --count 5 >/dev/null ;;
  esac
  case $run in
    aioice-*) stop_capture "$run-turn-vs-tusa-relay.pcapng" ;;
    *) stop_capture "uclient-$run-vs-tusa-relay.pcapng" ;;
  esac
  kill -TERM "${pids[-1]}" 2>/dev/null || true
done

"$TUSA" interop check --user alice:wonderland --secret northwind "$out"
