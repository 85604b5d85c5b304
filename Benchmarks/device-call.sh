#!/usr/bin/env bash
# A long call on sound devices (issue 19's clock drift): a private PulseAudio
# (scripts/sound.sh) with null sinks, the caller's devices at 48 kHz and the
# callee's at 44.1 kHz (PulseAudio's 44.1 kHz null sink runs 160-360 ppm fast),
# speech played into both microphones over and over, `tusa call` / `tusa answer`
# with `--in device --out device` through a relay's rendezvous on loopback, for
# SECONDS (600). Prints each side's jitter buffer delay a minute (the status
# line's, each the last second's delay, averaged over the minute; over 5 s blocks
# in a call shorter than three minutes), each side's device queues (level, most,
# underruns, slips), the call's loss, and the gaps each speaker played: what its
# sink's monitor recorded, searched for runs of 5 ms or more of digital silence
# once the call's audio had started (the speech played in is one unbroken stream
# with no such run, and the far end sends noise, never zeros, in its pauses; a
# queue that ran dry, or a sound server that ran out of what Tusa gave it, plays
# zeros). A control stream beside each, the same speech played by pacat into a
# sink at the speaker's rate with 20 ms at the server (a Tusa speaker keeps 20-30),
# shows when the machine itself stalled (a VM paused for tens of ms): a speaker's
# gap within 0.25 s of one of its control's is the machine's and is reported, not
# counted. Exit 0 when both ended well, the two microphone queues ran dry and the two
# speakers played gaps of their own (a speaker's queue running dry is one) no more
# than MAX_UNDERRUNS times in all (0) and the delay did not grow (no later block's
# more than 5 ms over the second block's).
#
#   bash Benchmarks/device-call.sh [SECONDS]     (release build of tusa, TUSA= another;
#                                                make test installs PulseAudio)
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=Benchmarks/bench-lib.sh
source Benchmarks/bench-lib.sh
SECONDS_CALL=${1:-600}
TUSA=${TUSA:-$PWD/.build/release/tusa}
MAX_UNDERRUNS=${MAX_UNDERRUNS:-0}
[[ -x $TUSA ]] || swift build -c release --product tusa >/dev/null || exit 1
command -v pactl >/dev/null || { echo "device-call: needs PulseAudio (scripts/setup.sh installs it)" >&2; exit 1; }
SPEECH=$(find /usr/share/pocketsphinx/test/data/librivox -name '*.wav' 2>/dev/null | sort | head -1)
[[ -n $SPEECH ]] || { echo "device-call: needs pocketsphinx-testdata (scripts/setup.sh installs it)" >&2; exit 1; }
D=$(mktemp -d /tmp/device-call.XXXX)
chmod 711 "$D" # as root the sound server runs as nobody, who must reach its folder
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  bash scripts/sound.sh stop "$D/sound" >/dev/null 2>&1
  rm -rf "$D"
}
trap cleanup EXIT
PULSE_SERVER=$(bash scripts/sound.sh start "$D/sound" | tail -1) || exit 1
export PULSE_SERVER
# Each null sink with a listener asking 10 ms, as SoundDeviceTests' sinks have: idle, a
# null sink renders in blocks as long as the shortest latency its streams ask, two
# seconds when none does, where a sound card runs at its period (without them, each
# speaker's queue took a 1.7 s backlog at the start and dropped it).
for s in far_mic:48000 far_speaker:48000 near_mic:44100 near_speaker:44100 far_control:48000 near_control:44100; do
  pactl load-module module-null-sink "sink_name=${s%%:*}" "rate=${s##*:}" >/dev/null || exit 1
  out=/dev/null
  [[ $s == *_speaker:* || $s == *_control:* ]] && out=$D/${s%%:*}.raw
  pacat --record -d "${s%%:*}.monitor" --latency-msec=10 --raw --format=s16le --channels=1 --rate="${s##*:}" >"$out" &
  PIDS+=("$!")
done
# ...and the call starts once they render at that latency (until then a speaker's first
# write waited for the sink's two-second block, and its queue dropped the 1.7 s it took).
settled=0
for _ in $(seq 150); do
  if pactl list sinks | awk '/Name:/ {n=$2} /^\tLatency:/ && n ~ /^(far|near)_/ {c++; if ($2 < 60000) ok++} END {exit !(c == 6 && ok == 6)}'; then
    settled=1
    break
  fi
  sleep 0.1
done
((settled)) || { echo "device-call: the null sinks did not settle to a low latency" >&2; exit 1; }
"$TUSA" relay --listen 127.0.0.1:0 --no-tcp --rendezvous-port 0 >"$D/relay.out" 2>"$D/relay.err" &
PIDS+=("$!")
R=$(wait_line "$D/relay.out" 's/^rendezvous tcp //p') || { echo "device-call: the relay did not start: $(tail -3 "$D/relay.err")" >&2; exit 1; }
"$TUSA" answer --rendezvous "$R" --timeout 30 --json --in device:near_mic.monitor --out device:near_speaker \
  >"$D/callee.out" 2>"$D/callee.err" &
callee=$!
PIDS+=("$callee")
KEY=$(wait_line "$D/callee.out" 's/^answering as //p') ||
  { echo "device-call: tusa answer did not start: $(tail -3 "$D/callee.err")" >&2; exit 1; }
# The speech as one unbroken stream (paplay again and again leaves silence between plays).
python3 -c 'import sys, wave; w = wave.open(sys.argv[1]); sys.stdout.buffer.write(w.readframes(w.getnframes()))' \
  "$SPEECH" >"$D/speech.raw" || exit 1
