"""Numbered, timed steps for long pipelines: each step reports when it starts and how long it took."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from decoctl.logs import get_logger

__all__ = ["Steps"]

log = get_logger(__name__)


class Steps:
    """``with steps.step("loading"):`` reports "[2/6] loading ..." then "[2/6] loading: 41.3 s".

    :param total: how many steps the pipeline has.
    :param report: where the lines go (the CLI prints them; the default logs them).
    """

    def __init__(self, total: int, report: Callable[[str], None] | None = None) -> None:
        self.total = total
        self._report = report or (lambda line: log.info("decoctl.import_step", line=line))
        self._done = 0
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, title: str, *, expect: str = "") -> Iterator[None]:
        """One step; ``expect`` says how long it usually takes ("about a minute")."""
        self._done += 1
        prefix = f"[{self._done}/{self.total}] {title}"
        self._report(f"{prefix}{f' ({expect})' if expect else ''} ...")
        started = time.perf_counter()
        yield
        elapsed = time.perf_counter() - started
        self.seconds[title] = round(elapsed, 2)
        self._report(f"{prefix}: {elapsed:.1f} s")

    def note(self, line: str) -> None:
        """A line that belongs to the current step (a result worth showing)."""
        self._report(f"      {line}")
