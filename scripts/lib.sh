# Shared by scripts/demo.sh and scripts/record-interop.sh (sourced, not run).
# Gives a scratch folder $work, a list of started processes $pids stopped on
# exit, and start_relay.
TUSA=${TUSA:-.build/debug/tusa}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# start_relay NAME ARGS...: starts `tusa relay ARGS`, waits for its
# "listening udp 127.0.0.1:PORT" line and sets PORT.
start_relay() {
  local name=$1; shift
  "$TUSA" relay "$@" >"$work/$name.out" 2>"$work/$name.log" &
  pids+=($!)
  for _ in $(seq 100); do
    PORT=$(sed -n 's/^listening udp 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$work/$name.out" | head -1)
    [ -n "$PORT" ] && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$work/$name.log"; echo "tusa relay failed to start" >&2; exit 1; }
    sleep 0.05
  done
  echo "tusa relay did not report its port" >&2; exit 1
}
