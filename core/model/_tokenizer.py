"""Text in and out through a tokenizer.json, with streaming that never cuts a UTF-8 character in half."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs
from tokenizers import Tokenizer as HfTokenizer
from tokenizers.decoders import DecodeStream

from decoctl.errors import ConfigError, ModelLoadError

__all__ = ["IncrementalDetokenizer", "Tokenizer", "require_utf8"]

CONTEXT = 8  # tokens decoded before the held-back ones when flushing, as tokenizers' DecodeStream does


def require_utf8(text: str, what: str) -> None:
    """Raise ConfigError when ``text`` cannot be written as UTF-8: it holds bytes that were not UTF-8 (which
    Python keeps as lone surrogates, as in sys.argv or a stream read with errors="surrogateescape")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        found = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"a lone surrogate U+{code:04X}"
        raise ConfigError(
            f"{what} is not valid UTF-8 text ({found} at character {exc.start}): give UTF-8 text (convert it "
            "with `iconv -t UTF-8`, or fix the encoding in your editor)"
        ) from None


@attrs.define
class Tokenizer:
    """A tokenizer.json plus the model's BOS rule.

    Prompts are encoded as the model's own tokenizer encodes them (transformers' ``tokenizer(prompt)``): the
    special tokens that tokenizer.json's post-processor adds are kept (Llama 3's BOS comes from there).
    ``add_bos``: tokenizer_config.json asks for BOS too; it is prepended where the post-processor did not put it
    first (a tokenizer.json without a post-processor; models trained with BOS degenerate without it).
    ``vocab_size``: every token, added ones included; ``base_vocab_size``: the model's own vocabulary, without
    the tokens added on top of it (special tokens a model may have no embedding row for).
    """

    _inner: HfTokenizer
    _bos_token_id: int | None
    _add_bos: bool
    vocab_size: int
    base_vocab_size: int

    @classmethod
    def from_file(cls, path: Path, *, bos_token_id: int | None, add_bos: bool) -> Tokenizer:
        """The tokenizer.json at ``path``, with the model's BOS rule (``add_bos``: encode puts ``bos_token_id``
        first)."""
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
        return cls(
            inner,
            bos_token_id,
            add_bos,
            inner.get_vocab_size(with_added_tokens=True),
            inner.get_vocab_size(with_added_tokens=False),
        )

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a prompt with the special tokens the model's tokenizer adds, BOS first when the model
        wants it (``add_special_tokens=False``: the text's own tokens only, as a rendered chat template is encoded);
        text that is not valid Unicode (bytes that were not UTF-8, kept as lone surrogates) raises ConfigError."""
        try:
            ids = self._inner.encode(text, add_special_tokens=add_special_tokens).ids
        except TypeError:
            require_utf8(text, "the prompt")  # tokenizers says only "TextInputSequence must be str"
            raise
        if not add_special_tokens:
            return ids
        if self._add_bos and self._bos_token_id is not None and (not ids or ids[0] != self._bos_token_id):
            ids.insert(0, self._bos_token_id)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens left out."""
        return self._inner.decode(list(ids), skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """The id of the token spelt ``token``, or None."""
        return self._inner.token_to_id(token)

    def detokenizer(self) -> IncrementalDetokenizer:
        """A new incremental detokenizer over this tokenizer."""
        return IncrementalDetokenizer(self)

    def to_json(self) -> str:
        """The tokenizer.json text, for libraries that build their own view of the vocabulary (llguidance)."""
        return self._inner.to_str()


@attrs.define
class IncrementalDetokenizer:
    """Turns a growing token list into text pieces, holding back bytes of an unfinished UTF-8 character.

    Byte-level BPE splits a multi-byte character across tokens; decoding a prefix then ends in U+FFFD. Each
    token goes through tokenizers' own ``DecodeStream`` (one call into Rust a token, which decodes a short window
    and emits only what is finished); ``flush`` emits what is still held back, an unfinished character as U+FFFD.
    """

    _tokenizer: Tokenizer
    _stream: DecodeStream = attrs.field(factory=lambda: DecodeStream(skip_special_tokens=True))
    _ids: list[int] = attrs.field(factory=list)
    _emitted: int = 0  # how many of _ids the text so far covers

    def push(self, ids: Sequence[int]) -> str:
        """Add tokens; return the newly finished text (possibly empty)."""
        inner, pieces = self._tokenizer._inner, []
        for token in ids:
            self._ids.append(token)
            piece = self._stream.step(inner, token)
            if piece is not None:
                pieces.append(piece)
                self._emitted = len(self._ids)
        return "".join(pieces)

    def flush(self) -> str:
        """The text still held back (an unfinished character is emitted as U+FFFD)."""
        if self._emitted == len(self._ids):
            return ""
        context = max(0, self._emitted - CONTEXT)  # decode with a few tokens before, as the stream does
        before = self._tokenizer.decode(self._ids[context : self._emitted])
        after = self._tokenizer.decode(self._ids[context:])
        self._emitted = len(self._ids)
        self._stream = DecodeStream(skip_special_tokens=True)
        return after[len(before) :]
