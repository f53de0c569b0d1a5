"""Images -> pixel values, exactly as transformers' image processor makes them from the same preprocessor_config.json:
its PIL backend (``AutoImageProcessor.from_pretrained(folder, backend="pil")``, what transformers picks where
torchvision is not installed), step by step in its order and its arithmetic, with Pillow and numpy only.

The processors decoctl knows are those of the vision-language models it runs: CLIPImageProcessor (LLaVA's checkpoints
ship it), LlavaImageProcessor, SiglipImageProcessor and Gemma3ImageProcessor (pan-and-scan off and on). The steps:

- reading: a file path or a file's bytes is opened as transformers' ``load_image`` opens a path or a data: URL (EXIF
  orientation applied, then Pillow's ``convert("RGB")``, which drops transparency); a PIL image is taken as it is;
- ``do_convert_rgb``: an image with an alpha band (any band named A) or a transparency entry is composited onto white,
  every other mode goes through ``convert("RGB")``;
- LlavaImageProcessor's ``do_pad``: the image padded to a square, centred, in ``image_mean`` times 255 (truncated);
- Gemma3ImageProcessor's ``do_pan_and_scan``: an image whose aspect ratio reaches ``pan_and_scan_min_ratio_to_activate``
  is also cut into 2 to ``pan_and_scan_max_num_crops`` crops along its long side, none smaller than
  ``pan_and_scan_min_crop_size``; the whole image and then its crops each go through the steps below (as
  Gemma3ImageProcessor reads the file; Gemma3Processor instead ignores the file's pan-and-scan settings and takes its
  own, off unless its caller turns it on);
- ``do_resize``: Pillow's resize of the uint8 image with the ``resample`` filter, to the size ``size`` gives (height
  and width; the shortest edge, with or without the longest; or the largest that fits ``max_height`` x ``max_width``);
- ``do_center_crop``: the centre ``crop_size``, padded with zeros where the image is smaller;
- ``do_rescale``: times ``rescale_factor`` in float64, then float32; ``do_normalize``: minus mean, over std, in float32;
- CLIP's and SigLIP's ``do_pad``: zeros below and to the right, up to ``pad_size`` or the largest of the images given
  together.

A setting transformers would act on and decoctl does not implement is refused at load, naming its key.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import attrs
import numpy as np

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.model._qwen_vl import smart_resize

__all__ = ["ImagePreprocessor"]

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_HALF = (0.5, 0.5, 0.5)

#: Pillow's resampling filters by the number preprocessor_config.json's ``resample`` holds
_RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

#: what transformers' ImagesKwargs carries that changes nothing in pixel values from a PIL image
_INERT = frozenset(
    {
        "input_data_format",
        "device",
        "return_tensors",
        "disable_grouping",
        "image_seq_length",
        "_valid_processor_keys",
        # transformers 5's PIL backend returns channels first whatever data_format says
        "data_format",
    }
)
#: names of the processor, not settings
_NAMES = frozenset({"image_processor_type", "feature_extractor_type", "processor_class"})
#: the settings every family reads (ImagesKwargs)
_SETTINGS = frozenset(
    {
        "do_convert_rgb",
        "do_resize",
        "size",
        "default_to_square",
        "resample",
        "do_center_crop",
        "crop_size",
        "do_rescale",
        "rescale_factor",
        "do_normalize",
        "image_mean",
        "image_std",
        "do_pad",
        "pad_size",
    }
)
#: the size shapes transformers' PIL backend resizes to (sets of keys of ``size``)
_SIZE_SHAPES = (
    {"height", "width"},
    {"shortest_edge"},
    {"shortest_edge", "longest_edge"},
    {"max_height", "max_width"},
)
#: shapes transformers accepts in a config but its PIL backend cannot resize to
#: the most pixels an image may have, as given and after its resize, unless the caller says otherwise (50 million: a
#: 7,000 x 7,000 photograph); checked from the file's header, before anything is decoded
MAX_PIXELS = 50_000_000
#: the most images one request to the server may carry unless its operator says otherwise (decoctl serve --max-images)
MAX_IMAGES = 8

_SIZE_SHAPES_REFUSED = ({"longest_edge"}, {"min_pixels", "max_pixels"})


@attrs.frozen(kw_only=True)
class _Family:
    """One transformers image processor: its class defaults (what a missing or null key means), whether it centre
    crops, and what its ``do_pad`` does ("square": LLaVA's, before resizing; "bottom_right": the PIL backend's, after
    normalizing; "": nothing)."""

    defaults: Mapping[str, Any]
    crops: bool
    pad: str
    own_keys: frozenset[str] = frozenset()


_CLIP_DEFAULTS: Mapping[str, Any] = {
    "do_convert_rgb": True,
    "do_resize": True,
    "size": {"shortest_edge": 224},
    "default_to_square": False,
    "resample": 3,
    "do_center_crop": True,
    "crop_size": {"height": 224, "width": 224},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": _CLIP_MEAN,
    "image_std": _CLIP_STD,
    "do_pad": None,
    "pad_size": None,
}

#: the families, as transformers 5 defines them (models/*/image_processing_pil_*.py)
_FAMILIES: Mapping[str, _Family] = {
    "CLIPImageProcessor": _Family(defaults=_CLIP_DEFAULTS, crops=True, pad="bottom_right"),
    "LlavaImageProcessor": _Family(defaults={**_CLIP_DEFAULTS, "do_pad": False}, crops=True, pad="square"),
    "SiglipImageProcessor": _Family(
        defaults={
            **_CLIP_DEFAULTS,
            "size": {"height": 224, "width": 224},
            "do_center_crop": None,
            "crop_size": None,
            "image_mean": _HALF,
            "image_std": _HALF,
        },
        crops=True,
        pad="bottom_right",
    ),
    # Qwen2-VL's (and Qwen2.5-VL's): resized to multiples of patch_size x merge_size between min_pixels and
    # max_pixels (size's shortest_edge and longest_edge), then cut into patches (decoctl.model._qwen_vl)
    "Qwen2VLImageProcessor": _Family(
        defaults={
            **_CLIP_DEFAULTS,
            "size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280},
            "do_center_crop": None,
            "crop_size": None,
            "min_pixels": None,
            "max_pixels": None,
            "patch_size": 14,
            "temporal_patch_size": 2,
            "merge_size": 2,
        },
        crops=False,
        pad="",
        own_keys=frozenset({"min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size"}),
    ),
    # Gemma 3's processor never crops or pads, whatever the config says
    "Gemma3ImageProcessor": _Family(
        defaults={
            **_CLIP_DEFAULTS,
            "size": {"height": 224, "width": 224},
            "default_to_square": True,
            "resample": 2,
            "do_center_crop": None,
            "crop_size": None,
            "image_mean": _HALF,
            "image_std": _HALF,
            "do_pan_and_scan": None,
        },
        crops=False,
        pad="",
        own_keys=frozenset(
            {
                "do_pan_and_scan",
                "pan_and_scan_min_crop_size",
                "pan_and_scan_max_num_crops",
                "pan_and_scan_min_ratio_to_activate",
            }
        ),
    ),
}


@attrs.frozen(kw_only=True)
class Resize:
    """The size ``size`` resizes an image to, as transformers' PIL backend computes it (one of: height and width;
    shortest_edge, with or without longest_edge; max_height and max_width)."""

    height: int | None = None
    width: int | None = None
    shortest_edge: int | None = None
    longest_edge: int | None = None
    max_height: int | None = None
    max_width: int | None = None
    #: Qwen2-VL's smart resize: to multiples of ``factor`` holding ``shortest_edge`` to ``longest_edge`` pixels
    factor: int | None = None

    def output(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after resizing an image of ``height`` x ``width``."""
        if self.factor and self.shortest_edge and self.longest_edge:
            return smart_resize(height, width, self.factor, self.shortest_edge, self.longest_edge)
        if self.shortest_edge and self.longest_edge:
            return _with_aspect_ratio(height, width, self.shortest_edge, self.longest_edge)
        if self.shortest_edge:
            short, long = (width, height) if width <= height else (height, width)
            new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
            return (new_long, new_short) if width <= height else (new_short, new_long)
        if self.max_height and self.max_width:
            scale = min(self.max_height / height, self.max_width / width)
            return int(height * scale), int(width * scale)
        assert self.height is not None and self.width is not None
        return self.height, self.width


