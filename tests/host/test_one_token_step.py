"""A one-token forward takes the runner's step path whatever container holds the token (the decode step of
every controller, the hookspec's example `forward([token])` included)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

from decoctl.host import Sequence
from decoctl.model import load_model

CONTAINERS: dict[str, Callable[[list[int]], Any]] = {
    "list": list,
    "tuple": tuple,
    "int64 array": lambda ids: np.array(ids, np.int64),
    "int32 array": lambda ids: np.array(ids, np.int32),
    "numpy ints in a list": lambda ids: [np.int64(i) for i in ids],
}


def _prefilled(folder: Path) -> Sequence:
    sequence = Sequence("target", load_model(folder, threads=1), max_length=32)
    sequence.prefill([1, 2, 3])
    return sequence


@pytest.mark.parametrize("container", CONTAINERS.values(), ids=CONTAINERS.keys())
def test_one_token_takes_the_step_path_in_any_container(genai_model: Path, container: Callable[..., Any]) -> None:
    sequence = _prefilled(genai_model)
    runner = sequence._runner
    with mock.patch.object(runner, "step", wraps=runner.step) as step:
        sequence.forward(container([5]))
        sequence.forward(container([6]))
    assert [c.args for c in step.call_args_list] == [(5,), (6,)]
    assert all(type(c.args[0]) is int for c in step.call_args_list)
    assert sequence.tokens.tolist() == [1, 2, 3, 5, 6]


@pytest.mark.parametrize("container", CONTAINERS.values(), ids=CONTAINERS.keys())
def test_one_token_gives_the_same_logits_in_any_container(genai_model: Path, container: Callable[..., Any]) -> None:
    given, reference = _prefilled(genai_model), _prefilled(genai_model)
    for token in (5, 6, 7):
        np.testing.assert_array_equal(np.array(given.forward(container([token]))), reference.forward((token,)))


def test_several_tokens_and_trees_keep_the_general_path(genai_model: Path) -> None:
    sequence = _prefilled(genai_model)
    runner = sequence._runner
    with mock.patch.object(runner, "step", wraps=runner.step) as step:
        sequence.forward([5, 6])
        sequence.forward(np.array([[7]], np.int64))  # a 2-d array: read as its flattened ids
        sequence.forward(8)  # type: ignore[arg-type]  # a bare id, as numpy reads it
    step.assert_not_called()
    assert sequence.tokens.tolist() == [1, 2, 3, 5, 6, 7, 8]
