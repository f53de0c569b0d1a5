"""The hook implementations the ``decoctl`` entry point ``logits-chain`` loads."""

from __future__ import annotations

from decoctl import ControllerSpec, ProcessorSpec, hookimpl
from decoctl_logits_chain.specs import controller_specs, processor_specs

__all__ = ["decoctl_controllers", "decoctl_logits_processors"]


@hookimpl
def decoctl_logits_processors() -> tuple[ProcessorSpec, ...]:
    return processor_specs()


@hookimpl
def decoctl_controllers() -> tuple[ControllerSpec, ...]:
    return controller_specs()
