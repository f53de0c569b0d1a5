"""The loader removes onnxruntime-genai's attention-mask subgraph and feeds the sequence lengths: same logits."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from structlog.testing import capture_logs

from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.model.graph import _protowire as pw
from decoctl.model.graph._fed_lengths import Kept, Rewritten, rewrite
from decoctl.testing import build_genai_model


def edited_copy(source: Path, tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    folder = tmp_path / "edited"
    shutil.copytree(source, folder)
    model = onnx.load(folder / "model.onnx")
    edit(model.graph)
    onnx.save_model(model, folder / "model.onnx")
    return folder


def node(graph: onnx.GraphProto, suffix: str) -> onnx.NodeProto:
    return next(n for n in graph.node if n.name.endswith(suffix))


def test_the_mask_subgraph_goes_and_the_lengths_become_inputs(genai_model: Path) -> None:
    model = load_model(genai_model, threads=1)
    inputs = [i.name for i in model.session.get_inputs()]
    lengths = model.capabilities.fed_lengths
    assert lengths is not None
    assert "attention_mask" not in inputs
    assert {lengths.seqlens_k, lengths.total_sequence_length} <= set(inputs)
    shapes = {i.name: (i.type, i.shape) for i in model.session.get_inputs()}
    assert shapes[lengths.seqlens_k] == ("tensor(int32)", ["batch_size"])
    assert shapes[lengths.total_sequence_length] == ("tensor(int32)", [])


def test_the_rewritten_graph_parses_without_the_six_nodes(genai_model: Path) -> None:
    original = (genai_model / "model.onnx").read_bytes()
    result = rewrite(original, "attention_mask")
    assert isinstance(result, Rewritten)
    before, after = onnx.load_from_string(original), onnx.load_from_string(result.model)
    gone = {n.op_type for n in before.graph.node} - {n.op_type for n in after.graph.node}
    assert gone == {"ReduceSum", "Sub", "Shape", "Cast"}  # Gather stays: the embedding is one
    assert len(before.graph.node) - len(after.graph.node) == result.removed_nodes == 6
    assert list(after.graph.initializer) == list(before.graph.initializer)  # weights byte for byte


def test_fed_lengths_give_the_mask_subgraphs_logits_bit_for_bit(genai_model: Path) -> None:
    fed = Sequence("target", load_model(genai_model, threads=1), max_length=64)
    masked = Sequence("target", load_model(genai_model, threads=1, feed_lengths=False), max_length=64)
    assert masked.model.capabilities.fed_lengths is None
    rng = np.random.default_rng(0)
    for step in range(40):
        if step % 7 == 6:
            length = int(rng.integers(0, fed.length + 1))
            fed.rewind(length)
            masked.rewind(length)
        tokens = rng.integers(0, fed.vocab_size, size=int(rng.integers(1, 4)))
        if fed.length + len(tokens) > fed.max_length:
            fed.rewind(0)
            masked.rewind(0)
        np.testing.assert_array_equal(fed.forward(tokens), masked.forward(tokens))


def test_tree_forwards_agree_too(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path / "tree", seed=5, tree_inputs=True)
    fed = Sequence("target", load_model(folder, threads=1), max_length=64)
    masked = Sequence("target", load_model(folder, threads=1, feed_lengths=False), max_length=64)
    assert fed.model.capabilities.fed_lengths is not None and fed.model.capabilities.tree
    for sequence in (fed, masked):
        sequence.forward(np.arange(3, 12))
    tree = [-1, 0, 0, 1, -1]
    np.testing.assert_array_equal(fed.forward([5, 6, 7, 8, 9], tree=tree), masked.forward([5, 6, 7, 8, 9], tree=tree))
    fed.keep([0, 1, 3])
    masked.keep([0, 1, 3])
    np.testing.assert_array_equal(fed.forward([10]), masked.forward([10]))


def test_feed_lengths_off_by_environment(genai_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DECOCTL_FEED_LENGTHS", "0")
    model = load_model(genai_model, threads=1)
    assert model.capabilities.fed_lengths is None
    assert "attention_mask" in [i.name for i in model.session.get_inputs()]


def test_another_subtraction_keeps_the_graph_and_says_why(genai_model: Path, tmp_path: Path) -> None:
    def subtract_two(graph: onnx.GraphProto) -> None:
        two = numpy_helper.from_array(np.array(2, np.int64), "two")
        graph.initializer.append(two)
        node(graph, "attn_mask_reformat/Sub").input[1] = "two"

    folder = edited_copy(genai_model, tmp_path, subtract_two)
    with capture_logs() as logs:
        model = load_model(folder, threads=1)
    assert model.capabilities.fed_lengths is None
    kept = [e for e in logs if e["event"] == "decoctl.mask_subgraph_kept"]
    assert kept and "not computed the way" in kept[0]["reason"]


def test_keepdims_one_keeps_the_graph(genai_model: Path) -> None:
    model = onnx.load(genai_model / "model.onnx")
    reduce = node(model.graph, "attn_mask_reformat/ReduceSum")
    del reduce.attribute[:]
    reduce.attribute.append(helper.make_attribute("keepdims", 1))
    result = rewrite(model.SerializeToString(), "attention_mask")
    assert isinstance(result, Kept) and "attribute or constant" in result.reason


def test_a_mask_that_feeds_other_nodes_keeps_the_graph(genai_model: Path) -> None:
    model = onnx.load(genai_model / "model.onnx")
    model.graph.node.append(helper.make_node("Identity", ["attention_mask"], ["mask_copy"], name="uses_mask"))
    model.graph.output.append(helper.make_tensor_value_info("mask_copy", onnx.TensorProto.INT64, None))
    result = rewrite(model.SerializeToString(), "attention_mask")
    assert isinstance(result, Kept) and "feeds other nodes" in result.reason


def test_a_graph_without_group_query_attention_is_kept(optimum_model: Path) -> None:
    result = rewrite((optimum_model / "model.onnx").read_bytes(), "attention_mask")
    assert isinstance(result, Kept) and "GroupQueryAttention" in result.reason
    assert load_model(optimum_model).capabilities.fed_lengths is None


def test_protowire_reads_what_onnx_writes_and_rebuilds_it_byte_for_byte(genai_model: Path) -> None:
    data = (genai_model / "model.onnx").read_bytes()
    model_fields = list(pw.fields(data))
    assert b"".join(f.raw for f in model_fields) == data
    graph = next(f for f in model_fields if f.number == 7)
    names = [
        next(p.text for p in pw.fields(f.payload) if p.number == 3) for f in pw.fields(graph.payload) if f.number == 1
    ]
    assert names == [n.name for n in onnx.load_from_string(data).graph.node]


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**40, -1, -(2**63)])
def test_varints_round_trip(value: int) -> None:
    encoded = pw.varint_field(3, value)
    (field,) = pw.fields(encoded)
    assert field.number == 3 and field.number_value == value % 2**64


def test_a_truncated_message_is_a_model_load_error() -> None:
    from decoctl import ModelLoadError

    with pytest.raises(ModelLoadError, match="truncated"):
        list(pw.fields(pw.length_delimited(7, b"abcdef")[:-2]))


def test_weights_load_into_the_heap_while_a_session_loads() -> None:
    """glibc serves a 1 MiB allocation from the heap inside contiguous_allocations() and from a mapping of its
    own outside it (what lets collapse() back prepacked weights with huge pages). In a fresh process: a long one
    may hold a freed heap chunk that malloc reuses either way."""
    import ctypes
    import subprocess
    import sys

    from decoctl.model import _huge_pages as huge_pages

    if not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "mallopt") or not huge_pages.enabled():
        pytest.skip("glibc on Linux with huge pages on")
    script = """
import numpy as np
from pathlib import Path
from decoctl.model import _huge_pages as huge_pages

def in_heap(array):
    address = array.ctypes.data
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split()
        start, end = (int(x, 16) for x in span.split("-"))
        if start <= address < end:
            return rest[-1] == "[heap]"
    return False

with huge_pages.contiguous_allocations():
    inside = np.ones(1 << 18, np.float32)
outside = np.ones(1 << 18, np.float32)
print(in_heap(inside), in_heap(outside))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "False"]
