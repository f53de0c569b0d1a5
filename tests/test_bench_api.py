"""decoctl.bench.run: the bench from Python, returning its report and printing nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

import decoctl.bench
from decoctl import ConfigError
from decoctl.plugins import PluginRegistry


def test_the_bench_runs_from_python_and_returns_its_report(
    genai_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[int, int]] = []

    report = decoctl.bench.run(
        model=str(genai_model),
        contenders="greedy,again=greedy",
        prompts=["def f(x):\n", "import os\n"],
        max_new_tokens=6,
        repeats=2,
        threads=1,
        registry=PluginRegistry(autoload=False),
        progress=lambda done, total: seen.append((done, total)),
    )

    assert [c.name for c in report.contenders] == ["greedy", "again"]
    assert all(c.identical_to_baseline for c in report.contenders)
    assert (report.prompts, report.repeats, report.threads) == (2, 2, 1)
    assert seen == [(1, 2), (2, 2)]
    assert capsys.readouterr() == ("", "")


def test_a_baseline_that_is_not_a_contender_is_refused_before_anything_loads() -> None:
    with pytest.raises(ConfigError, match=r"baseline 'greedy' is not among the contenders \['sample'\]"):
        decoctl.bench.run(contenders="sample", registry=PluginRegistry(autoload=False))
