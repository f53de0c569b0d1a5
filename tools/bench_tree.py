"""Time one tree forward of T nodes against one chain forward of T tokens, T = 4..64, on one model.

    .venv/bin/python tools/bench_tree.py MODEL [--prefix 128] [--sizes 4,8,16,32,64] [--repeats 30] [--json OUT]

Runs with decoctl's own venv (not .venv-tools). MODEL is a genai-layout folder; one without the tree inputs is
first rewritten by enable_tree into a temporary folder. Both forwards start from the same cached prefix of
--prefix tokens and are undone with rewind() after each timing, so every repeat sees the same state. The tree
is a random parent array (seeded), the shape a tree verifier feeds; cost depends on T and the prefix, not on
the shape. Figures are the median wall time of --repeats runs after --warmup, one intra-op thread by default,
with a one-token forward at the same prefix for scale; the three runs alternate, so background load hits
them alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.model.graph import enable_tree


def random_parents(size: int, rng: np.random.Generator) -> list[int]:
    return [int(rng.integers(-1, i)) for i in range(size)]


def median_seconds(runs: list[Callable[[], None]], repeats: int, warmup: int) -> list[float]:
    """Median wall time of each run; the runs alternate so background load hits them alike."""
    for _ in range(warmup):
        for run in runs:
            run()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, bucket in zip(runs, times, strict=True):
            begin = time.perf_counter()
            run()
            bucket.append(time.perf_counter() - begin)
    return [statistics.median(bucket) for bucket in times]


def bench(folder: Path, prefix: int, sizes: list[int], repeats: int, warmup: int, threads: int) -> dict:
    model = load_model(folder, threads=threads)
    sequence = Sequence("target", model, max_length=prefix + max(sizes))
    rng = np.random.default_rng(0)
    vocab = sequence.vocab_size
    sequence.forward(rng.integers(0, vocab, prefix))

    def feed(tokens: np.ndarray, tree: list[int] | None) -> Callable[[], None]:
        def run() -> None:
            sequence.forward(tokens, tree=tree)
            sequence.rewind(prefix)

        return run

    rows = []
    for size in sizes:
        tokens = rng.integers(0, vocab, size)
        one, chain, tree = median_seconds(
            [feed(tokens[:1], None), feed(tokens, None), feed(tokens, random_parents(size, rng))], repeats, warmup
        )
        rows.append(
            {
                "nodes": size,
                "one_token_ms": one * 1e3,
                "chain_ms": chain * 1e3,
                "tree_ms": tree * 1e3,
                "tree_over_chain": tree / chain,
            }
        )
    return {"model": str(folder), "prefix": prefix, "threads": model.threads, "repeats": repeats, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="genai-layout model folder")
    parser.add_argument("--prefix", type=int, default=128, help="cached tokens before each forward")
    parser.add_argument("--sizes", default="4,8,16,32,64", help="comma-separated T values")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.prefix < 1:
        parser.error("--prefix must be at least 1: a tree forward follows cached tokens")

    folder = args.model
    with tempfile.TemporaryDirectory() as scratch:
        if "tree" not in load_model(folder, threads=1).capabilities.names():
            print(f"{folder} has no tree inputs; benchmarking an enable_tree copy", file=sys.stderr)
            folder = enable_tree(folder, Path(scratch) / "tree")
        result = bench(folder, args.prefix, sizes, args.repeats, args.warmup, args.threads)
    result["model"] = str(args.model)

    print(f"{args.model}: prefix {result['prefix']}, {result['threads']} thread(s), median of {args.repeats}")
    print("| T | one-token forward (ms) | chain forward (ms) | tree forward (ms) | tree / chain |")
    print("|---:|---:|---:|---:|---:|")
    for row in result["rows"]:
        cells = [row["one_token_ms"], row["chain_ms"], row["tree_ms"], row["tree_over_chain"]]
        print(f"| {row['nodes']} | " + " | ".join(f"{cell:.2f}" for cell in cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
