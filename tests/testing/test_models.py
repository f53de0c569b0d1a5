"""decoctl.testing builds tiny ONNX causal LMs whose incremental runs agree with a from-scratch pass."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from tokenizers import Tokenizer

from decoctl import tap_layers
from decoctl.testing import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    PAD_TOKEN_ID,
    build_genai_model,
    build_optimum_model,
    build_tokenizer,
    reference_logits,
    top2_gap,
)

MAX_LENGTH = 64
ATOL = 1e-4
MASKED = -1e9


def _session(folder: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])


def _tokens(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 384, n)]


def _tree_inputs(parents: Sequence[int], past: int) -> tuple[np.ndarray, np.ndarray]:
    """position_ids int64[1, n] (past + depth) and attention_bias float32[1, 1, n, past + n] for a tree."""
    n = len(parents)
    depth = np.zeros(n, dtype=np.int64)
    ancestors = np.eye(n, dtype=bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            depth[i] = depth[parent] + 1
            ancestors[i] |= ancestors[parent]
    bias = np.zeros((1, 1, n, past + n), dtype=np.float32)
    bias[0, 0, :, past:] = np.where(ancestors, 0.0, MASKED)
    return (past + depth)[None, :], bias


class SharedBufferRunner:
    """Runs a genai model as the host does: past and present bound by IOBinding to ONE buffer per cache."""

    def __init__(self, folder: Path) -> None:
        config = json.loads((folder / "genai_config.json").read_text())
        decoder = config["model"]["decoder"]
        shape = (1, decoder["num_key_value_heads"], config["search"]["max_length"], decoder["head_size"])
        self.session = _session(folder)
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.caches = {
            (layer, kind): ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype=np.float32))
            for layer in range(decoder["num_hidden_layers"])
            for kind in ("key", "value")
        }

    def forward(self, tokens: Sequence[int], past: int, parents: Sequence[int] | None = None) -> np.ndarray:
        """Feed tokens after the first ``past`` cached positions; return logits float32[n, vocab]."""
        n = len(tokens)
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", np.asarray(tokens, dtype=np.int64)[None, :])
        binding.bind_cpu_input("attention_mask", np.ones((1, past + n), dtype=np.int64))
        if "position_ids" in self.inputs:
            position_ids, bias = _tree_inputs(range(-1, n - 1) if parents is None else parents, past)
            binding.bind_cpu_input("position_ids", position_ids)
            binding.bind_cpu_input("attention_bias", bias)
        binding.bind_output("logits")
        for (layer, kind), cache in self.caches.items():
            binding.bind_ortvalue_input(f"past_key_values.{layer}.{kind}", cache)
            binding.bind_ortvalue_output(f"present.{layer}.{kind}", cache)
        self.session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0][0]


def _run_concat(folder: Path, tokens: Sequence[int], chunks: Sequence[int]) -> np.ndarray:
    """Feed tokens chunk by chunk, passing each step's presents back as the next step's pasts."""
    session = _session(folder)
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    past = {
        name: np.zeros((1, value.shape[1], 0, value.shape[3]), dtype=np.float32)
        for name, value in inputs.items()
        if name.startswith("past_key_values.")
    }
    rows, start = [], 0
    for size in chunks:
        feeds = {
            "input_ids": np.asarray(tokens[start : start + size], dtype=np.int64)[None, :],
            "attention_mask": np.ones((1, start + size), dtype=np.int64),
            **past,
        }
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(start, start + size, dtype=np.int64)[None, :]
        results = dict(zip(outputs, session.run(outputs, feeds), strict=True))
        rows.append(results["logits"][0])
        past = {name: results[name.replace("past_key_values.", "present.")] for name in past}
        start += size
    return np.concatenate(rows)


@pytest.fixture(scope="module")
def genai_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("genai"), seed=1, max_length=MAX_LENGTH)


@pytest.fixture(scope="module")
def tree_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("tree"), seed=2, max_length=MAX_LENGTH, tree_inputs=True)


# --------------------------------------------------------------------------------------- genai, shared buffer


@pytest.mark.parametrize(
    "chunks",
    [(6, 1, 1, 1), (4, 3, 1, 5), (1, 1, 1, 1), (9,)],
    ids=["prefill-then-single-steps", "multi-token-steps-with-past", "one-token-prompt", "prefill-only"],
)
def test_shared_buffer_steps_match_single_pass_reference(genai_model: Path, chunks: tuple[int, ...]) -> None:
    tokens = _tokens(sum(chunks))
    runner = SharedBufferRunner(genai_model)
    rows, past = [], 0
    for size in chunks:
        rows.append(runner.forward(tokens[past : past + size], past))
        past += size
    np.testing.assert_allclose(np.concatenate(rows), reference_logits(genai_model, tokens), atol=ATOL)


def test_shared_buffer_rewind_is_a_shorter_mask(genai_model: Path) -> None:
    tokens = _tokens(12)
    runner = SharedBufferRunner(genai_model)
    runner.forward(tokens[:8], 0)
    runner.forward([5, 6, 7], 8)  # rejected draft rows 8..10, left in the buffer
    rows = runner.forward(tokens[8:], 8)
    np.testing.assert_allclose(rows, reference_logits(genai_model, tokens)[8:], atol=ATOL)


def test_shared_buffer_fills_up_to_max_length(genai_model: Path) -> None:
    tokens = _tokens(MAX_LENGTH)
    runner = SharedBufferRunner(genai_model)
    runner.forward(tokens[:-2], 0)
    rows = runner.forward(tokens[-2:], MAX_LENGTH - 2)
    np.testing.assert_allclose(rows, reference_logits(genai_model, tokens)[-2:], atol=ATOL)


def test_genai_concatenated_cache_matches_reference(genai_model: Path) -> None:
    tokens = _tokens(14)
    rows = _run_concat(genai_model, tokens, (5, 1, 4, 1, 3))
    np.testing.assert_allclose(rows, reference_logits(genai_model, tokens), atol=ATOL)


# --------------------------------------------------------------------------------------- genai, tree inputs


def test_tree_inputs_as_a_chain_match_reference(tree_model: Path) -> None:
    tokens = _tokens(10)
    runner = SharedBufferRunner(tree_model)
    rows = np.concatenate([runner.forward(tokens[:6], 0), runner.forward(tokens[6:], 6)])
    np.testing.assert_allclose(rows, reference_logits(tree_model, tokens), atol=ATOL)


def test_tree_forward_gives_each_branch_its_own_path(tree_model: Path) -> None:
    prefix = _tokens(7)
    a, b, c, d = 40, 41, 42, 43
    runner = SharedBufferRunner(tree_model)
    runner.forward(prefix, 0)
    rows = runner.forward([a, b, c, d], len(prefix), parents=[-1, 0, 0, 1])
    np.testing.assert_allclose(rows[[0, 1, 3]], reference_logits(tree_model, [*prefix, a, b, d])[-3:], atol=ATOL)
    np.testing.assert_allclose(rows[[0, 2]], reference_logits(tree_model, [*prefix, a, c])[-2:], atol=ATOL)


# --------------------------------------------------------------------------------------- optimum


@pytest.mark.parametrize("position_ids", [True, False], ids=["position-ids", "positions-from-past"])
@pytest.mark.parametrize("num_kv_heads", [4, 2], ids=["mha", "gqa"])
def test_optimum_incremental_matches_reference(tmp_path: Path, position_ids: bool, num_kv_heads: int) -> None:
    folder = build_optimum_model(tmp_path, seed=3, num_kv_heads=num_kv_heads, position_ids=position_ids)
    tokens = _tokens(13)
    rows = _run_concat(folder, tokens, (5, 1, 1, 4, 2))
    np.testing.assert_allclose(rows, reference_logits(folder, tokens), atol=ATOL)


def test_optimum_inputs_and_outputs(tmp_path: Path) -> None:
    session = _session(build_optimum_model(tmp_path, num_layers=1))
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name: o.shape for o in session.get_outputs()}
    assert list(inputs) == [
        "input_ids",
        "attention_mask",
        "position_ids",
        "past_key_values.0.key",
        "past_key_values.0.value",
    ]
    assert inputs["past_key_values.0.key"] == ["batch_size", 4, "past_sequence_length", 16]
    assert list(outputs) == ["logits", "present.0.key", "present.0.value"]
    assert outputs["logits"] == ["batch_size", "sequence_length", 384]


def test_optimum_padding_is_masked(tmp_path: Path) -> None:
    folder = build_optimum_model(tmp_path, seed=4, position_ids=True)
    tokens = _tokens(5)
    session = _session(folder)
    empty = {
        i.name: np.zeros((1, 4, 0, 16), dtype=np.float32)
        for i in session.get_inputs()
        if i.name.startswith("past_key_values.")
    }
    feeds = {
        "input_ids": np.asarray([[PAD_TOKEN_ID, PAD_TOKEN_ID, *tokens]], dtype=np.int64),
        "attention_mask": np.asarray([[0, 0] + [1] * 5], dtype=np.int64),
        "position_ids": np.asarray([[0, 0, 0, 1, 2, 3, 4]], dtype=np.int64),
        **empty,
    }
    (logits,) = session.run(["logits"], feeds)
    np.testing.assert_allclose(logits[0, 2:], reference_logits(folder, tokens), atol=ATOL)


def test_both_layouts_compute_the_same_function_from_one_seed(tmp_path: Path) -> None:
    genai = build_genai_model(tmp_path / "genai", seed=5, num_kv_heads=2)
    optimum = build_optimum_model(tmp_path / "optimum", seed=5, num_kv_heads=2)
    tokens = _tokens(20)
    np.testing.assert_allclose(reference_logits(genai, tokens), reference_logits(optimum, tokens), atol=ATOL)


# --------------------------------------------------------------------------------------- optional outputs


@pytest.mark.parametrize(
    ("hidden_states", "taps", "expected"),
    [
        (False, (), set()),
        (True, (), {"hidden_states"}),
        (False, (0,), {"aux_hidden_states"}),
        (True, (0, 1), {"hidden_states", "aux_hidden_states"}),
    ],
)
def test_optional_outputs_appear_exactly_when_requested(
    tmp_path: Path, hidden_states: bool, taps: tuple[int, ...], expected: set[str]
) -> None:
    session = _session(build_genai_model(tmp_path, hidden_states=hidden_states, tap_layers=taps))
    outputs = {o.name: o.shape for o in session.get_outputs()}
    presents = {f"present.{i}.{kind}" for i in range(2) for kind in ("key", "value")}
    assert set(outputs) == {"logits"} | presents | expected
    if hidden_states:
        assert outputs["hidden_states"] == ["batch_size", "sequence_length", 64]
    if taps:
        assert outputs["aux_hidden_states"] == ["batch_size", "sequence_length", 64 * len(taps)]


def test_hidden_states_is_the_final_norm_output(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path, seed=6, hidden_states=True)
    lm_head = _initializer(folder, "model.lm_head")
    logits, hidden = _run_outputs(folder, _tokens(6), ["logits", "hidden_states"])
    np.testing.assert_allclose(hidden @ lm_head, logits, atol=ATOL)


def test_tap_layer_i_is_the_residual_stream_entering_layer_i_in_the_order_given(tmp_path: Path) -> None:
    """Tap 0 enters the first layer: it is the token embedding. (tests/test_enable_taps.py checks every tap against
    the stream enable-taps reads at each layer's input norm.)"""
    folder = build_genai_model(tmp_path, seed=7, hidden_states=True, tap_layers=(1, 0))
    tokens = _tokens(6)
    (aux,) = _run_outputs(folder, tokens, ["aux_hidden_states"])
    entering_first = aux[..., 64:]
    np.testing.assert_array_equal(entering_first, _initializer(folder, "model.embed_tokens")[tokens])
    assert np.abs(aux[..., :64] - entering_first).max() > 0.1
    assert tap_layers(folder) == (1, 0)


def test_last_position_logits_model_emits_one_row(tmp_path: Path) -> None:
    last_only = build_genai_model(tmp_path / "last", seed=8, logits_all_positions=False)
    full = build_genai_model(tmp_path / "full", seed=8)
    tokens = _tokens(5)
    assert _session(last_only).get_outputs()[0].shape == ["batch_size", 1, 384]
    runner = SharedBufferRunner(last_only)
    rows = np.concatenate([runner.forward(tokens[:4], 0), runner.forward(tokens[4:], 4)])
    expected = reference_logits(full, tokens)
    np.testing.assert_allclose(rows, expected[[3, 4]], atol=ATOL)
    np.testing.assert_allclose(reference_logits(last_only, tokens), expected, atol=ATOL)


def _initializer(folder: Path, name: str) -> np.ndarray:
    model = onnx.load(folder / "model.onnx")
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def _run_outputs(folder: Path, tokens: Sequence[int], names: list[str]) -> list[np.ndarray]:
    session = _session(folder)
    feeds = {
        i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), dtype=np.float32)
        for i in session.get_inputs()
        if i.name.startswith("past_key_values.")
    }
    feeds["input_ids"] = np.asarray(tokens, dtype=np.int64)[None, :]
    feeds["attention_mask"] = np.ones((1, len(tokens)), dtype=np.int64)
    return [value[0] for value in session.run(names, feeds)]


