"""`decoctl bench --runs N`: the same bench in N fresh processes, aggregated with a confidence interval.

One bench process compares its contenders side by side, but on a shared machine the ratio between two
contenders also moves from process to process: where each session's weights landed in memory, what the
neighbours are doing to the caches. Measured on this project's 2-core machine, one contender pair's ratio ranged
over 0.86-1.14 across seven identical runs. A single run cannot tell a few percent apart; N runs can, and this
module says how sure the answer is.

Each run is a child ``decoctl bench`` with the same options and the contenders built in an order rotated by
one per run (load order is part of what moves between processes). Per contender: ``ratio_to_baseline`` is the
geometric mean of the per-run ratios, ``ratio_ci95`` its 95% confidence interval (Student's t over the log
ratios, so a ratio and its inverse get mirror-image intervals), ``faster_runs`` how many runs put it ahead of
the baseline, ``tokens_per_s`` the median over runs of each run's median.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from decoctl.errors import ConfigError

__all__ = ["RunsReport", "RunsResult", "aggregate", "child_command", "run_in_processes", "t_interval"]

#: two-sided 95% quantiles of Student's t by degrees of freedom (1..30); larger samples use the normal's
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


@attrs.frozen(kw_only=True)
class RunsResult:
    """One contender over all runs."""

    name: str
    tokens_per_s: float
    ratio_to_baseline: float
    ratio_ci95: tuple[float, float]
    ratios_per_run: list[float]
    faster_runs: int
    identical_to_baseline: bool
    target_forwards: int
    tokens: int


@attrs.frozen(kw_only=True)
class RunsReport:
    """The aggregate of ``runs`` single benches; its first six fields repeat a BenchReport's (the JSON stays flat
    like a single run's)."""

    model: str
    baseline: str
    threads: int
    max_new_tokens: int
    repeats: int
    prompts: int
    runs: int
    contenders: list[RunsResult]


def t_interval(values: Sequence[float]) -> tuple[float, float]:
    """The 95% confidence interval of the mean of ``values`` (Student's t; one value: that value twice)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean
    quantile = _T95[len(values) - 2] if len(values) - 1 <= len(_T95) else 1.960
    half = quantile * statistics.stdev(values) / math.sqrt(len(values))
    return mean - half, mean + half


def child_command(args: argparse.Namespace, contenders: str, json_path: Path) -> list[str]:
    """The ``decoctl bench`` command line of one run: the parent's options, one run, its own JSON."""
    command = [sys.executable, "-m", "decoctl.cli", "bench", "--contenders", contenders, "--json", str(json_path)]
    command += ["--baseline", args.baseline, "-n", str(args.max_new_tokens), "--repeats", str(args.repeats)]
    command += ["--calibration-pairs", str(args.calibration_pairs)]
    for flag, value in (("--model", args.model), ("--draft", args.draft), ("--prompts", args.prompts)):
        if value is not None:
            command += [flag, str(value)]
    if args.threads is not None:
        command += ["--threads", str(args.threads)]
    for role in args.role:
        command += ["--role", role]
    for provider in args.provider:
        command += ["--provider", provider]
    if args.no_huge_pages:
        command.append("--no-huge-pages")
    return command


def aggregate(reports: Sequence[dict[str, Any]]) -> RunsReport:
    """Combine the JSON reports of single runs (each with the same contenders, in any order)."""
    first = reports[0]
    names = [c["name"] for c in first["contenders"]]
    results = []
    for name in names:
        rows = [next(c for c in report["contenders"] if c["name"] == name) for report in reports]
        ratios = [row["ratio_to_baseline"] for row in rows]
        if min(ratios) <= 0:
            raise ConfigError(f"contender {name!r} made no tokens in some run: its ratios cannot be aggregated")
        low, high = t_interval([math.log(r) for r in ratios])
        results.append(
            RunsResult(
                name=name,
                tokens_per_s=statistics.median(row["tokens_per_s"] for row in rows),
                ratio_to_baseline=math.exp(statistics.fmean(math.log(r) for r in ratios)),
                ratio_ci95=(math.exp(low), math.exp(high)),
                ratios_per_run=ratios,
                faster_runs=sum(r > 1.0 for r in ratios),
                identical_to_baseline=all(row["identical_to_baseline"] for row in rows),
                target_forwards=rows[0]["target_forwards"],
                tokens=rows[0]["tokens"],
            )
        )
    return RunsReport(
        model=first["model"],
        baseline=first["baseline"],
        threads=first["threads"],
        max_new_tokens=first["max_new_tokens"],
        repeats=first["repeats"],
        prompts=first["prompts"],
        runs=len(reports),
        contenders=results,
    )


def format_runs_table(report: RunsReport) -> str:
    lines = [
        f"model {report.model}  threads {report.threads}  prompts {report.prompts}  max_new_tokens "
        f"{report.max_new_tokens}  repeats {report.repeats}  runs {report.runs} (fresh processes)  baseline "
        f"{report.baseline}",
        f"{'contender':<28}{'tok/s':>10}{'ratio':>8}{'95% CI':>17}{'faster runs':>13}{'identical':>11}",
    ]
    for c in report.contenders:
        interval = f"{c.ratio_ci95[0]:.3f}-{c.ratio_ci95[1]:.3f}"
        lines.append(
            f"{c.name:<28}{c.tokens_per_s:>10.1f}{c.ratio_to_baseline:>8.3f}{interval:>17}"
            f"{f'{c.faster_runs}/{report.runs}':>13}{'yes' if c.identical_to_baseline else 'NO':>11}"
        )
    return "\n".join(lines)


def run_in_processes(args: argparse.Namespace, specs_text: Sequence[str]) -> int:
    """Run the bench ``args.runs`` times in child processes, rotating the contender order; print and write
    the aggregate. ``specs_text``: each contender as written on the command line."""
    if args.plot:
        raise ConfigError("--plot draws one run's bars: leave it out with --runs, or plot a single run")
    reports = []
    with tempfile.TemporaryDirectory(prefix="decoctl-runs-") as folder:
        for run in range(args.runs):
            shift = run % len(specs_text)
            order = ",".join([*specs_text[shift:], *specs_text[:shift]])
            path = Path(folder) / f"run{run}.json"
            done = subprocess.run(
                child_command(args, order, path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
            )
            if done.returncode != 0:
                said = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["nothing"]
                raise ConfigError(
                    f"bench run {run + 1} of {args.runs} failed (exit {done.returncode}; it said: {said[0]}): run that "
                    "bench alone, without --runs, to see all of it"
                )
            reports.append(json.loads(path.read_text()))
            print(f"run {run + 1}/{args.runs}", file=sys.stderr)
    report = aggregate(reports)
    print(format_runs_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps({**attrs.asdict(report), "per_run": reports}, indent=2))
    if args.require_identical and not all(c.identical_to_baseline for c in report.contenders):
        print("a contender's tokens differ from the baseline's in some run: run it alone for where", file=sys.stderr)
        return 3
    return 0
