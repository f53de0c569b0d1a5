"""Random programs of fork, reorder, release, step, rewind and per-row forwards keep every row exact.

Each example drives one role's rows (decoctl.host.Rows) with a random sequence of operations and tracks, beside them,
the tokens each row must hold. Every logits row a step or forward returns must equal a from-scratch pass over that
row's tokens (decoctl.testing.reference_logits), and at the end every live row is stepped once more, which checks
the KV cache it was left with. Three models: the plain builder layout, one with tree inputs and a sliding window
of 3 (bias rows and positions per row), and Optimum's layout (a concatenated KV cache: every row keeps a cache of
its own, reorder hands them round and copies, a step is one Run per row).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoctl.host import Rows
from decoctl.model import load_model
from decoctl.model._loader import LoadedModel
from decoctl.testing import build_genai_model, build_optimum_model, reference_logits

ATOL = 1e-4
CAPACITY = 4
MAX_LENGTH = 20
OPERATIONS = ("fork", "release", "reorder", "step", "step_some", "rewind", "forward")
#: small enough for the three models to run in about 30 seconds on one core
PROGRAMS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module", params=["plain", "tree-windowed", "optimum"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    if request.param == "optimum":
        return load_model(build_optimum_model(tmp_path_factory.mktemp("optimum"), seed=7), threads=1)
    extra = {} if request.param == "plain" else {"tree_inputs": True, "local_window_size": 3}
    folder = build_genai_model(tmp_path_factory.mktemp(request.param), seed=7, num_layers=2, **extra)
    return load_model(folder, threads=1)


@functools.lru_cache(maxsize=4096)
def expected_logits(folder: Path, tokens: tuple[int, ...]) -> np.ndarray:
    return reference_logits(folder, tokens)


class Program:
    """Rows and the tokens each must hold; every operation checks the logits it gets back."""

    def __init__(self, model: LoadedModel, data: st.DataObject) -> None:
        self.rows = Rows("target", model, capacity=CAPACITY, max_length=MAX_LENGTH)
        self.folder = model.spec.path
        self.data = data
        self.token = st.integers(0, model.spec.vocab_size - 1)
        self.expected: dict[int, list[int]] = {0: []}

    def check(self, row: int, logits: np.ndarray) -> None:
        """``logits`` float32[n, vocab]: the rows of row ``row``'s last n tokens."""
        tokens = self.expected[row]
        assert self.rows[row].tokens.tolist() == tokens
        reference = expected_logits(self.folder, tuple(tokens))[len(tokens) - len(logits) :]
        np.testing.assert_allclose(logits, reference, atol=ATOL)

    def room(self, row: int) -> int:
        return MAX_LENGTH - len(self.expected[row])

    def draw(self, strategy: st.SearchStrategy, label: str) -> object:
        return self.data.draw(strategy, label=label)

    # -- operations (each returns False when it cannot run in this state) ----------------------------------
    def fork(self) -> bool:
        if len(self.rows) == CAPACITY:
            return False
        parent = self.draw(st.sampled_from(self.rows.ids), "fork of")
        child = self.rows.fork(parent)
        assert child not in self.expected
        self.expected[child] = list(self.expected[parent])
        return True

    def release(self) -> bool:
        if len(self.rows) == 1:
            return False
        row = self.draw(st.sampled_from(self.rows.ids[1:]), "release")
        self.rows.release(row)
        del self.expected[row]
        return True

    def reorder(self) -> bool:
        prefix = next(i for i in range(CAPACITY + 1) if i not in self.expected)  # rows 0..prefix-1 are live
        count = self.draw(st.integers(1, prefix), "rows reordered")
        parents = self.draw(st.lists(st.sampled_from(self.rows.ids), min_size=count, max_size=count), "parents")
        self.rows.reorder(parents)
        before = {row: list(tokens) for row, tokens in self.expected.items()}
        for row, parent in enumerate(parents):
            self.expected[row] = list(before[parent])
        return True

    def step(self, some: bool) -> bool:
        ready = [row for row in self.rows.ids if self.room(row) > 0]
        if not ready:
            return False
        chosen = self.draw(st.lists(st.sampled_from(ready), min_size=1, unique=True), "stepped") if some else ready
        fed = self.draw(st.lists(self.token, min_size=len(chosen), max_size=len(chosen)), "step tokens")
        every = list(chosen) == list(self.rows.ids)  # the default: every live row
        logits = np.array(self.rows.step(fed, rows=None if every else chosen))
        for i, row in enumerate(chosen):
            self.expected[row].append(fed[i])
            self.check(row, logits[i : i + 1])
            np.testing.assert_array_equal(np.array(self.rows[row].logits())[-1], logits[i])
        return True

    def rewind(self) -> bool:
        row = self.draw(st.sampled_from(self.rows.ids), "rewind")
        length = self.draw(st.integers(0, len(self.expected[row])), "to length")
        self.rows[row].rewind(length)
        del self.expected[row][length:]
        return True

    def forward(self) -> bool:
        """A multi-token forward on one row (GroupQueryAttention runs those one row at a time)."""
        ready = [row for row in self.rows.ids if self.room(row) > 1]
        if not ready:
            return False
        row = self.draw(st.sampled_from(ready), "forward on")
        fed = self.draw(st.lists(self.token, min_size=2, max_size=min(4, self.room(row))), "forward tokens")
        logits = np.array(self.rows[row].forward(fed))
        self.expected[row] += fed
        self.check(row, logits)
        return True

    def run(self, name: str) -> bool:
        if name in ("step", "step_some"):
            return self.step(some=name == "step_some")
        done: bool = getattr(self, name)()
        return done


@PROGRAMS
@given(data=st.data())
def test_every_row_stays_equal_to_a_from_scratch_pass_over_its_tokens(model: LoadedModel, data: st.DataObject) -> None:
    program = Program(model, data)
    prompt = data.draw(st.lists(program.token, min_size=1, max_size=6), label="prompt")
    program.expected[0] += prompt
    program.check(0, np.array(program.rows[0].forward(prompt)))

    for name in data.draw(st.lists(st.sampled_from(OPERATIONS), min_size=3, max_size=14), label="program"):
        program.run(name)
        assert program.rows.ids == tuple(sorted(program.expected))

    # the KV cache every row was left with: one more token on each row with room, all in one step
    ready = [row for row in program.rows.ids if program.room(row) > 0]
    if ready:
        tokens = [row % 7 for row in ready]
        logits = np.array(program.rows.step(tokens, rows=ready))
        for i, row in enumerate(ready):
            program.expected[row].append(tokens[i])
            program.check(row, logits[i : i + 1])
