"""Debug mode (DECOCTL_DEBUG=1): a logits or hidden-state pointer kept past its lifetime reads NaN, from C or from
a Python view that escaped the stale-view guard; normal mode hands out the runner's own buffers, untouched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from decoctl import Generator
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.plugins import PluginRegistry

PROMPT = "def fib(n):"


def stale_rows(model: Path, library: Path, registry: PluginRegistry) -> dict[str, int]:
    generator = Generator({"target": model}, f"{library}:stale_rows", registry=registry, threads=1)
    result = generator.generate(PROMPT, max_new_tokens=4)
    assert (
        result.tokens
        == Generator({"target": model}, registry=registry, threads=1).generate(PROMPT, max_new_tokens=4).tokens
    )  # debug mode or not, the output is greedy's: only the stale rows are poisoned
    stats: dict[str, int] = result.stats.controller
    return stats


def test_a_c_controller_reading_a_stale_pointer_reads_nan_in_debug_mode(
    genai_model: Path, misbehave: Path, registry: PluginRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DECOCTL_DEBUG", "1")
    seen = stale_rows(genai_model, misbehave, registry)
    assert seen == {"logits_width": 384, "nan_logits": 384, "hidden_width": 64, "nan_hidden": 64, "nan_current": 0}


def test_outside_debug_mode_a_stale_pointer_reads_plausible_numbers(
    genai_model: Path, misbehave: Path, registry: PluginRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DECOCTL_DEBUG", raising=False)
    seen = stale_rows(genai_model, misbehave, registry)
    assert (seen["nan_logits"], seen["nan_hidden"], seen["nan_current"]) == (0, 0, 0)


def raw(view: np.ndarray) -> np.ndarray:
    """The memory behind a host view, as a pointer kept by C sees it (no stale-view guard)."""
    return view.view(np.ndarray)


@pytest.mark.parametrize("retire", ["forward", "one_token_forward", "rewind", "keep"])
def test_every_primitive_that_ends_a_views_lifetime_poisons_it_in_debug_mode(retire: str, genai_model: Path) -> None:
    sequence = Sequence("target", load_model(genai_model, threads=1), debug=True)
    sequence.prefill([5, 6, 7])
    sequence.forward([8, 9])
    logits, hidden = raw(sequence.logits()), raw(sequence.hidden_states())
    kept = np.array(logits)
    assert np.isfinite(kept).all() and np.isfinite(hidden).all()
    if retire == "forward":
        sequence.forward([10, 11])
    elif retire == "one_token_forward":
        sequence.forward((10,))
    elif retire == "rewind":
        sequence.rewind(4)
    else:
        sequence.keep([0])
    assert np.isnan(logits).all() and np.isnan(hidden).all()
    if retire.endswith("forward"):
        fresh = raw(sequence.logits())
        assert np.isfinite(fresh).all()
        assert fresh.ctypes.data != logits.ctypes.data
    else:  # both left 5, 6, 7, 8: feeding 9 again gives the same row, in a new buffer
        again = raw(sequence.forward([9]))
        np.testing.assert_allclose(again, kept[1:], rtol=1e-5, atol=1e-5)


def test_normal_mode_hands_out_the_runners_own_buffers(genai_model: Path) -> None:
    sequence = Sequence("target", load_model(genai_model, threads=1), debug=False)
    sequence.prefill([5, 6, 7])
    first = sequence.forward((8,))
    address = first.ctypes.data
    sequence.forward((9,))
    assert sequence.logits().ctypes.data == address  # no copy per forward: the same buffer, rewritten
    assert np.isfinite(first).all()  # and nothing poisoned
