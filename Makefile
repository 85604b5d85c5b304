# Tusa: the two set-up commands are `make demo` and `make test`.
# Every target installs what is missing first (scripts/setup.sh, idempotent).

SWIFT       ?= swift
FUZZ_SECONDS ?= 600
SMOKE_FUZZ_SECONDS ?= 30
SHARED      ?= ../shared/interop

.PHONY: all setup build release demo test unit interop fuzz fuzz-smoke bench bench-smoke quality record clean

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

# Every test: unit, interop against coturn/aioice/tshark, and short fuzz and
# bench runs. The smoke runs come first so that swift test's summary closes the output.
test: setup fuzz-smoke
	$(SWIFT) build --build-tests
	@bash scripts/bench-smoke.sh
	$(SWIFT) test --skip-build

unit: setup
	$(SWIFT) test --filter STUNTests

interop: build
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build --filter InteropTests
	@bash scripts/interop-check.sh

fuzz: setup
	@bash scripts/fuzz.sh $(FUZZ_SECONDS)

fuzz-smoke: setup
	@bash scripts/fuzz.sh $(SMOKE_FUZZ_SECONDS)

bench: release
	@bash scripts/bench.sh

bench-smoke: build
	@bash scripts/bench-smoke.sh

# Voice quality: PESQ of real speech under loss, Tusa against a speexdsp baseline.
quality: release
	@bash scripts/quality.sh

# Re-record Tusa's own captures against real peers into Interop/.
record: build
	@bash scripts/record-interop.sh

clean:
	rm -rf .build .build-fuzz
