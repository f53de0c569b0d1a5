"""The runner binds and runs through onnxruntime's private C++ objects only on known-good onnxruntime versions,
and its public fallback gives the same logits."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest

from decoctl.host import Sequence
from decoctl.model import _runner as runner_module
from decoctl.model import load_model
from decoctl.model._runner import PUBLIC_ORT_ENV, binding_calls, private_ort_supported


def _decode(folder: Path) -> tuple[Sequence, list[np.ndarray]]:
    """A prompt, five greedy steps and a two-token forward; every logits row on the way."""
    sequence = Sequence("target", load_model(folder, threads=1), max_length=32)
    rows = [np.array(sequence.prefill([1, 2, 3]))]
    for _ in range(5):
        rows.append(np.array(sequence.forward([int(rows[-1][-1].argmax())])))
    rows.append(np.array(sequence.forward([4, 5])))
    return sequence, rows


@pytest.mark.parametrize(
    ("version", "supported"),
    [("1.20.0", True), ("1.32.0", True), ("1.21.1.dev20240601", True), ("1.19.2", False), ("1.33.0", False)],
)
def test_only_known_good_onnxruntime_versions_get_the_private_path(version: str, supported: bool) -> None:
    assert private_ort_supported(version) is supported


def test_the_public_path_gives_the_private_paths_logits(any_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PUBLIC_ORT_ENV, "1")
    public, public_rows = _decode(any_model)
    monkeypatch.delenv(PUBLIC_ORT_ENV)
    default, default_rows = _decode(any_model)
    assert public._runner._fast.private is False
    assert default._runner._fast.private is private_ort_supported(ort.__version__)
    assert public.tokens.tolist() == default.tokens.tolist()
    for got, expected in zip(public_rows, default_rows, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_an_unknown_onnxruntime_version_takes_the_public_path(
    genai_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module.ort, "__version__", "1.99.0")
    sequence, _ = _decode(genai_model)
    assert sequence._runner._fast.private is False


def test_a_build_without_the_private_objects_takes_the_public_path() -> None:
    session = SimpleNamespace(run_with_iobinding=lambda binding: None)  # no _sess
    binding = SimpleNamespace(bind_input=None, bind_output=None)  # no _iobinding
    assert binding_calls(session, binding, private=True).private is False  # type: ignore[arg-type]
