"""Model folders: both layouts load, and every broken folder gets an error that names the file and the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from decoctl import ModelLoadError
from decoctl.model import load_model
from decoctl.model.loader import default_threads


def copy_model(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(source, target)
    return target


def test_genai_layout_capabilities_come_from_the_graph(genai_model: Path) -> None:
    model = load_model(genai_model, threads=1)
    assert model.spec.layout == "genai"
    assert model.spec.share_buffer
    assert model.capabilities.names() == ("logits_all_positions", "hidden_states")


def test_optimum_layout_capabilities_come_from_the_graph(optimum_model: Path, optimum_model_no_positions: Path) -> None:
    assert load_model(optimum_model).spec.layout == "optimum"
    assert load_model(optimum_model).capabilities.position_ids == "position_ids"
    assert load_model(optimum_model_no_positions).capabilities.position_ids is None


def test_default_threads_follow_onnxruntime_genai(genai_model: Path) -> None:
    assert load_model(genai_model).threads == default_threads() >= 1


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nowhere")


def test_a_folder_of_unknown_layout_names_both_layouts(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"neither genai_config.json .* nor config.json"):
        load_model(tmp_path)


def test_a_missing_onnx_file_is_named(genai_model: Path, tmp_path: Path) -> None:
    folder = copy_model(genai_model, tmp_path)
    (folder / "model.onnx").unlink()
    with pytest.raises(ModelLoadError, match=r"model.onnx is missing"):
        load_model(folder)


def test_a_corrupt_onnx_file_is_reported(genai_model: Path, tmp_path: Path) -> None:
    folder = copy_model(genai_model, tmp_path)
    (folder / "model.onnx").write_bytes(b"not a protobuf at all")
    with pytest.raises(ModelLoadError, match=r"could not load .*corrupt"):
        load_model(folder)


def test_corrupt_config_json_is_reported(genai_model: Path, tmp_path: Path) -> None:
    folder = copy_model(genai_model, tmp_path)
    (folder / "genai_config.json").write_text("{ not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_model(folder)


def test_a_config_missing_a_field_is_reported(genai_model: Path, tmp_path: Path) -> None:
    folder = copy_model(genai_model, tmp_path)
    config = json.loads((folder / "genai_config.json").read_text())
    del config["model"]["decoder"]["head_size"]
    (folder / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="head_size"):
        load_model(folder)


def test_a_missing_tokenizer_is_named(optimum_model: Path, tmp_path: Path) -> None:
    folder = copy_model(optimum_model, tmp_path)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json is missing"):
        load_model(folder)


def test_a_corrupt_tokenizer_is_reported(optimum_model: Path, tmp_path: Path) -> None:
    folder = copy_model(optimum_model, tmp_path)
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=r"tokenizer file .* could not be read"):
        load_model(folder)


def test_a_config_that_does_not_match_the_graph_is_reported(genai_model: Path, tmp_path: Path) -> None:
    folder = copy_model(genai_model, tmp_path)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"]["num_hidden_layers"] = 3
    (folder / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="do not belong together"):
        load_model(folder)
