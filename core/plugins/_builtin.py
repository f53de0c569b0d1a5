"""The host's own contributions, registered like any plugin (entry point "decoctl" of the decoctl distribution):
the greedy and sample baselines."""

from __future__ import annotations

from decoctl.controllers import builtin_controllers
from decoctl.plugins._registry import hookimpl
from decoctl.specs import ControllerSpec


@hookimpl
def decoctl_controllers() -> tuple[ControllerSpec, ...]:
    return builtin_controllers()
