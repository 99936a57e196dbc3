# pdserve developer entry points. `make help` lists them.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
PY := .venv/bin/python
PDCTL := $(BUILD)/bin/pdctl
DEMO_MODEL := models/demo-llama-q8_0.gguf
DEFAULT_MODEL := models/gemma-3-270m-q4_k_m.gguf
DEMO_PROMPT ?= Once upon a time, in a small village by the sea, there lived
FUZZ_SECONDS ?= 20

.PHONY: help setup build test unit pytest fuzz run demo clean bench-pd-vs-colocated

help:
	@echo "make run    - set up, build, start a local cluster (router, prefill, decode) with the default model, continue one prompt through its OpenAI API, stop"
	@echo "make demo   - generate text with the synthetic demo model (random weights)"
	@echo "make test   - set up, build, and run every test (ctest, pytest, 20 s of fuzzing per fuzz target)"
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
	@echo "Model: Gemma 3 270M in Q4_K_M ($(DEFAULT_MODEL)), a small pretrained model: it continues text, it is not tuned to follow instructions."
	@echo "Starting pd-router + pd-prefill + pd-decode and continuing a prompt through the router's /v1/completions:"
	@echo
	@$(PDCTL) up --prefill 1 --decode 1 -m $(DEFAULT_MODEL) --complete "$(DEMO_PROMPT)" -n 48
	@echo
	@echo "Go on:"
	@echo "  $(PDCTL) up      # keep the cluster running: OpenAI HTTP on localhost:8080, gRPC on :50051; Ctrl-C stops it"
	@echo "  curl -s localhost:8080/v1/completions -H 'Content-Type: application/json' -d '{\"prompt\": \"The three primary colors are\", \"max_tokens\": 24, \"temperature\": 0}'"
	@echo "  $(PY) -c \"from openai import OpenAI; c = OpenAI(base_url='http://localhost:8080/v1', api_key='none'); print(c.completions.create(model='gemma-3-270m-q4_k_m', prompt='Water boils at', max_tokens=24, temperature=0).choices[0].text)\""
	@echo "  $(PDCTL) chat    # chat in the terminal (a pretrained model: expect loose answers)"

demo: build $(DEMO_MODEL)
	$(PDCTL) generate -m $(DEMO_MODEL) -p "Once upon a time" -n 64 --seed 42

bench-pd-vs-colocated: build
	$(PY) bench/pd_vs_colocated/run.py --bin-dir $(BUILD)/bin $(BENCH_ARGS)

clean:
	rm -rf $(BUILD) build-fuzz
