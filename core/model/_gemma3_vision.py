"""Gemma 3's image marks, expanded in the prompt's text as transformers' Gemma3Processor expands them.

A Gemma 3 prompt holds the begin-of-image token (``<start_of_image>``) where an image goes. The processor replaces
each with ``\\n\\n``, that token, ``image_seq_length`` image soft tokens, the end-of-image token and ``\\n\\n``; with
pan-and-scan crops, with "Here is the original image <that> and here are some crops to help you see better " and the
same sequence once per crop, joined by spaces. It does so in the text, before tokenizing, so the newlines tokenize
with the text beside them: decoctl expands the text too, never the token ids.

The token names come from tokenizer_config.json (``boi_token``, ``image_token``, ``eoi_token``, at the top or under
``extra_special_tokens`` as transformers writes them) and ``image_seq_length`` from processor_config.json, as
``Gemma3Processor.from_pretrained`` reads them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.model._capabilities import Capabilities
from decoctl.model._image_blocks import BidirectionalImages
from decoctl.model._spec import ModelSpec

__all__ = ["Gemma3Marks", "gemma3_images"]

#: Gemma3Processor's default image_seq_length, where processor_config.json gives none
_IMAGE_SEQ_LENGTH = 256


@attrs.frozen(kw_only=True)
class Gemma3Marks:
    """The begin-of-image (the mark a prompt holds), image soft and end-of-image tokens' texts, and the soft tokens
    an image (or a crop) takes."""

    boi: str
    soft: str
    eoi: str
    image_seq_length: int

    @classmethod
    def from_folder(cls, folder: Path) -> Gemma3Marks:
        """From the folder's tokenizer_config.json and processor_config.json; ModelLoadError naming the file and the
        key that is missing or wrong."""
        tokens = _json(folder / "tokenizer_config.json")
        extra = tokens.get("extra_special_tokens")
        named = {**(extra if isinstance(extra, Mapping) else {}), **tokens}
        texts = {}
        for key in ("boi_token", "image_token", "eoi_token"):
            value = named.get(key)
            if isinstance(value, Mapping):  # an AddedToken written out
                value = value.get("content")
            if not isinstance(value, str) or not value:
                raise ModelLoadError(
                    f"{folder / 'tokenizer_config.json'} names no {key}: Gemma 3's processor expands the image marks "
                    "with it; copy the tokenizer_config.json the model was published with"
                )
            texts[key] = value
        processor_path = folder / "processor_config.json"
        length = _json(processor_path).get("image_seq_length", _IMAGE_SEQ_LENGTH) if processor_path.is_file() else None
        if length is None:
            length = _IMAGE_SEQ_LENGTH
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ModelLoadError(f"{processor_path}: image_seq_length = {json.dumps(length)}: give a positive count")
        return cls(boi=texts["boi_token"], soft=texts["image_token"], eoi=texts["eoi_token"], image_seq_length=length)

    def expand(self, text: str, per_image: Sequence[int]) -> str:
        """``text`` with each begin-of-image mark expanded for the image in its place; ``per_image``: the feature
        rows each image gave, in order (its views, the whole image and its crops, times image_seq_length).
        ConfigError where the marks and the images do not pair up."""
        pieces = text.split(self.boi)
        if len(pieces) - 1 != len(per_image):
            raise ConfigError(
                f"the prompt holds {len(pieces) - 1} image mark(s) ({self.boi}) for {len(per_image)} image(s): put "
                "one where each image goes, one per image given"
            )
        whole = f"\n\n{self.boi}{self.soft * self.image_seq_length}{self.eoi}\n\n"
        out = [pieces[0]]
        for rows, after in zip(per_image, pieces[1:], strict=True):
            crops = rows // self.image_seq_length - 1
            if crops < 0 or rows % self.image_seq_length:
                raise ConfigError(
                    f"an image gave {rows} feature rows, not a multiple of image_seq_length {self.image_seq_length}: "
                    "the vision graph and processor_config.json belong to different models"
                )
            if crops:
                out.append(
                    f"Here is the original image {whole} and here are some crops to help you see better "
                    + " ".join([whole] * crops)
                )
            else:
                out.append(whole)
            out.append(after)
        return "".join(out)


def gemma3_images(spec: ModelSpec, capabilities: Capabilities) -> tuple[Gemma3Marks, BidirectionalImages]:
    """A Gemma 3 folder's image marks and its image blocks' feeding; ModelLoadError where the decoder cannot attend
    among an image's tokens both ways as transformers does."""
    missing = [
        name
        for name, found in (
            ("position_ids", capabilities.position_ids),
            ("attention_bias", capabilities.attention_bias),
        )
        if found is None
    ]
    if missing:
        raise ModelLoadError(
            f"{spec.onnx_file} takes no {' or '.join(missing)} input, but Gemma 3 attends bidirectionally among each "
            "image's tokens while the prompt goes in (transformers' token_type_ids mask) and the decoder's "
            "GroupQueryAttention is causal: decoctl feeds an image's tokens exactly through those two inputs "
            "(decoctl.model._image_blocks), and without them every answer to an image would differ from "
            f"transformers'. Run `decoctl models enable-tree {spec.path} NEW_FOLDER` and load NEW_FOLDER"
        )
    assert spec.image_token_id is not None  # the loader checked it
    marks = Gemma3Marks.from_folder(spec.path)
    # an image's block goes in as a tree does (its own bias and positions): ring layers take trees up to their slack
    limit = min((r.kernel_window - r.window + 1 for r in capabilities.rings), default=None)
    if limit is not None and limit < marks.image_seq_length:
        raise ModelLoadError(
            f"{spec.onnx_file}'s sliding-window layers keep ring caches whose slack lets an image block of at most "
            f"{limit} tokens go in exactly, and an image is {marks.image_seq_length} tokens (processor_config.json's "
            f"image_seq_length): load it with load_model(..., ring_slack={marks.image_seq_length}) or more, or "
            "export it without the builder's windowed KV cache"
        )
    return marks, BidirectionalImages(layers=spec.num_layers, image_token=spec.image_token_id)


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{path} is missing: Gemma 3's image marks are named there; copy the model's own") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path} cannot be read as JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path} holds a {type(value).__name__}, not an object")
    return value
