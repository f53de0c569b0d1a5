"""Token ids and biases written as values: nan, +inf and booleans are refused, -inf bans a token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chain_cases import random_case

from decoctl import ConfigError, Generator
from decoctl.plugins import PluginRegistry

BAD = [
    ("top_p=nan", "top_p='nan' is not a float: not a finite number"),
    ("temperature=inf", "temperature='inf' is not a float: not a finite number"),
    ("logit_bias=13:nan", "bias 'nan' of token '13' must be a finite number or -inf"),
    ("logit_bias=13:inf", "bias 'inf' of token '13' must be a finite number or -inf"),
    ("sequence_bias=5 6:nan", "bias 'nan' of sequence"),
    ([{"name": "logit_bias", "biases": {"13": True}}], "bias True of token '13' is not a number"),
    ([{"name": "suppress_tokens", "tokens": [True]}], "True is not a token id"),
    ([{"name": "suppress_tokens", "tokens": "[Infinity]"}], "inf is not a token id"),
    ([{"name": "top_k", "top_k": 2.5}], "top_k=2.5 is not an int: not a whole number"),
    ([{"name": "top_p", "top_p": True}], "a boolean is not a number"),
]


@pytest.mark.parametrize(("chain", "message"), BAD, ids=[str(c) for c, _ in BAD])
def test_values_that_are_not_numbers_are_refused(
    chain: Any, message: str, registry: PluginRegistry, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        Generator({"target": tmp_path / "no-such-model"}, "chain", processors=chain, registry=registry)


def test_a_bias_of_minus_infinity_bans_the_token(build: Any) -> None:
    rows, context = random_case(0)
    assert np.isneginf(build("logit_bias=13:-inf")(rows, context)[:, 13]).all()


def test_every_processor_schema_holds_its_own_defaults(registry: PluginRegistry) -> None:
    assert registry.processors()  # building the specs checks each default against its bounds
