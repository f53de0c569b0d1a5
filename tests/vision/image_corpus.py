"""Generated images (every PIL mode, tiny to huge sizes, extreme aspect ratios; random content from fixed seeds) and
transformers' image processors (PIL backend) as the oracle of decoctl's pixel values."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from PIL import ExifTags, Image

#: (width, height): one pixel, thin in each direction, huge and thin, odd and square
SIZES = [(1, 1), (2, 300), (300, 2), (3000, 20), (20, 3000), (37, 23), (23, 37), (64, 64)]

#: the modes do_convert_rgb meets; "P+t": a palette image whose transparent index is used
MODES = [
    "RGB",
    "RGBA",
    "LA",
    "P",
    "P+t",
    "PA",
    "CMYK",
    "I;16",
    "I",
    "F",
    "L",
    "1",
    "YCbCr",
    "LAB",
    "HSV",
    "RGBX",
    "RGBa",
]

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def image(mode: str, size: tuple[int, int], seed: int = 0) -> Image.Image:
    """A random image of ``mode`` and ``size`` (width, height)."""
    rng = np.random.default_rng([seed, size[0], size[1], sum(map(ord, mode))])
    width, height = size
    rgba = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
    rgba[..., 3] = rng.choice(np.array([0, 0, 90, 255, 255], np.uint8), (height, width))  # transparent, half, opaque
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65536, (height, width), dtype=np.uint16))
    if mode == "I":
        return Image.fromarray(rng.integers(-(2**20), 2**20, (height, width), dtype=np.int32))
    if mode == "F":
        return Image.fromarray((rng.random((height, width), dtype=np.float32) * 400 - 50).astype(np.float32))
    if mode == "P+t":
        paletted = Image.fromarray(rgba[..., :3]).quantize(8)
        paletted.info["transparency"] = int(np.asarray(paletted)[0, 0])
        return paletted
    if mode == "PA":
        return Image.fromarray(rgba).convert("PA")
    if mode in ("RGBA", "RGBa"):
        return Image.fromarray(rgba).convert(mode)
    return Image.fromarray(rgba).convert("RGB" if mode == "RGB" else "RGBA").convert(mode)


def corpus(seed: int = 0) -> list[tuple[str, Image.Image]]:
    """Every mode at every size: (a name for messages, the image)."""
    return [(f"{mode} {w}x{h}", image(mode, (w, h), seed)) for mode in MODES for w, h in SIZES]


def files(folder: Path) -> list[tuple[str, Path]]:
    """Image files as people have them: PNGs with transparency (RGBA, palette, RGB with a transparent colour),
    greyscale, 16-bit, a CMYK JPEG and JPEGs with every EXIF orientation."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []

    def save(name: str, picture: Image.Image, **options: Any) -> None:
        path = folder / name
        picture.save(path, **options)
        out.append((name, path))

    save("rgba.png", image("RGBA", (37, 23)))
    save("palette_transparent.png", image("P+t", (23, 37)))
    rgb = image("RGB", (30, 20))
    transparent = tuple(int(v) for v in np.asarray(rgb)[0, 0])
    save("rgb_trns.png", rgb, transparency=transparent)
    save("grey.png", image("L", (300, 2)))
    save("grey16.png", image("I;16", (20, 30)))
    save("bilevel.png", image("1", (17, 9)))
    save("cmyk.jpg", image("CMYK", (40, 24)))
    save("cmyk.tif", image("CMYK", (24, 40)))
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[ExifTags.Base.Orientation] = orientation
        save(f"exif{orientation}.jpg", image("RGB", (40, 24)), exif=exif.tobytes())
    return out


def data_url(path: Path) -> str:
    """The file as a data: URL, the form transformers reads bytes in."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def oracle(folder: Path, config: Mapping[str, Any]) -> Any:
    """transformers' image processor (PIL backend) for ``config``, written into ``folder``."""
    from transformers import AutoImageProcessor

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "preprocessor_config.json").write_text(json.dumps(config), encoding="utf-8")
    return AutoImageProcessor.from_pretrained(folder, backend="pil")


def expected(processor: Any, images: list[Any]) -> list[np.ndarray]:
    """transformers' pixel values, one float32[3, h, w] per image."""
    out = processor(images=images)["pixel_values"]
    return [np.asarray(p, np.float32) for p in out]


def png_bytes(picture: Image.Image) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return buffer.getvalue()
