# pdserve developer entry points. `make help` lists them.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
PY := .venv/bin/python
PDCTL := $(BUILD)/bin/pdctl
DEMO_MODEL := models/demo-llama-q8_0.gguf
DEFAULT_MODEL := models/gemma-3-270m-q4_k_m.gguf
CHAT_PROMPT ?= Explain in two sentences why the sky is blue.
FUZZ_SECONDS ?= 60

.PHONY: help setup build test unit pytest fuzz run demo clean bench-pd-vs-colocated

help:
	@echo "make run    - set up, build, start a local cluster (router, prefill, decode) with the default model, answer one chat prompt through it, stop"
	@echo "make demo   - generate text with the synthetic demo model (random weights)"
	@echo "make test   - set up, build, and run every test (ctest, pytest, 60 s GGUF fuzzing)"
	@echo "make setup  - install Debian packages and the Python venv (.venv); idempotent"
	@echo "make build  - configure and build into $(BUILD)/ (CMAKE_FLAGS=... to add options)"
	@echo "make unit | pytest | fuzz - one part of the test suite"
	@echo "make bench-pd-vs-colocated - P/D cluster (pinned cores) vs pd-serve, several rates (<= 15 min; BENCH_ARGS=--quick: ~3 min)"

setup:
	@scripts/setup.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

build: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j$(JOBS)

unit: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

pytest: build
	PDCTL=$(abspath $(PDCTL)) $(PY) -m pytest -q tests/python

fuzz: setup
	scripts/run_fuzz.sh $(FUZZ_SECONDS)

test: build
	@scripts/run_tests.sh $(BUILD) $(FUZZ_SECONDS)

$(DEMO_MODEL): scripts/synth_models.py
	$(PY) scripts/synth_models.py --demo $(DEMO_MODEL)

run: build
	@echo "> $(CHAT_PROMPT)"
	@$(PDCTL) up --prefill 1 --decode 1 -m $(DEFAULT_MODEL) --chat "$(CHAT_PROMPT)" -n 120

demo: build $(DEMO_MODEL)
	$(PDCTL) generate -m $(DEMO_MODEL) -p "Once upon a time" -n 64 --seed 42

bench-pd-vs-colocated: build
	$(PY) bench/pd_vs_colocated/run.py --bin-dir $(BUILD)/bin $(BENCH_ARGS)

clean:
	rm -rf $(BUILD) build-fuzz
