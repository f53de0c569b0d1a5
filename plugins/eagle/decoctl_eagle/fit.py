"""Whether an EAGLE head fits a target, written once for every place that asks: ``decoctl eagle import`` and
``info``, training, evaluation, and the controller before it drafts.

A head fits a target when its hidden size and vocabulary are the target's and the target has the features the head
is fed: its final hidden states (``hidden_states``, width H) for an EAGLE-1 head, three taps of its residual stream
(``aux_hidden_states``, width 3H) for an EAGLE-3 head. A head's feature row is the hidden state alone (EAGLE-1, width
H) or ``[taps | own]`` (EAGLE-3, width 4H), so the width of its ``target_hidden_states`` input says which it is.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from decoctl import CapabilityError, ConfigError
from decoctl.model.eagle_graph import EAGLE1, EAGLE3, FEATURES

__all__ = ["HeadShape", "TargetShape", "architecture_of", "check_fits", "mismatches"]


def architecture_of(feature_size: int, hidden: int) -> str | None:
    """The architecture of a head whose features input is ``feature_size`` wide and whose hidden size is ``hidden``
    (None: neither)."""
    return {hidden: EAGLE1, 4 * hidden: EAGLE3}.get(feature_size)


@attrs.frozen(kw_only=True)
class HeadShape:
    """What decides whether a head fits a target: its architecture, hidden size and vocabulary (the target's, which
    it drafts into)."""

    architecture: str
    hidden: int
    vocab: int

    @property
    def taps(self) -> int:
        """The width of the target's taps at the front of the head's feature row (0: an EAGLE-1 head)."""
        return 3 * self.hidden if self.architecture == EAGLE3 else 0

    @property
    def feature_size(self) -> int:
        """The width of the head's feature row: H (EAGLE-1) or 4H (EAGLE-3's ``[taps | own]``)."""
        return self.taps + self.hidden

    def target_rows(self, target: Any, rows: Any = slice(None)) -> np.ndarray:
        """The head's feature rows from the target's last forward (a decoctl.Sequence; its rows ``rows``), as the
        head is fed them while synced: the final hidden states (EAGLE-1), ``[taps | 0]`` (EAGLE-3).
        float32[n, feature_size], a copy: the target's outputs move on."""
        if not self.taps:
            return np.array(target.hidden_states()[rows])
        taps = target.hidden_states(kind="aux")[rows]
        features = np.zeros((len(taps), self.feature_size), np.float32)
        features[:, : self.taps] = taps
        return features

    def own_rows(self, predicted: np.ndarray) -> np.ndarray:
        """The head's feature rows from its own outputs (float32[n, H]) while drafting: as they are (EAGLE-1),
        ``[0 | own]`` (EAGLE-3)."""
        if not self.taps:
            return predicted
        features = np.zeros((len(predicted), self.feature_size), np.float32)
        features[:, self.taps :] = predicted
        return features

    @classmethod
    def of_model(cls, model: Any) -> HeadShape:
        """A loaded head's shape (a decoctl.model.LoadedModel); ConfigError for a model that is no EAGLE head."""
        width, hidden = model.capabilities.feature_size, model.spec.hidden_size
        if width is None:
            raise ConfigError(f"{model.name} has no {FEATURES} input: it is not an EAGLE head")
        architecture = architecture_of(width, hidden)
        if architecture is None:
            raise ConfigError(
                f"{model.name} takes features of width {width} with hidden size {hidden}: neither an EAGLE-1 head "
                f"(width {hidden}) nor an EAGLE-3 head (width {4 * hidden}); re-export it with decoctl eagle import"
            )
        return cls(architecture=architecture, hidden=hidden, vocab=model.spec.vocab_size)


@attrs.frozen(kw_only=True)
class TargetShape:
    """What a head needs of its target: its sizes and the widths of its feature outputs (None: no such output).
    ``folder``: where it is, for the commands a message suggests (its name when not given)."""

    name: str
    hidden_size: int
    vocab_size: int
    hidden_states: int | None
    aux_hidden_states: int | None
    folder: str | None = None

    @classmethod
    def of_model(cls, model: Any) -> TargetShape:
        """A loaded target's shape (a decoctl.model.LoadedModel)."""
        return cls(
            name=model.name,
            hidden_size=model.spec.hidden_size,
            vocab_size=model.spec.vocab_size,
            hidden_states=model.capabilities.hidden_size,
            aux_hidden_states=model.capabilities.aux_hidden_size,
            folder=str(model.spec.path),
        )


def mismatches(head: HeadShape, target: TargetShape, *, hidden_from: str = "", vocab_from: str = "") -> list[str]:
    """Why ``head`` cannot run beside ``target``, one phrase each; empty when it can. ``hidden_from`` and
    ``vocab_from`` say where the head's sizes were read (a tensor), for the phrases."""
    reasons = []
    if head.hidden != target.hidden_size:
        where = f" ({hidden_from})" if hidden_from else ""
        reasons.append(f"hidden size {head.hidden}{where}, the target's {target.hidden_size}")
    if head.vocab != target.vocab_size:
        where = f" ({vocab_from})" if vocab_from else ""
        reasons.append(f"vocabulary {head.vocab}{where}, the target's {target.vocab_size}")
    if reasons:
        return reasons  # the features follow from the hidden size: a head of another size cannot be fed them
    if head.architecture == EAGLE3 and target.aux_hidden_states != head.taps:
        has = f"width {target.aux_hidden_states}" if target.aux_hidden_states else "none"
        reasons.append(f"it is fed three taps (aux_hidden_states of width {head.taps}); the target has {has}")
    if head.architecture == EAGLE1 and target.hidden_states != head.hidden:
        has = f"width {target.hidden_states}" if target.hidden_states else "none"
        reasons.append(f"it is fed the final hidden states (width {head.hidden}); the target has {has}")
    return reasons


def check_fits(
    head: HeadShape, target: TargetShape, *, what: str, also: str = "", hidden_from: str = "", vocab_from: str = ""
) -> None:
    """Refuse ``head`` (named ``what`` in the message) beside ``target``, naming every mismatch and the fix:
    ConfigError when the sizes differ (the head was made for another target), CapabilityError when the target only
    lacks the features the head is fed (a copy of it with them fixes that). ``also``: a fix of the caller's own,
    added to the message."""
    reasons = mismatches(head, target, hidden_from=hidden_from, vocab_from=vocab_from)
    if not reasons:
        return
    copy = f"`decoctl models enable-taps {target.folder or target.name} DST`"
    error: type[ConfigError] | type[CapabilityError] = CapabilityError
    if head.hidden != target.hidden_size or head.vocab != target.vocab_size:
        error = ConfigError
        fix = (
            "the head was made for another target (or another tokenizer): use one trained for this target "
            "(decoctl eagle train)"
        )
    elif head.architecture == EAGLE3:
        fix = (
            f"make a copy of the target with the taps, {copy} (EAGLE-3's "
            "layers 2, N/2 and N-3), or export it with the builder options include_hidden_states=1 "
            "aux_hidden_state_layers=a,b,c"
        )
    else:
        fix = (
            f"make a copy of the target with them, {copy}, or export it with the builder option include_hidden_states=1"
        )
    raise error(f"{what} does not fit target {target.name}: {'; '.join(reasons)}: {fix}{also}")
