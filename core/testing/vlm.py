"""A tiny random-weight LLaVA (CLIP vision tower, Llama text model) built with transformers and exported into the
three graphs of onnxruntime-genai's vision-language layout, for tests and for trying decoctl's vision-language
path without downloading a model::

    python -m decoctl.testing.vlm build/tiny-llava       # then: decoctl generate -m build/tiny-llava/onnx ...

The graphs: ``vision.onnx`` (pixel_values -> image_features, the
vision tower and projector, torch.onnx.export), ``embedding.onnx`` (input_ids and image_features -> inputs_embeds:
the token embeddings with the image features at the image tokens' positions, torch.onnx.export) and the decoder
(onnxruntime-genai's builder with ``exclude_embeds=true``: it takes inputs_embeds), with a genai_config.json that
names all three and a preprocessor_config.json that says how images become pixel values. It needs torch,
transformers, onnxruntime-genai and onnx-ir (the test extras) and Pillow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs

from decoctl.testing import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, build_tokenizer

__all__ = ["IMAGE_MARK", "IMAGE_TOKENS", "NEEDED", "Llava", "build_llava", "main", "missing"]

NEEDED = ("onnxruntime_genai", "onnx_ir", "torch", "transformers", "PIL")
"""The packages building the model needs (``missing()`` says which are not installed)."""
IMAGE_SIZE = 28
PATCH = 14
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2
"""Image tokens per image: (28 / 14)^2 patches, the CLS token dropped ("default" feature selection)."""
IMAGE_MARK = "<image>"
"""The placeholder a prompt holds where an image goes (expanded to IMAGE_TOKENS image tokens)."""
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


@attrs.frozen(kw_only=True)
class Llava:
    """The transformers folder (``hf``) and the export (``onnx``); ``image_token``: the image placeholder's id."""

    hf: Path
    onnx: Path
    image_token: int


def missing() -> list[str]:
    """The packages the export needs that are not installed."""
    import importlib.util

    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def build_llava(root: Path) -> Llava:
    """Build the model under ``root`` (``root/hf``: transformers' folder; ``root/onnx``: the export)."""
    absent = missing()
    if absent:
        raise ModuleNotFoundError(
            f"the vision-language export needs {', '.join(absent)}: pip install 'decoctl[test]' (and torch==2.13.0)"
        )
    import torch
    from tokenizers import AddedToken, Tokenizer
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    root.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = root / "tokenizer"
    tokenizer_dir.mkdir(exist_ok=True)
    tokenizer = Tokenizer.from_file(str(build_tokenizer(tokenizer_dir / "bpe")))
    tokenizer.add_special_tokens([AddedToken(IMAGE_MARK, special=True, normalized=False)])
    found = tokenizer.token_to_id(IMAGE_MARK)
    assert found is not None  # added just above
    image_token = int(found)
    vocab = tokenizer.get_vocab_size()
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
        projection_dim=32,
    )
    text = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
        tie_word_embeddings=False,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=image_token,
        image_seq_length=IMAGE_TOKENS,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(7)
    model = LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():  # random weights large enough that the image moves the logits visibly
        for parameter in model.model.multi_modal_projector.parameters():
            parameter.mul_(4.0)
    hf = root / "hf"
    model.save_pretrained(hf)
    onnx_dir = root / "onnx"
    onnx_dir.mkdir(exist_ok=True)
    _export_decoder(model, text, root, onnx_dir, tokenizer)
    _export_vision(model, onnx_dir / "vision.onnx")
    export_embedding(model, image_token, onnx_dir / "embedding.onnx")
    _write_configs(onnx_dir, image_token, vision)
    tokenizer.save(str(onnx_dir / "tokenizer.json"))
    tokenizer.save(str(hf / "tokenizer.json"))
    return Llava(hf=hf, onnx=onnx_dir, image_token=image_token)


def _export_decoder(model: Any, text: Any, root: Path, out: Path, tokenizer: Any) -> None:
    from transformers import GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    language = LlamaForCausalLM(text).eval()
    language.model.load_state_dict(model.model.language_model.state_dict())
    language.lm_head.load_state_dict(model.lm_head.state_dict())
    language.generation_config = GenerationConfig(
        bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID
    )
    text_dir = root / "text"
    language.save_pretrained(text_dir)
    names = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, **names).save_pretrained(text_dir)
    run_builder(text_dir, root, out)


