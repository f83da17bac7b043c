# The two commands of a fresh Debian 12 machine:
#   make demo       install, build, prepare the bundled corpus, train llama-tiny, sample text
#   make test       install, build, run every test
# and of a GPU host (the torch of .venv must be a CUDA build: scripts/setup.sh --cuda):
#   make gpu-demo   the same demo on GPU 0 in bf16
#   make gpu-test   every test, the CUDA ones included (none may skip)
BUILD ?= build
JOBS ?= $(shell nproc)
TIDE := $(BUILD)/tools/tide
# The project's virtual environment (scripts/setup.sh): the PyTorch tide builds against.
PYTHON := .venv/bin/python
SETUP_FLAGS ?=
CORPUS := data/corpus/kjv.txt
DATASET := data/kjv

.PHONY: all setup configure build tools demo data test bench clean gpu-demo gpu-test

all: build

setup:
	@scripts/setup.sh $(SETUP_FLAGS)

# Ninja where it is installed (scripts/setup.sh installs it): it keeps both cores of a small
# machine busy across targets where Make's generator waits at each library's link. A build
# folder keeps the generator it was first configured with. Expanded when configure runs,
# after setup has installed Ninja.
GENERATOR = $(if $(wildcard $(BUILD)/CMakeCache.txt),,$(if $(shell command -v ninja),-G Ninja))

configure: setup
	@cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release -DTIDE_WERROR=ON > $(BUILD).configure.log 2>&1 \
	  || { cat $(BUILD).configure.log; exit 1; }

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Only the executables: what the demo and the benchmarks run (the tests build under `make test`).
tools: configure
	@cmake --build $(BUILD) -j $(JOBS) --target tide tide-worker tided

$(CORPUS):
	@scripts/fetch_corpus.sh $(CORPUS)

$(DATASET)/dataset.json: $(CORPUS) | tools
	@$(TIDE) data prepare $(CORPUS) --out $(DATASET) --vocab-size 8192 --val-fraction 0.02

data: tools $(DATASET)/dataset.json

demo: data
	@$(TIDE) train llama/llama-tiny --run-dir runs/llama-tiny
	@echo "--- sample from runs/llama-tiny ---"
	@$(TIDE) generate runs/llama-tiny --prompt "And God said" --max-tokens 120 --temperature 0.8 --top-k 50 --seed 7

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

gpu-demo:
	@$(MAKE) --no-print-directory SETUP_FLAGS=--cuda data
	@$(TIDE) train llama/llama-tiny --set device=cuda --set precision.compute=bf16 --run-dir runs/llama-tiny-cuda
	@echo "--- sample from runs/llama-tiny-cuda ---"
	@$(TIDE) generate runs/llama-tiny-cuda --device cuda --prompt "And God said" --max-tokens 120 \
	  --temperature 0.8 --top-k 50 --seed 7

gpu-test:
	@$(MAKE) --no-print-directory SETUP_FLAGS=--cuda build
	@cd $(BUILD) && TIDE_REQUIRE_CUDA=1 ctest --output-on-failure -j $(JOBS)

bench: data
	@$(PYTHON) bench/train_vs_pytorch.py --tide $(BUILD)/tools/tide
	@$(PYTHON) bench/parallel_layouts.py --tide $(BUILD)/tools/tide
	@$(PYTHON) bench/plan_vs_measured.py --tide $(BUILD)/tools/tide
	@$(PYTHON) bench/checkpoint_io.py --tide $(BUILD)/tools/tide
	@$(PYTHON) bench/daemon_load.py --tide $(BUILD)/tools/tide --tided $(BUILD)/tools/tided

clean:
	rm -rf $(BUILD) $(BUILD).configure.log
