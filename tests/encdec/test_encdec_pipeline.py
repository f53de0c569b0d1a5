"""An encoder-decoder folder runs a pipeline description like every other layout: its preset (the encoder once per
input, its output into the decoder's cross-attention), which `decoctl models pipeline` prints and which, written
as the folder's pipeline.json, runs the same; a rewind never runs the encoder again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl.cli import main
from decoctl.errors import ModelLoadError
from decoctl.host import Sequence
from decoctl.model._loader import load_model
from decoctl.model._pipeline import Edge, Pipeline, Stage, to_json
from decoctl.model._pipeline_executor import check_phases
from decoctl.model._runner import PUBLIC_ORT_ENV

SOURCE = [40, 41, 42, 43, 1]


def _described(folder: Path, tmp_path: Path, description: dict[str, Any]) -> Path:
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    (copy / "pipeline.json").write_text(json.dumps(description), encoding="utf-8")
    return copy


@pytest.mark.parametrize(
    ("variant", "stages", "edge"),
    [
        (
            "pair",
            [("encoder", "generation"), ("first_pass", "chunk"), ("decoder", "step")],
            ("encoder.last_hidden_state", "first_pass.encoder_hidden_states"),
        ),
        (
            "merged",
            [("encoder", "generation"), ("decoder", "step")],
            ("encoder.last_hidden_state", "decoder.encoder_hidden_states"),
        ),
    ],
)
def test_an_encoder_decoder_folder_runs_its_preset(
    seq2seq: Any, variant: str, stages: list[tuple[str, str]], edge: tuple[str, str]
) -> None:
    model = load_model(seq2seq.folder("t5", variant), threads=1)

    assert model.pipeline is not None
    assert [(s.name, s.phase) for s in model.pipeline.stages] == stages
    assert [(e.source, e.target) for e in model.pipeline.edges] == [edge]
    assert model.encoder is not None


def test_models_pipeline_prints_the_preset_as_json(seq2seq: Any, capsys: pytest.CaptureFixture[str]) -> None:
    folder = seq2seq.folder("t5")

    assert main(["models", "pipeline", str(folder)]) == 0

    printed = json.loads(capsys.readouterr().out)
    assert printed == {
        "sessions": {
            "encoder": {"file": "encoder_model.onnx", "phase": "generation", "host_inputs": ["*"]},
            "first_pass": {"file": "decoder_model.onnx", "phase": "chunk", "host_inputs": ["*"], "shares_kv": True},
            "decoder": {"file": "decoder_with_past_model.onnx", "phase": "step", "host_inputs": ["*"]},
        },
        "edges": [{"from": "encoder.last_hidden_state", "to": "first_pass.encoder_hidden_states"}],
    }


@pytest.mark.parametrize("variant", ["pair", "merged"])
def test_the_printed_preset_as_pipeline_json_runs_the_same(seq2seq: Any, variant: str, tmp_path: Path) -> None:
    preset = load_model(seq2seq.folder("bart", variant), threads=1)
    assert preset.pipeline is not None
    described = load_model(_described(seq2seq.folder("bart", variant), tmp_path, to_json(preset.pipeline)), threads=1)
    assert described.pipeline is not None and described.pipeline.origin.endswith("pipeline.json")
    assert preset.encoder is not None
    start = preset.encoder.parts.decoder_start_token_id
    logits = []
    for model in (preset, described):
        sequence = Sequence("target", model)
        sequence.encode(SOURCE)
        logits.append(np.array(sequence.forward([start, 7, 9, 11])))

    np.testing.assert_allclose(logits[1], logits[0], atol=1e-6)


def test_a_description_names_the_encoder_output_the_runner_reads(seq2seq: Any, tmp_path: Path) -> None:
    """The edge decides which encoder output feeds the cross-attention: one the encoder lacks is refused, naming
    the edge, the outputs it has and the fix."""
    folder = seq2seq.folder("t5")
    preset = load_model(folder, threads=1)
    assert preset.pipeline is not None
    description = to_json(preset.pipeline)
    description["edges"] = [{"from": "encoder.hidden", "to": "first_pass.encoder_hidden_states"}]

    with pytest.raises(
        ModelLoadError,
        match=r"pipeline.json: edge encoder.hidden -> first_pass.encoder_hidden_states: 'encoder' has no output "
        r"'hidden': 'encoder' has the outputs \['last_hidden_state'\]; fix the edge",
    ):
        load_model(_described(folder, tmp_path, description), threads=1)


def test_a_description_without_a_decoder_is_refused(seq2seq: Any, tmp_path: Path) -> None:
    description = {
        "sessions": {"encoder": {"file": "encoder_model.onnx", "phase": "generation", "host_inputs": ["*"]}},
        "edges": [],
    }

    with pytest.raises(ModelLoadError, match=r"exactly one step-phase session .* has none"):
        load_model(_described(seq2seq.folder("t5"), tmp_path, description), threads=1)


@pytest.mark.parametrize("variant", ["pair", "merged"])
def test_a_rewind_never_runs_the_once_per_input_encoder_again(
    seq2seq: Any, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The encoder session itself (not the runner's own counter) runs once for a source, whatever the rewinds."""
    monkeypatch.setenv(PUBLIC_ORT_ENV, "1")  # bindings run through session.run_with_iobinding, counted here
    model = load_model(seq2seq.folder("t5", variant), threads=1)
    assert model.encoder is not None
    session = model.encoder.session
    runs = []
    run = session.run_with_iobinding
    monkeypatch.setattr(session, "run_with_iobinding", lambda *a, **k: (runs.append(1), run(*a, **k))[1])
    start = model.encoder.parts.decoder_start_token_id
    sequence = Sequence("target", model)
    sequence.encode(SOURCE)
    sequence.forward([start, 7, 9, 11])
    for length, fed in ((2, [5, 6]), (0, [start]), (1, [7, 9]), (0, [start, 7, 9, 11, 13])):
        sequence.rewind(length)
        sequence.forward(fed)
    fork = Sequence("target", model)
    fork.copy_row_from(sequence)  # a fork copies the encoder's output: it does not run the encoder
    fork.rewind(1)
    fork.forward([8])

    assert len(runs) == 1
    sequence.rewind(0)
    sequence.encode([50, 51, 52])  # a new input: its once-per-input session runs again, once
    sequence.forward([start])
    assert len(runs) == 2


