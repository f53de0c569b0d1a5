"""Exports by onnxruntime-genai's model builder, as they are: the prompt as the model's own tokenizer encodes it,
every EOS the model declares, greedy tokens equal to transformers' generate() on the same weights, a tokenizer with
special tokens past the vocabulary, trees exact after enable-tree, and hybrid layers refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from builder_models import PROMPT, VOCAB, Export

from decoctl import Generator, ModelLoadError
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.model.graph import enable_tree
from decoctl.plugins import PluginRegistry
from decoctl.testing import BOS_TOKEN_ID

PROMPTS = (PROMPT, "x", "naïve façade 🚀", "<|bos|> twice")
PREFIX = [BOS_TOKEN_ID, 17, 42, 99]
TREE_TOKENS = [5, 6, 7, 8, 9, 10]
PARENTS = [-1, 0, 0, 1, -1, 4]
ATOL = 1e-4


@pytest.fixture(params=["llama", "qwen2"])
def export(request: pytest.FixtureRequest) -> Export:
    return request.getfixturevalue(request.param)


def transformers_greedy(export: Export, prompt: str, max_new_tokens: int) -> list[int]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    encoded = AutoTokenizer.from_pretrained(export.hf)(prompt, return_tensors="pt")
    model = AutoModelForCausalLM.from_pretrained(export.hf).eval()
    out = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False)
    return [int(t) for t in out[0, encoded.input_ids.shape[1] :]]


def test_the_prompt_is_encoded_as_the_models_own_tokenizer_encodes_it(export: Export) -> None:
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(export.hf)
    tokenizer = load_model(export.onnx, threads=1).tokenizer
    for prompt in PROMPTS:
        assert tokenizer.encode(prompt) == expected(prompt).input_ids, prompt


def test_a_bos_added_by_the_tokenizers_post_processor_starts_the_prompt_once(llama: Export) -> None:
    ids = load_model(llama.onnx, threads=1).tokenizer.encode(PROMPT)
    assert ids[0] == BOS_TOKEN_ID
    assert BOS_TOKEN_ID not in ids[1:]


def test_every_eos_the_model_declares_is_read(llama: Export) -> None:
    assert load_model(llama.onnx, threads=1).spec.eos_token_ids == llama.eos


def test_greedy_equals_transformers_generate_on_the_same_weights(export: Export, registry: PluginRegistry) -> None:
    result = Generator({"target": export.onnx}, "greedy", registry=registry, threads=1).generate(
        PROMPT, max_new_tokens=16
    )
    assert list(result.tokens) == transformers_greedy(export, PROMPT, 16)


def test_greedy_stops_at_an_eos_only_generation_config_declares(llama: Export, registry: PluginRegistry) -> None:
    result = Generator({"target": llama.onnx}, "greedy", registry=registry, threads=1).generate(
        PROMPT, max_new_tokens=16
    )
    assert result.stats.stop_reason == "eos"
    assert result.tokens[-1] == llama.eos[1]
    assert list(result.tokens) == transformers_greedy(llama, PROMPT, 16)


def test_a_tokenizer_with_a_special_token_past_the_models_vocabulary_loads(qwen2: Export) -> None:
    model = load_model(qwen2.onnx, threads=1)
    assert (model.tokenizer.vocab_size, model.tokenizer.base_vocab_size, model.spec.vocab_size) == (
        VOCAB + 1,
        VOCAB,
        VOCAB,
    )
    assert model.tokenizer.token_to_id("<|endoftext|>") == VOCAB


def test_enable_tree_gives_a_builder_export_exact_tree_verification(export: Export, tmp_path: Path) -> None:
    plain = Sequence("target", load_model(export.onnx, threads=1))
    tree = Sequence("target", load_model(enable_tree(export.onnx, tmp_path / "tree"), threads=1))
    tree.forward(PREFIX)
    rows = np.array(tree.forward(TREE_TOKENS, tree=PARENTS))
    for node in range(len(PARENTS)):
        path = [node]
        while PARENTS[path[0]] >= 0:
            path.insert(0, PARENTS[path[0]])
        plain.rewind(0)
        expected = plain.forward(PREFIX + [TREE_TOKENS[i] for i in path])[-1]
        np.testing.assert_allclose(rows[node], expected, atol=ATOL, err_msg=f"node {node}")


def test_lfm2s_convolution_layers_are_refused_by_name(lfm2: Export) -> None:
    with pytest.raises(
        ModelLoadError,
        match=r"\(lfm2\) is a hybrid model: its convolution layers carry state between steps that is not attention's "
        r"KV cache \(past\.0\.conv, past\.2\.conv, .*\)\. .* so convolution layers are not supported: run this model "
        r"with onnxruntime-genai",
    ):
        load_model(lfm2.onnx, threads=1)
