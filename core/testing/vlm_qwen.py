"""A tiny random-weight Qwen2.5-VL (windowed vision transformer with patch merging, Qwen2 text model with
multimodal rotary positions) built with transformers and exported into onnxruntime-genai's three-graph
vision-language layout, for tests and for trying decoctl's dynamic-resolution path without downloading a model::

    python -m decoctl.testing.vlm_qwen build/tiny-qwen-vl    # then: decoctl generate -m build/tiny-qwen-vl/onnx ...

The graphs: ``vision.onnx`` (torch.onnx.export of the vision tower and merger for any grid: it takes one image's
flattened patches and what the host computes from the grid, decoctl.model._qwen_vl: the patches' rotary rows and
columns, the window order and its inverse, and the windowed and full attention masks, so no loop over one grid is
traced into it), ``embedding.onnx`` (decoctl.testing.vlm.export_embedding) and the decoder (onnxruntime-genai's builder
on the Qwen2_5_VLForConditionalGeneration folder with ``exclude_embeds=true``: it takes inputs_embeds and 3 x batch x
sequence position_ids and applies M-RoPE itself), with a genai_config.json naming all three and a
preprocessor_config.json (Qwen2VLImageProcessor's settings).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from decoctl.model._qwen_vl import VISION_INPUTS
from decoctl.testing import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, build_tokenizer
from decoctl.testing.vlm import export_embedding, missing, run_builder, write_vision_sections

__all__ = ["IMAGE_MARK", "IMAGE_PAD", "MAX_PIXELS", "MIN_PIXELS", "QwenVL", "build_qwen_vl", "main", "missing"]

PATCH = 14
MERGE = 2
TEMPORAL = 2
WINDOW = 56
"""The vision window: 56 pixels, 2 x 2 merged patches, so that larger images span several windows."""
MIN_PIXELS = 28 * 28 * 2
"""Qwen2VLImageProcessor's lower bound: an image is resized to at least 2 merged patches (image tokens)."""
MAX_PIXELS = 28 * 28 * 20
"""Qwen2VLImageProcessor's upper bound: an image is resized to at most 20 merged patches (image tokens)."""
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
"""The image token: decoctl expands each to as many as its image has merged patches."""
IMAGE_MARK = f"{VISION_START}{IMAGE_PAD}{VISION_END}"
"""What a prompt holds where an image goes; decoctl expands the image pad to the image's merged patches."""
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)
#: the vision graph's inputs (named as genai_config.json's vision section keys them)
VISION_NAMES = {name: name for name in VISION_INPUTS}


@attrs.frozen(kw_only=True)
class QwenVL:
    """The transformers folder (``hf``) and the export (``onnx``); ``image_token``: the image pad's id."""

    hf: Path
    onnx: Path
    image_token: int


def build_qwen_vl(root: Path) -> QwenVL:
    """Build the model under ``root`` (``root/hf``: transformers' folder; ``root/onnx``: the export)."""
    absent = missing()
    if absent:
        raise ModuleNotFoundError(
            f"the vision-language export needs {', '.join(absent)}: pip install 'decoctl[test]' (and torch==2.13.0)"
        )
    import torch
    from tokenizers import AddedToken, Tokenizer
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2_5_VLConfig
    from transformers import Qwen2_5_VLForConditionalGeneration as Model

    root.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = root / "tokenizer"
    tokenizer_dir.mkdir(exist_ok=True)
    tokenizer = Tokenizer.from_file(str(build_tokenizer(tokenizer_dir / "bpe")))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in IMAGE_MARK_TOKENS])
    ids: dict[str, int] = {}
    for token in IMAGE_MARK_TOKENS:
        found = tokenizer.token_to_id(token)
        assert found is not None  # added just above
        ids[token] = int(found)
    vocab = tokenizer.get_vocab_size()
    text = {
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "initializer_range": 0.2,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "tie_word_embeddings": False,
    }
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "temporal_patch_size": TEMPORAL,
        "window_size": WINDOW,
        "out_hidden_size": 64,
        "fullatt_block_indexes": [1],
    }
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids[IMAGE_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        video_token_id=ids[VISION_END],  # no videos; the id must be a token
        tie_word_embeddings=False,
    )
    torch.manual_seed(11)
    model = Model(config).eval()
    with torch.no_grad():  # random weights large enough that the image moves the logits visibly
        for parameter in model.model.visual.merger.parameters():
            parameter.mul_(4.0)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID
    )
    hf = root / "hf"
    model.save_pretrained(hf)
    names = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, **names).save_pretrained(hf)
    onnx_dir = root / "onnx"
    onnx_dir.mkdir(exist_ok=True)
    run_builder(hf, root, onnx_dir)
    _export_vision(model, onnx_dir / "vision.onnx")
    export_embedding(model, ids[IMAGE_PAD], onnx_dir / "embedding.onnx")
    _write_configs(onnx_dir, ids[IMAGE_PAD])
    tokenizer.save(str(onnx_dir / "tokenizer.json"))
    (hf / "preprocessor_config.json").write_text((onnx_dir / "preprocessor_config.json").read_text())
    return QwenVL(hf=hf, onnx=onnx_dir, image_token=ids[IMAGE_PAD])


