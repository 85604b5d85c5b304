#!/usr/bin/env bash
# A party on a busy machine (issue 18: party audio under CPU starvation): the four
# members of PartyCommandTests' party (tusa relay --party-port, four `tusa party`
# processes each speaking an utterance in turn, each recording the room), scored
# with PESQ for every listener and speaker, side by side in one run:
#   quiet       nothing else running, members on defaults (played as early as the
#               path allows, a pull of the 5 ms audio clock after the fastest
#               packets, as in a call; delay a late packet added comes off in pauses);
#   quiet, 20   the same with --min-delay 20 (a frame held);
#   hog         two busy loops, one per core, for the whole party, on defaults;
#   hog, 20     the same with --min-delay 20;
#   hog, 60     the same with --min-delay 60 (what PartyCommandTests holds: its
#               debug-build members on a shared CI machine).
# TUSA=.build/debug/tusa runs the debug build the tests run.
# Each row: the runs' worst pair, the median pair, the members' mean playout delay
# and how much speech their jitter buffers time-stretched (summed over listeners).
# Usage: Benchmarks/party-starvation.sh [RUNS [ROW...]]   (default 3 runs of every row)
# Needs: $TUSA (default .build/release/tusa), .venv with pesq and numpy, Debian's
# pocketsphinx-testdata (make setup installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
TUSA=${TUSA:-$PWD/.build/release/tusa}
PY=.venv/bin/python
SCORER=Tests/InteropTests/peers/party_pesq.py
SPEECH=/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb
[ -x "$TUSA" ] || { echo "party-starvation: no $TUSA (swift build -c release --product tusa)" >&2; exit 1; }
[ -x "$PY" ] && [ -f "$SPEECH-0880.wav" ] || { echo "party-starvation: needs make setup (.venv, pocketsphinx-testdata)" >&2; exit 1; }
source Benchmarks/bench-lib.sh
bench_setup tusa-party-starvation

# One party in $1 with extra member flags $3..., under $2 busy loops. Prints the
# scores' JSON, then one JSON line per member report.
party() {
  local dir=$1 hogs=$2; shift 2
  mkdir -p "$dir"
  local plan total dur line addr key room k p
  plan=$("$PY" "$SCORER" prepare "$dir" "$TUSA" "$SPEECH-0880.wav" "$SPEECH-0930.wav" "$SPEECH-0890.wav" "$SPEECH-0920.wav")
  total=$(echo "$plan" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["total"])')
  dur=$("$PY" -c "print('%.1f' % ($total + 1.5))")
  local hogpids=()
  for ((k = 0; k < hogs; k++)); do (while :; do :; done) & hogpids+=($!); PIDS+=($!); done
  : >"$dir/relay.out"
  "$TUSA" relay --listen 127.0.0.1:0 --party-port 0 >"$dir/relay.out" 2>&1 &
  local relay=$!; PIDS+=($relay)
  line=$(wait_line "$dir/relay.out" '/^party udp /p' 100) || { echo "party-starvation: the relay did not start" >&2; exit 1; }
  addr=$(echo "$line" | awk '{print $3}'); key=$(echo "$line" | awk '{print $5}')
  member() {  # k, then the command's words
    local k=$1; shift
    "$TUSA" party "$@" --relay "$addr" --relay-key "$key" --in "$dir/in-$k.wav" --out "$dir/out-$k.wav" \
      --duration "$dur" --json --quiet "${extra[@]}" >"$dir/m$k.out" 2>"$dir/m$k.err"
  }
  extra=("$@")
  : >"$dir/m0.out"
  member 0 create Hearthstone & local members=($!)
  room=$(wait_line "$dir/m0.out" 's/^party \([a-z0-9]\{12\}\) .*/\1/p') ||
    { echo "party-starvation: no room: $(cat "$dir/m0.err")" >&2; exit 1; }
  for k in 1 2 3; do member "$k" join "$room" & members+=($!); done
  wait "${members[@]}"
  for p in "$relay" "${hogpids[@]}"; do stop_server "$p" 10; done
  "$PY" "$SCORER" score "$dir" 4
  for k in 0 1 2 3; do sed -n '/^{/,$p' "$dir/m$k.out" | tr -d '\n'; echo; done
}

ROWS=("${@:2}")
row() {  # name, hogs, member flags...
  local name=$1 hogs=$2; shift 2
  if ((${#ROWS[@]})) && [[ " ${ROWS[*]} " != *" $name "* ]]; then return; fi
  local r
  local tag=${name//[^a-z0-9]/-}
  for ((r = 1; r <= RUNS; r++)); do party "$TMP/$tag-$r" "$hogs" "$@" >"$TMP/$tag-$r.json"; done
  "$PY" - "$name" "$RUNS" "$TMP" "$tag" <<'EOF'
import json, statistics, sys
name, runs, work, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
worst, medians, delays, stretched = [], [], [], []
for r in range(1, runs + 1):
    lines = open(f"{work}/{tag}-{r}.json").read().split("\n")
    scores = json.loads(lines[0])
    worst.append(min(scores.values()))
    medians.append(statistics.median(scores.values()))
    s = 0.0
    for line in lines[1:]:
        if not line.strip():
            continue
        for sp in json.loads(line)["speakers"]:
            delays.append(sp["delayMeanMilliseconds"])
            s += sp.get("stretchedMilliseconds", 0)
    stretched.append(s)
fmt = lambda xs: " / ".join(f"{x:.3f}" for x in xs)
print(f"| {name} | {runs} | {fmt(worst)} | {statistics.median(medians):.3f} | "
      f"{statistics.mean(delays):.1f} | {' / '.join(f'{x:.0f}' for x in stretched)} |")
EOF
}

echo "| case | runs | worst pair's PESQ, each run | median pair | mean playout delay (ms) | speech stretched (ms), each run |"
echo "|---|---:|---|---:|---:|---|"
row quiet 0
row "quiet, 20" 0 --min-delay 20
row hog 2
row "hog, 20" 2 --min-delay 20
row "hog, 60" 2 --min-delay 60