# --------------------------------------------------------------------------------------- files and weights


def test_genai_config_follows_the_model_builder_format(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path, num_kv_heads=2, eos_token_id=[1, 2])
    config = json.loads((folder / "genai_config.json").read_text())
    model, decoder = config["model"], config["model"]["decoder"]
    assert (model["type"], model["vocab_size"], model["context_length"]) == ("llama", 384, 256)
    assert (model["bos_token_id"], model["eos_token_id"], model["pad_token_id"]) == (0, [1, 2], 2)
    assert (decoder["filename"], decoder["head_size"], decoder["hidden_size"]) == ("model.onnx", 16, 64)
    assert (decoder["num_attention_heads"], decoder["num_key_value_heads"], decoder["num_hidden_layers"]) == (4, 2, 2)
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert decoder["outputs"]["present_value_names"] == "present.%d.value"
    assert config["search"]["past_present_share_buffer"] is True
    assert config["search"]["max_length"] == 256
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in folder.iterdir()}


def test_optimum_config_is_a_hugging_face_llama_config(tmp_path: Path) -> None:
    config = json.loads((build_optimum_model(tmp_path, num_kv_heads=2) / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_key_value_heads"], config["vocab_size"], config["eos_token_id"]) == (2, 384, EOS_TOKEN_ID)
    assert config["max_position_embeddings"] == 256


def test_models_are_ir10_with_default_opset_21(tmp_path: Path) -> None:
    model = onnx.load(build_genai_model(tmp_path) / "model.onnx")
    assert model.ir_version == 10
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 21), ("com.microsoft", 1)}


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    first = (build_genai_model(tmp_path / "a", seed=11) / "model.onnx").read_bytes()
    again = (build_genai_model(tmp_path / "b", seed=11) / "model.onnx").read_bytes()
    other = (build_genai_model(tmp_path / "c", seed=12) / "model.onnx").read_bytes()
    assert first == again
    assert first != other


