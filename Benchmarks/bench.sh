#!/usr/bin/env bash
# `make bench`: every benchmark, side by side with its baseline, in one run.
#  1. STUN codec per message (time, mallocs) against the bare HMAC/CRC calls
#     (ordo-one/benchmark, package Benchmarks/).
#  2. Binding responses per second: trivial echo, tusa relay, coturn
#     turnserver -m 0, same load generator, each server on one core.
#  3. TURN: relayed ChannelData packets/s each way, allocations/s and memory per
#     live allocation, tusa relay against coturn turnserver; then voice traffic
#     (one packet per flow every 20 ms, flows interleaved): CPU per relayed packet
#     and the highest loss-free rate, against coturn and a minimal C forwarder.
#  4. Encrypted transport: seal+open per voice packet against the bare libsodium
#     calls (SecureMedia); handshakes/s, the responder's cost under a flood, and
#     sealed packets/s through the NIO driver against plain NIO UDP (secure-bench).
#  5. Voice: the jitter buffer's delay against speexdsp's and the hindsight best,
#     echo return loss, CPU per call-second against the bare library calls
#     (voice-bench), and PESQ under loss against a speexdsp baseline (quality.sh).
#     A four-member party's PESQ beside two CPU hogs and on a quiet machine, on
#     defaults, with a frame held (--min-delay 20) and with 60 ms held as the
#     party test holds (party-starvation.sh).
#     Parties: the room core's forwarding and hop sealing per delivered frame
#     against the bare AEAD seal; join and rekey times on loopback (party-bench);
#     room forwarding at voice pacing through real sockets, tusa relay against
#     coturn carrying the same conversation as a mesh of allocations, CPU per
#     delivered packet and the highest loss-free rate (party-relay-bench.sh); a
#     party beside a TLS handshake flood on the same relay (tls-flood-party.sh);
#     TURN voice flows and a TCP client beside a handshake flood on the relay's TLS
#     listener, handshakes signed on the loops against on low-priority threads
#     (tls-flood-relay.sh).
#     The directory: invitations acknowledged once stored, in memory, SQLite and
#     PostgreSQL side by side, at a steady pace from many users, and an invitation
#     to an online friend at the same node and at another node (directory-bench);
#     the memory of one node holding idle users up to the descriptor limit (directory-idle.sh).
#  6. Calls: dial to first audio and stack-added mouth-to-ear delay through real
#     calls on loopback (call-bench); time to connect and to first audio through
#     real kernel NAT, direct and relayed (scripts/nat-matrix.sh, as root).
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
echo
echo "== TURN relay under voice traffic: tusa, coturn, a C forwarder (Benchmarks/voice-relay-bench.sh)"
bash Benchmarks/voice-relay-bench.sh 2>&1 | tee out/bench/voice-relay.md
echo
echo "== Encrypted transport: seal+open vs bare libsodium (swift package --package-path Benchmarks benchmark --target SecureMedia)"
swift package --package-path Benchmarks --disable-sandbox benchmark --target SecureMedia \
  --format markdown --no-progress 2>&1 | tee out/bench/secure-media.md
echo
echo "== Encrypted transport: handshakes, flood, NIO driver (Benchmarks/InProcess/secure-bench)"
swift build -c release --product secure-bench >out/bench/secure-build.log 2>&1 \
  || { cat out/bench/secure-build.log; exit 1; }
"$(swift build -c release --show-bin-path)/secure-bench" --seconds 5 2>&1 | tee out/bench/secure.md
echo
echo "== Parties: forwarding + hop sealing per delivered frame, joins and rekeys (Benchmarks/InProcess/party-bench)"
swift build -c release --product party-bench >out/bench/party-build.log 2>&1 \
  || { cat out/bench/party-build.log; exit 1; }
"$(swift build -c release --show-bin-path)/party-bench" --seconds 5 --joins 50 2>&1 | tee out/bench/party.md
echo
echo "== Parties at voice pacing: tusa relay rooms vs a coturn mesh (Benchmarks/party-relay-bench.sh)"
bash Benchmarks/party-relay-bench.sh 2>&1 | tee out/bench/party-relay.md
echo
echo "== A party beside a TLS handshake flood on the relay's party TLS port (Benchmarks/tls-flood-party.sh)"
bash Benchmarks/tls-flood-party.sh 2>&1 | tee out/bench/tls-flood-party.md || true
echo
echo "== TURN beside a TLS handshake flood on the relay's TLS listener, signing on the loops vs on threads (Benchmarks/tls-flood-relay.sh)"
bash Benchmarks/tls-flood-relay.sh 2>&1 | tee out/bench/tls-flood-relay.md || true
echo
echo "== Directory: invitations acknowledged once stored, memory / SQLite / PostgreSQL; to a friend at another node (Benchmarks/InProcess/directory-bench)"
swift build -c release --product directory-bench >out/bench/directory-build.log 2>&1 \
  || { cat out/bench/directory-build.log; exit 1; }
"$(swift build -c release --show-bin-path)/directory-bench" 2>&1 | tee out/bench/directory.md || true
echo
echo "== Directory: idle users on one node, SQLite / PostgreSQL (Benchmarks/directory-idle.sh)"
bash Benchmarks/directory-idle.sh 2>&1 | tee out/bench/directory-idle.md || true
echo
echo "== Voice: jitter-buffer delay, echo canceller, CPU per call-second (Benchmarks/InProcess/voice-bench)"
swift build -c release --product voice-bench >out/bench/voice-build.log 2>&1 \
  || { cat out/bench/voice-build.log; exit 1; }
vb="$(swift build -c release --show-bin-path)/voice-bench"
"$vb" jitter 2>&1 | tee out/bench/voice-jitter.md
"$vb" echo 2>&1 | tee out/bench/voice-echo.md
"$vb" cpu 2>&1 | tee out/bench/voice-cpu.md
echo "== Voice: allocations per frame through VoiceSender and VoiceReceiver (swift package --package-path Benchmarks benchmark --target VoiceFrame)"
swift package --package-path Benchmarks --disable-sandbox benchmark --target VoiceFrame \
  --format markdown --no-progress 2>&1 | tee out/bench/voice-frame.md
echo
echo "== Voice quality: PESQ under loss (Benchmarks/quality.sh, also make quality)"
TUSA="$TUSA" bash Benchmarks/quality.sh
echo
echo "== A party on a busy machine: PESQ with two CPU hogs, defaults, --min-delay 20 and 60 (Benchmarks/party-starvation.sh)"
TUSA="$TUSA" bash Benchmarks/party-starvation.sh 5 2>&1 | tee out/bench/party-starvation.md || true
echo
echo "== Calls: dial to first audio, mouth-to-ear (Benchmarks/InProcess/call-bench)"
swift build -c release --product call-bench >out/bench/call-build.log 2>&1 \
  || { cat out/bench/call-build.log; exit 1; }
# (a missed target is reported in the table, not a reason to stop the other benchmarks)
"$(swift build -c release --show-bin-path)/call-bench" 10 2>/dev/null | tee out/bench/call.md || true
echo
echo "== Calls through real kernel NAT: time to connect and to first audio (scripts/nat-matrix.sh; root)"
TUSA="$TUSA" bash scripts/nat-matrix.sh -o out/bench/nat-matrix | tee out/bench/nat-matrix.txt || true
