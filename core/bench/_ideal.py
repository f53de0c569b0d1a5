"""The ideal speedup `decoctl bench` reports beside the measured one, and the verify-cost curve it rests on.

``ideal_ratio`` is the speedup over the baseline a strategy would reach if the only costs were the model forwards
it made. It is computed from measured quantities only:

- what the strategy fed the model, per generation (a :class:`ForwardLedger`): its target forwards by size,
  chain forwards of n tokens and tree forwards of T nodes apart, and the seconds every other role (a draft model,
  an EAGLE head) spent inside onnxruntime during decode, from the generation's own stats (the host counts every
  forward of every role by its size: ``GenerationStats.forward_sizes``);
- the verify-cost curve, measured in the same run on the same target model by :class:`CostCalibrator`:
  ``c(n) = t(chain forward of n tokens) / t(one-token forward)`` and ``c_tree(T) = t(tree forward of T nodes) /
  t(one-token forward)``, each the median of ratios of adjacent pairs (a one-token forward, then the n-token
  one), at a fixed context length, taken between the bench's repeats so that drift in machine load hits the
  curve and the contenders alike. ``t1`` is the median one-token forward in seconds. Times are onnxruntime's
  (the Sequence's ``seconds`` counter), the same clock as the roles' ``onnx_seconds``.

For one contender, summed over every prompt of every repeat::

    ideal_ratio = sum(tokens - 1) / sum( sum_n chain[n] * c(n) + sum_T tree[T] * c_tree(T) + other_seconds / t1 )

The numerator is what the baseline pays for the same output: greedy takes the first token from the prefill and
one one-token forward (cost c(1) = 1) per further token. The denominator is the strategy's model work in units of
that one-token forward. A strategy's acceptance enters through its forward counts (tokens per target forward);
nothing assumes an acceptance rate or a constant cost. ``fraction_of_ideal = ratio_to_baseline / ideal_ratio``
is how much of that model-only speedup the implementation keeps after its host-side work.

Where the ledger comes from (its ``basis``):

- ``forward sizes``: the host's count of the target's decode-time forwards by size, whatever the controller
  (a plugin, a C library, a user's loop): exact.
- ``one-token forwards``: a loop outside the host that feeds one token a forward (raw-ort).
- ``onnxruntime-genai stats``: onnxruntime-genai's speculative counters: verify passes (the tokens proposed plus
  one each, spread over the passes), re-anchor, reconciliation and standard steps (one token each), and its
  draft time when a draft model ran (n-gram lookup is host work, not a model forward).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from decoctl.errors import CapabilityError, ConfigError
from decoctl.host import ForwardSizes
from decoctl.host import Sequence as RoleSequence
from decoctl.model._loader import LoadedModel

__all__ = [
    "CostCalibrator",
    "CostCurve",
    "ForwardLedger",
    "ideal_ratio",
    "ledger_from_stats",
    "spread",
]

CHAIN, TREE = "chain", "tree"


def spread(tokens: int, forwards: int) -> dict[int, int]:
    """``tokens`` fed over ``forwards`` forwards as evenly as possible: {size: forwards of that size}."""
    if forwards <= 0:
        return {}
    size, rest = divmod(tokens, forwards)
    sizes = {size: forwards - rest, size + 1: rest}
    return {n: count for n, count in sizes.items() if count and n > 0}


@attrs.frozen(kw_only=True)
class ForwardLedger:
    """The decode-time model work of one generation, as the bench prices it.

    ``chain``: target forwards over n tokens -> how many; ``tree``: target tree forwards over T nodes -> how
    many; ``other_seconds``: seconds inside onnxruntime of every role but the target; ``basis``: where the
    counts come from (see the module docstring).
    """

    basis: str
    chain: Mapping[int, int] = attrs.field(factory=dict)
    tree: Mapping[int, int] = attrs.field(factory=dict)
    other_seconds: float = 0.0

    @classmethod
    def one_token(cls, forwards: int, other_seconds: float = 0.0) -> ForwardLedger:
        """``forwards`` one-token target forwards (a greedy loop)."""
        chain = {1: forwards} if forwards > 0 else {}
        return cls(basis="one-token forwards", chain=chain, other_seconds=other_seconds)

    def sizes(self, kind: str) -> Mapping[int, int]:
        return self.chain if kind == CHAIN else self.tree


def ledger_from_stats(*, forward_sizes: Mapping[str, ForwardSizes], onnx_seconds: Mapping[str, float]) -> ForwardLedger:
    """A generation's ledger from its stats (``GenerationStats`` fields; decode time only): the target's forwards by
    size as the host counted them, and every other role's onnxruntime seconds."""
    target = forward_sizes.get("target", ForwardSizes())
    chain = {n: count for n, (count, _) in target.chain.items()}
    tree = {n: count for n, (count, _) in target.tree.items()}
    other = sum(seconds for role, seconds in onnx_seconds.items() if role != "target")
    return ForwardLedger(chain=chain, tree=tree, other_seconds=other, basis="forward sizes")


