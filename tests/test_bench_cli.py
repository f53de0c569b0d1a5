"""`decoctl bench` as a user runs it: the real command in a fresh process, from an empty working folder.

The documented commands work as written on the bundled demo model (its tree inputs and its draft and EAGLE head
included), and bad input is refused with one `decoctl: error:` line before anything runs, never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ONE_PROMPT = json.dumps({"prompt": "def fibonacci(n):\n"}) + "\n"


class Decoctl:
    """Runs ``decoctl ARGS`` in a fresh process in the empty folder ``work``, with a cache of its own."""

    def __init__(self, work: Path, cache: Path) -> None:
        self.work = work
        self.cache = cache

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        environment = {**os.environ, "XDG_CACHE_HOME": str(self.cache), **(env or {})}
        command = [sys.executable, "-m", "decoctl.cli", *args]
        return subprocess.run(command, cwd=self.work, env=environment, capture_output=True, text=True, timeout=300)


@pytest.fixture
def decoctl(tmp_path: Path) -> Decoctl:
    (tmp_path / "work").mkdir()
    return Decoctl(tmp_path / "work", tmp_path / "cache")


@pytest.fixture
def one_prompt(tmp_path: Path) -> Path:
    path = tmp_path / "one.jsonl"
    path.write_text(ONE_PROMPT)
    return path


def rows(report: Path) -> dict[str, dict[str, object]]:
    return {c["name"]: c for c in json.loads(report.read_text())["contenders"]}


# -- the documented commands ---------------------------------------------------------------------------------
@pytest.mark.demo
def test_bench_with_no_options_runs_raw_ort_on_the_default_model(decoctl: Decoctl) -> None:
    done = decoctl("bench", "-n", "16", "--repeats", "1")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    table = done.stdout.splitlines()
    assert any(line.startswith("model pycode ") for line in table)
    assert any(line.startswith("raw-ort ") for line in table)


@pytest.mark.demo
def test_the_readme_comparison_with_onnxruntime_genai_writes_into_a_new_folder(
    decoctl: Decoctl, one_prompt: Path
) -> None:
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("matplotlib")
    # the README's line (extras: decoctl[ort-genai], decoctl[bench]), shortened by -n, --repeats and --prompts
    args = ["--contenders", "greedy,raw-ort,ort-genai", "--threads", "1", "--json", "build/bench.json"]
    args += ["--plot", "build/bench.png", "-n", "8", "--repeats", "1", "--prompts", str(one_prompt)]
    done = decoctl("bench", *args)
    assert done.returncode == 0, done.stderr
    assert set(rows(decoctl.work / "build" / "bench.json")) == {"greedy", "raw-ort", "ort-genai"}
    assert (decoctl.work / "build" / "bench.png").stat().st_size > 0


@pytest.mark.demo
def test_the_bundled_models_draft_and_head_serve_the_strategies_that_need_them(
    decoctl: Decoctl, one_prompt: Path
) -> None:
    pytest.importorskip("decoctl_speculative")
    pytest.importorskip("decoctl_eagle")
    args = ["--contenders", "greedy,speculative,eagle", "--prompts", str(one_prompt), "--threads", "1"]
    done = decoctl("bench", *args, "-n", "8", "--repeats", "1", "--json", "report.json")
    assert done.returncode == 0, done.stderr
    assert set(rows(decoctl.work / "report.json")) == {"greedy", "speculative", "eagle"}


# -- outputs -------------------------------------------------------------------------------------------------
def test_the_json_report_goes_into_a_folder_that_did_not_exist(
    decoctl: Decoctl, genai_model: Path, one_prompt: Path
) -> None:
    args = ["-m", str(genai_model), "--contenders", "greedy,raw-ort", "--prompts", str(one_prompt)]
    done = decoctl("bench", *args, "-n", "4", "--repeats", "1", "--threads", "1", "--json", "out/deeper/b.json")
    assert done.returncode == 0, done.stderr
    assert set(rows(decoctl.work / "out" / "deeper" / "b.json")) == {"greedy", "raw-ort"}


def test_a_plot_without_matplotlib_is_refused_before_the_bench_runs(
    decoctl: Decoctl, genai_model: Path, one_prompt: Path, tmp_path: Path
) -> None:
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "matplotlib.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    args = ["-m", str(genai_model), "--contenders", "greedy", "--prompts", str(one_prompt), "-n", "4"]
    done = decoctl("bench", *args, "--plot", "plots/b.png", env={"PYTHONPATH": str(blocked)})
    assert done.returncode == 2
    assert "decoctl: error: --plot needs matplotlib: pip install 'decoctl[bench]'" in done.stderr
    assert "repeat" not in done.stderr  # refused before any contender ran
    assert "Traceback" not in done.stderr


# -- bad input -----------------------------------------------------------------------------------------------
def test_zero_threads_are_refused(decoctl: Decoctl, genai_model: Path) -> None:
    done = decoctl("bench", "-m", str(genai_model), "--contenders", "greedy", "--threads", "0")
    assert done.returncode == 2
    assert "decoctl: error: --threads 0: give 1 or more intra-op threads" in done.stderr


def test_a_missing_prompts_file_is_an_error_not_a_traceback(decoctl: Decoctl, genai_model: Path) -> None:
    done = decoctl("bench", "-m", str(genai_model), "--contenders", "greedy", "--prompts", "nowhere.jsonl")
    assert done.returncode == 2
    assert "decoctl: error: --prompts nowhere.jsonl: no such file" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("prompt", ["5", "null", '["def f():"]'])
def test_a_prompt_that_is_not_a_string_is_an_error_naming_its_line(
    decoctl: Decoctl, genai_model: Path, tmp_path: Path, prompt: str
) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(ONE_PROMPT + f'{{"prompt": {prompt}}}\n')
    done = decoctl("bench", "-m", str(genai_model), "--contenders", "greedy", "--prompts", str(path))
    assert done.returncode == 2
    assert f"decoctl: error: {path}:2: the prompt must be a JSON string, not {prompt}" in done.stderr
