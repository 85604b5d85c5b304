#!/usr/bin/env bash
# Builds the libFuzzer target for the STUN decoders and runs it for N seconds
# (default 600) on a corpus seeded from ../shared/interop/fuzz-seeds and the
# project's own pinned crash inputs. A crash writes the input to
# Tests/STUNTests/FuzzCrashes/ (pin it there: a test replays every file).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
scratch=.build-fuzz
mkdir -p "$scratch"
echo "fuzz: building STUNFuzz with -sanitize=fuzzer,address"
swift build --product STUNFuzz --scratch-path "$scratch" \
  -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING >"$scratch/build.log" 2>&1 \
  || { cat "$scratch/build.log"; exit 1; }
bin="$scratch/debug/STUNFuzz"
corpus="$scratch/corpus"
mkdir -p "$corpus" Tests/STUNTests/FuzzCrashes
if [ -d ../shared/interop/fuzz-seeds ]; then
  cp -n ../shared/interop/fuzz-seeds/* "$corpus"/ 2>/dev/null || true
  cp -n ../shared/interop/messages/* "$corpus"/ 2>/dev/null || true
else
  echo "fuzz: ../shared/interop absent: starting from the pinned inputs only"
fi
cp -n Tests/STUNTests/FuzzCrashes/* "$corpus"/ 2>/dev/null || true
echo "fuzz: running for ${seconds}s"
"$bin" "$corpus" -max_total_time="$seconds" -max_len=4096 -timeout=5 -rss_limit_mb=2048 \
  -artifact_prefix=Tests/STUNTests/FuzzCrashes/ -print_final_stats=1 2>"$scratch/fuzz.log" || {
  tail -40 "$scratch/fuzz.log"
  echo "fuzz: FAILED: crash input saved under Tests/STUNTests/FuzzCrashes/"
  exit 1
}
grep -E 'stat::number_of_executed_units|Done' "$scratch/fuzz.log" | tail -2
echo "fuzz: no crash in ${seconds}s"
