"""The speculative decoding loop: a drafter and a draft-length rule (decoctl.draft_length) over decoctl.verify's chain
verification.

A step drafts d1..dK after the pending token and verifies them in ONE target forward over [pending, d1..dK]
(``Verifier.chain``): the longest acceptable prefix plus one target token is committed, losslessly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from decoctl import ConfigError, Host, Option
from decoctl.draft_length import DraftLength, draft_length
from decoctl.verify import Verifier
from decoctl_speculative.drafters import Drafter, DraftModelDrafter, PromptLookupDrafter

__all__ = ["OPTIONS", "Speculative", "roles_for"]

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
    Option(
        name="k_min",
        type="int",
        default=0,
        minimum=0,
        help="adaptive lower bound (0: the cost rule takes plain one-token steps where drafting does not pay)",
    ),
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
    """Draft k tokens, verify them with one target forward, keep the longest acceptable prefix plus one.
    ``clock``: what the draft-length rule's costs are measured with (seconds; tests give one that does not depend
    on the machine)."""

    def __init__(self, options: dict[str, Any], *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.sampling = bool(options["sampling"])
        self.temperature = float(options["temperature"])
        if options["ngram_min"] > options["ngram_max"]:
            raise ConfigError(
                f"speculative option ngram_min={options['ngram_min']} is above ngram_max={options['ngram_max']}"
            )
        self.drafter: Drafter
        if options["drafter"] == "draft-model":
            sample_draft = self.sampling and not options["draft_greedy"]
            self.drafter = DraftModelDrafter(sample=sample_draft, temperature=self.temperature, clock=clock)
        else:
            self.drafter = PromptLookupDrafter(ngram_min=options["ngram_min"], ngram_max=options["ngram_max"])
        self._options = options
        #: the drafter's one bucket, whose cost-model answer stands while it drafts nothing (a draft model's; a
        #: lookup's bucket is what it matches next)
        self._bucket = None if self.drafter.model_free else self.drafter.bucket
        self.clock = clock
        self.k = self._rule()
        self._run = self.k.run
        self.verifier = Verifier(sampling=self.sampling, temperature=self.temperature)
        self.draft_seconds = self.verify_seconds = 0.0

    def start(self, host: Host) -> None:
        self.draft_seconds = self.verify_seconds = 0.0
        self.k = self._rule(host)
        self._run = self.k.run
        prompt = host.prompt_tokens
        self._context = np.zeros(len(prompt) + host.remaining + 1, np.int64)
        self._context[: len(prompt)] = prompt
        self._length = len(prompt)
        self.verifier.start(host)
        self.drafter.start(host)
        host.trace["drafter"] = self.drafter.name
        host.trace["acceptance"] = self._mode()
        host.trace["draft_length"] = self._length_rule()

    def resume(self, host: Host) -> None:
        """Take the row back after other controllers stepped it (decoctl serve's batched greedy step, which leaves
        the last committed token in the target's KV cache and its logits ready): the context is rebuilt from the
        prompt and the output, the target gives the last committed token back and it becomes the pending one, as
        after ``start``. The draft-length rule and the drafter's statistics carry on; the drafter catches up on
        the new tokens at its next proposal."""
        prompt, output = host.prompt_tokens, host.output_tokens
        self._length = len(prompt) + len(output)
        self._context = np.zeros(self._length + host.remaining + 1, np.int64)
        self._context[: len(prompt)] = prompt
        self._context[len(prompt) : self._length] = output
        self.verifier.take_over(host)

    def _mode(self) -> str:
        if not self.sampling:
            return "greedy-exact-match"
        return "point-mass-rejection" if self.drafter.deterministic else "speculative-sampling"

    def _rule(self, host: Host | None = None) -> DraftLength:
        # a draft model's catch-up (feeding it what was committed since it last drafted) gives its first draft; the
        # cost rule's measurements carry over between a Generator's generations (decoctl.draft_length.remembered)
        drafter = host["draft"].model.name if host is not None and not self.drafter.model_free else None
        return draft_length(
            self._options,
            controller="speculative",
            first_from_catch_up=not self.drafter.model_free,
            model=None if host is None else host.target.model,
            drafter=drafter,
        )

    def step(self, host: Host) -> None:
        run = self._run
        if run.left or self.k.plain_now(self._bucket):
            # drafting stopped or not worth it, no probe due: a plain step the rule granted, greedy's host calls and a
            # timing, nothing proposed, priced or told (the context has room for a token past the generation's last)
            run.left -= 1
            began = self.clock()
            token = self.verifier.plain(host)
            seconds = self.clock() - began
            run.seconds += seconds
            self.verify_seconds += seconds
            self._context[self._length] = token
            self._length += 1
            return
        clock = self.clock
        began = clock()
        cap = min(self.k.high, self.verifier.room(host))
        context = self._context[: self._length]
        if self.drafter.model_free:  # drafting is free: take every candidate, then verify as many as pay
            drafts, q = self.drafter.propose(host, context, cap) if cap > 0 else ([], None)
            k = self.k.choose(self.drafter.bucket, len(drafts))
            drafts = drafts[:k]
        else:  # every draft token costs a draft forward: decide first
            k = self.k.choose(self.drafter.bucket, cap, backlog=self.drafter.backlog(context))
            drafts, q = self.drafter.propose(host, context, k) if k > 0 else ([], None)
        if not drafts:  # a plain step, as lean as greedy's (where drafting does not pay, most steps are these)
            self._plain(host, began)
            return
        q = None if q is None else q[: len(drafts)]
        drafted = clock()
        verdict = self.verifier.chain(host, drafts, q)
        verified = clock()
        self.draft_seconds += drafted - began
        self.verify_seconds += verified - drafted
        self.k.observe(
            bucket=self.drafter.bucket,
            drafted=len(drafts),
            accepted=verdict.accepted,
            verify_seconds=verified - drafted,
            draft_seconds=drafted - began - self.drafter.sync_seconds,
            catch_up_rows=self.drafter.synced_rows,
            catch_up_seconds=self.drafter.sync_seconds,
        )
        self.verifier.commit(host, verdict)
        if host.done:
            return
        new = verdict.tokens
        self._context[self._length : self._length + len(new)] = new
        self._length += len(new)

    def _plain(self, host: Host, began: float) -> None:
        """A step that drafts nothing (``Verifier.plain``), timed for the rule; ``began``: when the step began."""
        clock = self.clock
        verifying = clock()
        token = self.verifier.plain(host)
        verified = clock()
        self.draft_seconds += verifying - began
        self.verify_seconds += verified - verifying
        self.k.observe(
            bucket=self.drafter.bucket,
            drafted=0,
            accepted=0,
            verify_seconds=verified - verifying,
            draft_seconds=verifying - began,
        )
        if not host.done:
            self._context[self._length] = token
            self._length += 1

    def _length_rule(self) -> str:
        return self._options["length_rule"] if self._options["adaptive"] else "fixed"

    def stats(self) -> dict[str, Any]:
        steps, accepted = self.verifier.steps, self.verifier.accepted
        return {
            "drafter": self.drafter.name,
            **self.verifier.stats(),
            "mean_accepted_per_step": accepted / steps if steps else 0.0,
            "length_rule": self._length_rule(),
            **self.k.stats(),
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            **self.drafter.stats(),
        }
