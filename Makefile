# decoctl developer entry points. Every target is idempotent: a second run reinstalls nothing that is current.
# Environments are made and filled by uv (from the package index, torch from the machine's local CPU wheel), which
# keeps what it downloads in its cache (~/.cache/uv) between runs.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
PLUGINS := $(sort $(dir $(wildcard plugins/*/pyproject.toml)))
PLUGIN_NAMES := $(notdir $(patsubst %/,%,$(PLUGINS)))
# the tools that make environments and distributions: uv and build, in a venv of their own
TOOLS  := .venv-tools
UV     := $(TOOLS)/bin/uv
# torch (test extras only) must come from the machine's local CPU wheel, never the registry's CUDA build
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels)
# uv pip install into the environment whose python follows
UV_INSTALL := $(UV) pip install -q $(FIND_LINKS) --python
STAMP  := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
PROMPT ?= def fibonacci(n):
# pytest on both cores (pytest-xdist); JOBS=1 runs the tests in one process
JOBS   ?= 2

.PHONY: setup setup-test demo dist test test-installed test-exports test-ray test-openvino test-page lint docs bench \
	real-model-bench eagle-demo encdec-demo clean

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install -q --isolated --disable-pip-version-check 'uv>=0.5' 'build>=1.2'

# a new environment at $(1), with pip in it (so that `pip install` works in it as documented)
new_venv = rm -rf $(1) && $(UV) venv -q --seed --python $(PYTHON) $(1)

$(BIN)/python: | $(UV)
	$(call new_venv,$(VENV))

# core plus every distribution under plugins/, editable
$(STAMP): $(BIN)/python pyproject.toml setup.py $(wildcard abi/*.py abi/*.h) $(wildcard plugins/*/pyproject.toml)
	$(UV_INSTALL) $(BIN)/python -e . $(foreach p,$(PLUGINS),-e $(p))
	touch $@

# the test extras: pytest, hypothesis, ruff, mypy, import-linter, onnx; torch only from the machine's local CPU wheel
$(TEST_STAMP): $(STAMP)
	$(UV_INSTALL) $(BIN)/python -e '.[test]' $(foreach p,$(PLUGINS),-e '$(p)[test]')
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

# an sdist and a wheel of decoctl and of every plugin distribution, in dist/ (the sdists build the wheels, so an
# sdist that lacks a file its wheel needs fails here); build/dist.log keeps the build backends' output
DIST := dist
DIST_STAMP := $(DIST)/.built
DIST_SOURCES := pyproject.toml setup.py MANIFEST.in README.md $(shell find core abi plugins -type f \
	-not -path '*/__pycache__/*' -not -path '*/tests/*' -not -path '*.egg-info*' -not -name '*.so' 2>/dev/null)
$(DIST_STAMP): $(DIST_SOURCES) | $(UV)
	rm -rf $(DIST) && mkdir -p build $(DIST) && : > build/dist.log
	@for source in . $(PLUGINS); do \
		echo "building $$source"; \
		$(TOOLS)/bin/python -m build --installer uv --outdir $(DIST) $$source >> build/dist.log 2>&1 \
			|| { tail -40 build/dist.log; exit 1; }; \
	done
	touch $@

dist: $(DIST_STAMP)
	@ls $(DIST)

# The wheels from dist/ installed (not editable) into a clean environment, and used from a folder outside the source
# tree, so that nothing imports from it: the documented commands (tools/check_installed.sh), then the main test suite
# against the installed packages (DECOCTL_TEST_INSTALLED makes tests/conftest.py refuse a decoctl from elsewhere)
INSTALLED_VENV := build/venv-installed
INSTALLED_RUN  := build/installed-run
wheel_of = $(firstword $(wildcard $(DIST)/$(1)-*.whl))
WHEELS_TEST = '$(call wheel_of,decoctl)[test]' $(foreach n,$(PLUGIN_NAMES),'$(call wheel_of,decoctl_$(n))[test]')

test-installed: $(DIST_STAMP)
	$(call new_venv,$(INSTALLED_VENV))
	$(UV_INSTALL) $(INSTALLED_VENV)/bin/python $(WHEELS_TEST)
	rm -rf $(INSTALLED_RUN) && mkdir -p $(INSTALLED_RUN)
	cd $(INSTALLED_RUN) && PATH="$(CURDIR)/$(INSTALLED_VENV)/bin:$$PATH" bash $(CURDIR)/tools/check_installed.sh $(CURDIR)
	cd $(INSTALLED_RUN) && DECOCTL_TEST_INSTALLED=1 DECOCTL_DIST=$(CURDIR)/$(DIST) \
		$(CURDIR)/$(INSTALLED_VENV)/bin/python -m pytest -q -c $(CURDIR)/pyproject.toml --rootdir $(CURDIR) \
		-n $(JOBS) --durations 15 $(CURDIR)/tests $(CURDIR)/plugins

test: lint docs
	$(MAKE) test-installed
	$(MAKE) test-exports
	$(MAKE) test-ray
	$(MAKE) test-openvino

# Optimum's real exports: optimum-onnx pins an older transformers than the main test environment has, so those
# tests run in an environment of their own (elsewhere they skip, saying why), from the wheels in dist/
EXPORTS_VENV := build/venv-exports
test-exports: $(DIST_STAMP)
	$(call new_venv,$(EXPORTS_VENV))
	$(UV_INSTALL) $(EXPORTS_VENV)/bin/python '$(call wheel_of,decoctl)[test-exports]' '$(call wheel_of,decoctl_speculative)'
	mkdir -p $(INSTALLED_RUN) && cd $(INSTALLED_RUN) && DECOCTL_TEST_INSTALLED=1 $(CURDIR)/$(EXPORTS_VENV)/bin/python -m pytest -q \
		-c $(CURDIR)/pyproject.toml --rootdir $(CURDIR) -n $(JOBS) $(CURDIR)/tests/exports \
		$(CURDIR)/tests/encdec/test_optimum_seq2seq.py $(CURDIR)/tests/encdec/test_bench_transformers.py

# decoctl.ray on a local Ray cluster: Ray pins its own versions, so its tests run in an environment of their own
# (elsewhere they skip, saying why), from the wheels in dist/, which the Ray workers install too; the whole run is
# bounded in time, so a hang fails rather than waits
RAY_VENV := build/venv-ray
test-ray: $(DIST_STAMP)
	$(call new_venv,$(RAY_VENV))
	$(UV_INSTALL) $(RAY_VENV)/bin/python '$(call wheel_of,decoctl)[ray,test]' '$(call wheel_of,decoctl_models)'
	mkdir -p $(INSTALLED_RUN) && cd $(INSTALLED_RUN) && DECOCTL_TEST_INSTALLED=1 timeout 900 \
		$(CURDIR)/$(RAY_VENV)/bin/python -m pytest -q -c $(CURDIR)/pyproject.toml --rootdir $(CURDIR) \
		$(CURDIR)/tests/cluster

# OpenVINO's execution provider: onnxruntime-openvino replaces the onnxruntime package (the same import name), so its
# tests run in an environment of their own (elsewhere they skip, saying why), from the wheels in dist/ with
# onnxruntime swapped for it; the run is bounded in time
OPENVINO_VENV := build/venv-openvino
OPENVINO_PLUGINS := speculative lookahead eagle models
test-openvino: $(DIST_STAMP)
	$(call new_venv,$(OPENVINO_VENV))
	$(UV_INSTALL) $(OPENVINO_VENV)/bin/python '$(call wheel_of,decoctl)[testing]' 'pytest>=8' \
		$(foreach n,$(OPENVINO_PLUGINS),'$(call wheel_of,decoctl_$(n))')
	$(UV) pip uninstall -q --python $(OPENVINO_VENV)/bin/python onnxruntime
	$(UV_INSTALL) $(OPENVINO_VENV)/bin/python 'onnxruntime-openvino>=1.24'
	mkdir -p $(INSTALLED_RUN) && cd $(INSTALLED_RUN) && DECOCTL_TEST_INSTALLED=1 timeout 300 \
		$(CURDIR)/$(OPENVINO_VENV)/bin/python -m pytest -q -c $(CURDIR)/pyproject.toml --rootdir $(CURDIR) \
		$(CURDIR)/tests/openvino

# the server's chat page in headless Chromium through Playwright (opt-in, not CI): Debian's chromium, not a download
test-page: $(TEST_STAMP)
	$(UV_INSTALL) $(BIN)/python -e '.[test-page]'
	@test -x /usr/bin/chromium || { echo "make test-page needs Debian's chromium: apt-get install -y chromium"; exit 1; }
	$(BIN)/python -m pytest -q -m page tests/serve/test_page.py

# the encoder-decoder demo pair (docs/BENCHMARKS.md, "Encoder-decoder models"): trained here on one thread and
# exported with optimum-onnx in the test-exports environment; run it again after an interruption to go on
encdec-demo: $(UV)
	test -x $(EXPORTS_VENV)/bin/python || { $(call new_venv,$(EXPORTS_VENV)); }
	$(UV_INSTALL) $(EXPORTS_VENV)/bin/python -e '.[test-exports]' -e plugins/speculative
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
	$(UV_INSTALL) $(BIN)/python -e 'plugins/eagle[train]'
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
	rm -rf $(VENV) $(TOOLS) build $(DIST) *.egg-info

# the API reference: pdoc over exactly the public modules (decoctl._api.PUBLIC_MODULES) into build/docs; a public name
# without a docstring, a cross-reference that leads nowhere, or any warning fails it
.PHONY: docs
# the API reference of the public modules (decoctl._api.PUBLIC_MODULES) with pdoc, into build/docs: a public name
# without a docstring, a link that leads nowhere or any warning fails it
docs: $(TEST_STAMP)
	$(BIN)/python -W error tools/api_docs.py build/docs

# the documented commands that CI does not run (tests/docs/test_documented_commands.py, pytest marker docs_optin):
# in .venv with the import, onnxruntime-genai and bench extras (Gemma 3 270M is imported first where it is not: a few
# minutes, 3.5 GB of memory), then the Ray ones in the Ray environment of `make test-ray`; a command whose needs are
# missing is skipped, naming them. DOCS_LONG=1 adds the benchmark recipes and training runs (hours)
DOCS_LONG ?=
.PHONY: test-docs-optin
test-docs-optin: $(TEST_STAMP)
	$(UV_INSTALL) $(BIN)/python -e '.[import,ort-genai,bench]'
	DECOCTL_DOCS_LONG=$(DOCS_LONG) $(BIN)/python -m pytest -q -m docs_optin tests/docs
	@test -x $(RAY_VENV)/bin/python || { echo "the Ray commands run in $(RAY_VENV): make test-ray first"; exit 1; }
	DECOCTL_DOCS_LONG=$(DOCS_LONG) $(RAY_VENV)/bin/python -m pytest -q -m docs_optin -k ray tests/docs
