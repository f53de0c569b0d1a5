"""The Qwen2.5-VL family's host side: an image's patches and the vision graph's index inputs, and the decoder's
multimodal rotary positions (M-RoPE), each computed as transformers computes them.

- Patches (Qwen2VLImageProcessor.patchify): the normalised float32[3, H, W] image cut into ``patch_size`` squares,
  ordered ``merge_size`` x ``merge_size`` block by block, each repeated ``temporal_patch_size`` times (a still image
  is a clip of that many equal frames): float32[grid_h * grid_w, 3 * temporal * patch * patch].
- The vision graph's inputs beside the patches (transformers' vision_utils: get_vision_position_ids,
  get_vision_window_index, get_vision_cu_seqlens), so that the graph itself holds no loop over one grid: each patch's
  (row, column) for the vision rotary, the order that groups the merged patches window by window and its inverse,
  and the additive attention masks of the windowed and the full-attention layers (0 inside a block, -inf across).
- Positions (Qwen2_5_VLModel.get_rope_index): a text token takes one position on all three axes, one more than the
  last; the image tokens of one image take (t, row, column) of its merged grid, each plus the position where the image
  begins, and the text after it resumes at that start plus the grid's larger side. A generated token continues from
  there, so every position past the prompt is its index plus the row's delta (transformers' ``rope_deltas``).
  The positions are kept per cache index and recomputed from the tokens a row holds (fork, reorder), so that a
  rewind, a multi-token forward and a batched step each feed what transformers feeds.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from decoctl.errors import ConfigError, ModelLoadError

if TYPE_CHECKING:
    from decoctl.model._image_processor import ImagePreprocessor

__all__ = ["MRopePositions", "QwenVision", "patchify", "qwen_vision", "smart_resize"]

#: the vision graph's inputs, by the names genai_config.json's vision section maps to the graph's own
VISION_INPUTS = (
    "pixel_values",
    "rotary_positions",
    "window_index",
    "reverse_index",
    "window_attention_mask",
    "full_attention_mask",
)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' qwen2_vl smart_resize: (height, width) multiples of ``factor`` holding between ``min_pixels``
    and ``max_pixels`` pixels, the aspect ratio kept as near as that allows (its float arithmetic and round())."""
    if max(height, width) / min(height, width) > 200:
        raise ConfigError(
            f"an image of {width}x{height} has an aspect ratio over 200, which Qwen2-VL's processor refuses (as "
            "transformers does): crop it"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patchify(pixels: np.ndarray, patch: int, merge: int, temporal: int) -> np.ndarray:
    """float32[grid_h * grid_w, 3 * temporal * patch * patch] from a float32[3, H, W] image (H and W multiples of
    patch * merge), in Qwen2VLImageProcessor's order."""
    channels, height, width = pixels.shape
    grid_h, grid_w = height // patch, width // patch
    blocks = pixels.reshape(channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
    blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)
    frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], temporal, *blocks.shape[5:]))
    return np.ascontiguousarray(frames.reshape(grid_h * grid_w, channels * temporal * patch * patch), np.float32)


def qwen_vision(config_path: Path, preprocessor: ImagePreprocessor) -> QwenVision:
    """The vision geometry genai_config.json's vision section gives, checked against preprocessor_config.json's
    patching (ModelLoadError naming the key where they differ)."""
    section = json.loads(config_path.read_text(encoding="utf-8"))["model"]["vision"]
    vision = QwenVision.from_section(section, str(config_path))
    if preprocessor.patching is None:
        raise ModelLoadError(
            f"{config_path.parent / 'preprocessor_config.json'}: image_processor_type {preprocessor.processor!r} does "
            "not cut images into patches as a Qwen2.5-VL vision encoder takes them: give Qwen2VLImageProcessor's "
            "settings (the model's own preprocessor_config.json)"
        )
    patch, temporal, merge = preprocessor.patching
    for key, theirs, ours in (("patch_size", patch, vision.patch_size), ("merge_size", merge, vision.merge_size)):
        if theirs != ours:
            raise ModelLoadError(
                f"{config_path.parent / 'preprocessor_config.json'}: {key} {theirs} but {config_path}'s vision "
                f"section says {ours}: give both the vision config's value"
            )
    return attrs.evolve(vision, temporal_patch_size=temporal)


