"""The speculative decoding loop, over host primitives only.

Invariant between steps: the target's KV cache holds the context (prompt + committed tokens) except its last
token, the *pending* one. A step drafts d1..dK, runs ONE target forward over [pending, d1..dK] (K+1 rows, row i
predicting the token after d1..di), processes the rows through the logits chain with each row's own prefix,
accepts a prefix of the drafts plus one target token, commits them, and rewinds the target to
pending + accepted drafts (O(1)); the target's own token becomes the next pending token.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from decoctl import ConfigError, Host, Option
from decoctl.acceptance import accept_deterministic, accept_greedy, accept_sampled, probabilities
from decoctl_speculative.draft_length import CostAwareLength, DraftLength, ScheduledLength
from decoctl_speculative.drafters import Drafter, DraftModelDrafter, PromptLookupDrafter

__all__ = ["OPTIONS", "Speculative", "draft_length", "roles_for"]

DRAFTERS = ("draft-model", "prompt-lookup")

OPTIONS = (
    Option(name="drafter", type="str", default="draft-model", choices=DRAFTERS, help="who proposes tokens"),
    Option(name="k", type="int", default=4, minimum=1, help="tokens drafted per step (the start, when adaptive)"),
    Option(name="adaptive", type="bool", default=True, help="adapt k per step (rule: length_rule); false: fixed k"),
    Option(
        name="length_rule",
        type="str",
        default="cost",
        choices=("cost", "schedule"),
        help="adaptive k: the length with most expected tokens per measured cost, or HF's grow/shrink schedule",
    ),
    Option(name="k_min", type="int", default=1, minimum=1, help="adaptive lower bound"),
    Option(name="k_max", type="int", default=16, minimum=1, help="adaptive upper bound"),
    Option(name="sampling", type="bool", default=False, help="sample (lossless) instead of greedy"),
    Option(name="temperature", type="float", default=1.0, minimum=1e-6, help="sampling temperature"),
    Option(
        name="draft_greedy",
        type="bool",
        default=False,
        help="when sampling, the draft model proposes its argmax (verified with the point-mass rule)",
    ),
    Option(name="ngram_max", type="int", default=3, minimum=1, help="prompt lookup: longest n-gram matched"),
    Option(name="ngram_min", type="int", default=1, minimum=1, help="prompt lookup: shortest n-gram matched"),
)


def roles_for(options: dict[str, Any]) -> tuple[str, ...]:
    return ("target", "draft") if options["drafter"] == "draft-model" else ("target",)


class Speculative:
    """Draft k tokens, verify them with one target forward, keep the longest acceptable prefix plus one."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.sampling = bool(options["sampling"])
        self.temperature = float(options["temperature"])
        if options["ngram_min"] > options["ngram_max"]:
            raise ConfigError(
                f"speculative option ngram_min={options['ngram_min']} is above ngram_max={options['ngram_max']}"
            )
        self.drafter: Drafter
        if options["drafter"] == "draft-model":
            sample_draft = self.sampling and not options["draft_greedy"]
            self.drafter = DraftModelDrafter(sample=sample_draft, temperature=self.temperature)
        else:
            self.drafter = PromptLookupDrafter(ngram_min=options["ngram_min"], ngram_max=options["ngram_max"])
        self._options = options
        self.k = draft_length(options)
        self._reset_counters()

    def _reset_counters(self) -> None:
        self.steps = self.drafted = self.accepted = 0
        self.draft_seconds = self.verify_seconds = 0.0
        #: tokens per verify forward -> how many steps fed that many (for the bench's ideal-speedup model)
        self.verify_sizes: dict[int, int] = {}

    def start(self, host: Host) -> None:
        self._reset_counters()
        self.k = draft_length(self._options)  # what a rule learnt belongs to one generation
        target = host.target
        prompt = host.prompt_tokens
        self._context = np.zeros(len(prompt) + host.remaining + 1, np.int64)
        self._context[: len(prompt)] = prompt
        self._length = len(prompt)
        target.rewind(target.length - 1)
        self._pending = int(prompt[-1])
        self.drafter.start(host)
        host.trace["drafter"] = self.drafter.name
        host.trace["acceptance"] = self._mode()
        host.trace["draft_length"] = self._length_rule()

    def _mode(self) -> str:
        if not self.sampling:
            return "greedy-exact-match"
        return "point-mass-rejection" if self.drafter.deterministic else "speculative-sampling"

    def step(self, host: Host) -> None:
        target = host.target
        base = target.length
        cap = min(self.k.high, host.remaining - 1, target.max_length - base - 1)
        began = time.perf_counter()
        context = self._context[: self._length]
        if self.drafter.model_free:  # drafting is free: take every candidate, then verify as many as pay
            drafts, q = self.drafter.propose(host, context, cap) if cap > 0 else ([], None)
            k = self.k.choose(self.drafter.bucket, len(drafts))
            drafts = drafts[:k]
        else:  # every draft token costs a draft forward: decide first
            k = self.k.choose(self.drafter.bucket, cap)
            drafts, q = self.drafter.propose(host, context, k) if k > 0 else ([], None)
        q = None if q is None else q[: len(drafts)]
        verified = time.perf_counter()
        logits = target.forward([self._pending, *drafts])
        if not self.sampling:
            choices = host.argmax(logits, drafts)
            forwarded = time.perf_counter()
            accepted, following = accept_greedy(choices, drafts)
        else:
            rows = host.process(logits, drafts)
            forwarded = time.perf_counter()
            p = probabilities(rows, self.temperature)
            if q is None:
                accepted, following = accept_deterministic(p, drafts, host.rng)
            else:
                accepted, following = accept_sampled(p, q, drafts, host.rng)
        self.verify_seconds += time.perf_counter() - verified
        self.draft_seconds += verified - began
        self.k.observe(
            bucket=self.drafter.bucket,
            drafted=len(drafts),
            accepted=accepted,
            verify_seconds=forwarded - verified,
            draft_seconds=verified - began,
        )
        self.steps += 1
        self.verify_sizes[len(drafts) + 1] = self.verify_sizes.get(len(drafts) + 1, 0) + 1
        self.drafted += len(drafts)
        self.accepted += accepted
        new = [*drafts[:accepted], following]
        host.commit(new)
        if host.done:
            return
        target.rewind(base + 1 + accepted)
        self._context[self._length : self._length + len(new)] = new
        self._length += len(new)
        self._pending = following

    def _length_rule(self) -> str:
        return self._options["length_rule"] if self._options["adaptive"] else "fixed"

    def stats(self) -> dict[str, Any]:
        return {
            "drafter": self.drafter.name,
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "mean_accepted_per_step": self.accepted / self.steps if self.steps else 0.0,
            "length_rule": self._length_rule(),
            **self.k.stats(),
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "verify_sizes": dict(self.verify_sizes),
            **self.drafter.stats(),
        }


def draft_length(options: dict[str, Any]) -> DraftLength:
    """The draft-length rule the options ask for: fixed k, HF's schedule, or the cost-aware rule."""
    k, low, high = options["k"], options["k_min"], options["k_max"]
    if not options["adaptive"]:
        return DraftLength(k, min(low, k), max(high, k))
    if options["length_rule"] == "schedule":
        return ScheduledLength(k, low, high)
    return CostAwareLength(k, low, high)
