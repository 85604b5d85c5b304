#!/usr/bin/env bash
# `make quality`: PESQ of real speech through the voice pipeline under loss,
# Tusa's playout against a speexdsp-jitter-buffer baseline on the same traces
# (Benchmarks/quality.py). Results go to out/quality/ and standard output;
# BENCHMARKS.md keeps the latest table. Extra arguments go to quality.py
# (e.g. --codec speex, --seeds 5, --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
TUSA=${TUSA:-$PWD/.build/release/tusa}
[ -x "$TUSA" ] || { echo "quality: $TUSA not built (make release)" >&2; exit 1; }
[ -d /usr/share/pocketsphinx/test/data ] || { echo "quality: pocketsphinx-testdata missing (make setup)" >&2; exit 1; }
mkdir -p out/quality
.venv/bin/python Benchmarks/quality.py "$TUSA" out/quality/files "$@" | tee out/quality/pesq.md
