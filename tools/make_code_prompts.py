"""Code prompts for benchmarks, cut from the held-out stdlib files (never trained on), reproducibly.

    python tools/make_code_prompts.py --files 0,2,4,6,8 --out examples/code_prompts.jsonl        # reported
    python tools/make_code_prompts.py --files 1,3,5,7,9 --out build/tuning_prompts.jsonl         # for tuning

Each prompt is a run of whole lines (about --chars characters) starting at a top-level ``def`` or ``class`` line
chosen with a fixed seed, cut so the model has to continue mid-body. Files are indexed in the order of
tools/heldout_files.txt; giving tuning and reporting disjoint files keeps settings from fitting the prompts.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def heldout_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    names = [line.strip() for line in (HERE / "heldout_files.txt").read_text().splitlines()]
    return [stdlib / name for name in names if name and not name.startswith("#")]


def prompts_from(path: Path, count: int, chars: int, rng: np.random.Generator) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(("def ", "class ", "    def "))]
    if not starts:
        return []
    picked = rng.choice(starts, size=min(count, len(starts)), replace=False)
    out = []
    for start in sorted(int(i) for i in picked):
        text = ""
        for line in lines[start:]:
            if len(text) + len(line) > chars and text:
                break
            text += line
        out.append(text)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", required=True, help="comma-separated indices into tools/heldout_files.txt")
    parser.add_argument("--per-file", type=int, default=2)
    parser.add_argument("--chars", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    files = heldout_files()
    rng = np.random.default_rng(args.seed)
    records = []
    for index in (int(i) for i in args.files.split(",")):
        for prompt in prompts_from(files[index], args.per_file, args.chars, rng):
            records.append({"prompt": prompt, "source": files[index].name})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    print(f"{len(records)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
