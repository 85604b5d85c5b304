#!/usr/bin/env bash
# A private sound server for the tests: Debian's PulseAudio (from setup.sh) as an
# ordinary user's process with its own runtime folder, never the system's, with
# no sound card: the tests load null sinks (a sink's monitor is the microphone
# that hears what is played into it).
#
#   scripts/sound.sh start DIR   starts a server whose socket is DIR/native and
#                                prints its address for PULSE_SERVER (unix:DIR/native)
#   scripts/sound.sh stop DIR    stops it
#
# As root the server runs as "nobody" (PulseAudio is not meant to run as root);
# clients of any user reach it through the socket (anonymous access: the folder
# is the test's own).
set -euo pipefail
cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: scripts/sound.sh start DIR | stop DIR" >&2
  exit 64
fi
# end_server PID: ends the server this script started, by PID alone: the recorded
# process and the processes under it (as root that is runuser, and PulseAudio its
# child, which would outlive it: listed first, while runuser is still its parent).
end_server() {
  local children
  children=$(pgrep -P "$1" 2>/dev/null || true)
  # shellcheck disable=SC2086 # one PID per word
  kill -9 $children "$1" 2>/dev/null || true
}

case $cmd in
start)
  command -v pulseaudio >/dev/null || {
    echo "sound.sh: PulseAudio is not installed (scripts/setup.sh installs Debian's pulseaudio)" >&2
    exit 69
  }
  # The server lives on after this script: it must not keep what the caller had open.
  for fd in /proc/$$/fd/*; do
    fd=${fd##*/}
    case $fd in 0 | 1 | 2 | 255) ;; *) eval "exec $fd>&-" 2>/dev/null || true ;; esac
  done
  mkdir -p "$dir"
  chmod 700 "$dir"
  as=()
  if [ "$(id -u)" -eq 0 ]; then
    chown nobody "$dir"
    # A desktop's server runs at nice -11 (its own default, granted by rtkit or
    # RLIMIT_NICE); an unprivileged "nobody" cannot raise itself, so it starts there.
    as=(nice -n -11 runuser -u nobody --)
  fi
  if [ -S "$dir/native" ] && PULSE_SERVER="unix:$dir/native" timeout -k 1 2 pactl info >/dev/null 2>&1; then
    echo "unix:$dir/native"
    exit 0
  fi
  rm -f "$dir/native"
  (cd "$dir" && exec "${as[@]}" env -i PATH=/usr/bin:/bin HOME="$dir" XDG_RUNTIME_DIR="$dir" \
    pulseaudio -n --daemonize=no --exit-idle-time=-1 --use-pid-file=no --realtime=no --high-priority=no \
    --disallow-module-loading=no --log-target=file:"$dir/server.log" \
    -L "module-native-protocol-unix auth-anonymous=1 socket=$dir/native" \
    -L "module-null-sink sink_name=default_speaker sink_properties=device.description=Default" \
    </dev/null >/dev/null 2>&1 &
    echo $! >"$dir/server.pid")
  # Waits on the wall clock (SOUND_START_SECONDS, 15 by default), each question
  # bounded: a server that accepts but does not answer must not hold the script
  # past its deadline, or the caller's own timeout kills it before it can say why.
  pid=$(cat "$dir/server.pid")
  deadline=$((SECONDS + ${SOUND_START_SECONDS:-15}))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if PULSE_SERVER="unix:$dir/native" timeout -k 1 2 pactl info >/dev/null 2>&1; then
      echo "unix:$dir/native"
      exit 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "sound.sh: PulseAudio exited at start; its log ($dir/server.log) ends:" >&2
      tail -20 "$dir/server.log" >&2 2>/dev/null || true
      exit 1
    fi
    sleep 0.1
  done
  echo "sound.sh: PulseAudio did not answer in ${SOUND_START_SECONDS:-15} s; its processes and log ($dir/server.log):" >&2
  ps -o pid,stat,etime,time,wchan:20,args --ppid "$pid" -p "$pid" >&2 2>/dev/null || true
  tail -20 "$dir/server.log" >&2 2>/dev/null || true
  end_server "$pid"
  exit 1
  ;;
stop)
  [ -f "$dir/server.pid" ] || exit 0
  pid=$(cat "$dir/server.pid")
  PULSE_SERVER="unix:$dir/native" timeout 5 pactl exit >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  end_server "$pid"
  rm -f "$dir/server.pid"
  ;;
*)
  echo "usage: scripts/sound.sh start DIR | stop DIR" >&2
  exit 64
  ;;
esac