def test_a_per_step_session_may_read_a_once_per_input_output_but_not_the_reverse() -> None:
    encoder = Stage(name="encoder", file="e.onnx", phase="generation", host_inputs=("*",))
    decoder = Stage(name="decoder", file="d.onnx", phase="step", host_inputs=("*",))
    forward = Pipeline(
        stages=(encoder, decoder),
        edges=(Edge(source="encoder.last_hidden_state", target="decoder.encoder_hidden_states"),),
        origin="pipeline.json",
    )
    backward = Pipeline(
        stages=(encoder, decoder),
        edges=(Edge(source="decoder.logits", target="encoder.input_features"),),
        origin="pipeline.json",
    )

    check_phases(forward)
    with pytest.raises(
        ModelLoadError,
        match=r"pipeline.json: edge decoder.logits -> encoder.input_features feeds a generation-phase session from a "
        r"step-phase one: .* a rewind would leave it stale.*make 'encoder' run in phase 'step' or later, or feed it "
        r"from the host",
    ):
        check_phases(backward)


def test_a_description_without_the_encoder_of_an_encoder_decoder_export_is_refused(
    seq2seq: Any, tmp_path: Path
) -> None:
    description = {
        "sessions": {"decoder": {"file": "decoder_model_merged.onnx", "phase": "step", "host_inputs": ["*"]}},
        "edges": [],
    }

    with pytest.raises(
        ModelLoadError,
        match=r"is an encoder-decoder export, but no once-per-input session of this description feeds the decoder's "
        r"cross-attention \(decoder \(step\)\): add the encoder",
    ):
        load_model(_described(seq2seq.folder("t5", "merged"), tmp_path, description), threads=1)


def test_models_info_names_the_pipeline_it_runs(seq2seq: Any, capsys: pytest.CaptureFixture[str]) -> None:
    folder = seq2seq.folder("bart")

    assert main(["models", "info", str(folder)]) == 0

    out = capsys.readouterr().out
    assert "pipeline: encoder (generation), first_pass (chunk), decoder (step), from " in out
    assert "(the encoder-decoder preset)" in out
