#!/usr/bin/env bash
# Installs what Tusa needs on a Debian machine, idempotently and without questions:
# the C libraries (-dev packages), the real peers used by the interop tests
# (coturn, tshark), iproute2, nftables and conntrack (the NAT matrix), openssl (test certificates
# for TURN over TLS), real speech for the
# voice tests (pocketsphinx-testdata), a sound server with its tools and PortAudio for the live
# device tests (scripts/sound.sh runs a private PulseAudio), PostgreSQL for the directory (scripts/postgres.sh
# runs private servers; the system's own cluster is left stopped) and a Python venv in .venv with aioice, dpkt,
# and numpy + pesq for the voice quality scores.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  pkg-config libsodium-dev libopus-dev libspeex-dev libspeexdsp-dev
  libpcap-dev zlib1g-dev libsndfile1-dev liburing-dev coturn tshark iproute2 nftables conntrack python3-venv openssl
  pocketsphinx-testdata postgresql pulseaudio pulseaudio-utils libportaudio2
)
PY_PACKAGES=(aioice dpkt numpy pesq)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  # tshark asks whether non-root users may capture; answer once, non-interactively.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
  # What runs before the install is not ours: only a turnserver that the install
  # itself starts (coturn's package may start its system service on 3478) is stopped.
  before=$(pgrep -x turnserver 2>/dev/null | sort || true)
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [[ " ${missing[*]} " == *" coturn "* ]]; then
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
      $SUDO systemctl disable --now coturn >/dev/null 2>&1 || true
    fi
    for pid in $(comm -13 <(echo "$before") <(pgrep -x turnserver 2>/dev/null | sort || true)); do
      echo "setup: stopping the turnserver (pid $pid) that installing coturn started; the tests start their own"
      $SUDO kill "$pid" 2>/dev/null || true
    done
  fi
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
need_py=()
for p in "${PY_PACKAGES[@]}"; do
  .venv/bin/python -c "import $p" 2>/dev/null || need_py+=("$p")
done
if ((${#need_py[@]})); then
  echo "setup: pip installing ${need_py[*]}"
  .venv/bin/pip install -q --disable-pip-version-check "${need_py[@]}"
fi
echo "setup: ok"
