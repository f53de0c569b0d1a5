"""Bad input to several rows (issue 22): a batch or beam width the memory cannot hold, a fork beyond the buffer, a
reorder naming a row that is not there, sample-only processors with beam search. Each is a clear error, and a
generation that was running when it happened keeps the text it had made (GenerationError.text)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl import (
    ConfigError,
    ControllerSpec,
    GenerationError,
    Generator,
    Option,
    ProcessorSpec,
    SequenceError,
    hookimpl,
)
from decoctl.cli import main
from decoctl.host import Host, Rows
from decoctl.model import load_model
from decoctl.model._kv_rows import SharedKVRows
from decoctl.model._loader import LoadedModel
from decoctl.plugins import PluginRegistry

PROMPTS = ["def f(x):", "import os", "class A:", "x = 1"]


@pytest.fixture
def model(genai_model: Path) -> LoadedModel:
    return load_model(genai_model, threads=1)


def row_bytes(model: LoadedModel, length: int) -> int:
    return SharedKVRows.row_bytes(model.spec, np.dtype(np.float32), length)


@pytest.fixture
def memory_for_three_rows(monkeypatch: pytest.MonkeyPatch, model: LoadedModel) -> None:
    """The system has memory for three rows of 256 positions of the test model (what a short generation takes), and
    no more."""
    monkeypatch.setattr("decoctl.model._kv_rows.available_memory", lambda: 3 * row_bytes(model, 256) + 100)


# -- a batch larger than the memory holds ---------------------------------------------------------------------
@pytest.mark.usefixtures("memory_for_three_rows")
def test_rows_beyond_the_available_memory_name_how_many_fit(model: LoadedModel) -> None:
    with pytest.raises(
        ConfigError,
        match=r"needs 8 rows of 256 positions, 1.0 MiB of KV cache .* \(128.5 KiB a row\).*use at most 3 rows",
    ):
        Rows("target", model, capacity=8, max_length=256)


@pytest.mark.usefixtures("memory_for_three_rows")
def test_rows_that_fit_in_the_available_memory_are_made(model: LoadedModel) -> None:
    assert Rows("target", model, capacity=3, max_length=256).capacity == 3


def test_rows_are_made_where_the_available_memory_is_unknown(
    monkeypatch: pytest.MonkeyPatch, model: LoadedModel
) -> None:
    monkeypatch.setattr("decoctl.model._kv_rows.available_memory", lambda: None)
    assert Rows("target", model, capacity=8, max_length=64).capacity == 8


@pytest.mark.usefixtures("memory_for_three_rows")
def test_a_batch_the_memory_cannot_hold_is_refused_before_any_prompt_runs(genai_model: Path) -> None:
    generator = Generator({"target": genai_model}, threads=1)
    with pytest.raises(ConfigError, match=r"needs 4 rows.*use at most 3 rows \(a smaller batch_size"):
        generator.generate_batch(PROMPTS, batch_size=4, max_new_tokens=8)
    assert len(generator.generate_batch(PROMPTS, batch_size=3, max_new_tokens=8)) == 4


@pytest.mark.usefixtures("memory_for_three_rows")
def test_the_command_line_says_which_batch_size_fits(
    genai_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    code = main(["generate", "-m", str(genai_model), "--prompts", str(prompts), "--batch-size", "4", "-n", "8"])
    assert code == 2
    assert "use at most 3 rows" in capsys.readouterr().err


# -- fork and reorder beyond the rows -------------------------------------------------------------------------
def test_a_fork_of_a_row_beyond_the_buffer_names_the_capacity(model: LoadedModel) -> None:
    rows = Rows("target", model, capacity=2, max_length=16)
    rows[0].forward([1, 2])
    with pytest.raises(SequenceError, match=r"no row 5: its live rows are \[0\] of 2"):
        rows.fork(5)


@pytest.mark.parametrize(
    ("parents", "message"),
    [
        ([0, 7], r"parent 7 \(of row 1\) is not a live row; the live rows are \[0, 1\] of 3"),
        ([-1], r"parent -1 \(of row 0\) is not a live row"),
        ([2], r"parent 2 \(of row 0\) is not a live row"),  # released
        ([0, 1, 1], r"3 parents reorder rows 0..2, but row 2 is not live"),
        ([0.0, 1.0], r"parents are row ids, whole numbers \(not float64\)"),
    ],
)
def test_a_reorder_naming_rows_that_are_not_there_is_refused(
    model: LoadedModel, parents: list[Any], message: str
) -> None:
    rows = Rows("target", model, capacity=3, max_length=16)
    rows[0].forward([1, 2])
    rows.fork(0)
    rows.release(rows.fork(0))
    with pytest.raises(SequenceError, match=message):
        rows.reorder(parents)
    assert [rows[r].tokens.tolist() for r in rows.ids] == [[1, 2], [1, 2]]  # nothing moved


class Misbehaving:
    """Greedy for three tokens, then one bad call on the rows: forks past the buffer or reorders from row 5."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.mistake = options["mistake"]
        self.steps = 0

    def start(self, host: Host) -> None:
        del host

    def step(self, host: Host) -> None:
        token = int(host.argmax(host.target.logits()[-1:])[0])
        host.commit((token,))
        host.target.forward((token,))
        self.steps += 1
        if self.steps == 3:
            rows = host.rows("target")
            if self.mistake == "fork":
                rows.fork(0)
                rows.fork(0)
            else:
                rows.reorder([5])


