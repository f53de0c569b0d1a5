"""A prompt's forward computes its last row of logits only (the loader's logits_from input), and that row is the one
the whole forward gives: the engine's and the Generator's prefills rely on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from decoctl.host import Sequence
from decoctl.model._loader import load_model
from decoctl.model._runner import Runner
from decoctl.model.graph import _logit_rows as logit_rows
from decoctl.testing import build_genai_model

PROMPT = np.array([5, 17, 3, 99, 42, 7, 11], np.int64)


def test_the_loader_gives_a_genai_model_the_input_that_picks_the_first_logits_row(tiny_model: Path) -> None:
    assert load_model(tiny_model).capabilities.logits_from == logit_rows.LOGITS_FROM


def test_a_last_row_forward_gives_the_whole_forwards_last_row_and_the_same_cache(tiny_model: Path) -> None:
    model = load_model(tiny_model)
    whole, last = Runner(model, max_length=32), Runner(model, max_length=32)
    expected = whole.run(PROMPT).logits.copy()
    got = last.run(PROMPT, keep=1).logits
    assert expected.shape[0] == len(PROMPT) and got.shape == (1, expected.shape[1])
    np.testing.assert_array_equal(got[0], expected[-1])
    step = np.array([8], np.int64)
    np.testing.assert_array_equal(last.run(step).logits, whole.run(step).logits)


def test_a_forward_after_a_last_row_forward_gives_every_row_again(tiny_model: Path) -> None:
    model = load_model(tiny_model)
    runner, reference = Runner(model, max_length=32), Runner(model, max_length=32)
    runner.run(PROMPT[:3], keep=1)
    reference.run(PROMPT[:3])
    np.testing.assert_array_equal(runner.run(PROMPT[3:]).logits, reference.run(PROMPT[3:]).logits)


def test_prefill_keeps_the_last_row_only_and_returns_it(tiny_model: Path) -> None:
    model = load_model(tiny_model)
    sequence, reference = Sequence("target", model, max_length=32), Sequence("target", model, max_length=32)
    row = sequence.prefill(PROMPT)
    expected = reference.forward(PROMPT)[-1:]
    np.testing.assert_array_equal(row, expected)
    assert sequence.logits().shape == (1, expected.shape[1])


def test_a_forward_keeping_no_row_computes_no_logits_and_the_same_cache(tiny_model: Path) -> None:
    model = load_model(tiny_model)
    runner, reference = Runner(model, max_length=32), Runner(model, max_length=32)
    assert runner.run(PROMPT[:4], keep=0).logits.shape[0] == 0
    reference.run(PROMPT[:4])
    np.testing.assert_array_equal(runner.run(PROMPT[4:], keep=1).logits[0], reference.run(PROMPT[4:]).logits[-1])


def test_prefill_in_chunks_without_logits_then_the_last_gives_the_whole_prompts_row(tiny_model: Path) -> None:
    model = load_model(tiny_model)
    sequence, reference = Sequence("target", model, max_length=32), Sequence("target", model, max_length=32)
    reference.prefill(PROMPT[:2])  # the same chunks with every chunk's last row: the same row, bit for bit
    expected = reference.prefill(PROMPT[2:], chunk=2)
    assert sequence.prefill(PROMPT[:2], logits=False).shape == (0, expected.shape[1])
    assert sequence.logits().shape[0] == 0
    np.testing.assert_array_equal(sequence.prefill(PROMPT[2:], chunk=2), expected)
    assert sequence.length == len(PROMPT) and sequence.stats.forwards == 4


def test_a_graph_whose_logits_come_from_no_matmul_is_kept() -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["hidden"], ["logits"])],
        "g",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, "n", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "n", 4])],
    )
    result = logit_rows.rewrite(helper.make_model(graph).SerializeToString(), "logits")
    assert isinstance(result, logit_rows.Kept)


def test_the_rewrite_slices_the_lm_heads_input_through_a_cast() -> None:
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2, 3], [1, 2, 3, 4, 5, 6])
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["hidden", "w"], ["raw"]),
            helper.make_node("Cast", ["raw"], ["logits"], to=TensorProto.FLOAT),
        ],
        "g",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, "n", 2])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "n", 3])],
        [weight],
    )
    result = logit_rows.rewrite(helper.make_model(graph).SerializeToString(), "logits")
    assert isinstance(result, logit_rows.Rewritten)
    rewritten = onnx.load_from_string(result.model)
    onnx.checker.check_model(rewritten)
    head = next(n for n in rewritten.graph.node if n.op_type == "MatMul")
    sliced = next(n for n in rewritten.graph.node if n.op_type == "Slice")
    assert head.input[0] == sliced.output[0] and sliced.input[:2] == ["hidden", logit_rows.LOGITS_FROM]


def test_a_one_token_step_after_a_one_token_chunk_without_logits_gives_its_row(tmp_path: Path) -> None:
    # a model that takes nothing per step but the token: its one-token steps reuse the last one-token run's bindings
    model = load_model(build_genai_model(tmp_path / "plain", seed=3, max_length=64))
    sequence, reference = Sequence("target", model, max_length=32), Sequence("target", model, max_length=32)
    sequence.prefill(PROMPT[:1], logits=False)
    reference.prefill(PROMPT[:1])
    np.testing.assert_array_equal(sequence.forward((int(PROMPT[1]),)), reference.forward((int(PROMPT[1]),)))
