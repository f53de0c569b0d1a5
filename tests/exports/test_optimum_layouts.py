"""How decoctl reads an Optimum folder (issue 20, item 2), on graphs the fixtures build without an exporter:
the config's names per architecture, the context length, which graph file, the KV shape and types from the graph,
and the refusals, each by name, of what it cannot bind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import structlog
from graph_edits import merge_branches, narrow_interface, symbolic_kv_dims
from onnx import TensorProto, helper

from decoctl.cli import main
from decoctl.errors import ModelLoadError
from decoctl.generation import Generator
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.model._spec import ALIBI_CONTEXT_LENGTH, optimum_graph_file
from decoctl.plugins import PluginRegistry
from decoctl.testing import build_genai_model, build_optimum_model, reference_logits
from decoctl.testing._tokenizer import build_tokenizer

PROMPT = "def fib(n):"
#: the Llama-style graph every config below describes: 2 layers, hidden 64, 4 heads of 16, 2 KV heads
DIMS = {"num_layers": 2, "hidden": 64, "num_heads": 4, "num_kv_heads": 2}


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_optimum_model(tmp_path_factory.mktemp("optimum-plain"), seed=11, max_length=128, **DIMS)


def copy_with_config(source: Path, target: Path, **changes: Any) -> Path:
    """A copy of the model folder ``source`` whose config.json has ``changes`` (a value None removes the key)."""
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (target / "config.json").write_text(json.dumps(config))
    return target


def greedy(folder: Path) -> list[int]:
    generator = Generator({"target": str(folder)}, "greedy", registry=PluginRegistry(autoload=False), threads=1)
    return list(generator.generate(PROMPT, max_new_tokens=8).tokens)


LLAMA_NAMES = {
    "num_hidden_layers": None,
    "num_attention_heads": None,
    "hidden_size": None,
    "max_position_embeddings": None,
}


def test_gpt2_config_names_load_and_decode_as_the_common_names_do(plain: Path, tmp_path: Path) -> None:
    gpt2 = copy_with_config(
        plain, tmp_path / "gpt2", **LLAMA_NAMES, model_type="gpt2", n_layer=2, n_head=4, n_embd=64, n_positions=96
    )
    spec = load_model(gpt2, threads=1).spec
    assert (spec.num_layers, spec.hidden_size, spec.num_kv_heads, spec.head_size) == (2, 64, 2, 16)
    assert spec.context_length == 96
    assert greedy(gpt2) == greedy(plain)


def test_bloom_config_names_and_an_alibi_model_without_a_length(plain: Path, tmp_path: Path) -> None:
    bloom = copy_with_config(
        plain, tmp_path / "bloom", **LLAMA_NAMES, model_type="bloom", n_layer=2, n_head=4, n_embed=64
    )
    with structlog.testing.capture_logs() as logs:
        spec = load_model(bloom, threads=1).spec
    assert (spec.num_layers, spec.hidden_size, spec.context_length) == (2, 64, ALIBI_CONTEXT_LENGTH)
    assert [e["context_length"] for e in logs if e["event"] == "decoctl.context_length_assumed"] == [2048]


def test_a_missing_context_length_is_an_error_naming_the_fix(plain: Path, tmp_path: Path) -> None:
    folder = copy_with_config(plain, tmp_path / "nolength", max_position_embeddings=None)
    with pytest.raises(ModelLoadError, match=r'gives no context length .* add "max_position_embeddings": N'):
        load_model(folder, threads=1)


def test_kv_heads_and_head_size_come_from_the_graph(plain: Path, tmp_path: Path) -> None:
    """The config says 4 KV heads of 8 (as Falcon's num_kv_heads next to multi_query does); the graph's past inputs
    say 2 of 16, and the cache binds the graph's."""
    folder = copy_with_config(plain, tmp_path / "wrong", num_key_value_heads=4, head_dim=8)
    spec = load_model(folder, threads=1).spec
    assert (spec.num_kv_heads, spec.head_size) == (2, 16)
    assert greedy(folder) == greedy(plain)


def test_falcon_multi_query_config_reads_one_kv_head(tmp_path: Path) -> None:
    folder = build_optimum_model(tmp_path / "mq", seed=12, num_layers=1, hidden=64, num_heads=4, num_kv_heads=1)
    copy_with_config(folder, tmp_path / "falcon", model_type="falcon", num_kv_heads=4, multi_query=True)
    symbolic_kv_dims(tmp_path / "falcon" / "model.onnx")  # nothing in the graph to read: the config decides
    assert load_model(tmp_path / "falcon", threads=1).spec.num_kv_heads == 1


@pytest.mark.parametrize(
    ("files", "chosen"),
    [
        (["model.onnx", "decoder_model_merged.onnx"], "model.onnx"),
        (
            ["decoder_model.onnx", "decoder_with_past_model.onnx", "decoder_model_merged.onnx"],
            "decoder_model_merged.onnx",
        ),
        (["decoder_model.onnx", "decoder_with_past_model.onnx"], "decoder_with_past_model.onnx"),
        (["onnx/decoder_model_merged.onnx"], "onnx/decoder_model_merged.onnx"),
    ],
)
def test_the_graph_file_an_optimum_folder_offers(tmp_path: Path, files: list[str], chosen: str) -> None:
    for name in files:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).touch()
    assert optimum_graph_file(tmp_path) == tmp_path / chosen


