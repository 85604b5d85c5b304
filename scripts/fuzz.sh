#!/usr/bin/env bash
# Builds the libFuzzer targets and runs them for N seconds in all (default
# 600), split between them: STUNFuzz (the STUN decoders) on a corpus seeded from
# ../shared/interop/fuzz-seeds and its pinned crash inputs, for a third; then
# SecureFuzz (media and control packet openers, the Noise IK responder),
# RendezvousFuzz (the directory's messages, framing, cluster notices and server
# core; seeded from Tests/RendezvousTests/FuzzSeeds), PartyFuzz (the party's
# frame headers, control messages and channel, and the relay's and a member's
# room cores, with real packets XORed by the input), VoiceFuzz (a peer's
# packets through redundant audio, the jitter buffers and the decoders) and
# CallFuzz (call messages, and the call controller under a script of a peer's
# messages, the driver's events and time) on their pinned inputs, the rest
# shared evenly. Each corpus starts with the target's seeds (TUSA_FUZZ_SEEDS). A
# crash writes the input to Tests/<Target>Tests/FuzzCrashes/ (pin it there: a
# test replays every file).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
scratch=.build-fuzz
mkdir -p "$scratch"

# fuzz PRODUCT CRASH_DIR SECONDS: build with the sanitizers, run, report.
fuzz() {
  local product=$1 crashes=$2 budget=$3
  echo "fuzz: building $product with -sanitize=fuzzer,address"
  swift build --product "$product" --scratch-path "$scratch" \
    -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING >"$scratch/build-$product.log" 2>&1 \
    || { cat "$scratch/build-$product.log"; exit 1; }
  local bin="$scratch/debug/$product" corpus="$scratch/corpus-$product"
  mkdir -p "$corpus" "$crashes"
  cp -n "$crashes"/* "$corpus"/ 2>/dev/null || true
  rm -f "$corpus/README.md"
  # The target's own seeds, shaped like real traffic (none for the older targets).
  # (No leak check there: the fuzz room built once for the process stays, as it does when fuzzing.)
  TUSA_FUZZ_SEEDS="$corpus" ASAN_OPTIONS=detect_leaks=0 "$bin" >/dev/null
  echo "fuzz: running $product for ${budget}s"
  # (Stacks kept 100 frames deep: a suppression must find its frame under JSONDecoder's.)
  ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}malloc_context_size=100 \
    LSAN_OPTIONS=${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$PWD/scripts/fuzz-lsan.supp "$bin" "$corpus" -max_total_time="$budget" -max_len=4096 -timeout=5 -rss_limit_mb=2048 \
    -artifact_prefix="$crashes/" -print_final_stats=1 2>"$scratch/fuzz-$product.log" || {
    tail -40 "$scratch/fuzz-$product.log"
    echo "fuzz: $product FAILED: crash input saved under $crashes/"
    exit 1
  }
  grep -E 'stat::number_of_executed_units|Done' "$scratch/fuzz-$product.log" | tail -2
  echo "fuzz: $product: no crash in ${budget}s"
}

mkdir -p "$scratch/corpus-STUNFuzz"
if [ -d ../shared/interop/fuzz-seeds ]; then
  cp -n ../shared/interop/fuzz-seeds/* "$scratch/corpus-STUNFuzz"/ 2>/dev/null || true
  cp -n ../shared/interop/messages/* "$scratch/corpus-STUNFuzz"/ 2>/dev/null || true
else
  echo "fuzz: ../shared/interop absent: STUNFuzz starts from the pinned inputs only"
fi
# (At least a second each: -max_total_time=0 would mean no limit.)
stun=$((seconds / 3)); ((stun >= 1)) || stun=1
share=$(((seconds - stun) / 5)); ((share >= 1)) || share=1
secure=$((seconds - stun - 4 * share)); ((secure >= 1)) || secure=1
fuzz STUNFuzz Tests/STUNTests/FuzzCrashes "$stun"
fuzz SecureFuzz Tests/SecureTests/FuzzCrashes "$secure"
mkdir -p "$scratch/corpus-RendezvousFuzz"
cp -n Tests/RendezvousTests/FuzzSeeds/*.json "$scratch/corpus-RendezvousFuzz"/ 2>/dev/null || true
fuzz RendezvousFuzz Tests/RendezvousTests/FuzzCrashes "$share"
fuzz PartyFuzz Tests/PartyTests/FuzzCrashes "$share"
fuzz VoiceFuzz Tests/VoiceTests/FuzzCrashes "$share"
fuzz CallFuzz Tests/CallControlTests/FuzzCrashes "$share"
