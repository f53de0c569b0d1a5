"""A local Ray cluster of two nodes for the session (object stores bounded), whose workers get decoctl from its
wheels through Ray's runtime environment; the prompts the tests run, and their single-process results: every Ray
run is compared with what one process gives.

Ray has an environment of its own (make test-ray: build/venv-ray with the ray extra); where it is not installed these
tests skip, saying so.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from decoctl.cli import main
from decoctl.generation import BatchPrompt

#: the bundled small demo model (plugins/models): every actor loads it by name
MODEL = "pycode-small"
#: what a single-process line and a Ray line may differ in: how long it took
TIMINGS = ("seconds", "tokens_per_second")
#: the start of the name of each node's runtime resources folder (in the session's folder)
RESOURCES = "runtime_resources"

PROMPTS = [
    {"prompt": "def fibonacci(n):", "max_new_tokens": 12},
    {"prompt": "import os\n", "seed": 7},
    {"prompt": "class Stack:", "stop": ["\n\n"]},
    {"prompt": "for i in range(10):"},
    {"prompt": "x = [", "max_new_tokens": 5},
    {"prompt": "def read(path):\n    with open(path) as f:", "seed": 11, "max_new_tokens": 20},
    {"prompt": "# a comment"},
]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """Two Ray nodes of one CPU each on this machine, each with a runtime resources folder of its own (as two machines
    have), joined as decoctl's commands join a cluster: the workers' output stays in their logs, stdout is the
    command's."""
    ray = pytest.importorskip("ray", reason="Ray is not installed here: make test-ray runs these in build/venv-ray")
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "object_store_memory": 80 * 1024**2}
    # the raylets' environment (so their workers'), not ours: pip offline, a runtime environment that fails not
    # tried again, and Serve's proxy routing to either node's replica (it prefers its own node's by default)
    quiet = {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "RUNTIME_ENV_RETRY_TIMES": "1"}
    with _environ(**quiet, RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING="0"):
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                **node,
                **_agent_ports(),
                "include_dashboard": False,
                "runtime_env_dir_name": f"{RESOURCES}_head",
            },
        )
        cluster.add_node(**node, **_agent_ports(), runtime_env_dir_name=f"{RESOURCES}_second")
    # each node's runtime environment clones this virtual environment (Ray's pip plugin does, inside one): the
    # session's folder is removed at the end, or every run leaves a gigabyte or more under Ray's temporary folder
    session = Path(cluster.head_node.get_session_dir_path())
    ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(session, ignore_errors=True)


def _agent_ports() -> dict[str, int]:
    """Free ports for a node's agents, chosen here: a raylet left to learn the ports its agents took waits 15 s for
    them to say, too short for two nodes starting on two cores busy with other work."""
    names = ("metrics_agent_port", "metrics_export_port", "runtime_env_agent_port", "dashboard_agent_listen_port")
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in names]
        for sock in sockets:
            sock.bind(("", 0))
        return {name: int(sock.getsockname()[1]) for name, sock in zip(names, sockets, strict=True)}


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def shipped(path: str) -> bool:
    """Whether ``path`` (a worker's decoctl.__file__) lies in a node's runtime resources folder: the package Ray's
    runtime environment unpacked from the wheels, not the driver's environment."""
    parts = Path(path).parts
    unpacked = any(a.startswith(RESOURCES) and b == "py_modules_files" for a, b in itertools.pairwise(parts))
    return unpacked and not Path(path).is_relative_to(sys.prefix)


def _installed_from(name: str) -> Path:
    """The wheel file the distribution ``name`` was installed from (make test-ray installs them from dist/)."""
    import importlib.metadata

    direct = json.loads(importlib.metadata.distribution(name).read_text("direct_url.json") or "{}")
    path = Path(direct.get("url", "").removeprefix("file://"))
    if "archive_info" not in direct or path.suffix != ".whl" or not path.is_file():
        pytest.skip(f"{name} was not installed from a wheel file here: make test-ray installs it from dist/")
    return path


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the wheels decoctl and the demo models were installed from."""
    folder = tmp_path_factory.mktemp("wheels")
    for name in ("decoctl", "decoctl-models"):
        shutil.copy(_installed_from(name), folder)
    return folder


@pytest.fixture(scope="session")
def prompts() -> list[BatchPrompt]:
    return [BatchPrompt.of(p, f"prompt {i}") for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS), encoding="utf-8")
    return path


def without_timings(record: dict[str, Any]) -> dict[str, Any]:
    """A JSON line of decoctl generate --prompts less what differs from run to run (its timings)."""
    stats = {k: v for k, v in record["stats"].items() if k not in TIMINGS}
    return {**record, "stats": stats}


def jsonl(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """decoctl in this process: (status, stdout, stderr)."""
    capsys.readouterr()
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err