class MisbehavingPlugin:
    @hookimpl
    def decoctl_controllers(self) -> list[ControllerSpec]:
        mistake = Option(name="mistake", type="str", default="fork", choices=("fork", "reorder"))
        return [
            ControllerSpec(
                name="misbehaving", summary="test", factory=Misbehaving, rows_for=lambda o: 2, options=(mistake,)
            )
        ]


@pytest.mark.parametrize(
    ("mistake", "message"), [("fork", "all 2 rows are live"), ("reorder", r"parent 5 \(of row 0\) is not a live row")]
)
def test_a_bad_fork_or_reorder_inside_a_generation_keeps_the_text_so_far(
    genai_model: Path, registry: PluginRegistry, mistake: str, message: str
) -> None:
    registry.register(MisbehavingPlugin(), "misbehaving")
    # a prompt whose first three tokens decode to whole characters, so the text so far is all of them
    expected = Generator({"target": genai_model}, registry=registry).generate("return", max_new_tokens=3)
    generator = Generator({"target": genai_model}, "misbehaving", options={"mistake": mistake}, registry=registry)

    with pytest.raises(GenerationError, match=message) as raised:
        generator.generate("return", max_new_tokens=10)

    assert expected.text == 'ão":tot'
    assert raised.value.tokens == list(expected.tokens)
    assert raised.value.text == expected.text


# -- sample-only processors where nothing is drawn ------------------------------------------------------------
class Sharpen:
    """A stand-in for temperature: sample-only."""

    sample_only = True
    stateless = True

    def __call__(self, rows: np.ndarray, context: object) -> np.ndarray:
        return rows * np.float32(2.0)


class Nudge:
    """A processor that is not sample-only."""

    stateless = True

    def __call__(self, rows: np.ndarray, context: object) -> np.ndarray:
        return rows


class ProcessorsPlugin:
    @hookimpl
    def decoctl_logits_processors(self) -> list[ProcessorSpec]:
        return [
            ProcessorSpec(name="sharpen", summary="test", factory=lambda o: Sharpen()),
            ProcessorSpec(name="nudge", summary="test", factory=lambda o: Nudge()),
        ]

    @hookimpl
    def decoctl_controllers(self) -> list[ControllerSpec]:
        return [ControllerSpec(name="ranking", summary="test", factory=Misbehaving, sampling_processors=False)]


def test_a_controller_that_draws_nothing_refuses_sample_only_processors_before_loading(
    registry: PluginRegistry,
) -> None:
    registry.register(ProcessorsPlugin(), "test-processors")
    with pytest.raises(ConfigError, match=r"controller 'ranking' .* sample-only processors \(sharpen\)"):
        Generator({"target": "/no/such/model"}, "ranking", processors="nudge,sharpen", registry=registry)


def test_processors_that_are_not_sample_only_serve_a_controller_that_draws_nothing(
    genai_model: Path, registry: PluginRegistry
) -> None:
    registry.register(ProcessorsPlugin(), "test-processors")
    assert Generator({"target": genai_model}, "ranking", processors="nudge", registry=registry).chain


def test_beam_search_refuses_sample_only_processors(registry: PluginRegistry) -> None:
    registry.register(ProcessorsPlugin(), "test-processors")
    with pytest.raises(ConfigError, match=r"controller 'beam' ranks continuations.*remove them from the chain"):
        Generator({"target": "/no/such/model"}, "beam", processors="sharpen", registry=registry)


def test_sampling_controllers_keep_sample_only_processors(genai_model: Path, registry: PluginRegistry) -> None:
    registry.register(ProcessorsPlugin(), "test-processors")
    for controller in ("sample", "greedy"):
        assert Generator({"target": genai_model}, controller, processors="sharpen", registry=registry).chain


@pytest.mark.usefixtures("memory_for_three_rows")
def test_more_beams_than_the_memory_holds_are_refused_before_the_search(genai_model: Path) -> None:
    generator = Generator({"target": genai_model}, "beam", options={"num_beams": 8}, threads=1)
    with pytest.raises(ConfigError, match=r"needs 8 rows.*num_beams"):
        generator.generate("def f(x):", max_new_tokens=8)
