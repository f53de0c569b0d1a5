"""Text in and out through a tokenizer.json, with streaming that never cuts a UTF-8 character in half."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs
from tokenizers import Tokenizer as HfTokenizer

from decoctl.errors import ModelLoadError

__all__ = ["IncrementalDetokenizer", "Tokenizer"]

REPLACEMENT = "\ufffd"


@attrs.define
class Tokenizer:
    """A tokenizer.json plus the model's BOS rule.

    ``add_bos``: prepend ``bos_token_id`` to every prompt (models trained with BOS degenerate without it).
    """

    _inner: HfTokenizer
    _bos_token_id: int | None
    _add_bos: bool
    vocab_size: int

    @classmethod
    def from_file(cls, path: Path, *, bos_token_id: int | None, add_bos: bool) -> Tokenizer:
        try:
            inner = HfTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exception subclasses for every parse failure
            raise ModelLoadError(
                f"tokenizer file {path} could not be read ({exc}): save it again with tokenizers' "
                "Tokenizer.save() or transformers' save_pretrained()"
            ) from exc
        if add_bos and bos_token_id is None:
            raise ModelLoadError(
                f"{path.parent} asks for a BOS token but its config has no bos_token_id: add one to the config"
            )
        return cls(inner, bos_token_id, add_bos, inner.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt, BOS first when the model wants it."""
        ids = self._inner.encode(text, add_special_tokens=False).ids
        if self._add_bos and self._bos_token_id is not None and (not ids or ids[0] != self._bos_token_id):
            ids.insert(0, self._bos_token_id)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._inner.decode(list(ids), skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._inner.token_to_id(token)

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self)

    def to_json(self) -> str:
        """The tokenizer.json text, for libraries that build their own view of the vocabulary (llguidance)."""
        return self._inner.to_str()


@attrs.define
class IncrementalDetokenizer:
    """Turns a growing token list into text pieces, holding back bytes of an unfinished UTF-8 character.

    Byte-level BPE splits a multi-byte character across tokens; decoding a prefix then ends in U+FFFD.
    Decoding a short window (from ``_prefix`` on) and emitting only the part past ``_read`` keeps each
    step O(window), not O(output).
    """

    _tokenizer: Tokenizer
    _ids: list[int] = attrs.field(factory=list)
    _prefix: int = 0
    _read: int = 0

    def push(self, ids: Sequence[int]) -> str:
        """Add tokens; return the newly finished text (possibly empty)."""
        self._ids.extend(ids)
        before = self._tokenizer.decode(self._ids[self._prefix : self._read])
        after = self._tokenizer.decode(self._ids[self._prefix :])
        if after.endswith(REPLACEMENT) or len(after) <= len(before):
            return ""
        self._prefix = self._read
        self._read = len(self._ids)
        return after[len(before) :]

    def flush(self) -> str:
        """The text still held back (an unfinished character is emitted as U+FFFD)."""
        before = self._tokenizer.decode(self._ids[self._prefix : self._read])
        after = self._tokenizer.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :]
