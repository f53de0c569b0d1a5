"""The plugin module the `decoctl` entry point names: registers the `speculative` controller."""

from __future__ import annotations

from decoctl import ControllerSpec, hookimpl
from decoctl_speculative.controller import OPTIONS, Speculative, roles_for


@hookimpl
def decoctl_controllers() -> list[ControllerSpec]:
    return [
        ControllerSpec(
            name="speculative",
            summary="draft k tokens (draft model or prompt lookup), verify in one target forward; lossless",
            factory=Speculative,
            roles=("target", "draft"),
            roles_for=roles_for,
            scratch_for=lambda options: max(options["k"], options["k_max"]) + 1,
            options=OPTIONS,
        )
    ]