@attrs.frozen(kw_only=True)
class CostCurve:
    """The measured verify-cost curve: ``chain[n] = c(n)``, ``tree[T] = c_tree(T)`` (ratios to a one-token
    forward, which takes ``one_token_seconds``), at ``context`` cached tokens, from ``pairs`` pairs per size."""

    chain: Mapping[int, float]
    tree: Mapping[int, float]
    one_token_seconds: float
    context: int
    pairs: int

    def cost(self, ledger: ForwardLedger) -> float:
        """The ledger's model work in one-token forwards."""
        total = ledger.other_seconds / self.one_token_seconds if ledger.other_seconds else 0.0
        for kind, curve in ((CHAIN, self.chain), (TREE, self.tree)):
            for n, count in ledger.sizes(kind).items():
                if n not in curve:
                    raise ConfigError(
                        f"the verify-cost curve has no {kind} forward of {n} token(s): calibrate every size a "
                        "contender used (CostCalibrator.measure) before pricing it"
                    )
                total += count * curve[n]
        return total


def ideal_ratio(outcomes: Iterable[tuple[int, ForwardLedger]], curve: CostCurve) -> float | None:
    """sum(tokens - 1) / sum(cost) over (tokens generated, ledger) pairs; None when there is no decode work."""
    tokens = cost = 0.0
    for generated, ledger in outcomes:
        tokens += max(0, generated - 1)
        cost += curve.cost(ledger)
    return tokens / cost if cost > 0 else None


class CostCalibrator:
    """Measures the verify-cost curve on the target model with its own Sequence (its own KV cache).

    Each :meth:`measure` pass times, for every size asked, ``pairs`` adjacent pairs (a one-token forward, then a
    forward of the size) at ``context`` cached tokens, rewinding after each; the curve is the median of all
    pairs' ratios. A tree forward of T nodes is a real tree forward (a binary tree of T nodes; the model's cost
    depends on T, not on the shape), and needs a model with tree inputs. An encoder-decoder model's encoder reads
    ``source`` (the prompt's tokens by default; a speech model's window of features, float32[1, mel, frames]).
    """

    def __init__(
        self, model: LoadedModel, tokens: Sequence[int], *, context: int, pairs: int = 3, source: Any = None
    ) -> None:
        if pairs < 1:
            raise ConfigError(f"calibration pairs={pairs} must be at least 1")
        if not tokens:
            raise ConfigError("the verify-cost calibration needs some prompt tokens to fill its context")
        self.model = model
        self.pairs = pairs
        limit = min(model.spec.max_length, model.spec.context_length)
        self.context = max(1, min(context, limit // 2))
        self._tokens = [int(tokens[i % len(tokens)]) for i in range(limit)]
        # an encoder-decoder model's decoder reads the prompt through its encoder: the prompt is its source, unless
        # ``source`` is given (a speech model's window of features, float32[1, mel, frames])
        encoder = model.encoder
        if source is None and encoder is not None:
            source = [int(t) for t in tokens[: encoder.parts.source_length]]
        self._source = source
        self._sequence: RoleSequence | None = None
        self._ratios: dict[tuple[str, int], list[float]] = {}
        self._one_token: list[float] = []

    def measure(self, chain: Iterable[int], tree: Iterable[int] = ()) -> None:
        """One calibration pass over the given sizes (size 1 chain is the unit, always measured)."""
        wanted = [(CHAIN, n) for n in sorted({1, *chain})] + [(TREE, n) for n in sorted(set(tree))]
        if any(kind == TREE for kind, _ in wanted) and not self.model.capabilities.tree:
            raise CapabilityError(
                f"a contender made tree forwards but model {self.model.name} has no tree inputs to calibrate "
                "them on: run the bench on the tree-enabled model the contender used"
            )
        sequence = self._sequence_for(max(n for _, n in wanted))
        for kind, n in wanted:
            for _ in range(self.pairs):
                one = self._timed(sequence, CHAIN, 1)
                self._one_token.append(one)
                if kind == CHAIN and n == 1:
                    continue
                self._ratios.setdefault((kind, n), []).append(self._timed(sequence, kind, n) / max(one, 1e-9))

    def curve(self) -> CostCurve:
        if not self._one_token:
            raise ConfigError("the verify-cost curve has no measurement yet: call measure() first")
        chain: dict[int, float] = {1: 1.0}
        tree: dict[int, float] = {}
        for (kind, n), ratios in sorted(self._ratios.items()):
            (chain if kind == CHAIN else tree)[n] = statistics.median(ratios)
        return CostCurve(
            chain=chain,
            tree=tree,
            one_token_seconds=statistics.median(self._one_token),
            context=self.context,
            pairs=self.pairs,
        )

    def _sequence_for(self, largest: int) -> RoleSequence:
        needed = self.context + largest
        limit = min(self.model.spec.max_length, self.model.spec.context_length)
        if needed > limit:
            raise ConfigError(
                f"a forward of {largest} tokens after the calibration context of {self.context} passes model "
                f"{self.model.name}'s {limit} positions: bench with shorter prompts or a smaller draft/tree size"
            )
        if self._sequence is None or self._sequence.max_length < needed:
            capacity = min(limit, max(needed, self.context + 64))
            self._sequence = RoleSequence("target", self.model, max_length=capacity)
            if self._source is not None:
                self._sequence.encode(self._source)
            self._sequence.prefill(self._tokens[: self.context])
        return self._sequence

    def _timed(self, sequence: RoleSequence, kind: str, n: int) -> float:
        fed = self._tokens[self.context : self.context + n]
        before = sequence.stats.seconds
        if kind == TREE:
            sequence.forward(fed, tree=[-1, *((i - 1) // 2 for i in range(1, n))])
        else:
            sequence.forward(fed)
        seconds = sequence.stats.seconds - before
        sequence.rewind(self.context)
        return seconds
