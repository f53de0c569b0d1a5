"""Build the demo-model corpus from the running interpreter's standard library.

Which files: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]``, in sorted relative-path order,
minus test trees (any ``test``/``tests`` directory, ``lib2to3`` test data), ``idlelib``, ``site-packages``,
and machine-generated files that are data rather than code (charmap codec tables written by gencodec.py,
``pydoc_data/topics.py``, ``_sysconfigdata_*``, the ``config-*`` build directory).

Held out: a fixed 2% of files, chosen by hashing the relative path with a fixed seed, so the split does not
depend on file order or on which other files exist. The list is written to tools/heldout_files.txt (committed).

Output (build/ is git-ignored): build/corpus/train.txt and build/corpus/heldout.txt, each file's text
followed by the eos token text ``<|eos|>``, plus build/corpus/manifest.json.

Usage:  python tools/corpus.py [--out build/corpus]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
from pathlib import Path

EOS_TEXT = "<|eos|>"
HOLDOUT_SEED = "decoctl-pycode-v1"
HOLDOUT_PER_10000 = 200  # 2%
TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
HELDOUT_LIST = TOOLS / "heldout_files.txt"

_EXCLUDED_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__"}
_EXCLUDED_FILES = {"pydoc_data/topics.py"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _excluded(rel: Path, text: str) -> bool:
    parts = rel.parts
    if any(p in _EXCLUDED_DIRS for p in parts[:-1]):
        return True
    if parts[0].startswith("config-"):
        return True
    if parts[0] == "lib2to3" and any(p.startswith("test") or p == "data" for p in parts[1:-1]):
        return True
    if rel.as_posix() in _EXCLUDED_FILES or rel.name.startswith("_sysconfigdata_"):
        return True
    # Charmap codec tables: ~100 files of hex tables that would teach nothing about Python.
    return parts[0] == "encodings" and "gencodec.py" in text[:2000]


def is_heldout(rel_posix: str) -> bool:
    digest = hashlib.sha256(f"{HOLDOUT_SEED}:{rel_posix}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 10000 < HOLDOUT_PER_10000


def collect(root: Path) -> list[tuple[str, str]]:
    """Return (relative posix path, text) for every corpus file, sorted by path."""
    files = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root)
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a handful of deliberately mis-encoded files live only in test trees
        if _excluded(rel, text) or not text.strip():
            continue
        files.append((rel.as_posix(), text))
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "build" / "corpus")
    args = ap.parse_args()

    root = stdlib_root()
    files = collect(root)
    train = [(r, t) for r, t in files if not is_heldout(r)]
    held = [(r, t) for r, t in files if is_heldout(r)]

    args.out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train.txt", train), ("heldout.txt", held)):
        with open(args.out / name, "w", encoding="utf-8", newline="") as f:
            for _, text in part:
                f.write(text)
                f.write(EOS_TEXT)

    version = ".".join(map(str, sys.version_info[:3]))
    HELDOUT_LIST.write_text(
        f"# Held-out files (2%, sha256('{HOLDOUT_SEED}:' + path) % 10000 < {HOLDOUT_PER_10000}),\n"
        f"# relative to the stdlib of CPython {version}. Written by tools/corpus.py.\n"
        + "".join(r + "\n" for r, _ in held),
        encoding="utf-8",
    )
    manifest = {
        "python": version,
        "stdlib": str(root),
        "files_train": len(train),
        "files_heldout": len(held),
        "bytes_train": sum(len(t.encode()) for _, t in train),
        "bytes_heldout": sum(len(t.encode()) for _, t in held),
        "eos_text": EOS_TEXT,
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main()
