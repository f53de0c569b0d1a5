"""Whisper's timestamp tokens: the rules that keep them well formed (a logits processor) and the segments they mark.

A Whisper vocabulary ends with ``<|notimestamps|>`` followed by the timestamp tokens: id ``no_timestamps + 1 + k``
says "``k * precision`` seconds into the window" (``precision``: 0.02 s, the window's 30 s over the encoder's 1500
positions). A prompt that ends with ``<|notimestamps|>`` asks for text alone; without it the model writes
``<|0.00|> text <|1.20|><|1.20|> more text <|2.40|>``, and :class:`TimestampRules` keeps that shape as transformers'
WhisperTimeStampLogitsProcessor does, for each row and its generated tokens:

- ``<|notimestamps|>`` is never generated;
- timestamps come in pairs: after a pair (or at the start), no timestamp follows at once; after a lone timestamp,
  no text token (an id below EOS) follows: another timestamp closes the pair, or EOS ends;
- timestamps never go back: none below the last one (after a lone timestamp, the same one may close the pair),
  and none equal to it after a pair;
- the first generated token is a timestamp, at most ``max_initial_timestamp_index`` steps in (generation_config.json);
- where the timestamps' probabilities together outweigh the likeliest text token, a timestamp is generated.

:func:`segment_spans` reads the stretches of text between them, as OpenAI's verbose_json gives them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

__all__ = ["TimestampRules", "segment_spans"]


@attrs.frozen(kw_only=True)
class TimestampRules:
    """The processor (see the module docstring): ``no_timestamps`` the id of ``<|notimestamps|>`` (the timestamps
    follow it), ``eos`` the end-of-text id (text tokens are the ids below it), ``max_initial`` the latest first
    timestamp (steps after ``<|0.00|>``; None: any). A row whose prompt holds ``<|notimestamps|>`` is left as it is."""

    no_timestamps: int
    eos: int
    max_initial: int | None = None
    name: str = "whisper_timestamps"
    stateless: bool = True

    def __call__(self, rows: np.ndarray, context: Any) -> np.ndarray:
        if self.no_timestamps in context.prompt:
            return rows
        begin = self.no_timestamps + 1
        for index in range(rows.shape[0]):
            self._row(rows[index], context.generated(index), begin)
        return rows

    def _row(self, row: np.ndarray, generated: np.ndarray, begin: int) -> None:
        row[self.no_timestamps] = -np.inf
        last = len(generated) >= 1 and generated[-1] >= begin
        before_last = len(generated) < 2 or generated[-2] >= begin
        if last:
            if before_last:  # a pair just closed (or the first timestamp): text comes next
                row[begin:] = -np.inf
            else:  # a lone timestamp: another closes the pair, or EOS ends
                row[: self.eos] = -np.inf
        stamps = generated[generated >= begin]
        floor = begin
        if stamps.size:
            floor = int(stamps[-1]) if last and not before_last else int(stamps[-1]) + 1
        row[begin:floor] = -np.inf
        if len(generated) == 0:  # the first token is a timestamp, early enough
            row[:begin] = -np.inf
            if self.max_initial is not None:
                row[begin + self.max_initial + 1 :] = -np.inf
        stamped, text = row[begin:], row[:begin]
        top = float(stamped.max(initial=-np.inf))
        if top == -np.inf:
            return
        # log-softmax over the row: the normaliser is common to both sides, so the comparison is of the raw sums
        together = top + float(np.log(np.exp(stamped.astype(np.float64) - top).sum()))
        if together > float(text.max(initial=-np.inf)):
            row[:begin] = -np.inf


def segment_spans(
    tokens: Sequence[int], *, no_timestamps: int, precision: float, end: float
) -> list[tuple[float, float, list[int]]]:
    """(start, end, text tokens) of each stretch ``tokens`` (one window's generated tokens, EOS excluded) marks with
    timestamps, in seconds from the window's start. Text with no timestamp before it starts where the last one was
    (0 at first); text with none after it ends at ``end`` (the window's length: the model stopped, or ran out of
    tokens, inside a stretch); a stretch without text is left out."""
    begin = no_timestamps + 1
    spans: list[tuple[float, float, list[int]]] = []
    start: float | None = None
    words: list[int] = []
    last = 0.0
    for token in tokens:
        if token >= begin:
            at = (token - begin) * precision
            if start is None:
                start = at
            elif words:
                spans.append((start, at, words))
                start, words = None, []
            else:
                start = at
            last = at
        else:
            if start is None:
                start = last
            words.append(int(token))
    if words:
        spans.append((start if start is not None else last, max(end, last), words))
    return spans
