"""The pipeline description of a composite model, validated whole at load before any session runs: every fault an
error naming the file, the edge and the fix. The model is the tiny LLaVA's three graphs with a pipeline.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from vlm_models import Llava

from decoctl import ModelLoadError
from decoctl.model import load_model
from decoctl.model._pipeline import decoder_only, encoder_decoder

GOOD: dict[str, Any] = {
    "sessions": {
        "vision": {"file": "vision.onnx", "phase": "generation", "host_inputs": ["pixel_values"]},
        "embedding": {"file": "embedding.onnx", "phase": "chunk", "host_inputs": ["input_ids"]},
        "decoder": {"file": "model.onnx", "phase": "step", "host_inputs": ["*"]},
    },
    "edges": [
        {"from": "vision.image_features", "to": "embedding.image_features"},
        {"from": "embedding.inputs_embeds", "to": "decoder.inputs_embeds"},
    ],
}


def with_pipeline(llava: Llava, folder: Path, description: dict[str, Any]) -> Path:
    shutil.copytree(llava.onnx, folder)
    (folder / "pipeline.json").write_text(json.dumps(description), encoding="utf-8")
    return folder


def broken(**changes: Any) -> dict[str, Any]:
    description = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if key == "edges":
            description["edges"] = value
        else:
            description["sessions"][key] = value
    return description


def test_a_pipeline_file_that_describes_the_model_loads_and_runs(llava: Llava, tmp_path: Path) -> None:
    model = load_model(with_pipeline(llava, tmp_path / "m", GOOD), threads=1)

    assert model.vision is not None


@pytest.mark.parametrize(
    ("description", "message"),
    [
        (
            broken(edges=[*GOOD["edges"][:1], {"from": "embeding.inputs_embeds", "to": "decoder.inputs_embeds"}]),
            r"edge embeding.inputs_embeds -> decoder.inputs_embeds: its source session 'embeding' is not one of "
            r"\['decoder', 'embedding', 'vision'\]",
        ),
        (
            broken(edges=[{"from": "vision.image_feature", "to": "embedding.image_features"}, GOOD["edges"][1]]),
            r"'vision' has no output 'image_feature': 'vision' has the outputs \['image_features'\]",
        ),
        (
            broken(edges=[GOOD["edges"][0], {"from": "vision.inputs_embeds", "to": "decoder.inputs_embeds"}]),
            r"'vision' has no output 'inputs_embeds': it is an output of 'embedding', not of 'vision'",
        ),
        (
            broken(edges=[GOOD["edges"][0], {"from": "embedding.inputs_embeds", "to": "decoder.input_embeds"}]),
            r"'decoder' has no input 'input_embeds'",
        ),
        (
            broken(edges=[GOOD["edges"][1]]),
            r"session 'vision' feeds nothing",
        ),
        (
            broken(
                vision={"file": "vision.onnx", "phase": "generation", "host_inputs": []},
                edges=[*GOOD["edges"], {"from": "embedding.inputs_embeds", "to": "vision.pixel_values"}],
            ),
            r"sessions feed each other in a cycle \(",
        ),
        (
            broken(edges=[{"from": "vision.image_features", "to": "embedding.input_ids"}, GOOD["edges"][1]]),
            r"embedding.input_ids: embedding.input_ids is fed by the host; an edge cannot feed it too",
        ),
        (
            broken(
                embedding={"file": "embedding.onnx", "phase": "chunk", "host_inputs": []},
                edges=[{"from": "vision.image_features", "to": "embedding.input_ids"}, GOOD["edges"][1]],
            ),
            r"the output is tensor\(float\) but the input takes tensor\(int64\)",
        ),
        (
            broken(
                edges=[
                    GOOD["edges"][1],
                    {"from": "vision.image_features", "to": "embedding.image_features"},
                    {"from": "vision.image_features", "to": "embedding.image_features"},
                ]
            ),
            r"embedding.image_features is already fed by vision.image_features",
        ),
        (
            broken(vision={"file": "vision.onnx", "phase": "sometimes"}),
            r"not a pipeline description",
        ),
    ],
    ids=[
        "misspelled-session",
        "misspelled-output",
        "wrong-source-session",
        "misspelled-input",
        "dangling-session",
        "cycle",
        "host-input-fed",
        "type-mismatch",
        "fed-twice",
        "bad-phase",
    ],
)
def test_every_fault_of_a_pipeline_file_is_refused_naming_the_file_and_the_edge(
    llava: Llava, tmp_path: Path, description: dict[str, Any], message: str
) -> None:
    folder = with_pipeline(llava, tmp_path / "m", description)

    with pytest.raises(ModelLoadError, match=message) as raised:
        load_model(folder, threads=1)

    assert str(folder / "pipeline.json") in str(raised.value)


def test_an_unfed_input_is_refused_naming_it(llava: Llava, tmp_path: Path) -> None:
    description = broken(embedding={"file": "embedding.onnx", "phase": "chunk", "host_inputs": []})
    folder = with_pipeline(llava, tmp_path / "m", description)

    with pytest.raises(ModelLoadError, match=r"input embedding.input_ids is fed by no edge and not by the host"):
        load_model(folder, threads=1)


def test_a_decoder_that_takes_embeddings_without_an_embedding_stage_is_refused(llava: Llava, tmp_path: Path) -> None:
    folder = tmp_path / "decoder-only"
    folder.mkdir()
    for name in ("model.onnx", "model.onnx.data", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(llava.onnx / name, folder / name)
    config = json.loads((llava.onnx / "genai_config.json").read_text(encoding="utf-8"))
    del config["model"]["vision"], config["model"]["embedding"]
    (folder / "genai_config.json").write_text(json.dumps(config), encoding="utf-8")

    with pytest.raises(ModelLoadError, match=r"takes inputs_embeds instead of token ids.*describes no stage"):
        load_model(folder, threads=1)


def test_todays_layouts_are_presets_of_the_description() -> None:
    assert [(s.name, s.phase) for s in decoder_only("model.onnx").stages] == [("decoder", "step")]
    preset = encoder_decoder("encoder_model.onnx", "decoder_model_merged.onnx")
    assert [(s.name, s.phase) for s in preset.stages] == [("encoder", "generation"), ("decoder", "step")]
    assert [(e.source, e.target) for e in preset.edges] == [
        ("encoder.last_hidden_state", "decoder.encoder_hidden_states")
    ]
