"""Model folders: both layouts load, and every broken folder gets an error that names the file and the fix."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import onnx
import pytest
from structlog.testing import capture_logs
from tokenizers import Tokenizer as HfTokenizer

from decoctl import ConfigError, ModelLoadError
from decoctl.model import load_model
from decoctl.model._loader import default_threads
from decoctl.testing import build_genai_model


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


def set_config(folder: Path, **model_fields: object) -> None:
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"].update(model_fields)
    path.write_text(json.dumps(config))


def test_a_config_vocab_size_that_does_not_fit_the_graph_is_refused_at_load(genai_model: Path, tmp_path: Path) -> None:
    folder = copy_model(genai_model, tmp_path)
    set_config(folder, vocab_size=500)
    with pytest.raises(ModelLoadError, match=r"says vocab_size 500 but the graph's logits output has 384 .* to 384"):
        load_model(folder)


@pytest.mark.parametrize("field", ["eos_token_id", "bos_token_id"])
def test_a_special_token_outside_the_vocabulary_is_refused_at_load(
    genai_model: Path, tmp_path: Path, field: str
) -> None:
    folder = copy_model(genai_model, tmp_path)
    set_config(folder, **{field: [1, 384] if field == "eos_token_id" else 384})
    with pytest.raises(ModelLoadError, match=rf"{field} 384 is not a token of the model \(its vocabulary is 0..383\)"):
        load_model(folder)


def test_a_tokenizer_larger_than_the_graphs_vocabulary_is_refused(genai_model: Path, tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path / "small", seed=3, vocab=300)
    shutil.copy(genai_model / "tokenizer.json", folder / "tokenizer.json")  # 384 tokens
    with pytest.raises(ModelLoadError, match="has 384 tokens but the model's vocabulary is 300: the tokenizer belongs"):
        load_model(folder)


def test_special_tokens_added_past_the_graphs_vocabulary_are_accepted(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path / "model", seed=3, vocab=300)
    tokenizer = HfTokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.add_special_tokens(["<image>", "<audio>"])  # ids 300 and 301: no row of the graph
    tokenizer.save(str(folder / "tokenizer.json"))
    model = load_model(folder)
    assert (model.tokenizer.vocab_size, model.tokenizer.base_vocab_size, model.spec.vocab_size) == (302, 300, 300)


def test_a_graph_vocabulary_padded_past_the_tokenizer_is_accepted(tmp_path: Path) -> None:
    model = load_model(build_genai_model(tmp_path / "model", seed=3, vocab=448))
    assert (model.tokenizer.vocab_size, model.spec.vocab_size) == (384, 448)


def test_a_missing_weights_file_is_named(genai_model: Path, tmp_path: Path) -> None:
    folder = copy_model(genai_model, tmp_path)
    onnx.save_model(onnx.load_model(str(folder / "model.onnx")), str(folder / "model.onnx"), save_as_external_data=True)
    data = next(p for p in folder.iterdir() if p.name.endswith(".data"))
    data.unlink()
    with pytest.raises(ModelLoadError, match=rf"its weights file {data} is missing"):
        load_model(folder)


def test_a_prompt_that_is_not_unicode_is_refused(genai_model: Path) -> None:
    tokenizer = load_model(genai_model).tokenizer
    with pytest.raises(ConfigError, match=r"the prompt is not valid UTF-8 text \(byte 0xff at character 1\)"):
        tokenizer.encode(b"a\xff".decode("utf-8", "surrogateescape"))
    with pytest.raises(ConfigError, match=r"a lone surrogate U\+D800 at character 0"):
        tokenizer.encode("\ud800")


def test_more_threads_than_cores_is_logged(genai_model: Path) -> None:
    cores = os.cpu_count() or 1
    with capture_logs() as logs:
        assert load_model(genai_model, threads=cores + 1).threads == cores + 1
    assert next(e for e in logs if e["event"] == "decoctl.threads_above_cores")["cores"] == cores


@pytest.mark.parametrize("threads", [0, -1, True])
def test_a_thread_count_below_one_is_refused(genai_model: Path, threads: int) -> None:
    with pytest.raises(ConfigError, match="is not a thread count"):
        load_model(genai_model, threads=threads)
