#!/usr/bin/env bash
# A private PostgreSQL for the tests and benchmarks: its own data folder and a
# loopback port, never the system's service (Debian's package, from setup.sh).
#
#   scripts/postgres.sh start DIR PORT   makes DIR a cluster if it is not one, starts
#                                        it on 127.0.0.1:PORT (socket in DIR), makes
#                                        the database "tusa" and prints its URL
#   scripts/postgres.sh stop DIR         stops it (fast shutdown)
#
# The superuser is "tusa", trusted on loopback only. As root, the server runs as
# the "postgres" user (PostgreSQL refuses root); DIR's parent must let it in.
set -euo pipefail
cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: scripts/postgres.sh start DIR PORT | stop DIR" >&2
  exit 64
fi
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
  echo "postgres.sh: PostgreSQL is not installed (scripts/setup.sh installs Debian's postgresql)" >&2
  exit 69
fi
as=()
if [ "$(id -u)" -eq 0 ]; then
  id postgres >/dev/null 2>&1 || { echo "postgres.sh: no postgres user to run the server as" >&2; exit 69; }
  as=(runuser -u postgres --)
fi
case $cmd in
start)
  port=${3:?usage: scripts/postgres.sh start DIR PORT}
  # The server lives on after this script: it must not keep what the caller had
  # open (a test process's sockets hold their ports for as long as it runs).
  for fd in /proc/$$/fd/*; do
    fd=${fd##*/}
    case $fd in 0 | 1 | 2 | 255) ;; *) eval "exec $fd>&-" 2>/dev/null || true ;; esac
  done
  mkdir -p "$dir"
  [ ${#as[@]} -eq 0 ] || chown postgres "$dir"
  chmod 700 "$dir"
  if [ ! -f "$dir/PG_VERSION" ]; then
    "${as[@]}" "$bin/initdb" -D "$dir" -U tusa --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/../$(basename "$dir").initdb.log" 2>&1 ||
      { cat "$dir/../$(basename "$dir").initdb.log" >&2; exit 1; }
    rm -f "$dir/../$(basename "$dir").initdb.log"
  fi
  if ! "${as[@]}" "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
    "${as[@]}" "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 30 \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1" start >/dev/null ||
      { tail -20 "$dir/server.log" >&2; exit 1; }
  fi
  "${as[@]}" "$bin/psql" -h "$dir" -p "$port" -U tusa -d postgres -tAq \
    -c "SELECT 1 FROM pg_database WHERE datname = 'tusa'" | grep -q 1 ||
    "${as[@]}" "$bin/createdb" -h "$dir" -p "$port" -U tusa tusa
  echo "postgres://tusa@127.0.0.1:$port/tusa"
  ;;
stop)
  [ -f "$dir/postmaster.pid" ] || exit 0
  "${as[@]}" "$bin/pg_ctl" -D "$dir" -m fast -w -t 30 stop >/dev/null
  ;;
*)
  echo "usage: scripts/postgres.sh start DIR PORT | stop DIR" >&2
  exit 64
  ;;
esac
