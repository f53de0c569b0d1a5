"""`decoctl serve` with every engine step timed: what a step costs with and without prompt work.

    taskset -c 0 .venv/bin/python tools/serve_step_probe.py --log build/steps.json -- \
        -m gemma3-270m-int8 --threads 1 --max-rows 16 --port 8010 &
    taskset -c 1 .venv/bin/decoctl bench-serve --url decoctl=http://127.0.0.1:8010 \
        --prompts examples/real_model_prompts.jsonl --concurrency 1,16 --max-tokens 64 --requests 48
    kill %1; .venv/bin/python tools/serve_step_probe.py --report build/steps.json

The arguments after ``--`` go to `decoctl serve`; the step log is written when the server stops (SIGTERM or ^C).
``--one-forward-chunks`` holds a step's prompt work to the engine's floor (``MIN_CHUNK`` one-row steps),
to see what that does to inter-token latency and admission. ``--report`` prints, over the steps with at least
12 rows decoding, the step times (all, with a prompt chunk, without) and the chunks' own times.
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
    from decoctl.serve import _engine as engine
    from decoctl.serve import _join_rule as join_rule

    steps: list[dict[str, Any]] = []
    chunks: list[float] = []
    iteration, prefill = engine.Engine._iteration, engine.Engine._prefill

    def timed_prefill(self: Any, slot: Any, span: int | None) -> int | None:
        began = time.perf_counter()
        try:
            return prefill(self, slot, span)
        finally:
            chunks.append(time.perf_counter() - began)

    def timed_iteration(self: Any) -> None:
        chunks.clear()
        began = time.perf_counter()
        iteration(self)
        decoding = sum(1 for s in self._slots.values() if s.prompt is None)
        steps.append({"seconds": time.perf_counter() - began, "rows": decoding, "chunks": list(chunks)})

    engine.Engine._iteration, engine.Engine._prefill = timed_iteration, timed_prefill  # type: ignore[method-assign]
    if one_forward_chunks:
        rule = join_rule.JoinRule
        budget = rule.prefill_budget

        def one_forward(self: Any, span: int, capacity: int | None = None) -> float | None:
            """A step's prompt work held to the engine's floor: MIN_CHUNK one-row steps, whatever the Run."""
            if budget(self, span, capacity) is None:
                return None
            return join_rule.MIN_CHUNK * (self.run_seconds(1) or 0.0)

        rule.prefill_budget = one_forward  # type: ignore[method-assign]

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
    steps = [s for s in json.loads(log_path.read_text(encoding="utf-8")) if s["rows"] >= rows]

    def quantiles(values: list[float]) -> str:
        values = sorted(values)
        if not values:
            return "-"
        pick = lambda q: values[int(q * (len(values) - 1))] * 1e3  # noqa: E731
        return f"p50 {pick(0.5):.1f} / p99 {pick(0.99):.1f} ms"

    with_chunk = [s for s in steps if s["chunks"]]
    print(f"{len(steps)} steps with >= {rows} rows decoding, {len(with_chunk)} of them with a prompt chunk")
    print(f"all steps:              {quantiles([s['seconds'] for s in steps])}")
    print(f"steps with a chunk:     {quantiles([s['seconds'] for s in with_chunk])}")
    print(f"steps without:          {quantiles([s['seconds'] for s in steps if not s['chunks']])}")
    print(f"the chunks themselves:  {quantiles([c for s in with_chunk for c in s['chunks']])}")


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
