"""From a Hugging Face model and a PEFT LoRA adapter to decoctl: LoRA slots added to the builder's export of a tiny
Llama (``decoctl models add-lora-slots``; its q, k and v projections packed into one qkv_proj), a random PEFT adapter
converted (``decoctl models convert-adapter``), and greedy with it equal to transformers with peft, token for token,
logits close; the slots without an adapter add nothing; what does not fit is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from builder_models import PROMPT, Export

from decoctl import Generator
from decoctl.cli import main
from decoctl.errors import ConfigError, ModelLoadError
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.model._adapters import read_adapter, with_adapters
from decoctl.model._peft import convert_peft_adapter, read_safetensors
from decoctl.model.graph._lora_slots import add_lora_slots, lora_slots
from decoctl.plugins import PluginRegistry

peft = pytest.importorskip("peft")
torch = pytest.importorskip("torch")

NEW_TOKENS = 16
ATOL = 1e-4


def _peft_model(hf: Path, targets: list[str], seed: int = 7, std: float = 0.3, **config: object) -> object:
    """The HF model with a PEFT LoRA (r=4, alpha=8) on ``targets``, its B set at random (PEFT starts it at zero)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(hf).eval()
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, **config)
    model = peft.get_peft_model(base, lora)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, std)
    return model.eval()


