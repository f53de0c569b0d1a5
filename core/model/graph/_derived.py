"""A new model folder derived from another (``models disable-tree``, ``enable-taps``, ``add-lora-slots``): where it
may go, and how it is written so that it appears whole or not at all.

    check_new_folder(source, target, "enable-taps")    # ConfigError: inside the source, or not new and empty
    with staged_folder(target, "enable-taps") as staging:   # beside target; renamed to it at the end
        link(source / "model.onnx.data", staging / "model.onnx.data")
        ...                                              # an exception removes the staging folder instead
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from decoctl.errors import ConfigError
from decoctl.logs import get_logger

__all__ = ["check_new_folder", "link", "staged_folder"]

log = get_logger(__name__)


def check_new_folder(source: Path, target: Path, command: str) -> None:
    """ConfigError where ``command`` may not write its folder at ``target``: the source itself or inside it, or a
    path that exists and is not an empty folder (a derived folder never overwrites)."""
    if target == source or source in target.parents:
        raise ConfigError(f"{command} writes a new folder: {target} must lie outside the source {source}")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(f"{target} already exists and is not empty: give a new folder ({command} never overwrites)")


@contextmanager
def staged_folder(target: Path, command: str) -> Iterator[Path]:
    """A staging folder beside ``target`` for the block to fill; renamed to ``target`` (an empty folder there is
    replaced) when the block ends, removed with what it holds when the block raises."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as exc:
        raise ConfigError(
            f"{command} cannot write under {target.parent} ({exc.strerror}): give a destination in a folder you can "
            "write, with room for a copy of the model"
        ) from exc
    try:
        yield staging
        if target.exists():
            target.rmdir()
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def link(entry: str | Path, destination: str | Path) -> None:
    """``entry`` (a file or a folder of them) at ``destination`` as hard links, copies where they are refused."""
    if os.path.isdir(entry):
        shutil.copytree(entry, destination, copy_function=link)
        return
    try:
        os.link(entry, destination)
    except OSError as exc:
        log.info("decoctl.file_copied", source=str(entry), reason=f"no hard link: {exc.strerror}")
        shutil.copy2(entry, destination)
