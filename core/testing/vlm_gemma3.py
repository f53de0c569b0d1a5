"""A tiny random-weight Gemma 3 vision-language model (SigLIP vision tower, Gemma3MultiModalProjector, Gemma 3 text
model with sliding-window layers) built with transformers and exported into the three graphs of onnxruntime-genai's
vision-language layout, for tests::

    python -m decoctl.testing.vlm_gemma3 build/tiny-gemma3

The graphs: ``vision.onnx`` (pixel_values -> image_features: the vision tower, the projector's average pooling to
``mm_tokens_per_image`` rows, its norm and projection), ``embedding.onnx`` (input_ids and image_features ->
inputs_embeds: Gemma's scaled token embeddings with the image features at the image soft tokens) and the decoder
(onnxruntime-genai's builder with ``exclude_embeds=true`` on the text model as Gemma3ForCausalLM), with a
genai_config.json naming all three, a preprocessor_config.json (Gemma3ImageProcessor's settings), a
processor_config.json (``image_seq_length``) and a tokenizer_config.json naming the image tokens as Gemma 3's
tokenizer does (``boi_token``, ``image_token``, ``eoi_token``). That export is ``plain``; ``onnx`` is its copy with
the decoder's position_ids and attention_bias inputs (``decoctl models enable-tree``), which decoctl needs to let an
image's tokens attend to each other both ways as transformers' Gemma 3 does (decoctl.model._image_blocks).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from decoctl.model.graph import enable_tree
from decoctl.testing import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, build_tokenizer
from decoctl.testing.vlm import export_embedding, export_vision_graph, missing, run_builder, write_vision_sections

__all__ = ["BOI", "EOI", "IMAGE_MARK", "IMAGE_TOKENS", "SOFT", "Gemma3", "build_gemma3", "main", "missing"]

IMAGE_SIZE = 32
PATCH = 8
IMAGE_TOKENS = 4
"""Image soft tokens per image (or per pan-and-scan crop): the 4 x 4 patches average-pooled to 2 x 2."""
BOI = "<start_of_image>"
"""The begin-of-image mark (Gemma 3's boi_token)."""
SOFT = "<image_soft_token>"
"""The token an image's features take the place of, one per feature row (Gemma 3's image_token)."""
EOI = "<end_of_image>"
"""The end-of-image mark (Gemma 3's eoi_token)."""
IMAGE_MARK = BOI
"""What a prompt holds where an image goes: Gemma3Processor expands it to ``\\n\\n`` BOI, IMAGE_TOKENS soft tokens,
EOI ``\\n\\n``."""
SLIDING_WINDOW = 16


@attrs.frozen(kw_only=True)
class Gemma3:
    """The transformers folder (``hf``, with the tokenizer and the processor's configs, so that
    ``Gemma3Processor.from_pretrained(hf)`` loads), the export as the builder leaves it (``plain``) and with the tree
    inputs decoctl runs it with (``onnx``); the image tokens' ids."""

    hf: Path
    plain: Path
    onnx: Path
    boi_token: int
    image_token: int
    eoi_token: int


def build_gemma3(root: Path) -> Gemma3:
    """Build the model under ``root`` (``root/hf``: transformers' folder; ``root/plain`` and ``root/onnx``: the
    exports)."""
    absent = missing()
    if absent:
        raise ModuleNotFoundError(
            f"the vision-language export needs {', '.join(absent)}: pip install 'decoctl[test]' (and torch==2.13.0)"
        )
    import torch
    from tokenizers import AddedToken, Tokenizer
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

    root.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(build_tokenizer(root / "tokenizer" / "bpe")))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (BOI, SOFT, EOI)])
    found = [tokenizer.token_to_id(t) for t in (BOI, SOFT, EOI)]
    assert None not in found  # added just above
    boi, soft, eoi = (int(i) for i in found if i is not None)
    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
    )
    text = Gemma3TextConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        # untied and wide: tied tiny random Gemmas repeat their last token
        initializer_range=0.5,
        tie_word_embeddings=False,
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
    )
    config = Gemma3Config(
        vision_config=vision,
        text_config=text,
        mm_tokens_per_image=IMAGE_TOKENS,
        boi_token_index=boi,
        eoi_token_index=eoi,
        image_token_index=soft,
        tie_word_embeddings=False,
    )
    torch.manual_seed(11)
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # random weights large enough that the image moves the logits visibly
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 1.0)
    hf = root / "hf"
    _save(model, tokenizer, hf)
    plain = root / "plain"
    plain.mkdir(exist_ok=True)
    _export_decoder(model, text, tokenizer, root, plain)
    _export_vision(model, plain / "vision.onnx")
    export_embedding(_FoldedScale(model), soft, plain / "embedding.onnx")
    _write_configs(plain, hf, soft)
    tokenizer.save(str(plain / "tokenizer.json"))
    onnx_dir = enable_tree(plain, root / "onnx")
    return Gemma3(hf=hf, plain=plain, onnx=onnx_dir, boi_token=boi, image_token=soft, eoi_token=eoi)


