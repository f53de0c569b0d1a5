"""`decoctl serve` with every engine step timed: what a step costs, with and without prompt work, and what it does.

    taskset -c 0 .venv/bin/python tools/serve_step_probe.py --log build/steps.json -- \
        -m gemma3-270m-int8 --threads 1 --max-rows 16 --port 8010 &
    taskset -c 1 .venv/bin/decoctl bench-serve --url decoctl=http://127.0.0.1:8010 \
        --prompts examples/real_model_prompts.jsonl --concurrency 1,16 --max-tokens 64 --requests 48
    kill %1; .venv/bin/python tools/serve_step_probe.py --report build/steps.json

The arguments after ``--`` go to `decoctl serve`; the step log is written when the server stops (SIGTERM or ^C).
The probe times the host's two forwards (``Rows.step``, the batched Run; ``Sequence.prefill``, a prompt chunk), which
every version of the engine calls, so the same probe compares two commits' engines: a step is a batched Run and the
prompt chunks fed since the one before. ``--one-forward-chunks`` holds a step's prompt work to the engine's floor
(``MIN_CHUNK`` one-row steps), to see what that does to inter-token latency and admission. ``--report`` prints,
over the steps whose Run stepped at least 12 rows, the step times (all, with a prompt chunk, without), the chunks'
own times, and over every step the rows a Run stepped and spanned, the prompt tokens a step fed and the time a step
spent outside both forwards (the engine's own work, and the server's on the same core).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any


def serve(log_path: Path, one_forward_chunks: bool, serve_args: list[str]) -> None:
    from decoctl.host import _host as host
    from decoctl.host import _rows as rows
    from decoctl.serve import _join_rule as join_rule

    steps: list[dict[str, Any]] = []
    chunks: list[tuple[float, int]] = []
    last = [0.0]  # when the last Run ended
    step, prefill = rows.Rows.step, host.Sequence.prefill

    def timed_prefill(self: Any, tokens: Any, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return prefill(self, tokens, *args, **kwargs)
        finally:
            chunks.append((time.perf_counter() - began, len(tokens)))

    def timed_step(self: Any, tokens: Any, rows: Any = None) -> Any:
        began = time.perf_counter()
        try:
            return step(self, tokens, rows=rows)
        finally:
            ended = time.perf_counter()
            stepped = list(range(len(tokens))) if rows is None else [int(r) for r in rows]
            steps.append(
                {
                    # since the last Run ended (the first: its own): a gap while no row was live counts too, so the
                    # report reads medians, and the step times of steps with many rows
                    "seconds": ended - (last[0] or began),
                    "run": ended - began,
                    "rows": len(stepped),
                    "span": max(stepped) + 1,
                    "chunks": [c for c, _ in chunks],
                    "tokens": sum(t for _, t in chunks),
                }
            )
            last[0] = ended
            chunks.clear()

    rows.Rows.step, host.Sequence.prefill = timed_step, timed_prefill
    if one_forward_chunks:
        rule = join_rule.JoinRule
        budget = rule.prefill_budget

        def one_forward(self: Any, span: int, capacity: int | None = None) -> float | None:
            """A step's prompt work held to the engine's floor: MIN_CHUNK one-row steps, whatever the Run."""
            if budget(self, span, capacity) is None:
                return None
            return join_rule.MIN_CHUNK * (self.run_seconds(1) or 0.0)

        rule.prefill_budget = one_forward

    def write() -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(json.dumps(steps), encoding="utf-8")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    from decoctl.cli import main

    sys.argv = ["decoctl", "serve", *serve_args]
    try:
        main()
    finally:
        write()


def report(log_path: Path, rows: int = 12) -> None:
    every = json.loads(log_path.read_text(encoding="utf-8"))
    steps = [s for s in every if s["rows"] >= rows]

    def quantiles(values: list[float], scale: float = 1e3, unit: str = " ms") -> str:
        values = sorted(values)
        if not values:
            return "-"
        pick = lambda q: values[int(q * (len(values) - 1))] * scale  # noqa: E731
        return f"p50 {pick(0.5):.1f} / p99 {pick(0.99):.1f}{unit}"

    def mean(values: list[float]) -> str:
        return f"{sum(values) / len(values):.2f}" if values else "-"

    with_chunk = [s for s in steps if s["chunks"]]
    print(f"{len(steps)} steps with >= {rows} rows in their Run, {len(with_chunk)} of them with a prompt chunk")
    print(f"all steps:              {quantiles([s['seconds'] for s in steps])}")
    print(f"steps with a chunk:     {quantiles([s['seconds'] for s in with_chunk])}")
    print(f"steps without:          {quantiles([s['seconds'] for s in steps if not s['chunks']])}")
    print(f"the chunks themselves:  {quantiles([c for s in with_chunk for c in s['chunks']])}")
    if every and "run" in every[0]:  # logs of this probe's host-level timing
        fed = [s for s in every if s["chunks"]]
        outside = [s["seconds"] - s["run"] - sum(s["chunks"]) for s in every]
        print(
            f"over all {len(every)} Runs: rows stepped {mean([s['rows'] for s in every])}, spanned "
            f"{mean([s['span'] for s in every])}; {len(fed)} steps fed prompt chunks, "
            f"{mean([len(s['chunks']) for s in fed])} chunks and {mean([s['tokens'] for s in fed])} tokens each; "
            f"outside the two forwards a step {quantiles(outside)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, help="serve, writing the step log here when the server stops")
    parser.add_argument("--report", type=Path, help="print the step times of a step log")
    parser.add_argument("--one-forward-chunks", action="store_true", help="hold prompt chunks to one forward's cost")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then decoctl serve's arguments")
    args = parser.parse_args()
    if args.report:
        report(args.report)
    elif args.log:
        serve(args.log, args.one_forward_chunks, [a for a in args.serve_args if a != "--"])
    else:
        parser.error("give --log (to serve) or --report")


if __name__ == "__main__":
    main()
