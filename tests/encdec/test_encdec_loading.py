"""Optimum's encoder-decoder layout loads: detected from the folder, its parts read from the graphs, missing parts
named with the fix, and `decoctl models info` shows the parts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from decoctl.cli import main
from decoctl.errors import ModelLoadError
from decoctl.model._loader import load_model
from decoctl.model._spec import ModelSpec, detect_layout


def _copy(folder: Path, tmp_path: Path, *, drop: tuple[str, ...] = ()) -> Path:
    """A copy of an export without the files ``drop``."""
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(*drop))
    return copy


@pytest.mark.parametrize("variant", ["pair", "merged"])
def test_both_decoder_layouts_load_as_encoder_decoder(seq2seq: Any, variant: str) -> None:
    model = load_model(seq2seq.folder("t5", variant), threads=1)
    parts = model.spec.encoder_decoder
    assert model.spec.layout == "encoder-decoder"
    assert parts is not None and parts.merged == (variant == "merged")
    assert parts.decoder_start_token_id == seq2seq.model("t5").config.decoder_start_token_id
    assert (
        model.spec.onnx_file.name
        == {"pair": "decoder_with_past_model.onnx", "merged": "decoder_model_merged.onnx"}[variant]
    )
    assert (model.spec.num_layers, model.spec.num_kv_heads, model.spec.head_size) == (2, 4, 8)
    assert model.encoder is not None and model.encoder.hidden_size == 32
    assert (model.encoder.cross_heads, model.encoder.cross_head_size) == (4, 8)
    # what the graphs offer: every position's logits; no tree inputs, no hidden states
    assert model.capabilities.names() == ("logits_all_positions",)


def test_the_source_length_is_the_config_s_positions_else_the_tokenizer_s_limit(seq2seq: Any) -> None:
    bart = ModelSpec.from_folder(seq2seq.folder("bart"))
    t5 = ModelSpec.from_folder(seq2seq.folder("t5"))
    assert bart.encoder_decoder is not None and bart.encoder_decoder.source_length == 128  # max_position_embeddings
    assert t5.encoder_decoder is not None and t5.encoder_decoder.source_length == 128  # model_max_length (relative)


def test_an_export_under_onnx_loads(seq2seq: Any, tmp_path: Path) -> None:
    folder = _copy(seq2seq.folder("bart"), tmp_path)
    (folder / "onnx").mkdir()
    for graph in folder.glob("*.onnx"):
        graph.rename(folder / "onnx" / graph.name)
    assert load_model(folder, threads=1).spec.encoder_decoder is not None


@pytest.mark.parametrize(
    ("variant", "drop", "named"),
    [
        ("pair", ("encoder_model.onnx",), "encoder_model.onnx"),
        ("merged", ("encoder_model.onnx",), "encoder_model.onnx"),
        ("pair", ("decoder_with_past_model.onnx",), "decoder_with_past_model.onnx"),
        ("pair", ("decoder_model.onnx",), "decoder_model.onnx"),
        ("pair", ("decoder_model.onnx", "decoder_with_past_model.onnx"), "no decoder graph"),
    ],
)
def test_a_missing_part_is_named_with_where_it_comes_from(
    seq2seq: Any, tmp_path: Path, variant: str, drop: tuple[str, ...], named: str
) -> None:
    folder = _copy(seq2seq.folder("t5", variant), tmp_path, drop=drop)
    with pytest.raises(ModelLoadError, match=named) as caught:
        load_model(folder, threads=1)
    assert "export" in str(caught.value)  # the fix: the same export's file, or optimum-cli's command


def test_a_config_that_says_encoder_decoder_without_an_encoder_is_not_read_as_a_decoder(
    seq2seq: Any, tmp_path: Path
) -> None:
    folder = _copy(seq2seq.folder("bart"), tmp_path, drop=("encoder_model.onnx",))
    assert detect_layout(folder) == "encoder-decoder"  # config.json: is_encoder_decoder
    with pytest.raises(ModelLoadError, match=r"encoder_model\.onnx"):
        ModelSpec.from_folder(folder)


def test_a_config_without_decoder_start_asks_for_it(seq2seq: Any, tmp_path: Path) -> None:
    folder = _copy(seq2seq.folder("bart"), tmp_path, drop=("generation_config.json",))
    config = json.loads((folder / "config.json").read_text())
    del config["decoder_start_token_id"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="decoder_start_token_id"):
        load_model(folder, threads=1)


def test_parts_of_two_exports_are_refused(seq2seq: Any, tmp_path: Path) -> None:
    folder = _copy(seq2seq.folder("t5"), tmp_path)
    shutil.copy(seq2seq.folder("t5-draft") / "encoder_model.onnx", folder / "encoder_model.onnx")
    with pytest.raises(ModelLoadError, match="another export"):
        load_model(folder, threads=1)


@pytest.mark.parametrize("variant", ["pair", "merged"])
def test_models_info_shows_the_parts_and_runs_them(
    seq2seq: Any, variant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "info", str(seq2seq.folder("bart", variant))]) == 0
    out = capsys.readouterr().out
    assert "layout encoder-decoder" in out
    assert "encoder: encoder_model.onnx" in out
    assert ("no-past branch" if variant == "merged" else "decoder first pass: decoder_model.onnx") in out
    assert "decoder starts from token 1" in out
    assert "dry forward ok: the encoder over 2 source tokens" in out
