"""The C ABI's benchmark rows (docs/BENCHMARKS.md): one host-primitive round trip from C, and C greedy against
Python greedy.

    .venv/bin/python tools/abi_bench/bench_abi.py MODEL [--calls 200000] [--threads 1]

Builds tools/abi_bench/roundtrip.c and examples/c_controller/greedy.c with the system compiler into
build/abi_bench/, runs one generation with the roundtrip controller (its create() times `calls` calls each of
remaining(), length() and logits(), which the bridge answers in C, and of tokens(), which enters Python, and reports
nanoseconds per call through stats_json), then runs
`decoctl bench` with the Python greedy and the C greedy side by side (same process, interleaved, same threads,
tokens checked identical). Runs with decoctl's own venv.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from decoctl.generation import Generator

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "abi_bench"


def compile_library(source: Path, name: str) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    library = OUT / f"lib{name}.so"
    command = ["cc", "-O2", "-Wall", "-Wextra", "-std=c11", "-fPIC", "-shared", "-fvisibility=hidden"]
    subprocess.run([*command, "-I", str(ROOT / "abi"), "-o", str(library), str(source)], check=True)
    return library


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", "-n", type=int, default=128)
    args = parser.parse_args()

    roundtrip = compile_library(ROOT / "tools" / "abi_bench" / "roundtrip.c", "roundtrip")
    greedy = compile_library(ROOT / "examples" / "c_controller" / "greedy.c", "greedy")
    generator = Generator(
        {"target": args.model}, f"{roundtrip}:roundtrip", options={"calls": args.calls}, threads=args.threads
    )
    stats = generator.generate("def fibonacci(n):\n", max_new_tokens=8).stats.controller
    print(json.dumps({"round_trip_ns": dict(stats)}, indent=2))
    bench = [
        sys.executable, "-m", "decoctl.cli", "bench", "-m", args.model, "--threads", str(args.threads),
        "--contenders", f"greedy,c-greedy={greedy}:greedy", "-n", str(args.max_new_tokens),
        "--repeats", str(args.repeats), "--require-identical", "--json", str(OUT / "c-vs-python.json"),
    ]  # fmt: skip
    return subprocess.run(bench, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
