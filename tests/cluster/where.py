"""A greedy controller that says where the process running it imported decoctl from, for the Ray tests: named by
path (``tests/cluster/where.py:Where``) so that every actor loads it itself.

Option ``record``: a file path. Each generation appends one JSON line to it: the file of the decoctl package the
process imported, its Python executable and its Ray node.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import decoctl
from decoctl import Greedy, Option


class Where(Greedy):
    """Greedy; each generation's start records where this process's decoctl comes from."""

    options = (Option(name="record", type="str", help="the file the JSON lines are appended to"),)

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        import ray

        line = {
            "decoctl": decoctl.__file__,
            "python": sys.executable,
            "node": ray.get_runtime_context().get_node_id(),
        }
        with Path(options["record"]).open("a", encoding="utf-8") as record:
            record.write(json.dumps(line) + "\n")