@attrs.frozen(kw_only=True)
class QwenVision:
    """The vision encoder's geometry (genai_config.json's vision section: ``patch_size``, ``spatial_merge_size``,
    ``window_size``; preprocessor_config.json's ``temporal_patch_size``) and the graph's input names (its
    ``inputs``, keyed as VISION_INPUTS)."""

    patch_size: int
    merge_size: int
    window_size: int
    inputs: Mapping[str, str]
    temporal_patch_size: int = 2

    def image(self, pixels: np.ndarray) -> tuple[dict[str, np.ndarray], tuple[int, int, int]]:
        """The vision graph's feeds for one float32[3, H, W] image, and its patch grid (t, h, w)."""
        patches = patchify(pixels, self.patch_size, self.merge_size, self.temporal_patch_size)
        grid = (1, pixels.shape[1] // self.patch_size, pixels.shape[2] // self.patch_size)
        return self.feeds(patches, grid), grid

    @classmethod
    def from_section(cls, section: Mapping[str, Any], source: str) -> QwenVision:
        values = {}
        for key in ("patch_size", "spatial_merge_size", "window_size"):
            value = section.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelLoadError(
                    f"{source}: model.vision.{key} is {value!r}: a Qwen2.5-VL vision encoder needs it as a positive "
                    "whole number (the vision config's value)"
                )
            values[key] = value
        inputs = section.get("inputs", {})
        missing = [name for name in VISION_INPUTS if name not in inputs]
        if missing:
            raise ModelLoadError(
                f"{source}: model.vision.inputs lacks {', '.join(missing)}: decoctl computes those on the host and "
                "feeds them to the vision graph by these names. A vision graph that takes image_grid_thw and computes "
                "them inside, for the grid it was traced with, is not one decoctl runs: export the vision tower as "
                "decoctl.testing.vlm_qwen does"
            )
        if values["window_size"] % (values["patch_size"] * values["spatial_merge_size"]):
            raise ModelLoadError(
                f"{source}: model.vision.window_size {values['window_size']} is not a multiple of patch_size x "
                "spatial_merge_size: give the vision config's window_size"
            )
        return cls(
            patch_size=values["patch_size"],
            merge_size=values["spatial_merge_size"],
            window_size=values["window_size"],
            inputs={name: inputs[name] for name in VISION_INPUTS},
        )

    def feeds(self, patches: np.ndarray, grid: tuple[int, int, int]) -> dict[str, np.ndarray]:
        """The vision graph's inputs for one image's ``patches`` on its patch ``grid`` (t, h, w)."""
        t, h, w = grid
        merge = self.merge_size
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        shape = (h // merge, merge, w // merge, merge)
        rotary = np.stack(
            [
                rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1),
                cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1),
            ],
            axis=-1,
        )
        rotary = np.tile(rotary, (t, 1)).astype(np.int64)
        order, bounds = self._windows(t, h // merge, w // merge)
        count = len(patches)
        window = np.full((count, count), -np.inf, np.float32)
        for start, end in itertools.pairwise(bounds):
            window[start:end, start:end] = 0.0
        full = np.full((count, count), -np.inf, np.float32)
        for frame in range(t):  # transformers attends within each frame (get_vision_cu_seqlens)
            full[frame * h * w : (frame + 1) * h * w, frame * h * w : (frame + 1) * h * w] = 0.0
        names = self.inputs
        return {
            names["pixel_values"]: patches,
            names["rotary_positions"]: rotary,
            names["window_index"]: order,
            names["reverse_index"]: np.argsort(order, kind="stable").astype(np.int64),
            names["window_attention_mask"]: window,
            names["full_attention_mask"]: full,
        }

    def _windows(self, t: int, llm_h: int, llm_w: int) -> tuple[np.ndarray, list[int]]:
        """get_vision_window_index for one grid: the merged patches' order window by window, and the windows'
        bounds in patches (empty windows dropped, as unique_consecutive drops them)."""
        side = self.window_size // self.merge_size // self.patch_size
        unit = self.merge_size**2
        pad_h, pad_w = side - llm_h % side, side - llm_w % side
        index = np.arange(t * llm_h * llm_w).reshape(t, llm_h, llm_w)
        padded = np.pad(index, ((0, 0), (0, pad_h), (0, pad_w)), constant_values=-100)
        n_h, n_w = (llm_h + pad_h) // side, (llm_w + pad_w) // side
        padded = padded.reshape(t, n_h, side, n_w, side).transpose(0, 1, 3, 2, 4).reshape(t, n_h * n_w, side, side)
        sizes = (padded != -100).sum(axis=(2, 3)).reshape(-1)
        flat = padded.reshape(-1)
        bounds = [0, *(np.cumsum(sizes) * unit).tolist()]
        return flat[flat != -100].astype(np.int64), list(dict.fromkeys(bounds))


@attrs.frozen(kw_only=True)
class ImageGrid:
    """One image's merged grid (t, h, w): its image tokens' (t, row, column) offsets, int64[3, t * h * w], and how far
    the text after it moves on (the larger of h and w)."""

    offsets: np.ndarray
    span: int

    @classmethod
    def of(cls, grid: tuple[int, int, int], merge: int) -> ImageGrid:
        t, h, w = grid[0], grid[1] // merge, grid[2] // merge
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
        return cls(offsets=np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]).astype(np.int64), span=max(h, w))


