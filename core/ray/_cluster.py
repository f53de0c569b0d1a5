"""Ray itself: imported only when asked for (the ray extra), a cluster joined or started, and its CPUs counted
before anything loads.

decoctl asks Ray for workers and leaves everything else to it: ``ray.init`` starts a local cluster or joins an
existing one (``address``: "auto", "HOST:PORT" of its head, or "ray://HOST:PORT" through Ray Client).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

from decoctl.errors import ConfigError

__all__ = ["INSTALL", "connect", "joined", "require_cpus", "require_ray"]

#: how to get Ray, in every message that lacks it
INSTALL = "pip install 'decoctl[ray]'"
#: seconds to wait for a cluster's head to accept a connection before calling the address unreachable
REACH_TIMEOUT = 5.0


def require_ray(what: str) -> Any:
    """The ray module; ConfigError naming ``what`` needs it and the extra that installs it where it is missing."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"{what} needs Ray ({exc.name} is missing): {INSTALL}") from None
    return ray


def _host_port(address: str) -> tuple[str, int] | None:
    """The head's host and port in a Ray address ("HOST:PORT" or "ray://HOST:PORT"); None for "auto" and for what
    Ray resolves itself; ConfigError for a port that is not a number."""
    rest = address.removeprefix("ray://")
    if rest in ("auto", "local") or ":" not in rest:
        return None
    host, _, port = rest.rpartition(":")
    if not port.isdigit():
        raise ConfigError(f"Ray address {address!r}: the port {port!r} is not a number (give HOST:PORT)")
    return host.strip("[]"), int(port)


@contextlib.contextmanager
def joined(address: str | None, what: str) -> Iterator[Any]:
    """connect() for a command's duration: Ray, and at the end the local cluster shut down if this started it."""
    ray = require_ray(what)
    started = not ray.is_initialized()
    try:
        yield connect(address, what, command=True)
    finally:
        if started and ray.is_initialized():
            ray.shutdown()


def connect(address: str | None, what: str, *, command: bool = False) -> Any:
    """Ray, initialised: the cluster this process already joined, else the one at ``address``, else a new local
    cluster on this machine (or the one RAY_ADDRESS names, as ray.init has it). ConfigError, before Ray starts
    anything, for a missing ray package or an address whose head does not answer (checked also where this process
    has joined a cluster already, which it then keeps). ``command``: for one of decoctl's commands, whose stdout is
    its own: the workers' output stays in their logs and Ray says only warnings (a program of one's own gets
    ray.init's defaults)."""
    ray = require_ray(what)
    if address:
        reach = _host_port(address)
        if reach is not None:
            try:
                socket.create_connection(reach, timeout=REACH_TIMEOUT).close()
            except OSError as exc:
                reason = exc.strerror or str(exc) or type(exc).__name__
                raise ConfigError(
                    f"cannot reach the Ray cluster at {address} ({reason}): start one there with `ray start --head`, "
                    "or give its head's address (HOST:6379, or ray://HOST:10001 through Ray Client)"
                ) from None
    if ray.is_initialized():
        return ray
    try:
        quiet = {"logging_level": logging.WARNING, "include_dashboard": False, "log_to_driver": False}
        ray.init(address=address or None, **(quiet if command else {}))
    except ConnectionError as exc:
        raise ConfigError(
            f"cannot join the Ray cluster at {address or 'auto'} ({exc}): start one with `ray start --head`, or leave "
            "the address out to start a local cluster"
        ) from None
    return ray


def require_cpus(ray: Any, needed: float, what: str) -> None:
    """ConfigError where the cluster has fewer CPUs than ``needed`` (Ray would wait for them for ever)."""
    have = ray.cluster_resources().get("CPU", 0.0)
    if needed > have:
        raise ConfigError(
            f"{what} need {needed:g} CPUs, and the Ray cluster has {have:g}: run fewer, give each fewer threads, or "
            "add nodes to the cluster"
        )
