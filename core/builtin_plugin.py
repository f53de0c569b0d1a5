"""The host's own contributions, registered like any plugin: the greedy and sample baselines."""

from __future__ import annotations

import pluggy

from decoctl.controllers import builtin_controllers
from decoctl.specs import ControllerSpec

hookimpl = pluggy.HookimplMarker("decoctl")


@hookimpl
def decoctl_controllers() -> tuple[ControllerSpec, ...]:
    return builtin_controllers()