class MRopePositions:
    """One row's M-RoPE positions by cache index (see the module docstring): ``fill`` writes the positions of the
    tokens fed at an index and keeps, per index, where the text resumes."""

    def __init__(self, max_length: int, image_token: int | None, merge_size: int) -> None:
        self.image_token = -1 if image_token is None else image_token
        self.merge_size = merge_size
        #: the position the token at index i takes on every axis if it is text: transformers' current_pos
        self._cursor = np.zeros(max_length + 2, np.int64)
        #: for an image token at index i, the position where its image began
        self._start = np.zeros(max_length + 1, np.int64)
        #: whether the token at index i took an image's features
        self._image = np.zeros(max_length + 1, np.bool_)
        self._grids: tuple[tuple[int, int, int], ...] = ()
        self._merged: tuple[ImageGrid, ...] = ()
        self._first = np.zeros(1, np.int64)

    def _attach(self, grids: tuple[tuple[int, int, int], ...]) -> None:
        if grids == self._grids:
            return
        self._grids = grids
        self._merged = tuple(ImageGrid.of(g, self.merge_size) for g in grids)
        self._first = np.cumsum([0, *(g.offsets.shape[1] for g in self._merged)])

    def fill(
        self,
        tokens: np.ndarray,
        past: int,
        images_before: int,
        grids: tuple[tuple[int, int, int], ...],
        out: np.ndarray,
    ) -> None:
        """Positions int64[3, n] into ``out`` for ``tokens`` fed at ``past``, where ``images_before`` image tokens
        were fed earlier and ``grids`` are the patch grids of the images the prompt holds (their features go to the
        first image tokens, in order; an image token past them is text, as a generated one is).
        ConfigError where the tokens break an image's run (text inside it, or two images with nothing between them,
        which transformers' get_rope_index would read as one)."""
        self._attach(grids)
        held = int(self._first[-1])
        cursor = int(self._cursor[past])
        n = len(tokens)
        if images_before >= held or (self._locate(images_before)[1] == 0 and not (tokens == self.image_token).any()):
            # text only (every decode step): consecutive positions from the cursor
            after = cursor + np.arange(1, n + 1)
            out[:] = after - 1
            self._cursor[past + 1 : past + n + 1] = after
            self._image[past : past + n] = False
            return
        image_rows = images_before
        for i, token in enumerate(tokens.tolist()):
            index = past + i
            image, within = self._locate(image_rows) if image_rows < held else (-1, 0)
            if token == self.image_token and image >= 0:
                if within == 0:
                    if index > 0 and self._image[index - 1]:
                        raise ConfigError(
                            f"images {image - 1} and {image} stand next to each other in the prompt (index {index}): "
                            "put text between them (Qwen's <|vision_end|><|vision_start|>), as transformers needs"
                        )
                    self._start[index] = cursor
                else:
                    self._start[index] = self._start[index - 1]
                start = int(self._start[index])
                grid = self._merged[image]
                out[:, i] = grid.offsets[:, within] + start
                image_rows += 1
                if within == grid.offsets.shape[1] - 1:
                    cursor = start + grid.span
                self._image[index] = True
            else:
                if within:
                    raise ConfigError(
                        f"token {token} at index {index} falls inside image {image}'s image tokens: an image's tokens "
                        "stand together, where the prompt's image mark expands to them"
                    )
                out[:, i] = cursor
                cursor += 1
                self._image[index] = False
            self._cursor[index + 1] = cursor

    def _locate(self, row: int) -> tuple[int, int]:
        """(image, index within it) of the image feature row ``row``."""
        image = int(np.searchsorted(self._first, row, side="right")) - 1
        return image, row - int(self._first[image])

    def next_position(self, length: int) -> int:
        """The position a text token fed at index ``length`` takes (on every axis)."""
        return int(self._cursor[length])