@pytest.fixture(scope="module")
def adapted(llama: Export, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The export with slots on q_proj and v_proj (inside qkv_proj), a random PEFT adapter saved and converted by the
    command line, and the PEFT model itself."""
    root = tmp_path_factory.mktemp("lora-peft")
    base, saved, converted = root / "base", root / "peft", root / "a1.onnx_adapter"
    assert main(["models", "add-lora-slots", str(llama.onnx), "--targets", "q_proj,v_proj", "--out", str(base)]) == 0
    model = _peft_model(llama.hf, ["q_proj", "v_proj"])
    model.save_pretrained(saved)
    assert main(["models", "convert-adapter", str(saved), "--base", str(base), "--out", str(converted)]) == 0
    return {"base": base, "peft": saved, "adapter": converted, "model": model}


def _peft_greedy(llama: Export, model: object) -> list[int]:
    from transformers import AutoTokenizer

    encoded = AutoTokenizer.from_pretrained(llama.hf)(PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**encoded, max_new_tokens=NEW_TOKENS, do_sample=False)
    return [int(t) for t in out[0, encoded.input_ids.shape[1] :]]


def _onnx_prompt_logits(folder: Path, ids: list[int], parameters: dict[str, np.ndarray]) -> np.ndarray:
    """The graph's logits over the prompt ``ids`` (an empty past) with ``parameters`` fed to its slots."""
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    decoder = json.loads((folder / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
    empty = (1, decoder["num_key_value_heads"], 0, decoder["head_size"])
    feeds: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        if arg.name == "input_ids":
            feeds[arg.name] = np.array([ids], np.int64)
        elif arg.name == "attention_mask":
            feeds[arg.name] = np.ones((1, len(ids)), np.int64)
        elif arg.name == "position_ids":
            feeds[arg.name] = np.arange(len(ids), dtype=np.int64)[None]
        elif arg.name.startswith("past_key_values"):
            feeds[arg.name] = np.zeros(empty, np.float32)
    feeds.update(parameters)
    return session.run(["logits"], feeds)[0][0]


def test_slots_are_named_after_the_peft_modules_inside_the_packed_qkv_projection(adapted: dict[str, object]) -> None:
    slots = lora_slots(adapted["base"])
    assert sorted(slots) == sorted(
        f"model.layers.{layer}.self_attn.{proj}.lora_{ab}" for layer in (0, 1) for proj in ("q_proj", "v_proj")
        for ab in "AB"
    )  # fmt: skip
    rank = "model.layers.0.self_attn.v_proj.lora_rank"
    assert slots["model.layers.0.self_attn.v_proj.lora_A"] == ("float32", (64, rank))
    assert slots["model.layers.0.self_attn.v_proj.lora_B"] == ("float32", (rank, 32))  # 2 kv heads x 16


def test_the_converted_adapter_holds_peft_weights_transposed_with_the_scaling_in_b(adapted: dict[str, object]) -> None:
    parameters = read_adapter(adapted["adapter"]).parameters
    layer = adapted["model"].base_model.model.model.layers[1].self_attn.v_proj
    np.testing.assert_array_equal(
        parameters["model.layers.1.self_attn.v_proj.lora_A"], layer.lora_A["default"].weight.detach().numpy().T
    )
    scaled = layer.lora_B["default"].weight.detach().numpy().T * 2.0  # lora_alpha 8 / r 4
    np.testing.assert_allclose(parameters["model.layers.1.self_attn.v_proj.lora_B"], scaled, rtol=1e-6)


def test_greedy_with_the_adapter_equals_transformers_with_peft(
    llama: Export, adapted: dict[str, object], registry: PluginRegistry
) -> None:
    generator = Generator(
        {"target": adapted["base"]}, "greedy", threads=1, registry=registry, adapters={"a1": adapted["adapter"]}
    )
    tokens = list(generator.generate(PROMPT, max_new_tokens=NEW_TOKENS, adapter="a1").tokens)
    assert tokens == _peft_greedy(llama, adapted["model"])
    plain = Generator({"target": llama.onnx}, "greedy", threads=1, registry=registry)
    assert tokens != list(plain.generate(PROMPT, max_new_tokens=NEW_TOKENS).tokens)  # the adapter changes the answer


def test_the_prompts_logits_with_the_adapter_are_close_to_peft(llama: Export, adapted: dict[str, object]) -> None:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(llama.hf)(PROMPT).input_ids
    with torch.no_grad():
        expected = adapted["model"](torch.tensor([ids])).logits[0].numpy()
    logits = _onnx_prompt_logits(adapted["base"], ids, dict(read_adapter(adapted["adapter"]).parameters))
    np.testing.assert_allclose(logits, expected, atol=ATOL)


def test_without_an_adapter_the_slots_add_nothing(
    llama: Export, adapted: dict[str, object], registry: PluginRegistry
) -> None:
    plain = list(
        Generator({"target": llama.onnx}, "greedy", threads=1, registry=registry)
        .generate(PROMPT, max_new_tokens=NEW_TOKENS)
        .tokens
    )
    as_exported = Generator({"target": adapted["base"]}, "greedy", threads=1, registry=registry)
    stacked = Generator(
        {"target": adapted["base"]}, "greedy", threads=1, registry=registry, adapters={"a1": adapted["adapter"]}
    )
    assert list(as_exported.generate(PROMPT, max_new_tokens=NEW_TOKENS).tokens) == plain
    assert list(stacked.generate(PROMPT, max_new_tokens=NEW_TOKENS).tokens) == plain


def test_an_adapter_of_a_module_the_base_has_no_slot_for_is_refused_naming_it(
    llama: Export, adapted: dict[str, object], tmp_path: Path
) -> None:
    saved = tmp_path / "o-proj"
    _peft_model(llama.hf, ["q_proj", "o_proj"]).save_pretrained(saved)
    with pytest.raises(ModelLoadError, match=r"model\.layers\.0\.self_attn\.o_proj.*no LoRA slot.*--targets o_proj"):
        convert_peft_adapter(saved, adapted["base"], tmp_path / "o.onnx_adapter")
    assert not (tmp_path / "o.onnx_adapter").exists()


def test_an_adapter_whose_shapes_do_not_fit_the_slots_is_refused(
    llama: Export, adapted: dict[str, object], tmp_path: Path
) -> None:
    from safetensors.numpy import save_file

    saved = tmp_path / "other"
    saved.mkdir()
    (saved / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file(
        {
            f"{prefix}.lora_A.weight": np.ones((4, 96), np.float32),
            f"{prefix}.lora_B.weight": np.ones((64, 4), np.float32),
        },
        str(saved / "adapter_model.safetensors"),
    )
    with pytest.raises(ModelLoadError, match=r"q_proj\.lora_A is float32\[96, 4\] but model .* takes float32\[64, "):
        convert_peft_adapter(saved, adapted["base"], tmp_path / "other.onnx_adapter")


def test_a_dora_adapter_is_refused_saying_why(llama: Export, adapted: dict[str, object], tmp_path: Path) -> None:
    saved = tmp_path / "dora"
    _peft_model(llama.hf, ["q_proj"], use_dora=True).save_pretrained(saved)
    with pytest.raises(ModelLoadError, match="use_dora is set, and DoRA"):
        convert_peft_adapter(saved, adapted["base"], tmp_path / "dora.onnx_adapter")


def test_a_target_the_graph_has_no_projection_for_is_refused(llama: Export, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--targets c_attn: .* has no such projection \(its projections: .*q_proj"):
        add_lora_slots(llama.onnx, tmp_path / "out", ["q_proj", "c_attn"])
    assert not (tmp_path / "out").exists()


def test_safetensors_are_read_as_the_safetensors_package_writes_them(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {"a": torch.randn(3, 5), "b": torch.randn(2, 4).to(torch.bfloat16), "c": torch.randn(7).half()}
    save_file(tensors, str(tmp_path / "t.safetensors"))
    read = read_safetensors(tmp_path / "t.safetensors")
    for name, tensor in tensors.items():
        np.testing.assert_array_equal(read[name], tensor.float().numpy())


ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_gemma2_with_every_projection_adapted_equals_transformers_with_peft(
    gemma2: Export, registry: PluginRegistry, tmp_path: Path
) -> None:
    """Gemma's graph scales the embedding by a Constant node and has windowed layers: the slots stack through it."""
    base, saved = tmp_path / "base", tmp_path / "peft"
    add_lora_slots(gemma2.onnx, base, ALL_PROJECTIONS)
    model = _peft_model(gemma2.hf, ALL_PROJECTIONS, seed=11, std=1.0)
    model.save_pretrained(saved)
    adapter = convert_peft_adapter(saved, base, tmp_path / "all.onnx_adapter")
    assert len(read_adapter(adapter).parameters) == 2 * 7 * 3  # A and B, 7 projections, 3 layers
    generator = Generator({"target": base}, "greedy", threads=1, registry=registry, adapters={"all": adapter})
    tokens = list(generator.generate(PROMPT, max_new_tokens=NEW_TOKENS, adapter="all").tokens)
    assert tokens == _peft_greedy(gemma2, model)
    plain = Generator({"target": gemma2.onnx}, "greedy", threads=1, registry=registry)
    assert list(generator.generate(PROMPT, max_new_tokens=NEW_TOKENS).tokens) == list(
        plain.generate(PROMPT, max_new_tokens=NEW_TOKENS).tokens
    )
    # the random Gemma 2 repeats one token with the adapter and without: its logits tell them apart
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(gemma2.hf)(PROMPT).input_ids
    sequence = Sequence("target", with_adapters(load_model(base, threads=1, lora_stacks=True), {"all": adapter}))
    sequence.runner.adapter = 1
    logits = np.array(sequence.forward(ids))
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
        with model.disable_adapter():
            unadapted = model(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(logits, expected, atol=ATOL)
    assert np.abs(expected - unadapted).max() > 100 * ATOL