def test_a_merged_decoder_runs_its_no_past_branch_first_and_its_past_branch_after(plain: Path, tmp_path: Path) -> None:
    """decoder_model_merged.onnx (an If on use_cache_branch; its no-past branch marks every logit with +1): the
    prompt's forward on the empty cache runs the no-past branch, every later one the with-past branch, and the
    text is the plain graph's."""
    folder = shutil.copytree(plain, tmp_path / "merged")
    merge_branches(folder / "model.onnx", folder / "decoder_model_merged.onnx")
    # optimum 1.x leaves its first-pass graph next to the merged one (a stand-in here: decoctl never reads it)
    (folder / "model.onnx").rename(folder / "decoder_model.onnx")
    model = load_model(folder, threads=1)
    assert (model.spec.onnx_file.name, model.capabilities.use_cache_branch) == (
        "decoder_model_merged.onnx",
        "use_cache_branch",
    )
    ids = model.tokenizer.encode(PROMPT)
    expected = reference_logits(plain, ids)
    sequence = Sequence("target", model, max_length=32)
    np.testing.assert_allclose(sequence.forward(ids[:-2]), expected[:-2] + 1, atol=1e-5)
    np.testing.assert_allclose(sequence.forward(ids[-2:]), expected[-2:], atol=1e-5)
    sequence.rewind(0)
    np.testing.assert_allclose(sequence.forward(ids), expected + 1, atol=1e-5)
    assert greedy(folder) == greedy(plain)


def test_a_with_past_decoder_takes_an_empty_past_first(plain: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(plain, tmp_path / "with-past")
    (folder / "model.onnx").rename(folder / "decoder_with_past_model.onnx")
    shutil.copy(folder / "decoder_with_past_model.onnx", folder / "decoder_model.onnx")
    assert load_model(folder, threads=1).spec.onnx_file.name == "decoder_with_past_model.onnx"
    assert greedy(folder) == greedy(plain)


def test_a_folder_without_a_steppable_graph_says_what_it_holds(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"has no decoder graph: none of model.onnx, decoder_model_merged.onnx"):
        optimum_graph_file(tmp_path)
    (tmp_path / "decoder_model.onnx").touch()
    with pytest.raises(ModelLoadError, match=r"holds decoder_model.onnx .* takes no past key values"):
        optimum_graph_file(tmp_path)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_outputs_are_bound_in_their_type_and_read_as_float32(
    plain: Path, tmp_path: Path, dtype: str
) -> None:
    folder = shutil.copytree(plain, tmp_path / dtype)
    narrow_interface(folder / "model.onnx", dtype)
    ids = load_model(plain, threads=1).tokenizer.encode(PROMPT)
    expected = reference_logits(plain, ids)
    sequence = Sequence("target", load_model(folder, threads=1), max_length=32)
    rows = np.concatenate([sequence.forward(part).copy() for part in (ids[:-3], ids[-3:-1], ids[-1:])])
    assert rows.dtype == np.float32
    # float16 keeps 11 bits of each logit and KV value, bfloat16 8: the error is what that rounding allows
    assert np.abs(rows - expected).max() < {"float16": 0.02, "bfloat16": 0.15}[dtype]
    assert len(greedy(folder)) == 8


def test_a_float16_genai_graph_widens_its_logits_on_the_one_token_step_too(tmp_path: Path) -> None:
    """The decode step's fast path (Runner.step, shared KV buffer) widens a float16 graph's logits as run() does."""
    plain_genai = build_genai_model(tmp_path / "genai", seed=3)
    folder = shutil.copytree(plain_genai, tmp_path / "genai16")
    narrow_interface(folder / "model.onnx", "float16")
    model = load_model(folder, threads=1)
    ids = model.tokenizer.encode(PROMPT)
    sequence = Sequence("target", model, max_length=32)
    rows = [sequence.forward(ids[:-3]).copy(), *(sequence.forward([token]).copy() for token in ids[-3:])]
    assert np.abs(np.concatenate(rows) - reference_logits(plain_genai, ids)).max() < 0.02


def tiny_graph(folder: Path, inputs: list[Any], outputs: list[Any], config: dict[str, Any], vocab: int = 384) -> Path:
    """A folder with config.json, the test tokenizer and a graph whose logits are a lookup of the token ids
    and whose every other output is its like-named input passed through."""
    folder.mkdir()
    build_tokenizer(folder, vocab_size=vocab)
    table = helper.make_tensor("table", TensorProto.FLOAT, [vocab, vocab], np.eye(vocab, dtype=np.float32).ravel())
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["logits"])]
    for value in outputs[1:]:
        nodes.append(helper.make_node("Identity", [value.name.replace("present", "past_key_values")], [value.name]))
    graph = helper.make_graph(nodes, "tiny", inputs, outputs, initializer=[table])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    (folder / "config.json").write_text(
        json.dumps({"vocab_size": vocab, "bos_token_id": 0, "eos_token_id": 1, **config})
    )
    return folder


