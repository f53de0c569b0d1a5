"""The plugin module the `decoctl` entry point names: registers the `eagle` controller and the `decoctl eagle`
command (train, import, info)."""

from __future__ import annotations

from decoctl import CommandSpec, ControllerSpec, hookimpl
from decoctl_eagle.commands import COMMAND
from decoctl_eagle.controller import HEAD, OPTIONS, Eagle, capabilities_for, check_options, scratch_for


@hookimpl
def decoctl_controllers() -> list[ControllerSpec]:
    return [
        ControllerSpec(
            name="eagle",
            summary="EAGLE: a draft head on the target's features drafts a chain or an EAGLE-2 dynamic tree, "
            "verified in one target forward; lossless",
            factory=Eagle,
            roles=("target", HEAD),
            capabilities_for=capabilities_for,
            check_options=check_options,
            scratch_for=scratch_for,
            options=OPTIONS,
        )
    ]


@hookimpl
def decoctl_commands() -> list[CommandSpec]:
    return [COMMAND]