def _with_aspect_ratio(height: int, width: int, size: int, max_size: int) -> tuple[int, int]:
    # transformers' get_size_with_aspect_ratio, its float arithmetic and round() (half to even) kept
    raw_size = None
    low, high = float(min(height, width)), float(max(height, width))
    if high / low * size > max_size:
        raw_size = max_size * low / high
        size = round(raw_size)
    if (height <= width and height == size) or (width <= height and width == size):
        return height, width
    if width < height:
        return (int(raw_size * height / width) if raw_size is not None else int(size * height / width)), size
    return size, (int(raw_size * width / height) if raw_size is not None else int(size * width / height))


@attrs.frozen(kw_only=True)
class PanAndScan:
    """Gemma3ImageProcessor's pan-and-scan settings."""

    min_crop_size: int
    max_num_crops: int
    min_ratio_to_activate: float

    def crops(self, height: int, width: int) -> list[tuple[int, int, int, int]]:
        """The crops (top, left, bottom, right) of an image of ``height`` x ``width``, as transformers' pan_and_scan
        cuts them (its arithmetic kept); [] where it cuts none."""
        if width >= height:
            if width / height < self.min_ratio_to_activate:
                return []
            across = min(math.floor(width / self.min_crop_size), math.floor(width / height + 0.5))
            across, down = min(self.max_num_crops, max(2, across)), 1
        else:
            if height / width < self.min_ratio_to_activate:
                return []
            down = min(math.floor(height / self.min_crop_size), math.floor(height / width + 0.5))
            across, down = 1, min(self.max_num_crops, max(2, down))
        crop_width, crop_height = math.ceil(width / across), math.ceil(height / down)
        if min(crop_width, crop_height) < self.min_crop_size:
            return []
        return [
            (top, left, min(top + crop_height, height), min(left + crop_width, width))
            for top in range(0, crop_height * down, crop_height)
            for left in range(0, crop_width * across, crop_width)
        ]


