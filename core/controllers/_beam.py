"""Beam search over the target's rows, token for token as transformers' generate(num_beams=...) decides.

decoctl generate "def f(x):" -c beam -o num_beams=4 -o num_return_sequences=2 -o length_penalty=1.0

The whole search runs inside one controller step: the Generator prefills row 0; the search forks it into
``num_beams`` rows, steps every beam in one onnxruntime Run (decoctl.host.Rows), reorders the rows to follow the
surviving beams, and commits nothing until it ends. Then the ``num_return_sequences`` best finished hypotheses
become completions 0..R-1 (best first), each with its length-normalised score (transformers' sequences_scores).

The rules are transformers' (GenerationMixin._beam_search, written again here over numpy): the logits chain runs
on each beam's log-softmax with that beam's own prefix; the top ``max(2, 1 + EOS ids) * num_beams`` continuations
of all beams are kept; a continuation that ends in an EOS id or reaches max_new_tokens finishes, and enters the
finished set (score: its log-probability over ``new tokens ** length_penalty``) only if it ranks among the first
``num_beams`` of them; the best ``num_beams`` unfinished ones run on. The search ends when every continuation
finishes (max_new_tokens), when early_stopping is "true" and ``num_beams`` hypotheses are finished, or when no
running beam can beat the worst finished one (transformers' heuristic: with early_stopping "false" at the current
length, with "never" and a positive length_penalty at the longest possible length).

Stop strings do not steer the search: each returned hypothesis is cut at its first stop string when it is committed
(stop_reason "stop_string"), and its score stays that of the whole hypothesis.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from decoctl.errors import ConfigError, ControllerError
from decoctl.host import Host
from decoctl.specs import ControllerSpec, Option

__all__ = ["BeamSearch", "beam_spec", "log_softmax", "top_k"]

#: what transformers adds to a score to take it out of the running (float32, as its tensors are)
_OUT = np.float32(-1.0e9)
EARLY_STOPPING = ("true", "false", "never")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float32[n, vocab] -> float32[n, vocab]: each row's log-probabilities."""
    shifted = logits.astype(np.float32) - logits.max(axis=1, keepdims=True).astype(np.float32)
    result: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True, dtype=np.float32))
    return result


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """int64[k]: the indices of the ``k`` largest of float32[n] ``values``, largest first, the lower index first on
    ties. O(n): a partition, then a sort of the k found."""
    if k >= len(values):
        chosen = np.arange(len(values))
    else:
        part = np.argpartition(values, len(values) - k)[len(values) - k :]
        kth = values[part].min()
        above = np.flatnonzero(values > kth)
        chosen = np.concatenate((above, np.flatnonzero(values == kth)[: k - len(above)]))
    return chosen[np.lexsort((chosen, -values[chosen]))].astype(np.int64)


