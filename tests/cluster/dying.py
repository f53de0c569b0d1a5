"""Greedy controllers whose actor process ends abruptly part-way (os._exit, as a process killed by the kernel or an
operator does), for the Ray tests: named by path (``tests/cluster/dying.py:DiesOnce``) so every actor loads them itself.

Option ``marker``: a file path. DiesOnce ends the first process that reaches a prompt's third token while the marker
does not exist, creating it first, so exactly one actor dies and its replacement runs to the end; DiesAlways ends
every process that reaches a third token.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from decoctl import Greedy, Option

#: the token after which a process ends
AT_TOKEN = 3


class DiesOnce(Greedy):
    """Greedy; the first process to reach a prompt's third token ends there (once per marker file)."""

    options = (Option(name="marker", type="str", help="the file that records the death"),)

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self.marker = Path(options["marker"])

    def next_token(self, host: Any) -> int:
        if host.committed == AT_TOKEN and self._should_die():
            os._exit(1)
        return super().next_token(host)

    def _should_die(self) -> bool:
        try:
            self.marker.open("x").close()
        except FileExistsError:
            return False
        return True


class DiesAlways(DiesOnce):
    """Greedy; every process that reaches a prompt's third token ends there."""

    def _should_die(self) -> bool:
        self.marker.touch()
        return True
