#!/usr/bin/env bash
# `make bench`: every benchmark, side by side with its baseline, in one run.
#  1. STUN codec per message (time, mallocs) against the bare HMAC/CRC calls
#     (ordo-one/benchmark, package Benchmarks/).
#  2. Binding responses per second: trivial echo, tusa relay, coturn
#     turnserver -m 0, same load generator, each server on one core.
#  3. TURN: relayed ChannelData packets/s each way, allocations/s and memory per
#     live allocation, tusa relay against coturn turnserver.
# Results go to standard output and out/bench/; BENCHMARKS.md keeps the latest.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out/bench
export TUSA=${TUSA:-$PWD/.build/release/tusa}
echo "== STUN codec (swift package --package-path Benchmarks benchmark --target STUNCodec)"
swift package --package-path Benchmarks --disable-sandbox benchmark --target STUNCodec \
  --format markdown --no-progress 2>&1 | tee out/bench/codec.md
echo
echo "== Binding responses per second (Benchmarks/binding-rps.sh)"
bash Benchmarks/binding-rps.sh "$@" 2>&1 | tee out/bench/binding-rps.md
echo
echo "== TURN relay: tusa relay vs coturn turnserver (Benchmarks/turn-bench.sh)"
bash Benchmarks/turn-bench.sh 2>&1 | tee out/bench/turn.md