IMAGE_MARK_TOKENS = (VISION_START, IMAGE_PAD, VISION_END)


def _export_vision(model: Any, path: Path) -> None:
    import torch
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision

    from decoctl.model._qwen_vl import QwenVision

    visual = model.model.visual

    class Vision(torch.nn.Module):
        """The vision tower as Qwen2_5_VisionTransformerPretrainedModel.forward runs it, its per-grid indices and
        attention blocks taken as inputs (eager attention with an additive mask, one image at a time)."""

        def __init__(self) -> None:
            super().__init__()
            self.visual = visual

        def forward(
            self,
            pixel_values: torch.Tensor,
            rotary_positions: torch.Tensor,
            window_index: torch.Tensor,
            reverse_index: torch.Tensor,
            window_attention_mask: torch.Tensor,
            full_attention_mask: torch.Tensor,
        ) -> torch.Tensor:
            v = self.visual
            hidden = v.patch_embed(pixel_values)
            count = hidden.shape[0]
            unit = v.spatial_merge_unit

            def windowed(x: torch.Tensor) -> torch.Tensor:
                return x.reshape(count // unit, unit, -1)[window_index].reshape(count, -1)

            hidden = windowed(hidden)
            cos, sin = v.rotary_pos_emb(hidden, rotary_positions)
            cos, sin = windowed(cos), windowed(sin)
            for number, block in enumerate(v.blocks):
                mask = full_attention_mask if number in v.fullatt_block_indexes else window_attention_mask
                attention = block.attn
                normed = block.norm1(hidden)
                q, k, values = attention.qkv(normed).reshape(count, 3, attention.num_heads, -1).permute(1, 0, 2, 3)
                q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
                q, k, values = (x.transpose(0, 1) for x in (q, k, values))
                scores = torch.matmul(q, k.transpose(1, 2)) * attention.scaling + mask
                weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32)
                out = torch.matmul(weights, values).transpose(0, 1).reshape(count, -1)
                hidden = hidden + attention.proj(out)
                hidden = hidden + block.mlp(block.norm2(hidden))
            return v.merger(hidden)[reverse_index]

    layout = QwenVision.from_section(
        {
            "patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "window_size": WINDOW,
            "inputs": VISION_NAMES,
        },
        "the export",
    )
    grid = (1, 8, 12)
    patches = np.zeros((grid[1] * grid[2], 3 * TEMPORAL * PATCH * PATCH), np.float32)
    feeds = layout.feeds(patches, grid)
    order = list(VISION_NAMES)
    inputs = tuple(torch.from_numpy(np.ascontiguousarray(feeds[name])) for name in order)
    patches_axis = {0: "patches"}
    torch.onnx.export(
        Vision().eval(),
        inputs,
        str(path),
        input_names=order,
        output_names=["image_features"],
        dynamic_axes={
            "pixel_values": patches_axis,
            "rotary_positions": patches_axis,
            "window_index": {0: "merged"},
            "reverse_index": {0: "merged"},
            "window_attention_mask": {0: "patches", 1: "patches"},
            "full_attention_mask": {0: "patches", 1: "patches"},
            "image_features": {0: "merged"},
        },
        opset_version=17,
        dynamo=False,
    )


def _write_configs(out: Path, image_token: int) -> None:
    vision = {"patch_size": PATCH, "spatial_merge_size": MERGE, "window_size": WINDOW, "inputs": VISION_NAMES}
    write_vision_sections(out, "qwen2_5_vl", image_token, vision)
    processor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "do_resize": True,
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "patch_size": PATCH,
        "temporal_patch_size": TEMPORAL,
        "merge_size": MERGE,
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
    """``python -m decoctl.testing.vlm_qwen FOLDER``: build the tiny Qwen2.5-VL there."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m decoctl.testing.vlm_qwen", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write (hf/ and onnx/ inside)")
    built = build_qwen_vl(parser.parse_args().out)
    print(f"{built.onnx}: image pad {IMAGE_PAD!r} (id {built.image_token}); a prompt marks an image as {IMAGE_MARK}")


if __name__ == "__main__":
    main()
