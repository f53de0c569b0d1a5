# decoctl developer entry points. Every target is idempotent: a second run reinstalls nothing that is current.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
PLUGINS := $(sort $(dir $(wildcard plugins/*/pyproject.toml)))
# torch (test extra only) must come from the machine's local CPU wheel, never the registry's CUDA build
PIP    := $(BIN)/pip install -q $(if $(wildcard /opt/wheels),--find-links /opt/wheels)
STAMP  := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
PROMPT ?= def fibonacci(n):

.PHONY: setup setup-test demo test test-exports test-ray test-page lint bench real-model-bench eagle-demo encdec-demo clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# core plus every distribution under plugins/, editable
$(STAMP): $(BIN)/python pyproject.toml setup.py $(wildcard abi/*.py abi/*.h) $(wildcard plugins/*/pyproject.toml)
	$(PIP) -e . $(foreach p,$(PLUGINS),-e $(p))
	touch $@

# the test extras: pytest, hypothesis, ruff, mypy, import-linter, onnx; torch only from the machine's local CPU wheel
$(TEST_STAMP): $(STAMP)
	$(PIP) -e '.[test]' $(foreach p,$(PLUGINS),-e '$(p)[test]')
	touch $@

setup: $(STAMP)

setup-test: $(TEST_STAMP)

# generate on the bundled demo model "pycode" (plugins/models), every command's default
demo: $(STAMP)
	$(BIN)/decoctl generate "$(PROMPT)"

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy core
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest -q
	$(MAKE) test-exports
	$(MAKE) test-ray

# Optimum's real exports: optimum-onnx pins an older transformers than the main test environment has, so those
# tests run in an environment of their own (elsewhere they skip, saying why)
EXPORTS_VENV := build/venv-exports
$(EXPORTS_VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(EXPORTS_VENV)
	$(EXPORTS_VENV)/bin/pip install -q --upgrade pip
	$(EXPORTS_VENV)/bin/pip install -q $(if $(wildcard /opt/wheels),--find-links /opt/wheels) -e '.[test-exports]' \
		-e plugins/speculative
	touch $@

test-exports: $(EXPORTS_VENV)/.installed
	$(EXPORTS_VENV)/bin/python -m pytest -q tests/exports tests/encdec/test_optimum_seq2seq.py \
		tests/encdec/test_bench_transformers.py

# decoctl.ray on a local two-CPU Ray cluster: Ray pins its own versions, so its tests run in an environment of their
# own (elsewhere they skip, saying why); the whole run is bounded in time, so a hang fails rather than waits
RAY_VENV := build/venv-ray
$(RAY_VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/pip install -q --upgrade pip
	$(RAY_VENV)/bin/pip install -q $(if $(wildcard /opt/wheels),--find-links /opt/wheels) -e '.[ray,test]' \
		-e plugins/models
	touch $@

test-ray: $(RAY_VENV)/.installed
	timeout 600 $(RAY_VENV)/bin/python -m pytest -q tests/cluster

# the server's chat page in headless Chromium through Playwright (opt-in, not CI): Debian's chromium, not a download
test-page: $(TEST_STAMP)
	$(PIP) -e '.[test-page]'
	@test -x /usr/bin/chromium || { echo "make test-page needs Debian's chromium: apt-get install -y chromium"; exit 1; }
	$(BIN)/python -m pytest -q -m page tests/serve/test_page.py

# the encoder-decoder demo pair (docs/BENCHMARKS.md, "Encoder-decoder models"): trained here on one thread and
# exported with optimum-onnx in the test-exports environment; run it again after an interruption to go on
encdec-demo: $(EXPORTS_VENV)/.installed
	nice -n 10 $(EXPORTS_VENV)/bin/python tools/encdec_demo.py all

bench: $(STAMP)
	$(BIN)/decoctl bench --contenders greedy,raw-ort --json build/bench.json

# the real-model benchmark (docs/REAL_MODEL.md): Gemma 3 270M, converted on this machine first with
# `decoctl models import gemma3-270m` (GEMMA=gemma3-270m-int8 after `... --int8`); code and plain-text prompts,
# one intra-op thread for every contender, outputs checked identical to decoctl greedy
GEMMA ?= gemma3-270m
real-model-bench: $(STAMP)
	mkdir -p build
	$(BIN)/decoctl bench -m $(GEMMA) --contenders greedy,raw-ort,ort-genai --prompts examples/real_model_prompts.jsonl \
		--threads 1 -n 64 --repeats 3 --require-identical --json build/real-model-bench-$(GEMMA).json

# an EAGLE-3 head for the demo target from a clean clone (docs/MODELS.md, "The EAGLE head"): the corpus from this
# interpreter's standard library, the target's features, training and export into EAGLE_DEMO (about an hour on
# one core; run it again after an interruption to go on), then that head and the bundled pycode-eagle measured the
# same way on the held-out files. EAGLE_BUDGET: how long it trains (e.g. EAGLE_BUDGET=--epochs\ 2 with a new EAGLE_DEMO)
EAGLE_DEMO ?= build/eagle-demo
EAGLE_BUDGET ?= --max-tokens 2000000
EAGLE_TRAIN_STAMP := $(VENV)/.installed-eagle-train
$(EAGLE_TRAIN_STAMP): $(STAMP)
	$(PIP) -e 'plugins/eagle[train]'
	touch $@

build/corpus/train.txt: tools/corpus.py
	$(BIN)/python tools/corpus.py --out build/corpus

eagle-demo: $(EAGLE_TRAIN_STAMP) build/corpus/train.txt
	$(BIN)/decoctl eagle train --target pycode --data build/corpus/train.txt --out $(EAGLE_DEMO) --resume \
		--arch eagle3 --draft-vocab 2048 --intermediate 512 --ttt-steps 2 --lr 1e-3 $(EAGLE_BUDGET) \
		--threads 1 --no-register
	$(BIN)/decoctl eagle eval --target pycode --head $(EAGLE_DEMO)/head --data build/corpus/heldout.txt \
		--threads 1 --json $(EAGLE_DEMO)/eval.json
	$(BIN)/decoctl eagle eval --target pycode --head pycode-eagle --data build/corpus/heldout.txt \
		--threads 1 --json $(EAGLE_DEMO)/eval-bundled.json

clean:
	rm -rf $(VENV) build *.egg-info
