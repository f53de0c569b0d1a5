"""Qwen2VLImageProcessor (Qwen2-VL's and Qwen2.5-VL's): decoctl's patches equal transformers' pixel values (PIL
backend) on the generated corpus of modes and sizes, its grids equal image_grid_thw, and a setting decoctl does not
implement is refused at load naming its key."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from image_corpus import CLIP_MEAN, CLIP_STD, corpus, image, oracle

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.model._image_processor import ImagePreprocessor
from decoctl.model._qwen_vl import patchify

TOLERANCE = 1e-6

CONFIGS: Mapping[str, Mapping[str, Any]] = {
    # as Qwen2.5-VL's checkpoints ship it: no size, min_pixels and max_pixels
    "qwen2.5-vl": {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2_5_VLProcessor",
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
    },
    # transformers 5's form: size's edges, a small budget (most images scaled down), bilinear, other patching
    "small budget": {
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "size": {"shortest_edge": 1024, "longest_edge": 4096},
        "patch_size": 16,
        "temporal_patch_size": 1,
        "merge_size": 2,
        "resample": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    },
}

#: beside the corpus: below min_pixels, wide, tall, large, and an aspect ratio of 200 (the most transformers takes)
SIZES = [(30, 41), (200, 90), (90, 200), (1200, 900), (2000, 10)]


def pictures() -> list[tuple[str, Any]]:
    extra = [(f"RGB {w}x{h}", image("RGB", (w, h))) for w, h in SIZES]
    return [*corpus(), *extra]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_patches_and_grids_equal_transformers_on_every_mode_and_size(name: str, tmp_path: Path) -> None:
    config = CONFIGS[name]
    transformers = oracle(tmp_path, config)
    decoctl = ImagePreprocessor.from_config(config)
    assert decoctl.patching is not None
    patch, temporal, merge = decoctl.patching
    failures = {}
    for label, picture in pictures():
        theirs = transformers(images=[picture])
        ours = decoctl.each([picture])[0]
        grid = [1, ours.shape[1] // patch, ours.shape[2] // patch]
        patches = patchify(ours, patch, merge, temporal)
        if grid != theirs["image_grid_thw"][0].tolist() or patches.shape != theirs["pixel_values"].shape:
            failures[label] = f"grid {grid} != {theirs['image_grid_thw'][0].tolist()}"
            continue
        gap = float(np.abs(patches.astype(np.float64) - theirs["pixel_values"].astype(np.float64)).max())
        if gap > TOLERANCE:
            failures[label] = f"{gap:.3g}"
    assert failures == {}


def test_an_aspect_ratio_transformers_refuses_is_refused_naming_it() -> None:
    decoctl = ImagePreprocessor.from_config(CONFIGS["qwen2.5-vl"])

    with pytest.raises(ConfigError, match=r"3000x10 has an aspect ratio over 200"):
        decoctl.each([image("RGB", (3000, 10))])


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"do_resize": False}, r"do_resize = false: decoctl resizes every image"),
        ({"size": {"height": 224, "width": 224}}, r"size = .*resizes by shortest_edge and longest_edge"),
        ({"patch_size": "14"}, r"patch_size = \"14\": give a positive whole number"),
        ({"max_pixels": 0}, r"max_pixels = 0: give a positive whole number of pixels"),
        ({"image_grid_pinpoints": [[336, 672]]}, r"image_grid_pinpoints = .*: decoctl does not know what this setting"),
    ],
)
def test_a_setting_decoctl_does_not_implement_is_refused_at_load_naming_its_key(
    settings: Mapping[str, Any], named: str
) -> None:
    with pytest.raises(ModelLoadError, match=named):
        ImagePreprocessor.from_config({**CONFIGS["qwen2.5-vl"], **settings})