def test_logits_rarely_tie(genai_model: Path) -> None:
    gaps = top2_gap(reference_logits(genai_model, _tokens(MAX_LENGTH)))
    assert np.mean(gaps < 1e-3) < 0.02
    assert np.median(gaps) > 0.1


def test_a_larger_vocab_pads_the_model_beyond_the_tokenizer(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path, vocab=500)
    assert reference_logits(folder, [BOS_TOKEN_ID]).shape == (1, 500)
    assert Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size() == 384


@pytest.mark.parametrize(
    "sizes",
    [{"hidden": 60, "num_heads": 8}, {"num_heads": 4, "num_kv_heads": 3}, {"num_layers": 0}],
    ids=["hidden-not-divisible", "kv-heads-not-dividing", "no-layers"],
)
def test_impossible_sizes_raise(tmp_path: Path, sizes: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        build_genai_model(tmp_path, **sizes)


def test_a_tap_layer_out_of_range_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tap_layers=\(2,\).*in \[0, 2\)"):
        build_genai_model(tmp_path, tap_layers=(2,))


# --------------------------------------------------------------------------------------- tokenizer


def test_tokenizer_special_tokens_have_fixed_ids(tmp_path: Path) -> None:
    tokenizer = Tokenizer.from_file(str(build_tokenizer(tmp_path)))
    ids = [tokenizer.token_to_id(t) for t in ("<|bos|>", "<|eos|>", "<|pad|>")]
    assert ids == [BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID]
    assert tokenizer.get_vocab_size() == 384


def test_tokenizer_round_trips_multibyte_text(tmp_path: Path) -> None:
    tokenizer = Tokenizer.from_file(str(build_tokenizer(tmp_path / "tokenizer.json", vocab_size=300)))
    text = "def f(x):\n    return 'café — 你好 🚀'\n"
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == text
    assert "\ufffd" in tokenizer.decode(tokenizer.encode("🚀").ids[:1])  # a token holding part of a character


def test_tokenizer_training_is_deterministic(tmp_path: Path) -> None:
    first = build_tokenizer(tmp_path / "a").read_bytes()
    assert build_tokenizer(tmp_path / "b").read_bytes() == first
