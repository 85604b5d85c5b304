# Tusa: the two set-up commands are `make demo` and `make test`.
# Every target installs what is missing first (scripts/setup.sh, idempotent).

SWIFT       ?= swift
FUZZ_SECONDS ?= 600
SMOKE_FUZZ_SECONDS ?= 30
SHARED      ?= ../shared/interop

.PHONY: all setup build release demo test unit lint layout interop fuzz fuzz-smoke bench bench-smoke soak quality record clean

all: build

setup:
	@bash scripts/setup.sh

build: setup
	$(SWIFT) build

release: setup
	$(SWIFT) build -c release --product tusa

# Relay on loopback, `tusa stun` against it, the shared corpus checked, clean stop.
demo: build
	@bash scripts/demo.sh

# Every test: the format lint and the target layout, unit, interop against
# coturn/aioice/tshark, and short fuzz and bench runs. The smoke runs come first
# so that swift test's summary closes the output. The party tests score four
# members' real-time audio with PESQ and time a tone through a room, and the sound device tests score calls
# through a sound server and its echo canceller: each runs alone first, so that
# their audio threads do not share the two cores with the rest of the suite. So
# does the directory cluster (five processes and 144 users on the test process's
# event loops, timed to seconds): beside the rest it once heard nothing for 20 s.
test: setup lint layout fuzz-smoke
	$(SWIFT) build --build-tests
	@bash Benchmarks/smoke.sh
	$(SWIFT) test --skip-build --filter 'PartyCommandTests|PartyVoiceFormatTests'
	$(SWIFT) test --skip-build --filter SoundDeviceTests
	$(SWIFT) test --skip-build --filter DirectoryClusterTests
	$(SWIFT) test --skip-build --skip PartyCommandTests --skip PartyVoiceFormatTests --skip SoundDeviceTests --skip DirectoryClusterTests

# Every unit test: each library's own test target (everything but InteropTests,
# which runs real peers and binaries).
unit: setup
	$(SWIFT) test --skip InteropTests

# The toolchain's swift-format with the project's .swift-format: fails on any finding.
lint:
	$(SWIFT) format lint --strict --recursive Package.swift Sources Tests Benchmarks/Package.swift Benchmarks/Sources Benchmarks/Benchmarks Benchmarks/InProcess

# What an app that only places calls links: no server-only dependency may reach it.
layout:
	@bash scripts/check-layout.sh

interop: build
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build --filter InteropTests
	@bash scripts/interop-check.sh

fuzz: setup
	@bash scripts/fuzz.sh $(FUZZ_SECONDS)

fuzz-smoke: setup
	@bash scripts/fuzz.sh $(SMOKE_FUZZ_SECONDS)

# Every benchmark, side by side with its baseline, in one run (Benchmarks/bench.sh).
bench: release
	@bash Benchmarks/bench.sh

bench-smoke: build
	@bash Benchmarks/smoke.sh

# Reliability: the relay under floods and hours of allocations, with figures
# (Benchmarks/soak.sh; `make test` runs its --short version).
soak: setup
	@bash Benchmarks/soak.sh

# Voice quality: PESQ of real speech under loss, Tusa against a speexdsp baseline.
quality: release
	@bash Benchmarks/quality.sh

# Re-record Tusa's own captures against real peers into Interop/.
record: build
	@bash scripts/record-interop.sh

clean:
	rm -rf .build .build-fuzz
