"""A grammar constraint backed by llguidance: a regex, a JSON schema or a Lark grammar masks the logits.

The matcher's state is the committed output only. Rows of drafted paths are evaluated on copies of it
(llguidance's ``deep_copy``, well under a microsecond), so speculative, lookahead and EAGLE verification never
move it; ``commit`` advances it and ``reset`` starts it over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from decoctl import ConfigError, ControllerError, ProcessContext
from decoctl.logs import get_logger
from decoctl_logits_chain._parse import parse_structured
from decoctl_logits_chain.base import NEG_INF, Processor

__all__ = ["KINDS", "Grammar", "compile_grammar"]

log = get_logger(__name__)

KINDS = ("regex", "json_schema", "lark")
OWNER = "logits processor 'grammar'"


def _llguidance() -> Any:
    try:
        import llguidance
        import llguidance.numpy
    except ImportError as exc:
        raise ConfigError(f"{OWNER} needs llguidance ({exc}): pip install 'decoctl-logits-chain[grammar]'") from None
    return llguidance


def compile_grammar(kind: str, source: str) -> str:
    """llguidance's grammar text for a regex, a JSON schema (JSON text) or a Lark grammar; ConfigError when it
    does not compile, so a bad grammar stops the run before generation starts."""
    llg = _llguidance()
    if kind == "regex":
        grammar = llg.LLMatcher.grammar_from_regex(source)
    elif kind == "lark":
        grammar = llg.LLMatcher.grammar_from_lark(source)
    elif kind == "json_schema":
        try:
            schema = parse_structured(source)
            grammar = llg.LLMatcher.grammar_from_json_schema(schema)
        except (ValueError, SyntaxError) as exc:
            raise ConfigError(f"{OWNER}: json_schema is not a JSON object ({exc})") from None
    else:
        raise ConfigError(f"{OWNER}: unknown grammar kind {kind!r} (use one of {', '.join(KINDS)})")
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConfigError(f"{OWNER}: the {kind} does not compile: {messages[0].strip()}")
    for message in messages:
        log.warning("decoctl.grammar_warning", kind=kind, warning=message)
    return grammar


class Grammar(Processor):
    """logit_t <- -inf for every token t the grammar does not allow after the row's prefix; once the grammar
    is complete only EOS stays. A row whose drafted path the grammar already rejects is masked entirely (a
    verifier never reaches it: the row before gave that drafted token probability 0).

    Needs the model's tokenizer, which the host passes in ``context.tokenizer``.
    """

    #: one grammar a chain (decoctl.processing.ProcessorChain refuses two)
    exclusive = True

    def __init__(self, kind: str, source: str) -> None:
        self.kind = kind
        self.grammar = compile_grammar(kind, source)
        self._llg = _llguidance()
        self._key: tuple[Any, ...] | None = None
        self._initial: Any = None
        self._matcher: Any = None
        self._eos: frozenset[int] = frozenset()
        self._committed: list[int] = []

    # -- state ------------------------------------------------------------------------------------------
    def reset(self, prompt: np.ndarray) -> None:
        del prompt  # the grammar constrains the output only
        self._committed = []
        self._matcher = None

    def clone(self) -> Grammar:
        """``LogitsProcessor.clone``: the same grammar for another sequence, at the same point of it. The compiled
        grammar and the initial matcher are shared (they are only ever copied from); the committed tokens and the
        matcher are its own."""
        twin = Grammar.__new__(Grammar)
        twin.__dict__.update(self.__dict__)
        twin._committed = list(self._committed)
        twin._matcher = None if self._matcher is None else self._matcher.deep_copy()
        return twin

    def commit(self, tokens: Sequence[int]) -> None:
        start = len(self._committed)
        self._committed.extend(int(t) for t in tokens)
        if self._matcher is not None:
            self._replay(self._committed[start:])

    def _replay(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            if not self._advance(self._matcher, token):
                raise ControllerError(
                    f"token {token} was committed but the {self.kind} grammar does not allow it there: a controller "
                    "under a grammar must pick tokens from host.process() rows"
                )

    def _advance(self, matcher: Any, token: int) -> bool:
        """Consume ``token`` if the grammar allows it; never leave the matcher in llguidance's sticky error state."""
        if matcher.is_stopped():
            return token in self._eos  # EOS after a complete grammar is accepted and changes nothing
        return bool(matcher.validate_tokens([token]) == 1 and matcher.consume_token(token))

    def _ensure(self, context: ProcessContext, vocab: int) -> None:
        eos = tuple(sorted(t for t in context.eos_token_ids if t < vocab))
        key = (id(context.tokenizer), vocab, eos)
        if key != self._key:
            if context.tokenizer is None:
                raise ConfigError(f"{OWNER} needs the model's tokenizer: run it through a decoctl Generator or Host")
            tokenizer = self._llg.LLTokenizer(context.tokenizer.to_json(), n_vocab=vocab, eos_token=list(eos) or None)
            initial = self._llg.LLMatcher(tokenizer, self.grammar, log_level=0)
            if initial.is_error():
                raise ConfigError(f"{OWNER}: the {self.kind} does not work with this tokenizer: {initial.get_error()}")
            self._key, self._initial, self._eos, self._matcher = key, initial, frozenset(eos), None
        if self._matcher is None:
            self._matcher = self._initial.deep_copy()
            self._replay(self._committed)

    # -- masking ----------------------------------------------------------------------------------------
    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        vocab = rows.shape[1]
        self._ensure(context, vocab)
        bits = np.zeros((len(rows), (vocab + 31) // 32), np.int32)
        work: Any = None
        work_path: tuple[int, ...] = ()
        for index, raw_path in enumerate(context.paths):
            path = tuple(int(t) for t in raw_path)
            if not path:
                matcher = self._matcher
            else:
                if work is None or path[: len(work_path)] != work_path:
                    work, work_path = self._matcher.deep_copy(), ()
                if not all(self._advance(work, t) for t in path[len(work_path) :]):
                    work, work_path = None, ()
                    continue  # its bits stay 0: every token masked
                matcher, work_path = work, path
            self._llg.numpy.fill_next_token_bitmask(matcher, bits, index)
        allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :vocab].astype(bool)
        rows[~allowed] = NEG_INF
        return rows
