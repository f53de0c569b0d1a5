"""Drafters propose the next tokens cheaply; the target verifies them in one forward.

``propose(host, context, k)`` returns up to k tokens and, for drafters that sample, the float64[k, vocab]
distributions q they were drawn from (None for point-mass proposals).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from decoctl import Host
from decoctl.verify import LookupIndex, draw, probabilities

__all__ = ["DraftModelDrafter", "Drafter", "PromptLookupDrafter"]


class Drafter(Protocol):
    name: str
    #: proposals are point masses (q = 1): verification uses the deterministic-draft rule
    deterministic: bool
    #: proposing costs no model forward, so the controller asks for every candidate and then picks how many to verify
    model_free: bool
    #: what the last proposal was based on, for the draft-length rule's acceptance statistics (0: one bucket)
    bucket: int
    #: the context tokens the last proposal fed the drafter before its first draft, and the seconds that took
    synced_rows: int
    sync_seconds: float

    def start(self, host: Host) -> None: ...

    def propose(self, host: Host, context: np.ndarray, k: int) -> tuple[list[int], np.ndarray | None]: ...

    def backlog(self, context: np.ndarray) -> int:
        """Context tokens the drafter has not been fed yet (what its next proposal catches up on first)."""
        ...

    def stats(self) -> dict[str, Any]: ...


class DraftModelDrafter:
    """A smaller model in role "draft" runs k autoregressive steps. Greedy (argmax of its processed logits:
    a point mass) or sampled from softmax(processed / temperature) (its q rows are returned).

    The draft's KV cache is kept in step with the committed context lazily: before drafting, the longest
    prefix its tokens share with the context is kept and only the rest is fed (usually the accepted tokens
    plus the target's correction, in one forward; after steps that drafted nothing, everything they committed).
    That catch-up's last row gives the first draft: ``synced_rows`` and ``sync_seconds`` (on ``clock``) say what the
    last proposal's catch-up fed and cost, for the draft-length rule.
    """

    name = "draft-model"
    model_free = False
    bucket = 0

    def __init__(self, *, sample: bool, temperature: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.deterministic = not sample
        self.temperature = temperature
        self.clock = clock
        self._matched = 0
        self.synced_rows = 0
        self.sync_seconds = 0.0

    def start(self, host: Host) -> None:
        host["draft"].rewind(0)
        self._matched = 0

    def _sync(self, host: Host, context: np.ndarray) -> np.ndarray:
        """Bring the draft to ``context`` and return its last logits row."""
        draft = host["draft"]
        have = draft.length
        start = min(self._matched, have)
        tail = draft.tokens[start:have]
        compared = context[start : start + len(tail)]
        differ = np.flatnonzero(tail[: len(compared)] != compared)
        common = start + (int(differ[0]) if differ.size else min(len(tail), len(compared)))
        common = min(common, len(context) - 1)  # feed at least one token to get a fresh row
        draft.rewind(common)
        row = draft.prefill(context[common:], host.prefill_chunk)[-1]
        self._matched = len(context)
        self.synced_rows = len(context) - common
        return row

    def backlog(self, context: np.ndarray) -> int:
        return max(1, len(context) - self._matched)

    def propose(self, host: Host, context: np.ndarray, k: int) -> tuple[list[int], np.ndarray | None]:
        draft = host["draft"]
        began = self.clock()
        row = self._sync(host, context)
        self.sync_seconds = self.clock() - began
        drafts: list[int] = []
        qs: list[np.ndarray] = []
        for index in range(k):
            if self.deterministic:
                # the chain's argmax: equal to the processed row's, and free of the row copy where it can be
                token = int(host.argmax(row[None, :], paths=[drafts])[0])
            else:
                q = probabilities(host.process(row[None, :], paths=[drafts]), self.temperature)[0]
                token = draw(q, host.rng)
                qs.append(q)
            drafts.append(token)
            if index + 1 < k:
                row = draft.forward((token,))[-1]
        return drafts, (None if self.deterministic else np.stack(qs))

    def stats(self) -> dict[str, Any]:
        return {}


class PromptLookupDrafter:
    """Copy the continuation of the latest earlier occurrence of the context's last n tokens (n from
    ``ngram_max`` down to ``ngram_min``), from prompt and output alike (decoctl.verify.LookupIndex, extended by the
    new tokens only). An encoder-decoder target's source (``host.source_tokens``) comes first in the index, so a
    summary or a translation copies names and phrases from its source. Point-mass proposals; no model.
    """

    name = "prompt-lookup"
    deterministic = True
    model_free = True
    synced_rows = 0
    sync_seconds = 0.0

    def __init__(self, *, ngram_min: int, ngram_max: int) -> None:
        #: the length of the n-gram the last proposal matched (0: none): longer matches are accepted more often
        self.bucket = 0
        self._sizes = (ngram_max, ngram_min)
        self.index = LookupIndex(ngram_max, ngram_min)
        self._before = 0
        self.hits = self.misses = 0

    def start(self, host: Host) -> None:
        self.index = LookupIndex(*self._sizes)
        self.index.extend(host.source_tokens.tolist())
        #: index positions before the context's first token (the source's)
        self._before = len(self.index.tokens)
        self.hits = self.misses = 0

    def backlog(self, context: np.ndarray) -> int:
        del context
        return 0

    def propose(self, host: Host, context: np.ndarray, k: int) -> tuple[list[int], np.ndarray | None]:
        del host
        self.index.extend(context[len(self.index.tokens) - self._before :].tolist())
        drafts, self.bucket = self.index.find(k)
        if self.bucket:
            self.hits += 1
        else:
            self.misses += 1
        return drafts, None

    def stats(self) -> dict[str, Any]:
        return {"lookup_hits": self.hits, "lookup_misses": self.misses}
