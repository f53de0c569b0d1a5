"""Bad configuration is a ConfigError naming the problem, raised when the chain is parsed: before any model is
loaded, so before generation starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chain_cases import random_case

from decoctl import ConfigError, Generator
from decoctl.plugins import PluginRegistry

BAD = [
    ("top_q=0.9", "unknown logits processor 'top_q'"),
    ("top_p=1.5", "top_p=1.5 must be at most 1"),
    ("top_p=-0.1", "must be at least 0"),
    ("temperature=-1", "temperature=-1.0 must be above 0.0"),
    ("temperature=0", "temperature=0.0 must be above 0.0"),
    ("top_k=0", "must be at least 1"),
    ("top_k=many", "is not an int"),
    ("typical_p=1", "typical_p=1.0 must be below 1.0"),
    ("epsilon=0", "epsilon=0.0 must be above 0.0"),
    ("eta=1.5", "eta=1.5 must be below 1.0"),
    ("repetition_penalty=0", "penalty=0.0 must be above 0.0"),
    ("no_repeat_ngram=0", "must be at least 1"),
    ("logit_bias", "needs biases"),
    ("logit_bias=13", "must be TOKEN:BIAS"),
    ("logit_bias=13:lots", "is not a number"),
    ("bad_words=5 6 | ", "empty sequence"),
    ("suppress_tokens=-3", "is not a token id"),
    ("grammar", "needs exactly one of regex, json_schema, lark"),
    ("grammar=[0-9", "the regex does not compile"),
    ("greedy,temperature=0.5", "'greedy' ends a chain"),
    ("sample,top_k=5", "'sample' ends a chain"),
    ("greedy=1", "takes no value"),
    ([{"name": "top_k", "top_k": 5, "keep": 2}], "has no option 'keep'"),
    ([{"name": "grammar", "regex": "a", "lark": 'start: "a"'}], "needs exactly one"),
    ([{"name": "grammar", "lark": "start: missing"}], "the lark does not compile"),
    ([{"name": "grammar", "json_schema": "{not json"}], "json_schema is not a JSON object"),
    ([{"name": "grammar", "json_schema": '{"type": "wat"}'}], "the json_schema does not compile"),
]


@pytest.mark.parametrize(("chain", "message"), BAD, ids=[str(c) for c, _ in BAD])
def test_bad_configuration_fails_before_the_model_is_loaded(
    chain: Any, message: str, registry: PluginRegistry, tmp_path: Path
) -> None:
    missing_model = tmp_path / "no-such-model"  # a ConfigError, not a ModelLoadError: nothing was loaded
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        Generator({"target": missing_model}, "chain", processors=chain, registry=registry)


def test_token_ids_outside_the_vocabulary_are_named(build: Any) -> None:
    rows, context = random_case(0, vocab=64)
    with pytest.raises(ConfigError, match=r"token id\(s\) \[64, 99\] are outside the model's vocabulary of 64"):
        build("suppress_tokens=3 64 99")(rows, context)


@pytest.mark.parametrize(
    ("chain", "value"),
    [
        ([{"name": "bad_words", "sequences": [[5, 6], [9]]}], ((5, 6), (9,))),
        ([{"name": "bad_words", "sequences": "[[5, 6], [9]]"}], ((5, 6), (9,))),
        ("bad_words=5 6|9", ((5, 6), (9,))),
    ],
)
def test_token_sequences_come_from_a_string_or_a_run_file_list(chain: Any, value: Any, build: Any) -> None:
    assert build(chain).processors[0].sequences == value


def test_logit_biases_come_from_pairs_or_a_table(build: Any) -> None:
    rows, context = random_case(0)
    pairs = build("logit_bias=3:-2 7:1.5")(rows.copy(), context)
    table = build([{"name": "logit_bias", "biases": {"3": -2, "7": 1.5}}])(rows.copy(), context)
    np.testing.assert_array_equal(pairs, table)
    np.testing.assert_allclose(pairs[:, [3, 7]], rows[:, [3, 7]] + [-2, 1.5])
