"""The grammar processor (llguidance): masks what the grammar forbids, advances only on committed tokens, and
evaluates drafted paths on copies, so speculative verification sees what plain decoding would."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl import ConfigError, ControllerError, Generator, ProcessContext
from decoctl.model import Tokenizer
from decoctl.plugins import PluginRegistry
from decoctl.testing import EOS_TOKEN_ID

VOCAB = 400  # wider than the tokenizer's 384 tokens, as a model's padded vocabulary often is
REGEX = "ab[0-9]{2}"


def context(tokenizer: Tokenizer, paths: list[list[int]] | None = None) -> ProcessContext:
    empty = np.zeros(0, np.int64)
    return ProcessContext(empty, empty, paths or [[]], eos_token_ids=frozenset({EOS_TOKEN_ID}), tokenizer=tokenizer)


def allowed(grammar: Any, tokenizer: Tokenizer, paths: list[list[int]] | None = None) -> list[set[int]]:
    rows = np.zeros((len(paths or [[]]), VOCAB), np.float32)
    return [set(np.flatnonzero(row > -np.inf)) for row in grammar(rows, context(tokenizer, paths))]


@pytest.fixture
def regex(build: Any) -> Any:
    return build([{"name": "grammar", "regex": REGEX}])


def ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)


def test_the_first_row_allows_only_tokens_that_can_start_a_match(regex: Any, tokenizer: Tokenizer) -> None:
    (first,) = allowed(regex, tokenizer)
    assert first, "some token must be allowed"
    assert all(re.fullmatch(r"a(b[0-9]{0,2})?", tokenizer.decode([t])) for t in first)
    assert ids(tokenizer, "a")[0] in first
    assert ids(tokenizer, "b")[0] not in first
    assert EOS_TOKEN_ID not in first


def test_commit_advances_the_grammar(regex: Any, tokenizer: Tokenizer) -> None:
    regex.commit(ids(tokenizer, "ab"))
    (row,) = allowed(regex, tokenizer)
    assert row and all(re.fullmatch("[0-9]{1,2}", tokenizer.decode([t])) for t in row)
    assert ids(tokenizer, "7")[0] in row


def test_drafted_paths_do_not_advance_the_grammar(regex: Any, tokenizer: Tokenizer) -> None:
    before = allowed(regex, tokenizer)
    allowed(regex, tokenizer, [[], ids(tokenizer, "a"), ids(tokenizer, "ab")])
    assert allowed(regex, tokenizer) == before


def test_drafted_rows_equal_rows_after_committing_the_draft(build: Any, tokenizer: Tokenizer) -> None:
    draft = ids(tokenizer, "ab1")
    grammar = build([{"name": "grammar", "regex": REGEX}])
    together = allowed(grammar, tokenizer, [draft[:i] for i in range(len(draft) + 1)])
    for i in range(len(draft) + 1):
        plain = build([{"name": "grammar", "regex": REGEX}])
        plain.commit(draft[:i])
        assert allowed(plain, tokenizer) == [together[i]]


def test_a_row_after_a_drafted_token_the_grammar_rejects_is_fully_masked(regex: Any, tokenizer: Tokenizer) -> None:
    bad = ids(tokenizer, "b")
    rows = allowed(regex, tokenizer, [[], bad, [*bad, *ids(tokenizer, "a")], ids(tokenizer, "a")])
    assert rows[1] == set() and rows[2] == set()
    assert rows[3] == {t for t in rows[3] if re.fullmatch(r"b([0-9]{0,2})", tokenizer.decode([t]))}
    assert rows[3]


def test_the_chain_takes_a_drafted_row_the_grammar_masks_after_a_rejected_token(
    build: Any, tokenizer: Tokenizer
) -> None:
    chain = build([{"name": "grammar", "regex": REGEX}])
    bad, good = ids(tokenizer, "b"), ids(tokenizer, "a")
    rows = np.zeros((3, VOCAB), np.float32)
    paths = [[], bad, good]  # no verifier reaches the row after "b": the first row gives "b" no probability
    out = chain(rows, context(tokenizer, paths))
    assert np.all(out[1] == -np.inf) and np.any(out[2] > -np.inf)
    assert chain.argmax(np.zeros((3, VOCAB), np.float32), context(tokenizer, paths))[2] in set(
        np.flatnonzero(out[2] > -np.inf)
    )


def test_a_chain_of_two_grammars_is_refused(build: Any) -> None:
    # they would leave a row no token wherever they disagree ("a" against "b": at once)
    with pytest.raises(ConfigError, match="a chain takes one"):
        build([{"name": "grammar", "regex": "a"}, {"name": "grammar", "regex": "b"}])


def test_a_complete_match_allows_only_eos(regex: Any, tokenizer: Tokenizer) -> None:
    regex.commit(ids(tokenizer, "ab12"))
    assert allowed(regex, tokenizer) == [{EOS_TOKEN_ID}]
    regex.commit([EOS_TOKEN_ID])


def test_committing_a_token_the_grammar_forbids_raises(regex: Any, tokenizer: Tokenizer) -> None:
    allowed(regex, tokenizer)
    with pytest.raises(ControllerError, match="grammar does not allow it"):
        regex.commit(ids(tokenizer, "b"))


def test_reset_starts_the_grammar_over(regex: Any, tokenizer: Tokenizer) -> None:
    first = allowed(regex, tokenizer)
    regex.commit(ids(tokenizer, "ab"))
    regex.reset(np.zeros(3, np.int64))
    assert allowed(regex, tokenizer) == first


def test_tokens_committed_before_the_first_row_are_replayed(regex: Any, tokenizer: Tokenizer) -> None:
    regex.commit(ids(tokenizer, "ab12"))
    assert allowed(regex, tokenizer) == [{EOS_TOKEN_ID}]


def test_a_json_schema_masks_the_first_token(build: Any, tokenizer: Tokenizer) -> None:
    grammar = build([{"name": "grammar", "json_schema": '{"type": "integer"}'}])
    (first,) = allowed(grammar, tokenizer)
    assert ids(tokenizer, "1")[0] in first and ids(tokenizer, "-")[0] in first
    assert ids(tokenizer, "a")[0] not in first and ids(tokenizer, "{")[0] not in first


def test_a_json_schema_given_as_a_toml_table_works(build: Any, tokenizer: Tokenizer) -> None:
    grammar = build([{"name": "grammar", "json_schema": {"type": "object", "required": ["a"]}}])
    (first,) = allowed(grammar, tokenizer)
    assert ids(tokenizer, "{")[0] in first and ids(tokenizer, "1")[0] not in first


def test_a_lark_grammar_masks_the_first_token(build: Any, tokenizer: Tokenizer) -> None:
    grammar = build([{"name": "grammar", "lark": 'start: "yes" | "no"'}])
    (first,) = allowed(grammar, tokenizer)
    assert {tokenizer.decode([t])[:1] for t in first} == {"y", "n"}


@pytest.mark.parametrize("controller", ["chain", "greedy", "sample"])
def test_a_generation_under_a_regex_matches_it_and_ends(
    controller: str, tiny_model: Path, registry: PluginRegistry
) -> None:
    generator = Generator(
        {"target": tiny_model}, controller, processors=[{"name": "grammar", "regex": "[0-9]{3}"}], registry=registry
    )
    for seed in range(3):
        result = generator.generate("def fib(n):", max_new_tokens=12, seed=seed)
        assert re.fullmatch("[0-9]{3}", result.text)
        assert result.stats.stop_reason == "eos"
