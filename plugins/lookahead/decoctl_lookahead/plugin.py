"""The plugin module the `decoctl` entry point names: registers the `lookahead` controller."""

from __future__ import annotations

from decoctl import ControllerSpec, hookimpl
from decoctl_lookahead.controller import OPTIONS, Lookahead, scratch_for


@hookimpl
def decoctl_controllers() -> list[ControllerSpec]:
    return [
        ControllerSpec(
            name="lookahead",
            summary="Jacobi lookahead window + n-gram pool verified in one tree forward (Fu et al. 2024); lossless",
            factory=Lookahead,
            scratch_for=scratch_for,
            options=OPTIONS,
        )
    ]