def _save(model: Any, tokenizer: Any, hf: Path) -> None:
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    model.generation_config = GenerationConfig(
        bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID
    )
    model.save_pretrained(hf)
    names = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
    # Gemma 3's tokenizer names its image tokens; Gemma3Processor reads them from these attributes
    extra = {"boi_token": BOI, "image_token": SOFT, "eoi_token": EOI}
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, **names, extra_special_tokens=extra).save_pretrained(hf)
    (hf / "preprocessor_config.json").write_text(json.dumps(_preprocessor(), indent=2), encoding="utf-8")
    processor = {"processor_class": "Gemma3Processor", "image_seq_length": IMAGE_TOKENS}
    (hf / "processor_config.json").write_text(json.dumps(processor, indent=2), encoding="utf-8")


def _preprocessor() -> dict[str, Any]:
    """Gemma3ImageProcessor's settings as the published checkpoints carry them (pan-and-scan off; its crop settings
    null, so Gemma3Processor's defaults apply when a caller turns it on)."""
    return {
        "image_processor_type": "Gemma3ImageProcessor",
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_pan_and_scan": None,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": None,
        "pan_and_scan_min_ratio_to_activate": None,
        "resample": 2,
        "rescale_factor": 1 / 255,
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    }


def _export_decoder(model: Any, text: Any, tokenizer: Any, root: Path, out: Path) -> None:
    """The text model alone as Gemma3ForCausalLM, its config.json flattened as the builder reads it (as decoctl's Gemma
    3 importer does), through the builder."""
    from transformers import Gemma3ForCausalLM, PreTrainedTokenizerFast

    from decoctl.importers._gemma3 import builder_config

    language = Gemma3ForCausalLM(text).eval()
    language.model.load_state_dict(model.model.language_model.state_dict())
    language.lm_head.load_state_dict(model.lm_head.state_dict())
    language.generation_config = model.generation_config
    text_dir = root / "text"
    language.save_pretrained(text_dir)
    config_path = text_dir / "config.json"
    config_path.write_text(json.dumps(builder_config(json.loads(config_path.read_text(encoding="utf-8")))))
    names = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, **names).save_pretrained(text_dir)
    run_builder(text_dir, root, out)


class _FoldedScale:
    """The model as export_embedding reads it, its embedding table times Gemma's embed_scale: the graph is then one
    Gather whose table decoctl looks decode steps up in (and a generated image token, which no image fills, takes its
    row). float32 products, the same bits whether the scale comes before the lookup or after."""

    def __init__(self, model: Any) -> None:
        import torch

        scaled = model.get_input_embeddings()
        weight = scaled.weight.detach() * scaled.embed_scale.to(scaled.weight.dtype)
        self.table = torch.nn.Embedding.from_pretrained(weight, freeze=True)
        self.config = model.config

    def get_input_embeddings(self) -> Any:
        return self.table


def _export_vision(model: Any, path: Path) -> None:
    import torch

    class Vision(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gemma = model

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            # Gemma3Model.get_image_features: the tower's last hidden state, pooled, normed and projected
            patches = self.gemma.model.vision_tower(pixel_values=pixel_values).last_hidden_state
            features = self.gemma.model.multi_modal_projector(patches)
            return features.reshape(-1, features.shape[-1])

    export_vision_graph(Vision(), IMAGE_SIZE, path)


def _write_configs(out: Path, hf: Path, image_token: int) -> None:
    write_vision_sections(out, "gemma3", image_token)
    for name in ("preprocessor_config.json", "processor_config.json", "tokenizer_config.json"):
        (out / name).write_bytes((hf / name).read_bytes())


def main() -> None:
    """``python -m decoctl.testing.vlm_gemma3 FOLDER``: build the tiny Gemma 3 there."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m decoctl.testing.vlm_gemma3", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write (hf/, plain/ and onnx/ inside)")
    built = build_gemma3(parser.parse_args().out)
    print(f"{built.onnx}: image mark {IMAGE_MARK!r}, {IMAGE_TOKENS} soft tokens (id {built.image_token}) an image")


if __name__ == "__main__":
    main()
