"""The committed output of one generation: tokens, text, stop rules, streaming."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import attrs
import numpy as np

from decoctl.model._tokenizer import IncrementalDetokenizer

__all__ = ["Output", "StopRules"]

StreamSink = Callable[[list[int], str], None]


@attrs.frozen(kw_only=True)
class StopRules:
    """When a generation ends: any EOS id, ``max_new_tokens`` committed, any stop string in the text, or the
    sequence reaching ``capacity`` new tokens (the KV cache is full)."""

    eos_token_ids: frozenset[int] = attrs.field(converter=frozenset)
    max_new_tokens: int
    stop_strings: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    capacity: int


class Output:
    """Tokens accepted so far and the text they make.

    ``commit`` applies the stop rules token by token and returns how many tokens it took; EOS is counted as
    taken but adds no text; a stop string is cut from the text. ``sink`` receives (new tokens, new text) after
    every commit; text that could still become a stop string is held back until it cannot. With neither a sink
    nor stop strings nothing needs the text during the generation, so it is decoded when ``text`` is first read
    (one pass over the tokens, not one call a commit).
    """

    def __init__(self, rules: StopRules, detokenizer: IncrementalDetokenizer, sink: StreamSink | None) -> None:
        self.rules = rules
        self.tokens: list[int] = []
        self.stop_reason: str | None = None
        self._ids = np.empty(64, np.int64)  # the same tokens as an array that grows by doubling
        self._read_only = self._read_only_view()
        self._detokenizer = detokenizer
        self._sink = sink
        self._text = ""
        self._emitted = 0
        self._holdback = max((len(s) for s in rules.stop_strings), default=1) - 1
        self._lazy = sink is None and not rules.stop_strings
        self._decoded = 0  # how many tokens the text covers
        self._flushed = False

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def remaining(self) -> int:
        """How many more tokens commit() may take."""
        if self.done:
            return 0
        limit = min(self.rules.max_new_tokens, self.rules.capacity)
        return limit - len(self.tokens)

    @property
    def text(self) -> str:
        """The text so far (a stop string and an unfinished UTF-8 character excluded)."""
        if self._lazy:
            self._decode_pending()
        return self._text

    @property
    def ids(self) -> np.ndarray:
        """int64[len(tokens)]: the committed tokens as an array (a read-only view, valid until the next commit)."""
        return self._read_only[: len(self.tokens)]  # a slice of a read-only view is read-only: one numpy call

    def _read_only_view(self) -> np.ndarray:
        view = self._ids[:]
        view.flags.writeable = False
        return view

    def is_eos(self, token: int) -> bool:
        """Whether ``token`` ends the output (one of the stop rules' EOS ids)."""
        return token in self.rules.eos_token_ids

    def commit(self, tokens: Iterable[int]) -> int:
        """Append ``tokens`` until a stop rule ends the output (EOS, max_new_tokens, capacity, a stop string);
        returns how many were taken."""
        taken: list[int] = []
        rules, output = self.rules, self.tokens
        eos, stops = rules.eos_token_ids, rules.stop_strings
        limit = min(rules.max_new_tokens, rules.capacity)
        for token in tokens:
            if self.stop_reason is not None:
                break
            token = int(token)
            taken.append(token)
            output.append(token)
            if token in eos:
                self.stop_reason = "eos"
            elif stops:  # a stop string may end in this token: decode it now
                self._decoded = len(output)
                self._append_text(self._detokenizer.push((token,)))
            if self.stop_reason is None and len(output) >= limit:
                self.stop_reason = "max_new_tokens" if len(output) >= rules.max_new_tokens else "max_length"
        if taken:
            self._store(taken)
        if not self._lazy:
            self._decode_pending()
            if taken:
                self._emit(taken)
        return len(taken)

    def _decode_pending(self) -> None:
        """Decode the committed tokens not decoded yet (a final EOS adds no text) and, once the generation is done,
        what the detokenizer still holds back (unless a stop string ended it)."""
        if self._decoded < len(self.tokens):
            text_tokens = self.tokens[self._decoded :]
            if self.stop_reason == "eos":
                text_tokens = text_tokens[:-1]
            self._decoded = len(self.tokens)
            self._append_text(self._detokenizer.push(text_tokens))
        if self.done and not self._flushed:
            self._flushed = True
            if self.stop_reason != "stop_string":
                self._append_text(self._detokenizer.flush())

    def _store(self, taken: list[int]) -> None:
        end = len(self.tokens)
        if end > self._ids.size:
            grown = np.empty(max(end, 2 * self._ids.size), np.int64)
            grown[: end - len(taken)] = self._ids[: end - len(taken)]
            self._ids = grown
            self._read_only = self._read_only_view()
        for at, token in enumerate(taken, end - len(taken)):  # a few tokens: scalar stores beat a list conversion
            self._ids[at] = token

    def _append_text(self, piece: str) -> None:
        if not piece or self.stop_reason == "stop_string":
            return
        start = max(0, len(self._text) - self._holdback)
        self._text += piece
        for stop in self.rules.stop_strings:
            at = self._text.find(stop, start)
            if at >= 0:
                self._text = self._text[:at]
                self.stop_reason = "stop_string"
                return

    def _emit(self, tokens: Sequence[int]) -> None:
        if self._sink is None:
            return
        end = len(self._text) if self.done else self._safe_end()
        piece = self._text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        self._sink(list(tokens), piece)

    def _safe_end(self) -> int:
        """End of the text that no stop string can still claim."""
        text = self._text
        for keep in range(min(self._holdback, len(text)), 0, -1):
            tail = text[-keep:]
            if any(stop.startswith(tail) for stop in self.rules.stop_strings):
                return len(text) - keep
        return len(text)