class _Beams:
    """The search's state between model steps: the running beams and the finished hypotheses (``width`` each)."""

    def __init__(self, width: int, max_new: int, eos: frozenset[int], length_penalty: float, early: str) -> None:
        self.width, self.max_new, self.length_penalty, self.early = width, max_new, length_penalty, early
        self.eos = np.fromiter(sorted(eos), np.int64, len(eos))
        #: continuations kept per step: enough that ``width`` of them are still running when the best all end in EOS
        self.keep = max(2, 1 + len(eos)) * width
        self.length = 0  # tokens each running beam has generated
        self.running = np.zeros((width, max_new), np.int64)
        self.scores = np.full(width, _OUT, np.float32)
        self.scores[0] = 0.0  # the other beams start as copies of beam 0 that no continuation should come from
        self.finished = np.zeros((width, max_new), np.int64)
        self.finished_lengths = np.zeros(width, np.int64)
        self.finished_scores = np.full(width, _OUT, np.float32)
        self.is_finished = np.zeros(width, bool)
        self.can_improve = True

    def paths(self) -> list[np.ndarray]:
        return [self.running[b, : self.length] for b in range(self.width)]

    def advance(self, log_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Take one step from float32[width, vocab] processed log-probabilities; return (parents, tokens) of the
        beams that run on (row i continues beam parents[i] with tokens[i]), or None when the search is over."""
        vocab = log_probs.shape[1]
        total = (log_probs + self.scores[:, None]).reshape(-1)
        picked = top_k(total, self.keep)
        beams, tokens, scores = picked // vocab, picked % vocab, total[picked]
        ends = np.isin(tokens, self.eos) | (self.length + 1 >= self.max_new)
        candidates = self.running[beams]
        candidates[:, self.length] = tokens

        running = scores + ends.astype(np.float32) * _OUT
        going = top_k(running, self.width)
        self.running, self.scores = candidates[going], running[going]

        self._finish(candidates, scores, ends)
        self.length += 1
        self._check_improvement()
        if not self.can_improve or (self.early == "true" and self.is_finished.all()) or ends.all():
            return None
        if self.width == 1 and self.is_finished[0]:
            return None  # one beam is greedy search, as transformers runs num_beams=1: the first EOS ends it
        return beams[going], tokens[going]

    def _finish(self, candidates: np.ndarray, scores: np.ndarray, ends: np.ndarray) -> None:
        """Merge the continuations that just ended (among the first ``width``) into the finished hypotheses."""
        ended = ends & (np.arange(self.keep) < self.width)
        normalised = scores / np.float32((self.length + 1) ** self.length_penalty)
        if self.early == "true" and self.is_finished.all():
            normalised += _OUT
        if not self.can_improve:
            normalised += _OUT
        normalised += (~ended).astype(np.float32) * _OUT
        merged = np.concatenate((self.finished_scores, normalised))
        best = top_k(merged, self.width)
        self.finished = np.concatenate((self.finished, candidates))[best]
        lengths = np.full(self.keep, self.length + 1, np.int64)
        self.finished_lengths = np.concatenate((self.finished_lengths, lengths))[best]
        self.finished_scores = merged[best]
        self.is_finished = np.concatenate((self.is_finished, ended))[best]

    def _check_improvement(self) -> None:
        """transformers' early-stop heuristic: can the best running beam still beat the worst finished hypothesis?"""
        # a positive length penalty favours long hypotheses: "never" hopes for the longest one
        hoped = self.max_new if self.early == "never" and self.length_penalty > 0.0 else self.length
        best = self.scores[0] / np.float32(hoped**self.length_penalty)
        worst = np.where(self.is_finished, self.finished_scores.min(), _OUT)
        self.can_improve = self.can_improve and bool((best > worst).any())

    def best(self, count: int) -> list[tuple[np.ndarray, float]]:
        """The ``count`` best finished hypotheses, best first: (tokens, score); fewer only when the chain masked
        (-inf) every other continuation."""
        return [
            (self.finished[i, : self.finished_lengths[i]], float(self.finished_scores[i]))
            for i in range(count)
            if self.is_finished[i]
        ]


class BeamSearch:
    """Beam search (see the module docstring). Options: num_beams, length_penalty, early_stopping,
    num_return_sequences."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.num_beams = int(options["num_beams"])
        self.length_penalty = float(options["length_penalty"])
        self.early_stopping = str(options["early_stopping"])
        self.num_return_sequences = int(options["num_return_sequences"])
        self._steps = 0
        self._finished = 0

    def start(self, host: Host) -> None:
        """Make an output for each further hypothesis returned (num_return_sequences)."""
        # the other completions exist from the start, so that a chain that cannot serve several is refused at once
        for _ in range(self.num_return_sequences - 1):
            host.new_output(final=True)

    def step(self, host: Host) -> None:
        """The whole search: fork the beams, step them in one Run until the search ends, and commit the best
        hypotheses, one output each with its length-normalised score."""
        rows = host.rows("target")
        width = self.num_beams
        for _ in range(width - 1):
            rows.fork(0)  # every beam starts from the prompt; beams 1.. stay out of the running until reordered
        beams = _Beams(
            width,
            host.remaining,
            frozenset(host.target.model.spec.eos_token_ids),
            self.length_penalty,
            self.early_stopping,
        )
        identity = np.arange(width)
        logits = np.repeat(host.target.logits()[-1:], width, axis=0)
        while True:
            if width > 1:
                processed = host.process(log_softmax(logits), paths=beams.paths())
            else:  # greedy search, whose chain sees the logits themselves (a repetition penalty acts on them)
                processed = log_softmax(host.process(logits, paths=beams.paths()))
            self._steps += 1
            chosen = beams.advance(processed)
            if chosen is None:
                break
            parents, tokens = chosen
            if not np.array_equal(parents, identity):
                rows.reorder(parents)
            logits = rows.step(tokens, rows=identity)
        found = beams.best(self.num_return_sequences)
        self._finished = int(beams.is_finished.sum())
        if len(found) < self.num_return_sequences:
            raise ControllerError(
                f"beam search finished {len(found)} hypotheses, fewer than num_return_sequences="
                f"{self.num_return_sequences}: the logits chain masked every other continuation (-inf); loosen it"
            )
        for output, (tokens, score) in enumerate(found):
            host.commit(tokens, output=output)
            host.score(output, score)

    def stats(self) -> Mapping[str, Any]:
        """The search's steps and how many hypotheses finished."""
        return {"beam_steps": self._steps, "finished_hypotheses": self._finished}


def _check(options: dict[str, Any]) -> None:
    if options["num_return_sequences"] > options["num_beams"]:
        raise ConfigError(
            f"controller 'beam': num_return_sequences={options['num_return_sequences']} is more than "
            f"num_beams={options['num_beams']}: a search keeps num_beams hypotheses, so ask for at most that many"
        )


def beam_spec() -> ControllerSpec:
    """Beam search's ControllerSpec (controller "beam")."""
    return ControllerSpec(
        name="beam",
        summary="beam search, token for token as transformers' generate(num_beams=...)",
        factory=BeamSearch,
        rows_for=lambda options: int(options["num_beams"]),
        sampling_processors=False,  # it ranks continuations: temperature, top_k, top_p, ... are refused
        check_options=_check,
        options=(
            Option(name="num_beams", type="int", default=4, minimum=1, help="hypotheses kept at every step"),
            Option(
                name="length_penalty",
                type="float",
                default=1.0,
                help="a finished hypothesis scores log-probability / new tokens ** length_penalty (> 0 favours long)",
            ),
            Option(
                name="early_stopping",
                type="str",
                default="false",
                choices=EARLY_STOPPING,
                help="true: stop once num_beams hypotheses are finished; false: once none can improve "
                "(transformers' heuristic); never: also consider the longest length with a positive penalty",
            ),
            Option(
                name="num_return_sequences",
                type="int",
                default=1,
                minimum=1,
                help="completions returned, best first (at most num_beams)",
            ),
        ),
    )
