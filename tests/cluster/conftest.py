"""A local Ray cluster of two CPUs for the session (object store bounded), the prompts the tests run, and their
single-process results: every Ray run is compared with what one process gives.

Ray has an environment of its own (make test-ray: build/venv-ray with the ray extra); where it is not installed these
tests skip, saying so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from decoctl.cli import main
from decoctl.generation import BatchPrompt

#: the bundled small demo model (plugins/models): every actor loads it by name
MODEL = "pycode-small"
#: what a single-process line and a Ray line may differ in: how long it took
TIMINGS = ("seconds", "tokens_per_second")

PROMPTS = [
    {"prompt": "def fibonacci(n):", "max_new_tokens": 12},
    {"prompt": "import os\n", "seed": 7},
    {"prompt": "class Stack:", "stop": ["\n\n"]},
    {"prompt": "for i in range(10):"},
    {"prompt": "x = [", "max_new_tokens": 5},
    {"prompt": "def read(path):\n    with open(path) as f:", "seed": 11, "max_new_tokens": 20},
    {"prompt": "# a comment"},
]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray", reason="Ray is not installed here: make test-ray runs these in build/venv-ray")
    # as decoctl's commands join a cluster: the workers' output stays in their logs, stdout is the command's
    ray.init(
        num_cpus=2,
        object_store_memory=100 * 1024**2,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def prompts() -> list[BatchPrompt]:
    return [BatchPrompt.of(p, f"prompt {i}") for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS), encoding="utf-8")
    return path


def without_timings(record: dict[str, Any]) -> dict[str, Any]:
    """A JSON line of decoctl generate --prompts less what differs from run to run (its timings)."""
    stats = {k: v for k, v in record["stats"].items() if k not in TIMINGS}
    return {**record, "stats": stats}


def jsonl(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """decoctl in this process: (status, stdout, stderr)."""
    capsys.readouterr()
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err