def value(name: str, shape: list[Any], elem: int = TensorProto.FLOAT) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


IDS = [value("input_ids", ["batch", "sequence"], TensorProto.INT64), value("attention_mask", ["batch", "total"], 7)]
LOGITS = value("logits", ["batch", "sequence", 384])
BLOOM = {"model_type": "bloom", "n_layer": 1, "n_head": 4, "hidden_size": 32}


def test_bloom_with_heads_merged_into_the_batch_is_refused_by_name(tmp_path: Path) -> None:
    folder = tiny_graph(
        tmp_path / "old-bloom",
        [*IDS, value("past_key_values.0.key", ["bh", 8, "past"]), value("past_key_values.0.value", ["bh", "past", 8])],
        [LOGITS, value("present.0.key", ["bh", 8, "total"]), value("present.0.value", ["bh", "total", 8])],
        BLOOM,
    )
    with pytest.raises(ModelLoadError, match=r"heads merged into the batch axis .* transformers >= 4.44"):
        load_model(folder, threads=1)


def test_a_transposed_key_is_refused_by_name(tmp_path: Path) -> None:
    kv = [value("past_key_values.0.key", ["batch", 4, 8, "past"]), value("past_key_values.0.value", [1, 4, "past", 8])]
    out = [value("present.0.key", ["batch", 4, 8, "total"]), value("present.0.value", ["batch", 4, "total", 8])]
    folder = tiny_graph(tmp_path / "transposed", [*IDS, *kv], [LOGITS, *out], BLOOM)
    with pytest.raises(ModelLoadError, match=r"keeps past_key_values.0.key transposed"):
        load_model(folder, threads=1)


def test_gpt_bigcode_with_fused_key_value_is_refused_by_name(tmp_path: Path) -> None:
    config = {"model_type": "gpt_bigcode", "n_layer": 1, "n_head": 4, "n_embd": 32, "n_positions": 64}
    folder = tiny_graph(
        tmp_path / "bigcode",
        [*IDS, value("past_key_values.0.key_value", ["batch", "past", 16])],
        [LOGITS, value("present.0.key_value", ["batch", "total", 16])],
        {**config, "multi_query": True},
    )
    with pytest.raises(ModelLoadError, match=r"key and value in one tensor \(past_key_values.0.key_value"):
        load_model(folder, threads=1)


def test_types_decoctl_does_not_feed_are_refused_by_name(tmp_path: Path) -> None:
    kv = [value("past_key_values.0.key", ["batch", 4, "past", 8]), value("past_key_values.0.value", [1, 4, "past", 8])]
    out = [value("present.0.key", ["batch", 4, "total", 8]), value("present.0.value", ["batch", 4, "total", 8])]
    ids = [value("input_ids", ["batch", "sequence"], TensorProto.INT32), IDS[1]]
    folder = tiny_graph(tmp_path / "int32", [*ids, *kv], [LOGITS, *out], {**BLOOM, "max_position_embeddings": 64})
    with pytest.raises(ModelLoadError, match=r"input_ids is tensor\(int32\), decoctl feeds tensor\(int64\)"):
        load_model(folder, threads=1)


def test_models_info_fails_clearly_where_the_graph_does_not_run_as_bound(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The graph leaves its KV dimensions symbolic and the config gives the wrong KV heads: the folder loads, but
    its first forward cannot, and models info says so instead of reporting success."""
    folder = copy_with_config(plain, tmp_path / "wrong-heads", num_key_value_heads=4)
    symbolic_kv_dims(folder / "model.onnx")
    assert main(["models", "info", str(folder)]) == 2
    captured = capsys.readouterr()
    assert "layout optimum" in captured.out
    assert "dry forward ok" not in captured.out
    assert "loads but the first forward (2 tokens, empty cache) fails in onnxruntime" in captured.err
    assert "past_key_values.0.key tensor(float)['batch_size', 'kv_heads'" in captured.err


def test_models_info_reports_the_dry_forward(plain: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "info", str(plain)]) == 0
    out = capsys.readouterr().out
    assert "dry forward ok: 2 tokens, then one step on their cache; logits float32, KV float32 [2 heads x 16]" in out