#: Gemma3ImageProcessor's pan-and-scan settings, with what Gemma3Processor passes for them when a caller turns
#: pan-and-scan on (for the refusal of a null one)
_PAN_AND_SCAN = {
    "pan_and_scan_min_crop_size": 256,
    "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}


@attrs.frozen(kw_only=True)
class ImagePreprocessor:
    """Images -> pixel values as ``processor`` (transformers' image processor class) makes them from the folder's
    preprocessor_config.json (see the module docstring). Each step is None where it does not run: ``square_pad``
    (LLaVA's pad to a square, in this colour), ``resize`` and ``resample`` (Pillow's filter number), ``crop``
    (height, width), ``rescale`` (the factor), ``mean`` and ``std``, ``pad`` (height, width; ``pad_to_largest``: up
    to the largest of the images given together)."""

    processor: str
    convert_rgb: bool
    square_pad: tuple[int, int, int] | None
    resize: Resize | None
    resample: int
    crop: tuple[int, int] | None
    rescale: float | None
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None
    pad: tuple[int, int] | None
    pad_to_largest: bool
    #: Qwen2-VL's patching, (patch_size, temporal_patch_size, merge_size): the vision encoder takes the image cut
    #: into patches (decoctl.model._qwen_vl.patchify); None for every other processor
    patching: tuple[int, int, int] | None = None
    #: Gemma 3's pan-and-scan crops, None where off
    pan_and_scan: PanAndScan | None = None

    @classmethod
    def from_folder(cls, folder: Path) -> ImagePreprocessor:
        path = folder / "preprocessor_config.json"
        if not path.is_file():
            raise ModelLoadError(
                f"{folder} has a vision encoder but no preprocessor_config.json: copy the one the model was published "
                "with (transformers' image processor settings) next to the graphs"
            )
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"{path} cannot be read as JSON: {exc}") from exc
        if not isinstance(config, dict):
            raise ModelLoadError(f"{path} holds a {type(config).__name__}, not an object of image processor settings")
        return cls.from_config(config, source=str(path))

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, source: str = "preprocessor_config.json") -> ImagePreprocessor:
        """From the settings of a preprocessor_config.json (``source`` names it in errors); raises ModelLoadError
        naming a key decoctl cannot honour exactly."""
        return _Reader(config, source).preprocessor()

    def __call__(self, images: Sequence[Any]) -> np.ndarray:
        """float32[len(images), 3, height, width] from images (file paths, the files' bytes or PIL images) that all
        come out the same size; with pan-and-scan, each image's views one after another (transformers' order)."""
        pixels = [view for p in self.each(images) for view in (p if p.ndim == 4 else p[None])]
        if len({p.shape for p in pixels}) > 1:
            shapes = ", ".join(f"{p.shape[2]}x{p.shape[1]}" for p in pixels)
            raise ConfigError(
                f"the images come out in different sizes ({shapes}) under {self.processor}'s settings: give them one "
                "at a time, or resize them alike"
            )
        return np.stack(pixels) if pixels else np.zeros((0, 3, 0, 0), np.float32)

    def each(self, images: Sequence[Any], *, max_pixels: int = MAX_PIXELS) -> list[np.ndarray]:
        """One float32[3, height, width] per image (file paths, the files' bytes or PIL images), in order; with
        pan-and-scan on, float32[views, 3, height, width] per image: the whole image, then its crops. ConfigError
        for an image of more than ``max_pixels`` pixels, as given (read from its header, before it is decoded) or
        once resized."""
        pixels = [self._one(_read(image, index, max_pixels), index, max_pixels) for index, image in enumerate(images)]
        if self.pad_to_largest and pixels:
            target = max(p.shape[1] for p in pixels), max(p.shape[2] for p in pixels)
            pixels = [_pad_bottom_right(p, target, index, "the largest image's") for index, p in enumerate(pixels)]
        elif self.pad is not None:
            pixels = [_pad_bottom_right(p, self.pad, index, "pad_size") for index, p in enumerate(pixels)]
        return pixels

    def _one(self, picture: Any, index: int, max_pixels: int = MAX_PIXELS) -> np.ndarray:
        from PIL import Image

        rgb = self._rgb(picture, index)
        if self.square_pad is not None and rgb.width != rgb.height:
            side = max(rgb.width, rgb.height)
            canvas = Image.new("RGB", (side, side), self.square_pad)
            canvas.paste(rgb, ((side - rgb.width) // 2, (side - rgb.height) // 2))
            rgb = canvas
        if self.pan_and_scan is None:
            return self._pixels(rgb, index, max_pixels)
        whole = np.asarray(rgb)
        crops = [
            Image.fromarray(whole[top:bottom, left:right])
            for top, left, bottom, right in self.pan_and_scan.crops(rgb.height, rgb.width)
        ]
        return np.stack([self._pixels(view, index, max_pixels) for view in [rgb, *crops]])

    def _pixels(self, rgb: Any, index: int, max_pixels: int) -> np.ndarray:
        """float32[3, height, width] from an RGB PIL image: resized, cropped, rescaled and normalized."""
        if self.resize is not None:
            height, width = self.resize.output(rgb.height, rgb.width)
            if height < 1 or width < 1:
                raise ConfigError(
                    f"image {index} ({rgb.width}x{rgb.height}) would be resized to {width}x{height} under "
                    f"{self.processor}'s size {attrs.asdict(self.resize, filter=lambda _, v: v is not None)}: "
                    "transformers fails on it too; crop the image to a less extreme aspect ratio"
                )
            if height * width > max_pixels:
                raise ConfigError(
                    f"image {index} ({rgb.width}x{rgb.height}) would be resized to {width}x{height}, more than the "
                    f"limit of {max_pixels:,} pixels: crop it to a less extreme aspect ratio"
                )
            rgb = rgb.resize((width, height), self.resample)
        pixels: np.ndarray = np.asarray(rgb)
        if self.crop is not None:
            pixels = _center_crop(pixels, *self.crop)
        if self.rescale is not None:
            pixels = (pixels.astype(np.float64) * self.rescale).astype(np.float32)
        if self.mean is not None and self.std is not None:
            pixels = pixels.astype(np.float32, copy=False)
            pixels = (pixels - np.array(self.mean, np.float32)) / np.array(self.std, np.float32)
        return np.ascontiguousarray(pixels.transpose(2, 0, 1), dtype=np.float32)

    def _rgb(self, picture: Any, index: int) -> Any:
        from PIL import Image

        if not self.convert_rgb:
            if picture.mode == "RGB":
                return picture
            bands = picture.getbands()
            if len(bands) == 3 and picture.mode in ("YCbCr", "LAB", "HSV"):
                # transformers reads the three bytes of each pixel as they are, as if they were RGB
                return Image.fromarray(np.asarray(picture))
            raise ConfigError(
                f"image {index} has mode {picture.mode} ({len(bands)} band(s)) and preprocessor_config.json's "
                "do_convert_rgb is false or null, so nothing converts it to the three channels the vision encoder "
                "takes (transformers fails on it or gives other than three); give an RGB image or set do_convert_rgb "
                "to true"
            )
        try:
            if "A" in picture.getbands() or picture.info.get("transparency") is not None:
                rgba = picture.convert("RGBA")
                white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                return Image.alpha_composite(white, rgba).convert("RGB")
            return picture.convert("RGB")
        except (ValueError, OSError) as exc:
            raise ConfigError(
                f"image {index} has mode {picture.mode}, which Pillow cannot convert to RGB ({exc}): save it as RGB or "
                "RGBA"
            ) from exc


def _within(size: tuple[int, int], index: int, max_pixels: int, shown: str) -> None:
    width, height = size
    if width * height > max_pixels:
        raise ConfigError(
            f"image {index} ({shown}) is {width}x{height}, {width * height:,} pixels, more than the limit of "
            f"{max_pixels:,}: send it scaled down (the model sees it resized anyway)"
        )


def _read(image: Any, index: int, max_pixels: int = MAX_PIXELS) -> Any:
    """A PIL image from a path or bytes (as transformers' load_image reads a path or a data: URL: EXIF orientation
    applied, RGB), or the PIL image given. ConfigError for one of more than ``max_pixels`` pixels, checked on the
    header before the pixels are decoded."""
    try:
        from PIL import Image, ImageOps, UnidentifiedImageError
    except ImportError as exc:
        raise ConfigError("images need Pillow: pip install 'decoctl[vision]' (or pip install pillow)") from exc
    if isinstance(image, Image.Image):
        _within(image.size, index, max_pixels, "a PIL image")
        try:
            image.load()
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise ConfigError(f"image {index} (a PIL image) cannot be read: {exc}") from exc
        return image
    if not isinstance(image, (str, Path, bytes, bytearray)):
        raise ConfigError(
            f"image {index} is a {type(image).__name__}: give a file path, the file's bytes or a PIL image"
        )
    try:
        source = image if isinstance(image, (str, Path)) else io.BytesIO(image)
        with Image.open(source) as opened:
            _within(opened.size, index, max_pixels, _shown(image))
            opened.load()
            return ImageOps.exif_transpose(opened).convert("RGB")
    except Image.DecompressionBombError as exc:
        raise ConfigError(f"image {index} ({_shown(image)}) is refused by Pillow as too large: {exc}") from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ConfigError(f"image {index} ({_shown(image)}) is not an image Pillow can read: {exc}") from exc


def _shown(image: Any) -> str:
    if isinstance(image, (str, Path)):
        return str(image)
    return f"{len(image)} bytes" if isinstance(image, (bytes, bytearray)) else type(image).__name__


def _center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """transformers' center_crop on uint8[h, w, 3]: the centre ``height`` x ``width``, zero-padded (centred, the odd
    pixel after) where the image is smaller."""
    rows, cols = pixels.shape[:2]
    top, left = (rows - height) // 2, (cols - width) // 2
    bottom, right = top + height, left + width
    if top >= 0 and bottom <= rows and left >= 0 and right <= cols:
        return pixels[top:bottom, left:right]
    new_rows, new_cols = max(height, rows), max(width, cols)
    canvas = np.zeros((new_rows, new_cols, *pixels.shape[2:]), pixels.dtype)
    top_pad, left_pad = math.ceil((new_rows - rows) / 2), math.ceil((new_cols - cols) / 2)
    canvas[top_pad : top_pad + rows, left_pad : left_pad + cols] = pixels
    top, bottom, left, right = top + top_pad, bottom + top_pad, left + left_pad, right + left_pad
    return canvas[max(0, top) : min(new_rows, bottom), max(0, left) : min(new_cols, right)]


def _pad_bottom_right(pixels: np.ndarray, target: tuple[int, int], index: int, what: str) -> np.ndarray:
    height, width = pixels.shape[1:]
    if height > target[0] or width > target[1]:
        raise ConfigError(
            f"image {index} comes out {width}x{height}, larger than {what} {target[1]}x{target[0]} it is padded to: "
            "raise pad_size in preprocessor_config.json or resize the images smaller"
        )
    return np.pad(pixels, ((0, 0), (0, target[0] - height), (0, target[1] - width)))


class _Reader:
    """Reads one preprocessor_config.json into an ImagePreprocessor: each setting or its class default, checked."""

    def __init__(self, config: Mapping[str, Any], source: str) -> None:
        self.config = config
        self.source = source
        self.processor = self._processor()
        self.family = _FAMILIES[self.processor]

    def preprocessor(self) -> ImagePreprocessor:
        self._refuse_unknown()
        normalize, do_pad = self._flag("do_normalize"), self._flag("do_pad")
        square = do_pad and self.family.pad == "square"
        mean = self._triple("image_mean") if normalize else None
        square_pad = None
        if square:
            # LlavaImageProcessor's background: int(mean * 255) per channel (black without a mean)
            colour = self._triple("image_mean") if self._get("image_mean") is not None else (0.0, 0.0, 0.0)
            square_pad = (int(colour[0] * 255), int(colour[1] * 255), int(colour[2] * 255))
        pad, pad_to_largest = None, False
        if do_pad and self.family.pad == "bottom_right":
            pad = self._height_width("pad_size") if self._get("pad_size") is not None else None
            pad_to_largest = pad is None
        return ImagePreprocessor(
            processor=self.processor,
            convert_rgb=self._flag("do_convert_rgb"),
            square_pad=square_pad,
            resize=self._resize() if self._flag("do_resize") else None,
            resample=self._resample() if self._flag("do_resize") else 0,
            crop=self._height_width("crop_size") if self.family.crops and self._flag("do_center_crop") else None,
            rescale=self._number("rescale_factor") if self._flag("do_rescale") else None,
            mean=mean,
            std=self._triple("image_std") if normalize else None,
            pad=pad,
            pad_to_largest=pad_to_largest,
            patching=self._patching(),
            pan_and_scan=self._pan_and_scan() if "do_pan_and_scan" in self.family.own_keys else None,
        )

    def _pan_and_scan(self) -> PanAndScan | None:
        if not self._flag("do_pan_and_scan"):
            return None
        values: dict[str, Any] = {}
        for key, processors in _PAN_AND_SCAN.items():
            value = self._get(key)
            if value is None:
                self._refuse(
                    key,
                    "do_pan_and_scan is true and Gemma3ImageProcessor has no value for this (it fails on it); give one "
                    f"(Gemma3Processor passes {processors} when a caller turns pan-and-scan on)",
                )
            ratio = key == "pan_and_scan_min_ratio_to_activate"
            if isinstance(value, bool) or not isinstance(value, (int, float) if ratio else int) or value <= 0:
                self._refuse(key, "give a positive number" if ratio else "give a positive whole number")
            values[key.removeprefix("pan_and_scan_")] = value
        return PanAndScan(**values)

    def _patching(self) -> tuple[int, int, int] | None:
        if "patch_size" not in self.family.own_keys:
            return None
        if not self._flag("do_resize"):
            self._refuse(
                "do_resize",
                f"decoctl resizes every image for {self.processor} (to whole merged patches); set it to true",
            )
        sizes = []
        for key in ("patch_size", "temporal_patch_size", "merge_size"):
            value = self._required(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                self._refuse(key, "give a positive whole number")
            sizes.append(value)
        return sizes[0], sizes[1], sizes[2]

    def _pixels_resize(self) -> Resize:
        # Qwen2VLImageProcessor's __init__: min_pixels and max_pixels, where given, replace size's two edges
        size = self._size_dict("size", default_to_square=False)
        for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            value = self._get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                self._refuse(key, "give a positive whole number of pixels")
            size[edge] = value
        if set(size) != {"shortest_edge", "longest_edge"}:
            self._refuse(
                "size",
                f"{self.processor} resizes by shortest_edge and longest_edge (the least and most pixels, or "
                "min_pixels and max_pixels); give both",
            )
        patch, merge = self._required("patch_size"), self._required("merge_size")
        return Resize(shortest_edge=size["shortest_edge"], longest_edge=size["longest_edge"], factor=patch * merge)

    def _processor(self) -> str:
        named = self.config.get("image_processor_type")
        if named is None and isinstance(self.config.get("feature_extractor_type"), str):
            # transformers' AutoImageProcessor reads an old config's feature extractor as the image processor
            named = self.config["feature_extractor_type"].replace("FeatureExtractor", "ImageProcessor")
        if not isinstance(named, str):
            raise ModelLoadError(
                f"{self.source} names no image_processor_type: add the transformers class the model was published with "
                f"(decoctl computes pixel values as {', '.join(_FAMILIES)} do)"
            )
        base = named.removesuffix("Fast").removesuffix("Pil")
        if base not in _FAMILIES:
            raise ModelLoadError(
                f"{self.source}: image_processor_type {named!r} is not one decoctl prepares images for (it does as "
                f"{', '.join(_FAMILIES)} do); use a model whose processor is one of them"
            )
        return base

    def _refuse_unknown(self) -> None:
        known = _SETTINGS | _INERT | _NAMES | self.family.own_keys
        for key, value in self.config.items():
            if key in known or value is None or value is False:
                continue
            self._refuse(
                key,
                f"decoctl does not know what this setting does to {self.processor}'s pixel values, so it cannot make "
                "them exactly; remove the key if the model does not use it",
            )

    def _refuse(self, key: str, why: str) -> NoReturn:
        raise ModelLoadError(f"{self.source}: {key} = {json.dumps(self.config.get(key))}: {why}")

    def _get(self, key: str) -> Any:
        # a missing key means the class default; null means no value (transformers sets the attribute to None)
        return self.config[key] if key in self.config else self.family.defaults.get(key)

    def _flag(self, key: str) -> bool:
        value = self._get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            self._refuse(key, "give true or false")
        return value

    def _required(self, key: str) -> Any:
        value = self._get(key)
        if value is None:
            self._refuse(
                key,
                f"null is no value (not {self.processor}'s default) and the step that reads it is on, so transformers "
                "fails; give a value or remove the key",
            )
        return value

    def _number(self, key: str) -> float:
        value = self._required(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self._refuse(key, "give a number")
        return float(value)

    def _triple(self, key: str) -> tuple[float, float, float]:
        value = self._required(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if key == "image_mean" and self.family.pad == "square" and self._flag("do_pad"):
                self._refuse(key, "LlavaImageProcessor's do_pad needs one mean per channel (transformers fails on one)")
            return float(value), float(value), float(value)
        if (
            not isinstance(value, (list, tuple))
            or len(value) != 3
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        ):
            self._refuse(key, "give three numbers, one per RGB channel (or one for all three)")
        return float(value[0]), float(value[1]), float(value[2])

    def _resample(self) -> int:
        value = self._required("resample")
        if isinstance(value, bool) or not isinstance(value, int) or value not in _RESAMPLE_NAMES:
            self._refuse(
                "resample",
                "give one of Pillow's filter numbers: "
                + ", ".join(f"{number} ({name})" for number, name in _RESAMPLE_NAMES.items()),
            )
        return int(value)

    def _size_dict(self, key: str, *, default_to_square: bool) -> dict[str, int]:
        # transformers' get_size_dict: a number is a square (or the shortest edge), a list is (height, width)
        value = self._required(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return {"height": value, "width": value} if default_to_square else {"shortest_edge": value}
        if isinstance(value, (list, tuple)) and len(value) == 2:
            value = {"height": value[0], "width": value[1]}
        if not isinstance(value, dict) or not value:
            self._refuse(key, 'give an object such as {"height": 336, "width": 336}')
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value.values()):
            self._refuse(key, "give positive whole numbers")
        return dict(value)

    def _height_width(self, key: str) -> tuple[int, int]:
        size = self._size_dict(key, default_to_square=True)
        if set(size) != {"height", "width"}:
            self._refuse(key, "give height and width, as transformers needs them there")
        return size["height"], size["width"]

    def _resize(self) -> Resize:
        if "min_pixels" in self.family.own_keys:
            return self._pixels_resize()
        default_to_square = self._flag("default_to_square")
        size = self._size_dict("size", default_to_square=default_to_square)
        keys = set(size)
        if keys in _SIZE_SHAPES_REFUSED:
            self._refuse(
                "size",
                f"transformers' {self.processor} does not resize by {' and '.join(sorted(keys))} (it fails on it); "
                "give height and width, or shortest_edge (with longest_edge if you want the long side bounded)",
            )
        if keys not in _SIZE_SHAPES:
            self._refuse(
                "size",
                "give one of: height and width; shortest_edge; shortest_edge and longest_edge; max_height and "
                "max_width",
            )
        return Resize(**size)
