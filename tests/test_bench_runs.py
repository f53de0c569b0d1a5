"""`decoctl bench --runs N`: the per-run ratios aggregate into a geometric mean with a 95% interval."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from decoctl.bench._runs import aggregate, t_interval
from decoctl.cli import main


def report(ratios: dict[str, float], identical: bool = True) -> dict[str, Any]:
    contenders = [
        {
            "name": name,
            "tokens_per_s": 100.0 * ratio,
            "ratio_to_baseline": ratio,
            "identical_to_baseline": identical or name == "greedy",
            "target_forwards": 10,
            "tokens": 11,
        }
        for name, ratio in ratios.items()
    ]
    return {
        "model": "m",
        "baseline": "greedy",
        "threads": 1,
        "max_new_tokens": 8,
        "repeats": 2,
        "prompts": 1,
        "contenders": contenders,
    }


def test_the_ratio_is_the_geometric_mean_of_the_runs() -> None:
    result = aggregate([report({"greedy": 1.0, "other": 2.0}), report({"other": 0.5, "greedy": 1.0})])
    other = next(c for c in result.contenders if c.name == "other")
    assert other.ratio_to_baseline == pytest.approx(1.0)
    assert other.ratios_per_run == [2.0, 0.5]
    assert other.faster_runs == 1
    assert result.runs == 2


def test_the_interval_is_symmetric_in_log_ratio_and_holds_the_mean() -> None:
    runs = [report({"greedy": 1.0, "other": r}) for r in (1.02, 1.05, 0.99, 1.04)]
    other = aggregate(runs).contenders[1]
    low, high = other.ratio_ci95
    assert low < other.ratio_to_baseline < high
    assert math.log(other.ratio_to_baseline) - math.log(low) == pytest.approx(math.log(high / other.ratio_to_baseline))


def test_t_interval_uses_students_quantile() -> None:
    low, high = t_interval([1.0, 3.0])  # mean 2, sd sqrt(2), n 2: half-width 12.706 * sqrt(2) / sqrt(2)
    assert (low, high) == pytest.approx((2.0 - 12.706, 2.0 + 12.706))
    assert t_interval([5.0]) == (5.0, 5.0)


def test_a_run_with_different_tokens_marks_the_contender_not_identical() -> None:
    result = aggregate([report({"greedy": 1.0, "other": 1.1}), report({"greedy": 1.0, "other": 1.1}, identical=False)])
    assert [c.identical_to_baseline for c in result.contenders] == [True, False]


def test_runs_in_fresh_processes_end_to_end(genai_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    args = ["bench", "-m", str(genai_model), "--contenders", "greedy,g2=greedy", "-n", "6", "--repeats", "1"]
    args += ["--threads", "1", "--calibration-pairs", "1", "--runs", "2", "--require-identical", "--json", str(out)]
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert data["runs"] == 2 and len(data["per_run"]) == 2
    # the contender order rotates between runs: the second run built g2 first
    assert [c["name"] for c in data["per_run"][1]["contenders"]] == ["g2", "greedy"]
    assert [c["name"] for c in data["contenders"]] == ["greedy", "g2"]
    assert all(c["identical_to_baseline"] for c in data["contenders"])


def test_runs_below_one_are_refused(genai_model: Path) -> None:
    assert main(["bench", "-m", str(genai_model), "--contenders", "greedy", "--runs", "0"]) == 2


def test_a_failing_run_is_reported_with_what_it_said(genai_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "-m", str(genai_model), "--contenders", "greedy,la=lookahead", "-n", "4", "--runs", "2"]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert "bench run 1 of 2 failed" in error and "it said: decoctl: error:" in error
