"""enable_tree / `decoctl models enable-tree`: a genai-builder model gains position_ids and attention_bias; disable_tree
takes them away again (the plain twin onnxruntime-genai and the bench's raw loop run)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from structlog.testing import capture_logs

from decoctl import ConfigError, ModelLoadError
from decoctl.cli import main
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.model.graph import disable_tree, enable_tree

PREFIX = [0, 17, 42]
TREE_TOKENS = [5, 6, 7, 8, 9]
PARENTS = [-1, 0, 0, -1, 3]


def gqa_nodes(folder: Path) -> list[onnx.NodeProto]:
    graph = onnx.load_model(str(folder / "model.onnx"), load_external_data=False).graph
    return [node for node in graph.node if node.op_type == "GroupQueryAttention"]


def tree_rows(folder: Path) -> np.ndarray:
    sequence = Sequence("target", load_model(folder, threads=1))
    sequence.forward(PREFIX)
    return np.array(sequence.forward(TREE_TOKENS, tree=PARENTS))


def test_the_copy_takes_position_ids_and_attention_bias(transformed_model: Path) -> None:
    graph = onnx.load_model(str(transformed_model / "model.onnx"), load_external_data=False).graph
    inputs = {value.name: value.type.tensor_type for value in graph.input}
    assert inputs["position_ids"].elem_type == TensorProto.INT64
    assert [d.dim_param for d in inputs["position_ids"].shape.dim] == ["batch_size", "sequence_length"]
    assert inputs["attention_bias"].elem_type == TensorProto.FLOAT
    bias_dims = [d.dim_param or d.dim_value for d in inputs["attention_bias"].shape.dim]
    assert bias_dims == ["batch_size", 1, "sequence_length", "total_sequence_length"]
    config = json.loads((transformed_model / "genai_config.json").read_text())
    assert config["model"]["decoder"]["inputs"]["position_ids"] == "position_ids"
    assert "tree" in load_model(transformed_model, threads=1).capabilities.names()


def test_every_group_query_attention_node_reads_both_inputs(transformed_model: Path) -> None:
    nodes = gqa_nodes(transformed_model)
    assert len(nodes) == 2
    for node in nodes:
        assert (node.input[9], node.input[10]) == ("position_ids", "attention_bias")


def test_weights_and_other_files_are_copied_unchanged(plain_model: Path, transformed_model: Path) -> None:
    for name in ("model.onnx.data", "tokenizer.json", "tokenizer_config.json"):
        assert (transformed_model / name).read_bytes() == (plain_model / name).read_bytes()
    graph = onnx.load_model(str(transformed_model / "model.onnx"), load_external_data=False).graph
    assert any(tensor.data_location == TensorProto.EXTERNAL for tensor in graph.initializer)


def test_the_copy_computes_what_a_model_built_with_tree_inputs_computes(
    transformed_model: Path, built_tree_model: Path
) -> None:
    np.testing.assert_allclose(tree_rows(transformed_model), tree_rows(built_tree_model), atol=1e-5)


def test_plain_forwards_are_unchanged(plain_model: Path, transformed_model: Path) -> None:
    tokens = [0, 17, 42, 99, 5, 6]
    before = Sequence("target", load_model(plain_model, threads=1)).forward(tokens)
    after = Sequence("target", load_model(transformed_model, threads=1)).forward(tokens)
    np.testing.assert_allclose(after, before, atol=1e-5)


def test_a_model_that_already_has_the_inputs_is_copied_as_is(built_tree_model: Path, tmp_path: Path) -> None:
    copy = enable_tree(built_tree_model, tmp_path / "again")
    graph = onnx.load_model(str(copy / "model.onnx")).graph
    assert [v.name for v in graph.input].count("attention_bias") == 1
    np.testing.assert_allclose(tree_rows(copy), tree_rows(built_tree_model), atol=1e-6)


def half_precision_copy(plain_model: Path, source: Path) -> Path:
    """A copy of ``plain_model`` whose rotary caches (GroupQueryAttention's compute type) are float16."""
    shutil.copytree(plain_model, source)
    model = onnx.load_model(str(source / "model.onnx"))
    for tensor in model.graph.initializer:
        if tensor.name in ("cos_cache", "sin_cache"):
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16), tensor.name))
    onnx.save_model(model, str(source / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    return source


def test_a_half_precision_graph_gets_the_bias_cast_to_its_type(plain_model: Path, tmp_path: Path) -> None:
    source = half_precision_copy(plain_model, tmp_path / "fp16")

    graph = onnx.load_model(str(enable_tree(source, tmp_path / "out") / "model.onnx"), load_external_data=False).graph

    (cast,) = [node for node in graph.node if node.op_type == "Cast" and node.input[0] == "attention_bias"]
    assert cast.attribute[0].i == TensorProto.FLOAT16
    assert all(node.input[10] == cast.output[0] for node in graph.node if node.op_type == "GroupQueryAttention")


def test_an_existing_destination_with_files_is_refused(plain_model: Path, tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        enable_tree(plain_model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_an_empty_destination_folder_is_filled(plain_model: Path, tmp_path: Path) -> None:
    assert enable_tree(plain_model, tmp_path) == tmp_path.resolve()
    assert (tmp_path / "model.onnx").exists()


def test_writing_into_the_source_is_refused(plain_model: Path) -> None:
    with pytest.raises(ConfigError, match="outside the source"):
        enable_tree(plain_model, plain_model / "tree")


def test_a_folder_without_genai_config_is_refused(optimum_model: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"genai_config\.json"):
        enable_tree(optimum_model, tmp_path / "out")


def test_a_graph_without_group_query_attention_is_refused(
    plain_model: Path, optimum_model: Path, tmp_path: Path
) -> None:
    source = tmp_path / "mixed"
    shutil.copytree(plain_model, source)
    shutil.copy(optimum_model / "model.onnx", source / "model.onnx")
    with pytest.raises(ModelLoadError, match=r"no com\.microsoft GroupQueryAttention"):
        enable_tree(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_without_onnx_installed_the_error_says_how_to_get_it(
    plain_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ConfigError, match="pip install onnx"):
        enable_tree(plain_model, tmp_path / "out")


def test_the_command_line_writes_a_tree_capable_copy(
    plain_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "enable-tree", str(plain_model), str(tmp_path / "tree")]) == 0
    assert "tree" in load_model(tmp_path / "tree", threads=1).capabilities.names()
    assert main(["models", "enable-tree", str(plain_model), str(tmp_path / "tree")]) == 2
    assert "not empty" in capsys.readouterr().err


# -- disable_tree: the inverse, for hosts that feed neither input ----------------------------------------------
def plain_rows(folder: Path) -> np.ndarray:
    return np.array(Sequence("target", load_model(folder, threads=1)).forward([0, 17, 42, 99, 5, 6]))


def test_the_plain_twin_has_neither_tree_input_nor_their_wiring(transformed_model: Path, tmp_path: Path) -> None:
    twin = disable_tree(transformed_model, tmp_path / "plain")
    graph = onnx.load_model(str(twin / "model.onnx"), load_external_data=False).graph
    assert not {"position_ids", "attention_bias"} & {value.name for value in graph.input}
    assert all(set(node.input[9:]) <= {""} for node in gqa_nodes(twin))
    config = json.loads((twin / "genai_config.json").read_text())
    assert "position_ids" not in config["model"]["decoder"]["inputs"]
    assert "tree" not in load_model(twin, threads=1).capabilities.names()


def test_the_plain_twin_computes_what_the_model_before_enable_tree_computes(
    plain_model: Path, transformed_model: Path, tmp_path: Path
) -> None:
    twin = disable_tree(transformed_model, tmp_path / "plain")
    np.testing.assert_allclose(plain_rows(twin), plain_rows(plain_model), atol=1e-5)


def test_the_plain_twin_links_its_weights_instead_of_copying_them(transformed_model: Path, tmp_path: Path) -> None:
    twin = disable_tree(transformed_model, tmp_path / "plain")
    assert (twin / "model.onnx.data").samefile(transformed_model / "model.onnx.data")
    assert (twin / "tokenizer.json").samefile(transformed_model / "tokenizer.json")


def test_where_hard_links_fail_the_plain_twin_copies_and_says_so(
    plain_model: Path, transformed_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # not a symbolic link: onnxruntime refuses external data whose real path lies outside the model's folder
    def cross_device(source: object, destination: object) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "link", cross_device)
    with capture_logs() as logs:
        twin = disable_tree(transformed_model, tmp_path / "plain")
    assert not (twin / "model.onnx.data").is_symlink()
    assert not (twin / "model.onnx.data").samefile(transformed_model / "model.onnx.data")
    assert "decoctl.file_copied" in [e["event"] for e in logs]
    np.testing.assert_allclose(plain_rows(twin), plain_rows(plain_model), atol=1e-5)


def test_a_half_precision_twin_loses_the_bias_cast_too(plain_model: Path, tmp_path: Path) -> None:
    tree = enable_tree(half_precision_copy(plain_model, tmp_path / "fp16"), tmp_path / "tree")
    twin = disable_tree(tree, tmp_path / "plain")
    graph = onnx.load_model(str(twin / "model.onnx"), load_external_data=False).graph
    assert not [node for node in graph.node if "attention_bias" in node.input]
    assert "attention_bias" not in {value.name for value in graph.input}


def test_disable_tree_needs_no_onnx_package(
    transformed_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)
    twin = disable_tree(transformed_model, tmp_path / "plain")
    assert (twin / "model.onnx").is_file()


def test_positions_that_other_nodes_read_stay_an_input(transformed_model: Path, tmp_path: Path) -> None:
    source = tmp_path / "rotary-outside"
    shutil.copytree(transformed_model, source)
    model = onnx.load_model(str(source / "model.onnx"), load_external_data=False)
    model.graph.node.append(onnx.helper.make_node("Identity", ["position_ids"], ["positions_seen"]))
    model.graph.output.append(onnx.helper.make_tensor_value_info("positions_seen", TensorProto.INT64, None))
    onnx.save_model(model, str(source / "model.onnx"))

    twin = disable_tree(source, tmp_path / "plain")
    graph = onnx.load_model(str(twin / "model.onnx"), load_external_data=False).graph
    assert [value.name for value in graph.input].count("position_ids") == 1
    assert "attention_bias" not in {value.name for value in graph.input}
    assert all(set(node.input[9:]) <= {""} for node in gqa_nodes(twin))
    config = json.loads((twin / "genai_config.json").read_text())
    assert config["model"]["decoder"]["inputs"]["position_ids"] == "position_ids"


def test_disable_tree_never_overwrites(transformed_model: Path, tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        disable_tree(transformed_model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
