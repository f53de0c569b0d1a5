"""decoctl's pixel values equal transformers' image processors' (PIL backend) on a generated corpus of images (every
PIL mode; tiny, huge and extremely thin sizes) for every setting the supported processors read; what decoctl cannot
make exactly is refused at load, naming the key, and an image transformers fails on is refused by name."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("transformers")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from image_corpus import CLIP_MEAN, CLIP_STD, corpus, data_url, expected, files, image, oracle
from PIL import Image

from decoctl import ConfigError, ModelLoadError
from decoctl.model._image_processor import ImagePreprocessor

#: float32 rounding: what "equal" means here (decoctl repeats transformers' arithmetic, so the measured gap is 0)
TOLERANCE = 1e-6

CLIP = "CLIPImageProcessor"
#: llava-hf's checkpoints' settings, at a small size
LLAVA_HF = {
    "image_processor_type": CLIP,
    "processor_class": "LlavaProcessor",
    "do_resize": True,
    "size": {"shortest_edge": 16},
    "do_center_crop": True,
    "crop_size": {"height": 16, "width": 16},
    "resample": 3,
    "do_rescale": True,
    "rescale_factor": 0.00392156862745098,
    "do_normalize": True,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "do_convert_rgb": True,
}

LLAVA_HF_NAME = "llava-hf shortest_edge + crop, bicubic"
SIGLIP_NAME = "SigLIP height/width (data_format ignored)"

#: name -> preprocessor_config.json: every size shape, each filter, crops larger than the image, every rescale and
#: normalize combination, each supported processor with its own defaults and padding
CONFIGS: dict[str, dict[str, Any]] = {
    LLAVA_HF_NAME: LLAVA_HF,
    "CLIP defaults (crop on), int crop_size": {
        "image_processor_type": CLIP,
        "size": {"shortest_edge": 12},
        "crop_size": 10,
    },
    "CLIP height/width, no crop": {
        "image_processor_type": CLIP,
        "size": {"height": 14, "width": 20},
        "do_center_crop": False,
    },
    "CLIP shortest_edge + longest_edge": {
        "image_processor_type": CLIP,
        "size": {"shortest_edge": 16, "longest_edge": 40},
        "do_center_crop": False,
    },
    "CLIP max_height/max_width": {
        "image_processor_type": CLIP,
        "size": {"max_height": 20, "max_width": 30},
        "do_center_crop": False,
    },
    **{
        f"CLIP resample {number} ({name}), odd crop": {
            "image_processor_type": CLIP,
            "size": {"shortest_edge": 9},
            "crop_size": {"height": 9, "width": 7},
            "resample": number,
        }
        for number, name in [(0, "nearest"), (1, "lanczos"), (2, "bilinear"), (4, "box"), (5, "hamming")]
    },
    "CLIP crop larger than the resized image": {
        "image_processor_type": CLIP,
        "size": {"height": 10, "width": 9},
        "crop_size": {"height": 15, "width": 12},
    },
    "CLIP no rescale": {"image_processor_type": CLIP, "size": 12, "crop_size": 12, "do_rescale": False},
    "CLIP no normalize": {"image_processor_type": CLIP, "size": 12, "crop_size": 12, "do_normalize": False},
    "CLIP neither (uint8 values)": {
        "image_processor_type": CLIP,
        "size": [12, 18],
        "do_center_crop": False,
        "do_rescale": False,
        "do_normalize": False,
    },
    "CLIP nulls (no value, not the default)": {
        "image_processor_type": CLIP,
        "size": 11,
        "default_to_square": None,
        "do_center_crop": None,
        "crop_size": None,
        "do_pad": None,
    },
    "CLIP one mean and std, own rescale_factor": {
        "image_processor_type": CLIP,
        "size": {"shortest_edge": 11},
        "image_mean": 0.5,
        "image_std": 0.25,
        "rescale_factor": 0.5 / 255,
    },
    "CLIP int size, default_to_square": {"image_processor_type": CLIP, "size": 13, "default_to_square": True},
    "CLIP pad to the largest": {
        "image_processor_type": CLIP,
        "size": {"max_height": 16, "max_width": 16},
        "do_center_crop": False,
        "do_pad": True,
    },
    "CLIPImageProcessorFast named": {**LLAVA_HF, "image_processor_type": "CLIPImageProcessorFast"},
    "Llava pad to square": {**LLAVA_HF, "image_processor_type": "LlavaImageProcessor", "do_pad": True},
    SIGLIP_NAME: {
        "image_processor_type": "SiglipImageProcessor",
        "size": {"height": 16, "width": 16},
        "data_format": "channels_last",
    },
    "SigLIP fit and pad_size": {
        "image_processor_type": "SiglipImageProcessor",
        "size": {"max_height": 16, "max_width": 16},
        "do_pad": True,
        "pad_size": {"height": 16, "width": 18},
    },
    "Gemma 3 (its crop and pad settings ignored)": {
        "image_processor_type": "Gemma3ImageProcessor",
        "size": {"height": 16, "width": 16},
        "resample": 2,
        "do_pan_and_scan": None,
        "pan_and_scan_min_crop_size": 256,
        "pan_and_scan_max_num_crops": 4,
        "pan_and_scan_min_ratio_to_activate": 1.2,
        "do_center_crop": True,
        "crop_size": 8,
        "do_pad": True,
        "image_seq_length": 256,
    },
}

CORPUS = corpus()
#: without the two 3000-pixel sizes, for a config that pads them to 3000 x 3000 before resizing
SMALL_CORPUS = [(name, picture) for name, picture in CORPUS if max(picture.size) < 3000]


def differences(config: Mapping[str, Any], images: list[Any], tmp_path: Path) -> dict[str, float | str]:
    """Per image: the largest |decoctl - transformers|, or why only one side made pixel values (each given alone)."""
    transformers = oracle(tmp_path, config)
    decoctl = ImagePreprocessor.from_config(config)
    out: dict[str, float | str] = {}
    for name, picture in images:
        try:
            theirs = expected(transformers, [picture])[0]
        except ValueError as exc:  # e.g. a size that rounds to no pixels: decoctl must refuse it too
            try:
                decoctl.each([picture])
            except ConfigError:
                out[name] = 0.0
            else:
                out[name] = f"transformers fails ({exc}), decoctl does not"
            continue
        ours = decoctl.each([picture])[0]
        out[name] = f"shape {ours.shape} != {theirs.shape}" if ours.shape != theirs.shape else _gap(ours, theirs)
    return out


def _gap(ours: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.abs(ours.astype(np.float64) - theirs.astype(np.float64)).max()) if ours.size else 0.0


def _failures(gaps: Mapping[str, float | str]) -> dict[str, float | str]:
    return {name: gap for name, gap in gaps.items() if isinstance(gap, str) or gap > TOLERANCE}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_pixel_values_equal_transformers_on_every_mode_and_size(name: str, tmp_path: Path) -> None:
    config = CONFIGS[name]
    images = (
        SMALL_CORPUS if config.get("do_pad") and config["image_processor_type"] == "LlavaImageProcessor" else CORPUS
    )
    assert _failures(differences(config, images, tmp_path)) == {}


def test_images_given_together_are_padded_to_the_largest_as_transformers_pads_them(tmp_path: Path) -> None:
    config = CONFIGS["CLIP pad to the largest"]
    pictures = [image("RGB", size) for size in [(20, 300), (37, 23), (300, 20), (1, 1)]]

    theirs = expected(oracle(tmp_path, config), pictures)
    ours = ImagePreprocessor.from_config(config).each(pictures)

    assert [p.shape for p in ours] == [p.shape for p in theirs] == [(3, 16, 16)] * 4
    assert max(_gap(a, b) for a, b in zip(ours, theirs, strict=True)) <= TOLERANCE


@pytest.mark.parametrize("config_name", [LLAVA_HF_NAME, SIGLIP_NAME])
def test_files_and_their_bytes_are_read_as_transformers_reads_a_path_and_a_data_url(
    config_name: str, tmp_path: Path
) -> None:
    config = CONFIGS[config_name]
    transformers = oracle(tmp_path / "config", config)
    decoctl = ImagePreprocessor.from_config(config)
    gaps = {}
    for name, path in files(tmp_path / "files"):
        by_path = _gap(decoctl.each([path])[0], expected(transformers, [str(path)])[0])
        by_bytes = _gap(decoctl.each([path.read_bytes()])[0], expected(transformers, [data_url(path)])[0])
        with Image.open(path) as opened:
            as_pil = _gap(decoctl.each([opened])[0], expected(transformers, [opened])[0])
        gaps[name] = max(by_path, by_bytes, as_pil)

    assert _failures(gaps) == {}


def test_a_transparent_png_by_path_loses_its_alpha_and_as_a_pil_image_is_composited_onto_white(tmp_path: Path) -> None:
    # transformers' load_image converts a path's image to RGB (alpha dropped); its processor composites a PIL
    # image's alpha onto white: decoctl follows each
    picture = image("RGBA", (16, 16))
    path = tmp_path / "rgba.png"
    picture.save(path)
    decoctl = ImagePreprocessor.from_config(CONFIGS[SIGLIP_NAME])

    by_path, as_pil = decoctl.each([path])[0], decoctl.each([picture])[0]

    assert not np.array_equal(by_path, as_pil)
    assert np.array_equal(by_path, decoctl.each([picture.convert("RGB")])[0])


#: google/gemma-3-*-it's preprocessor_config.json (at 16 pixels where it says 896): its do_convert_rgb is null
GEMMA3_PUBLISHED = {
    "do_convert_rgb": None,
    "do_normalize": True,
    "do_pan_and_scan": None,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Gemma3ImageProcessor",
    "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5],
    "pan_and_scan_max_num_crops": None,
    "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None,
    "processor_class": "Gemma3Processor",
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 16, "width": 16},
}


@pytest.mark.parametrize(
    "config",
    [{**LLAVA_HF, "do_convert_rgb": False}, {**LLAVA_HF, "do_convert_rgb": None}, GEMMA3_PUBLISHED],
    ids=["llava-hf, false", "llava-hf, null", "Gemma 3 as published (null)"],
)
def test_without_do_convert_rgb_three_band_images_equal_transformers_and_others_are_refused(
    config: dict[str, Any], tmp_path: Path
) -> None:
    transformers = oracle(tmp_path, config)
    decoctl = ImagePreprocessor.from_config(config)
    gaps = {}
    for name, picture in CORPUS:
        try:
            theirs = expected(transformers, [picture])[0]
        except (ValueError, TypeError):
            theirs = None
        if picture.mode in ("RGB", "YCbCr", "LAB", "HSV"):
            gaps[name] = _gap(decoctl.each([picture])[0], theirs) if theirs is not None else "transformers failed"
            continue
        with pytest.raises(ConfigError, match=rf"has mode {picture.mode} .* do_convert_rgb is false or null"):
            decoctl.each([picture])
        # transformers fails on it, or its answer has other than the three channels the encoder takes
        assert theirs is None or theirs.shape[0] != 3

    assert _failures(gaps) == {}


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    width=st.integers(1, 400),
    height=st.integers(1, 400),
    mode=st.sampled_from(["RGB", "RGBA", "L", "P+t", "I;16", "CMYK"]),
    shape=st.sampled_from(["shortest_edge", "height_width", "shortest_longest", "max_height_width"]),
    edge=st.integers(1, 48),
    crop=st.one_of(st.none(), st.tuples(st.integers(1, 48), st.integers(1, 48))),
    resample=st.integers(0, 5),
)
def test_any_size_and_settings_equal_transformers(
    tmp_path_factory: pytest.TempPathFactory,
    width: int,
    height: int,
    mode: str,
    shape: str,
    edge: int,
    crop: tuple[int, int] | None,
    resample: int,
) -> None:
    size = {
        "shortest_edge": {"shortest_edge": edge},
        "height_width": {"height": edge, "width": edge + 3},
        "shortest_longest": {"shortest_edge": edge, "longest_edge": edge * 2 + 1},
        "max_height_width": {"max_height": edge, "max_width": edge + 5},
    }[shape]
    config = {"image_processor_type": CLIP, "size": size, "resample": resample, "do_center_crop": crop is not None}
    if crop is not None:
        config["crop_size"] = {"height": crop[0], "width": crop[1]}
    picture = image(mode, (width, height), seed=width * 401 + height)
    transformers = oracle(tmp_path_factory.mktemp("config"), config)
    decoctl = ImagePreprocessor.from_config(config)
    try:
        theirs = expected(transformers, [picture])[0]
    except ValueError:  # a size that rounds to zero pixels
        with pytest.raises(ConfigError, match="would be resized to"):
            decoctl.each([picture])
        return

    assert _gap(decoctl.each([picture])[0], theirs) <= TOLERANCE


def test_an_image_resized_to_no_pixels_is_refused_naming_the_size(tmp_path: Path) -> None:
    config = CONFIGS["CLIP shortest_edge + longest_edge"]
    thin = image("RGB", (3000, 1))
    with pytest.raises(ValueError):
        expected(oracle(tmp_path, config), [thin])

    with pytest.raises(ConfigError, match=r"image 0 \(3000x1\) would be resized to 40x0 .*longest_edge"):
        ImagePreprocessor.from_config(config).each([thin])


def test_a_mode_pillow_cannot_convert_is_refused_naming_it() -> None:
    premultiplied = Image.new("La", (4, 4))

    with pytest.raises(ConfigError, match="image 0 has mode La, which Pillow cannot convert to RGB"):
        ImagePreprocessor.from_config(LLAVA_HF).each([premultiplied])


def test_a_file_that_is_not_an_image_is_refused_naming_it(tmp_path: Path) -> None:
    fake = tmp_path / "photo.png"
    fake.write_bytes(b"\x89PNG\r\n\x1a\n broken")

    with pytest.raises(ConfigError, match=r"image 1 \(.*photo.png\) is not an image Pillow can read"):
        ImagePreprocessor.from_config(LLAVA_HF).each([image("RGB", (4, 4)), fake])
    with pytest.raises(ConfigError, match=rf"image 0 \({len(fake.read_bytes())} bytes\) is not an image"):
        ImagePreprocessor.from_config(LLAVA_HF).each([fake.read_bytes()])


@pytest.mark.parametrize(
    ("settings_", "named"),
    [
        ({"image_processor_type": "Idefics3ImageProcessor"}, "image_processor_type 'Idefics3ImageProcessor'"),
        ({"size": {"shortest_edge": 8}}, "names no image_processor_type"),
        ({"image_processor_type": CLIP, "image_grid_pinpoints": [[336, 672]]}, "image_grid_pinpoints"),
        ({"image_processor_type": CLIP, "do_pan_and_scan": True}, "do_pan_and_scan"),
        (
            {"image_processor_type": "Gemma3ImageProcessor", "do_pan_and_scan": True},
            "pan_and_scan_min_crop_size = null: do_pan_and_scan is true",
        ),
        ({"image_processor_type": CLIP, "size": {"longest_edge": 32}}, "size .* does not resize by longest_edge"),
        ({"image_processor_type": CLIP, "size": {"min_pixels": 9, "max_pixels": 99}}, "max_pixels and min_pixels"),
        ({"image_processor_type": CLIP, "size": {"shortest_edge": 0}}, "size .* positive whole numbers"),
        ({"image_processor_type": CLIP, "crop_size": {"shortest_edge": 8}}, "crop_size .* height and width"),
        ({"image_processor_type": CLIP, "crop_size": None}, "crop_size = null: null is no value"),
        ({"image_processor_type": CLIP, "do_resize": True, "resample": None}, "resample = null"),
        ({"image_processor_type": CLIP, "resample": 7}, "resample = 7: give one of Pillow's filter numbers"),
        ({"image_processor_type": CLIP, "image_mean": [0.5, 0.5]}, "image_mean .* three numbers"),
        ({"image_processor_type": CLIP, "do_resize": "yes"}, "do_resize .* true or false"),
    ],
)
def test_a_setting_decoctl_cannot_honour_exactly_is_refused_at_load_naming_its_key(
    settings_: dict[str, Any], named: str, tmp_path: Path
) -> None:
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(settings_), encoding="utf-8")

    with pytest.raises(ModelLoadError, match=rf"preprocessor_config.json.*{named}"):
        ImagePreprocessor.from_folder(tmp_path)


def test_settings_that_are_off_or_null_are_accepted() -> None:
    preprocessor = ImagePreprocessor.from_config(
        {"image_processor_type": CLIP, "do_pan_and_scan": False, "use_square_size": False, "image_grid_pinpoints": None}
    )

    assert preprocessor.crop == (224, 224)  # CLIP's default: a missing do_center_crop means crop


def test_images_stacked_together_must_come_out_the_same_size() -> None:
    preprocessor = ImagePreprocessor.from_config(CONFIGS["CLIP max_height/max_width"])
    pictures = [image("RGB", (40, 20)), image("RGB", (20, 40))]

    assert [p.shape for p in preprocessor.each(pictures)] == [(3, 15, 30), (3, 20, 10)]
    with pytest.raises(ConfigError, match=r"come out in different sizes \(30x15, 10x20\)"):
        preprocessor(pictures)
    assert preprocessor(pictures[:1]).shape == (1, 3, 15, 30)


def test_an_image_over_the_pixel_limit_is_refused_from_its_size_as_given_and_once_resized() -> None:
    decoctl = ImagePreprocessor.from_config(LLAVA_HF)  # shortest edge to 16, then a centre crop
    with pytest.raises(ConfigError, match=r"image 0 \(a PIL image\) is 100x100, 10,000 pixels, more than the limit"):
        decoctl.each([Image.new("RGB", (100, 100))], max_pixels=9_999)
    thin = Image.new("RGB", (2000, 5))  # 10,000 pixels that the resize makes 6,400 x 16
    with pytest.raises(ConfigError, match="would be resized to 6400x16, more than the limit of 20,000 pixels"):
        decoctl.each([thin], max_pixels=20_000)
    assert decoctl.each([Image.new("RGB", (120, 80))], max_pixels=20_000)[0].shape == (3, 16, 16)
