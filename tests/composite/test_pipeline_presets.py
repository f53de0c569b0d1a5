"""Every folder runs a pipeline description, lowered at load by one function: a plain decoder its decoder-only
preset, a vision-language folder the description its genai_config.json implies, a split export its pipeline.json
(the split prefill/decode preset). `decoctl models pipeline` prints the one a folder runs, in pipeline.json's
format, and that printout written as the folder's pipeline.json runs the same. A hidden-state tap a controller
reads but the pipeline does not give on every forward is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from split_models import split_export
from vlm_models import Llava

from decoctl.cli import main
from decoctl.errors import CapabilityError, ModelLoadError
from decoctl.generation._opening import check_models
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.model._pipeline import decoder_only, split_prefill, to_json
from decoctl.specs import ControllerSpec
from decoctl.testing import build_genai_model

CHUNK = 8


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("plain") / "m", seed=4, num_layers=2, hidden_states=True)


def _printed(folder: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["models", "pipeline", str(folder)]) == 0
    printed: dict[str, Any] = json.loads(capsys.readouterr().out)
    return printed


def _with_description(folder: Path, copy: Path, description: dict[str, Any]) -> Path:
    shutil.copytree(folder, copy)
    (copy / "pipeline.json").write_text(json.dumps(description), encoding="utf-8")
    return copy


def test_a_decoder_only_folder_runs_its_preset(plain: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = load_model(plain, threads=1)

    assert model.pipeline is not None
    assert [(s.name, s.phase, s.host_inputs) for s in model.pipeline.stages] == [("decoder", "step", ("*",))]
    assert _printed(plain, capsys) == to_json(decoder_only("model.onnx"))


def test_the_decoder_only_preset_as_pipeline_json_runs_the_same(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    described = load_model(_with_description(plain, tmp_path / "m", _printed(plain, capsys)), threads=1)
    logits = [np.array(Sequence("target", m).forward([5, 6, 7, 8])) for m in (load_model(plain, threads=1), described)]

    np.testing.assert_allclose(logits[1], logits[0], atol=1e-6)


def test_a_vision_language_folder_prints_what_its_genai_config_implies(
    llava: Llava, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    printed = _printed(llava.onnx, capsys)

    assert printed["sessions"]["vision"]["phase"] == "generation"
    assert printed["sessions"]["embedding"]["phase"] == "chunk"
    assert {"from": "embedding.inputs_embeds", "to": "decoder.inputs_embeds"} in printed["edges"]
    described = load_model(_with_description(llava.onnx, tmp_path / "m", printed), threads=1)
    assert described.vision is not None
    assert described.pipeline is not None and described.pipeline.origin.endswith("pipeline.json")


def test_a_split_export_runs_the_split_prefill_preset(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    split = split_export(plain, tmp_path / "split", CHUNK)

    assert _printed(split, capsys) == to_json(split_prefill("prefill.onnx", "model.onnx"))
    model = load_model(split, threads=1)
    assert model.prefill is not None and model.prefill.chunk == CHUNK


def _reads(tap: str) -> ControllerSpec:
    return ControllerSpec(name="reads-taps", summary="reads a tap", factory=dict, capabilities={"target": (tap,)})


def test_a_tap_the_prefill_session_does_not_give_is_refused_naming_it(plain: Path, tmp_path: Path) -> None:
    """The decoder gives hidden_states, but the prefill session runs every multi-token forward and gives none: a
    controller reading them is refused before it runs, naming the session and the fix."""
    model = load_model(split_export(plain, tmp_path / "split", CHUNK), threads=1)
    assert "hidden_states" in model.capabilities.names()

    with pytest.raises(
        CapabilityError,
        match=r"controller 'reads-taps' needs hidden_states on role 'target' .*pipeline.json: session 'prefill' "
        r"\(prefill.onnx\) runs every multi-token forward and gives no hidden_states .* remove 'prefill' from the "
        r"pipeline",
    ):
        check_models(_reads("hidden_states"), {}, {"target": model})


def test_the_same_tap_on_the_one_graph_folder_is_given(plain: Path) -> None:
    check_models(_reads("hidden_states"), {}, {"target": load_model(plain, threads=1)})


def test_a_description_no_phase_lowering_takes_is_refused_with_its_sessions(llava: Llava, tmp_path: Path) -> None:
    """An embedding session with no once-per-input chain before it: refused, listing the sessions and phases."""
    description = {
        "sessions": {
            "embedding": {"file": "embedding.onnx", "phase": "chunk", "host_inputs": ["input_ids", "image_features"]},
            "decoder": {"file": "model.onnx", "phase": "step", "host_inputs": ["*"]},
        },
        "edges": [{"from": "embedding.inputs_embeds", "to": "decoder.inputs_embeds"}],
    }

    with pytest.raises(
        ModelLoadError,
        match=r"pipeline.json: decoctl lowers once-per-input sessions into an embedding session .* this description "
        r"has embedding \(chunk\), decoder \(step\)",
    ):
        load_model(_with_description(llava.onnx, tmp_path / "m", description), threads=1)
