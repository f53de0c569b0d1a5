"""Requests checked into plans: what a request asks for, checked against what the engine was started with, once per
distinct choice.

plans = Plans(models, registry, max_rows=8, max_length=4096)
plan = plans.check(request)      # a Plan, or ConfigError naming what this engine cannot give

A plan holds the controller's spec and parsed options and the logits chain built from the request's processors (its
grammars compiled), so checking is the slow part of a request that a client chooses: call it off the engine thread
and the event loop (the app does, in its worker pool). The last ``PLANS_KEPT`` distinct choices keep their plan; each
completion runs a clone of the plan's chain.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from decoctl.errors import ConfigError
from decoctl.generation._opening import check_choice, check_models
from decoctl.host import role_flag
from decoctl.logs import get_logger
from decoctl.model._loader import LoadedModel
from decoctl.plugins import PluginRegistry
from decoctl.processing import ProcessContext, ProcessorChain
from decoctl.serve._requests import EngineRequest, Plan
from decoctl.specs import normalise_name

__all__ = ["PLANS_KEPT", "Plans"]

log = get_logger(__name__)

#: how many distinct (controller, options, processors) choices keep their checked plan
PLANS_KEPT = 64


class Plans:
    """Checks requests (from any thread) and keeps the plans of the last ``PLANS_KEPT`` distinct choices."""

    def __init__(
        self, models: Mapping[str, LoadedModel], registry: PluginRegistry, *, max_rows: int, max_length: int
    ) -> None:
        self.models = models
        self.registry = registry
        self.max_rows = max_rows
        self.max_length = max_length
        self._kept: collections.OrderedDict[tuple[str, str, str], Plan] = collections.OrderedDict()
        self._lock = threading.Lock()

    def check(self, request: EngineRequest) -> Plan:
        """The request's checked plan; ConfigError naming what it asks for that this engine cannot give."""
        if not request.ids:
            raise ConfigError("the prompt is empty and the model adds no BOS token: give some prompt text")
        if len(request.ids) >= self.max_length:
            raise ConfigError(
                f"the prompt has {len(request.ids)} tokens but the model's context holds {self.max_length} "
                f"positions, prompt and completion together: shorten the prompt to under {self.max_length} tokens"
            )
        if request.max_new_tokens < 1:
            raise ConfigError(f"max_tokens={request.max_new_tokens} must be at least 1")
        if not 1 <= request.n <= self.max_rows:
            raise ConfigError(f"n={request.n} must be from 1 to {self.max_rows} (the server's --max-rows)")
        vocab = self.models["target"].spec.vocab_size
        if any(not 0 <= t < vocab for t in request.ids):
            raise ConfigError(f"the prompt holds token ids outside the vocabulary 0..{vocab - 1}")
        plan = self.plan(request.controller, request.options, request.processors)
        scratch = plan.spec.scratch(dict(plan.options))
        if len(request.ids) + scratch >= self.max_length:
            raise ConfigError(
                f"the prompt has {len(request.ids)} tokens and controller {plan.spec.name!r} needs {scratch} positions "
                f"of scratch, but the model's context holds {self.max_length} positions: shorten the prompt"
            )
        if request.logprobs is not None and not plan.batched:
            raise ConfigError(
                f"logprobs: controller {plan.spec.name!r} commits tokens from its own verification, which gives no "
                "per-token log-probabilities here; use greedy or sample (the default) for logprobs"
            )
        return plan

    def plan(self, controller: str, options: Mapping[str, Any], processors: str | list[dict[str, Any]] | None) -> Plan:
        """The plan of a choice: kept, or made (and kept, the least recently used one forgotten past PLANS_KEPT)."""
        key = (
            normalise_name(controller),
            json.dumps(dict(options), sort_keys=True, default=str),
            json.dumps(processors, sort_keys=True, default=str),
        )
        with self._lock:
            plan = self._kept.get(key)
            if plan is not None:
                self._kept.move_to_end(key)
                return plan
        plan = self._make(controller, options, processors)
        with self._lock:
            self._kept[key] = plan
            while len(self._kept) > PLANS_KEPT:
                self._kept.popitem(last=False)
        return plan

    def _make(self, controller: str, options: Mapping[str, Any], processors: str | list[dict[str, Any]] | None) -> Plan:
        installed = self.registry.controllers()
        spec = installed.get(normalise_name(controller))
        if spec is None:
            raise ConfigError(
                f"unknown controller {controller!r}: a request chooses among the installed controllers "
                f"({', '.join(sorted(installed))}), never a path or a library"
            )
        # checked exactly as decoctl generate checks them, against the loaded models only: a request never makes the
        # server load one
        choice = check_choice(spec, options, processors, self.registry)
        missing = [r for r in choice.roles if r not in self.models]
        if missing:
            raise ConfigError(
                f"controller {spec.name!r} with these options needs the role(s) {missing}, which this server was not "
                f"started with (decoctl serve {role_flag(missing[0])}); its roles: {sorted(self.models)}"
            )
        check_models(spec, choice.options, {r: self.models[r] for r in choice.roles})
        if spec.rows(choice.options) > 1:
            raise ConfigError(
                f"controller {spec.name!r} with these options holds {spec.rows(choice.options)} rows per "
                "request (parallel samples or beams): ask for several completions with the request's n instead"
            )
        self._prepare(choice.chain)
        return Plan(
            spec=spec,
            options=choice.options,
            processors=processors,
            roles=choice.roles,
            batched=spec.batched and choice.roles == ("target",),
            chain=choice.chain,
            kind=(spec.name, json.dumps(dict(choice.options), sort_keys=True, default=str)),
        )

    def _prepare(self, chain: ProcessorChain) -> None:
        """Run the plan's chain once over a row of zeros, so that what its processors build on their first call (a
        grammar's llguidance tokenizer and first matcher) is built here, where the plan is made, and shared by the
        clones each completion runs, never built on the engine thread. A processor that cannot run on that row
        builds it on its first real call instead (and raises there what it raises)."""
        if not chain:
            return
        model = self.models["target"]
        empty = np.zeros(0, np.int64)
        context = ProcessContext(
            empty,
            empty,
            [()],
            eos_token_ids=frozenset(model.spec.eos_token_ids),
            tokenizer=model.tokenizer,
        )
        try:
            chain(np.zeros((1, model.spec.vocab_size), np.float32), context)
        except Exception as exc:
            log.debug("decoctl.serve.chain_not_prepared", error=f"{type(exc).__name__}: {exc}")