def run_builder(text_dir: Path, root: Path, out: Path, *, exclude_embeds: bool = True) -> None:
    """onnxruntime-genai's builder on the transformers folder ``text_dir`` with ``exclude_embeds=true`` (the decoder
    takes inputs_embeds; false: token ids, the text model alone); its model.onnx, weights and genai_config.json copied
    into ``out``."""
    decoder_dir = root / "decoder"
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(text_dir), "-o", str(decoder_dir)]
    command += ["-p", "fp32", "-e", "cpu", "-c", str(root / "builder-cache")]
    if exclude_embeds:
        command += ["--extra_options", "exclude_embeds=true"]
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    if done.returncode != 0:
        raise RuntimeError(f"the builder failed on the text model:\n{(done.stdout + done.stderr)[-3000:]}")
    for name in ("model.onnx", "model.onnx.data", "genai_config.json"):
        if (decoder_dir / name).exists():
            (out / name).write_bytes((decoder_dir / name).read_bytes())


def _export_vision(model: Any, path: Path) -> None:
    import torch

    class Vision(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llava = model

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            # LLaVA's selection: the second-to-last layer's patches (CLS dropped), through the projector
            outputs = self.llava.model.vision_tower(pixel_values, output_hidden_states=True)
            patches = outputs.hidden_states[-2][:, 1:]
            features = self.llava.model.multi_modal_projector(patches)
            return features.reshape(-1, features.shape[-1])

    export_vision_graph(Vision(), IMAGE_SIZE, path)


def export_vision_graph(vision: Any, image_size: int, path: Path) -> None:
    """Export ``vision`` (a torch module: pixel_values [images, 3, size, size] -> image_features [rows, hidden]) as
    the vision graph, its images and feature rows dynamic."""
    import torch

    torch.onnx.export(
        vision.eval(),
        (torch.zeros(1, 3, image_size, image_size),),
        str(path),
        input_names=["pixel_values"],
        output_names=["image_features"],
        dynamic_axes={"pixel_values": {0: "num_images"}, "image_features": {0: "num_image_tokens"}},
        opset_version=17,
        dynamo=False,
    )


def export_embedding(model: Any, image_token: int, path: Path) -> None:
    """The embedding graph: input_ids and image_features -> inputs_embeds, the model's input embeddings with the
    feature rows at the ``image_token`` positions, in order."""
    import torch

    class Embedding(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = model.get_input_embeddings()

        def forward(self, input_ids: torch.Tensor, image_features: torch.Tensor) -> torch.Tensor:
            embeds = self.table(input_ids)
            mask = (input_ids == image_token).reshape(-1)
            flat = embeds.reshape(-1, embeds.shape[-1])
            # row 0 is a zero row, so that text-only forwards (no feature rows) gather in bounds
            zero = torch.zeros(1, image_features.shape[1], dtype=image_features.dtype)
            padded = torch.cat([zero, image_features], dim=0)
            index = torch.cumsum(mask.to(torch.int64), 0) * mask.to(torch.int64)
            picked = padded[index]
            flat = torch.where(mask[:, None], picked, flat)
            return flat.reshape(embeds.shape)

    ids = torch.tensor([[5, image_token, 6]])
    features = torch.zeros(1, model.config.text_config.hidden_size)
    torch.onnx.export(
        Embedding().eval(),
        (ids, features),
        str(path),
        input_names=["input_ids", "image_features"],
        output_names=["inputs_embeds"],
        dynamic_axes={
            "input_ids": {0: "batch_size", 1: "sequence_length"},
            "image_features": {0: "num_image_tokens"},
            "inputs_embeds": {0: "batch_size", 1: "sequence_length"},
        },
        opset_version=17,
        dynamo=False,
    )


def write_vision_sections(out: Path, model_type: str, image_token: int, vision: dict[str, Any] | None = None) -> None:
    """Name the family, the image token, ``vision.onnx`` and ``embedding.onnx`` in the builder's genai_config.json
    in ``out``; ``vision``: the vision section's settings and inputs beyond pixel_values -> image_features."""
    config_path = out / "genai_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["model"]["type"] = model_type
    config["model"]["image_token_id"] = image_token
    config["model"]["vision"] = {
        "filename": "vision.onnx",
        "inputs": {"pixel_values": "pixel_values"},
        "outputs": {"image_features": "image_features"},
        **(vision or {}),
    }
    config["model"]["embedding"] = {
        "filename": "embedding.onnx",
        "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
        "outputs": {"inputs_embeds": "inputs_embeds"},
    }
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")


def _write_configs(out: Path, image_token: int, vision: Any) -> None:
    write_vision_sections(out, "llava", image_token)
    processor = {
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": True,
        "size": {"height": vision.image_size, "width": vision.image_size},
        "do_center_crop": False,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(MEAN),
        "image_std": list(STD),
        "do_convert_rgb": True,
        "resample": 3,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True}), encoding="utf-8")


def main() -> None:
    """``python -m decoctl.testing.vlm FOLDER``: build the tiny LLaVA there."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m decoctl.testing.vlm", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write (hf/ and onnx/ inside)")
    built = build_llava(parser.parse_args().out)
    print(f"{built.onnx}: image token {IMAGE_MARK!r} (id {built.image_token}), {IMAGE_TOKENS} tokens an image")


if __name__ == "__main__":
    main()
