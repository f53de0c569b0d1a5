"""``python -m decoctl.abi --include-dir`` (or ``--cflags``): where the installed ABI header is, for a C controller's
build (``cc $(python -m decoctl.abi --cflags) -shared -fPIC -o libmine.so mine.c``)."""

from __future__ import annotations

import argparse

from decoctl.abi import ABI_MAJOR, ABI_MINOR, include_dir


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m decoctl.abi", description=f"decoctl's C ABI {ABI_MAJOR}.{ABI_MINOR}: where its header is"
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--include-dir", action="store_true", help="print the folder that holds decoctl.h")
    what.add_argument("--cflags", action="store_true", help="print the compiler flag that finds decoctl.h")
    args = parser.parse_args()
    print(include_dir() if args.include_dir else f"-I{include_dir()}")


if __name__ == "__main__":
    main()
