"""Gemma 3's pan-and-scan: decoctl's pixel values equal Gemma3ImageProcessor's (PIL backend) with it on, the whole
image and then its crops, on the generated corpus and on sizes that cut every crop count; a crop setting it would fail
on is refused at load by its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("transformers")

from image_corpus import corpus, image, oracle

from decoctl import ModelLoadError
from decoctl.model._image_processor import ImagePreprocessor

TOLERANCE = 1e-6

GEMMA3 = {
    "image_processor_type": "Gemma3ImageProcessor",
    "size": {"height": 16, "width": 16},
    "resample": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_pan_and_scan": True,
    "pan_and_scan_min_crop_size": 8,
    "pan_and_scan_max_num_crops": 3,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}

#: (width, height): square (no crops), below the ratio, two and three crops each way, more than the most crops, crops
#: that would be smaller than the smallest (none), uneven last crops
SIZES = [(32, 32), (35, 30), (40, 20), (20, 40), (50, 17), (17, 50), (200, 20), (20, 200), (15, 7), (33, 13), (7, 1)]


def transformers_pixels(tmp_path: Path, config: dict[str, Any], pictures: list[Any]) -> tuple[np.ndarray, list[int]]:
    out = oracle(tmp_path / "oracle", config)(images=pictures)
    return np.stack([np.asarray(p, np.float32) for p in out["pixel_values"]]), [int(n) for n in out["num_crops"]]


def test_pixel_values_and_crops_equal_transformers_with_pan_and_scan_on(tmp_path: Path) -> None:
    decoctl = ImagePreprocessor.from_config(GEMMA3)
    pictures = [image("RGB", size, seed=3) for size in SIZES]

    ours = decoctl.each(pictures)
    theirs, crops = transformers_pixels(tmp_path, GEMMA3, pictures)

    assert [len(views) - 1 for views in ours] == crops
    assert set(crops) == {0, 2, 3}  # none, and each count pan-and-scan cuts (at least 2, at most 3 here)
    assert float(np.abs(np.concatenate(ours) - theirs).max()) <= TOLERANCE
    assert np.array_equal(decoctl(pictures), np.concatenate(ours))


def test_pan_and_scan_equals_transformers_on_every_mode_and_size(tmp_path: Path) -> None:
    decoctl = ImagePreprocessor.from_config(GEMMA3)
    transformers = oracle(tmp_path / "oracle", GEMMA3)
    gaps = {}
    for name, picture in corpus():
        theirs = transformers(images=[picture])
        ours = decoctl.each([picture])[0]
        assert len(ours) - 1 == int(theirs["num_crops"][0]), name
        gaps[name] = float(np.abs(ours - np.stack([np.asarray(p) for p in theirs["pixel_values"]])).max())

    assert {name: gap for name, gap in gaps.items() if gap > TOLERANCE} == {}


@pytest.mark.parametrize(
    "key", ["pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops", "pan_and_scan_min_ratio_to_activate"]
)
def test_a_null_crop_setting_with_pan_and_scan_on_is_refused_naming_its_key(key: str, tmp_path: Path) -> None:
    config = {**GEMMA3, key: None}
    with pytest.raises(TypeError):  # transformers fails on it
        oracle(tmp_path / "oracle", config)(images=[image("RGB", (40, 20))])

    with pytest.raises(ModelLoadError, match=rf"{key} = null: do_pan_and_scan is true"):
        ImagePreprocessor.from_config(config)


def test_pan_and_scan_equals_gemma3_processors_when_its_caller_turns_it_on(tmp_path: Path) -> None:
    """Gemma3Processor takes its pan-and-scan settings from its caller (the file's are its image processor's); with the
    same settings given, its pixel values are decoctl's."""
    from transformers import Gemma3Processor, PreTrainedTokenizerFast

    from decoctl.testing import build_tokenizer

    names = {"boi_token": "<boi>", "image_token": "<soft>", "eoi_token": "<eoi>"}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(build_tokenizer(tmp_path / "tokenizer")), extra_special_tokens=names
    )
    transformers_image = oracle(tmp_path / "oracle", {**GEMMA3, "do_pan_and_scan": None})
    processor = Gemma3Processor(image_processor=transformers_image, tokenizer=tokenizer, image_seq_length=2)
    pictures = [image("RGB", (50, 17), seed=5), image("RGB", (16, 16), seed=6)]
    settings = {key: value for key, value in GEMMA3.items() if "pan_and_scan" in key}

    theirs = processor(text="<boi> and <boi>", images=pictures, **settings)
    ours = ImagePreprocessor.from_config(GEMMA3)(pictures)

    assert len(theirs["pixel_values"]) == 1 + 3 + 1  # the first image whole and in 3 crops, the square one whole
    assert float(np.abs(ours - np.asarray(theirs["pixel_values"], np.float32)).max()) <= TOLERANCE