RATE=$(python3 -c 'import sys, wave; print(wave.open(sys.argv[1]).getframerate())' "$SPEECH")
[[ $RATE =~ ^[0-9]+$ ]] || { echo "device-call: cannot read the rate of $SPEECH" >&2; exit 1; }
for sink in far_mic:40 near_mic:40 far_control:20 near_control:20; do
  (while true; do cat "$D/speech.raw" || exit; done) |
    pacat --playback -d "${sink%%:*}" --raw --format=s16le --channels=1 --rate="$RATE" --latency-msec="${sink##*:}" \
      >/dev/null 2>&1 &
  PIDS+=("$!")
done
"$TUSA" call "$KEY" --rendezvous "$R" --duration "$SECONDS_CALL" --json --in device:far_mic.monitor \
  --out device:far_speaker >"$D/caller.out" 2>"$D/caller.err"
caller_status=$?
wait "$callee"
callee_status=$?
echo "## A ${SECONDS_CALL} s call on devices (caller 48 kHz, callee 44.1 kHz), $(date -u +%F)"
echo "caller exit $caller_status, callee exit $callee_status"
python3 - "$D" "$SECONDS_CALL" "$MAX_UNDERRUNS" <<'PY'
import json, re, sys
d, seconds, most_underruns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
block = 60 if seconds >= 180 else 5
ok = True
for side in ("caller", "callee"):
    # The status line comes every second or so: one delay per line, grouped by the
    # packets sent (50 a second).
    status = open(f"{d}/{side}.err", errors="replace", newline="").read().split("\r")
    delays = {}
    for line in status:
        m = re.search(r"buffer (\d+) ms .* sent (\d+)", line)
        if m:
            delays.setdefault(int(m.group(2)) // (50 * block), []).append(int(m.group(1)))
    blocks = [sum(v) / len(v) for k, v in sorted(delays.items())]
    if len(blocks) < 3:
        ok = False
        print(f"{side}: too few status lines to follow the delay ({len(blocks)} blocks of {block} s)")
    print(f"{side}'s jitter buffer delay every {block} s (ms):", " ".join(f"{x:.1f}" for x in blocks))
    # (The first block holds the call's start: the second is the reference.)
    if len(blocks) >= 3 and max(blocks[2:]) > blocks[1] + 5:
        ok = False
        print(f"{side}: the delay grew")
underruns = 0
for side in ("caller", "callee"):
    text = open(f"{d}/{side}.out").read()
    report = json.loads(text[text.index("{"):])
    for name in ("captureDevice", "playbackDevice"):
        q = report.get(name) or {}
        print(f"{side} {name}: level {q.get('queueMilliseconds', 0):.1f} ms, most {q.get('maximumQueueMilliseconds', 0):.1f} ms,"
              f" underruns {q.get('underruns')} (late writes waited for {q.get('lateWrites', 0)}), dropped {q.get('droppedSamples')}, repeated {q.get('repeatedSamples')}")
        if name == "captureDevice":  # (a speaker's own show up among its gaps below)
            underruns += q.get("underruns", 1)
    print(f"{side}: sent {report.get('packetsSent')}, received {report.get('packetsReceived')}, loss {report.get('lossPercent', 0):.2f} %")
def gaps(sink, rate):
    """Runs of 5 ms or more of zero samples in a sink's recording, from a second after its
    first audio to a second before its last, as (start, end) in seconds into the
    recording; None when it played nothing."""
    data = open(f"{d}/{sink}.raw", "rb").read()
    audio = re.search(rb"[^\0]", data)
    if not audio:
        return None
    first, last = audio.start() // 2 * 2, len(data.rstrip(b"\0"))
    # (Bytes, two a sample: a run of zero bytes one longer than 5 ms holds 5 ms of zero samples.)
    runs = re.compile(rb"\0{%d,}" % (2 * rate * 5 // 1000 + 1)).finditer(data, first + 2 * rate, max(0, last - 2 * rate))
    return [(m.start() / 2 / rate, m.end() / 2 / rate) for m in runs]
def listed(found):
    return ": " + ", ".join(f"{(b - a) * 1000:.0f} ms at {a:.1f} s" for a, b in found[:10]) if found else ""
for side, sink, control, rate in (("caller", "far_speaker", "far_control", 48000),
                                  ("callee", "near_speaker", "near_control", 44100)):
    stalls = gaps(control, rate)
    if stalls is None:
        print(f"{side}'s control stream played nothing: no stall of the machine's can be told apart")
        stalls = []
    else:
        print(f"{side}'s control stream played {len(stalls)} gaps of 5 ms or more (the machine's stalls){listed(stalls)}")
    found = gaps(sink, rate)
    if found is None:
        print(f"{side}'s speaker played nothing")
        underruns += 1
        continue
    own = [g for g in found if not any(a - 0.25 <= g[0] <= b + 0.25 for a, b in stalls)]
    print(f"{side}'s speaker played {len(own)} gaps of 5 ms or more{listed(own)}"
          + (f" (and {len(found) - len(own)} when its control stream had one too)" if len(found) > len(own) else ""))
    underruns += len(own)
if underruns > most_underruns:
    ok = False
    print(f"{underruns} underruns and gaps, more than {most_underruns}")
sys.exit(0 if ok else 1)
PY
judged=$?
((caller_status == 0 && callee_status == 0 && judged == 0))
