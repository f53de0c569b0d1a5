"""Tokens at the edges: the prompt as the model's own tokenizer encodes it (BOS from tokenizer.json's
post-processor or from tokenizer_config.json), every EOS the model declares, and graph state that is not KV."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HfTokenizer
from tokenizers import processors

from decoctl import ModelLoadError
from decoctl.model._spec import ModelSpec, non_attention_state
from decoctl.model._tokenizer import Tokenizer
from decoctl.testing import BOS_TOKEN_ID, EOS_TOKEN_ID, SPECIAL_TOKENS, build_genai_model, build_optimum_model

PROMPT = "def fib(n):"
BOS = SPECIAL_TOKENS[BOS_TOKEN_ID]


def with_bos_post_processor(folder: Path) -> Path:
    """Give the folder's tokenizer.json a Llama 3 style post-processor that puts BOS first."""
    path = folder / "tokenizer.json"
    inner = HfTokenizer.from_file(str(path))
    inner.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_TOKEN_ID)]
            ),
        ]
    )
    inner.save(str(path))
    return path


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture(params=["genai", "optimum"])
def folder(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    build = build_genai_model if request.param == "genai" else build_optimum_model
    return build(tmp_path / request.param, seed=3)


def test_a_bos_that_the_post_processor_adds_starts_the_prompt(folder: Path) -> None:
    with_bos_post_processor(folder)
    spec = ModelSpec.from_folder(folder)
    ids = Tokenizer.from_file(spec.tokenizer_file, bos_token_id=spec.bos_token_id, add_bos=spec.add_bos).encode(PROMPT)
    plain = HfTokenizer.from_file(str(spec.tokenizer_file)).encode(PROMPT, add_special_tokens=False).ids
    assert ids == [BOS_TOKEN_ID, *plain]


def test_the_prompt_equals_transformers_tokenizer_in_both_layouts(folder: Path) -> None:
    transformers = pytest.importorskip("transformers")
    with_bos_post_processor(folder)
    spec = ModelSpec.from_folder(folder)
    tokenizer = Tokenizer.from_file(spec.tokenizer_file, bos_token_id=spec.bos_token_id, add_bos=spec.add_bos)
    expected = transformers.AutoTokenizer.from_pretrained(folder)
    for prompt in (PROMPT, "x", f"{BOS} twice", "naïve 🚀"):
        assert tokenizer.encode(prompt) == expected(prompt).input_ids, prompt


def test_add_bos_token_with_a_post_processor_bos_gives_one_bos(tmp_path: Path) -> None:
    path = with_bos_post_processor(build_genai_model(tmp_path / "model", seed=3))
    ids = Tokenizer.from_file(path, bos_token_id=BOS_TOKEN_ID, add_bos=True).encode(PROMPT)
    assert ids[0] == BOS_TOKEN_ID
    assert BOS_TOKEN_ID not in ids[1:]


def test_add_bos_token_prepends_bos_where_the_tokenizer_adds_none(genai_model: Path) -> None:
    path = genai_model / "tokenizer.json"
    plain = Tokenizer.from_file(path, bos_token_id=BOS_TOKEN_ID, add_bos=False).encode(PROMPT)
    assert BOS_TOKEN_ID not in plain
    assert Tokenizer.from_file(path, bos_token_id=BOS_TOKEN_ID, add_bos=True).encode(PROMPT) == [BOS_TOKEN_ID, *plain]


def test_the_bundled_demo_models_prompts_start_without_bos() -> None:
    found = importlib.util.find_spec("decoctl_models")
    if found is None or found.origin is None:
        pytest.skip("the bundled models (plugins/models) are not installed")
    spec = ModelSpec.from_folder(Path(found.origin).parent / "pycode")
    tokenizer = Tokenizer.from_file(spec.tokenizer_file, bos_token_id=spec.bos_token_id, add_bos=spec.add_bos)
    plain = HfTokenizer.from_file(str(spec.tokenizer_file)).encode(PROMPT, add_special_tokens=False).ids
    assert tokenizer.encode(PROMPT) == plain
    assert plain[0] != spec.bos_token_id


def test_an_eos_list_in_generation_config_is_read_in_both_layouts(folder: Path) -> None:
    write_json(folder / "generation_config.json", {"eos_token_id": [EOS_TOKEN_ID, 361]})
    assert ModelSpec.from_folder(folder).eos_token_ids == (EOS_TOKEN_ID, 361)


def test_every_config_adds_its_eos_once_in_order(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path / "model", seed=3, eos_token_id=[EOS_TOKEN_ID, 7])
    write_json(folder / "generation_config.json", {"eos_token_id": [361, EOS_TOKEN_ID]})
    write_json(folder / "config.json", {"model_type": "llama", "eos_token_id": 9})
    assert ModelSpec.from_folder(folder).eos_token_ids == (EOS_TOKEN_ID, 7, 361, 9)


def test_a_generation_config_eos_that_is_not_a_token_id_names_the_file(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path / "model", seed=3)
    write_json(folder / "generation_config.json", {"eos_token_id": "</s>"})
    with pytest.raises(ModelLoadError, match=r"generation_config\.json: eos_token_id '</s>' is not a token id"):
        ModelSpec.from_folder(folder)


def test_past_inputs_that_are_not_kv_are_non_attention_state(genai_model: Path) -> None:
    spec = ModelSpec.from_folder(genai_model)
    inputs = ["input_ids", "attention_mask", "past_key_values.1.key", "past_key_values.1.value", "past.0.conv"]
    outputs = ["logits", "present.1.key", "present.1.value", "present.0.conv"]
    state = non_attention_state(spec, inputs, outputs)
    assert state is not None
    assert (state.names, state.layer_kind, state.architecture) == (
        ("past.0.conv", "present.0.conv"),
        "convolution layers",
        "llama",
    )


def test_a_graph_whose_every_past_is_kv_has_no_other_state(genai_model: Path) -> None:
    spec = ModelSpec.from_folder(genai_model)
    inputs = ["input_ids", "attention_mask", "position_ids", "past_key_values.0.key", "past_key_values.0.value"]
    assert non_attention_state(spec, inputs, ["logits", "present.0.key", "present.0.value"]) is None
