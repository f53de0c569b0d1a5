"""The command line: generate, plugins, models, bench."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decoctl import bench
from decoctl.bench._contenders import ControllerContender
from decoctl.cli import main


def test_generate_streams_text_and_prints_stats(genai_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "def f(x):", "--model", str(genai_model), "-n", "8", "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.strip()
    assert "-- 8 tokens" in err
    assert "controller: greedy" in err


def test_generate_with_a_custom_loop_from_a_file(genai_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).parents[1] / "examples" / "custom_loop.py"
    args = ["generate", "x", "-m", str(genai_model), "-c", f"{example}:MyLoop", "-o", "penalty=1.5", "-n", "4"]
    assert main([*args, "--stats", "json"]) == 0
    stats = json.loads(capsys.readouterr().err)
    assert stats["trace"]["controller"] == "myloop"
    assert stats["trace"]["options"] == {"penalty": 1.5}


def test_generate_with_an_unknown_model_explains(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "x", "--model", "no-such-model"]) == 2
    assert "neither a folder nor a registered model" in capsys.readouterr().err


def test_plugins_lists_controllers_with_their_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "controllers:" in out
    assert "greedy" in out
    assert "decoctl" in out


def test_models_info_shows_capabilities(genai_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "info", str(genai_model)]) == 0
    assert "capabilities: logits_all_positions, hidden_states" in capsys.readouterr().out


def test_bench_compares_contenders_and_writes_json(
    genai_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"prompt": "import os"}\n')
    report = tmp_path / "bench.json"
    args = ["bench", "-m", str(genai_model), "--contenders", "greedy,raw-ort,t=sample(temperature=0.9)"]
    args += ["--prompts", str(prompts), "-n", "6", "--repeats", "2", "--threads", "1", "--json", str(report)]
    assert main(args) == 0
    data = json.loads(report.read_text())
    assert data["baseline"] == "greedy"
    rows = {c["name"]: c for c in data["contenders"]}
    assert set(rows) == {"greedy", "raw-ort", "t"}
    assert rows["raw-ort"]["identical_to_baseline"] is True
    assert rows["greedy"]["ratio_to_baseline"] == 1.0
    assert rows["raw-ort"]["tokens"] == 12
    assert {"tokens_per_s", "ratio_to_baseline", "identical_to_baseline", "target_forwards", "tokens"} <= set(rows["t"])
    assert "raw-ort" in capsys.readouterr().out


def test_bench_takes_the_after_warm_up_memory_figure_after_the_warm_up(
    genai_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[int] = []
    original = ControllerContender.run

    def counted(self: ControllerContender, prompt: str, prompt_ids: list[int], max_new_tokens: int) -> bench.Outcome:
        runs.append(1)
        return original(self, prompt, prompt_ids, max_new_tokens)

    monkeypatch.setattr(ControllerContender, "run", counted)
    monkeypatch.setattr(bench, "resident_mb", lambda: float(len(runs)))  # "memory" = runs so far
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"prompt": "import os"}\n')
    report = tmp_path / "bench.json"
    args = ["bench", "-m", str(genai_model), "--contenders", "greedy", "--prompts", str(prompts), "-n", "2"]
    assert main([*args, "--repeats", "1", "--threads", "1", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["rss_mb_after_warmup"] == 1.0  # the one warm-up run
    assert data["rss_mb_end"] == 3.0  # and one run per prompt


def test_bench_refuses_a_baseline_that_is_not_a_contender(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--contenders", "raw-ort", "--baseline", "greedy"]) == 2
    assert "baseline 'greedy' is not among the contenders" in capsys.readouterr().err
