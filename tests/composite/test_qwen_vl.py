"""A dynamic-resolution vision-language model (a tiny Qwen2.5-VL: merged patches, windowed vision attention,
multimodal rotary positions) under the decoder's primitives: greedy and beam search equal transformers' generate() on
the same weights and images, whatever their size and aspect ratio and with two images in one prompt, every other
strategy equals greedy, and a folder whose type decoctl does not run is refused by name."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qwen_vl_models import IMAGE_MARK, QwenVL

import decoctl
from decoctl import ConfigError, Generator, ModelLoadError
from decoctl.host import Rows
from decoctl.host import Sequence as Row
from decoctl.model._qwen_vl import QwenVision
from decoctl.plugins import PluginRegistry
from decoctl.testing import EOS_TOKEN_ID, PAD_TOKEN_ID

PROMPT = f"{IMAGE_MARK}\nUSER: what is in the picture? ASSISTANT:"
TWO = f"USER: {IMAGE_MARK} and {IMAGE_MARK} differ how? ASSISTANT:"
NEW = 24
#: (width, height): below min_pixels (scaled up), wide, tall, above max_pixels (scaled down), an extreme strip
SIZES = [(30, 41), (200, 90), (90, 200), (300, 300), (400, 20)]


def picture(folder: Path, size: tuple[int, int], seed: int = 1) -> Path:
    from PIL import Image

    width, height = size
    path = folder / f"noise-{width}x{height}-{seed}.png"
    if not path.exists():
        pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path)
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("images")


@cache
def reference(hf: Path) -> Any:
    from transformers import Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration.from_pretrained(hf).eval()


def transformers_generate(qwen: QwenVL, ids: list[int], pictures: Sequence[Path], **options: Any) -> list[list[int]]:
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor

    model = reference(qwen.hf)
    processed = AutoImageProcessor.from_pretrained(qwen.onnx, backend="pil")(
        [Image.open(p) for p in pictures], return_tensors="pt"
    )
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            pixel_values=processed.pixel_values,
            image_grid_thw=processed.image_grid_thw,
            mm_token_type_ids=(input_ids == qwen.image_token).int(),  # what Qwen2_5_VLProcessor gives
            max_new_tokens=NEW,
            do_sample=False,
            eos_token_id=EOS_TOKEN_ID,
            pad_token_id=PAD_TOKEN_ID,
            **options,
        )
    rows = [row[len(ids) :].tolist() for row in out]
    return [row[: row.index(EOS_TOKEN_ID) + 1] if EOS_TOKEN_ID in row else row for row in rows]  # padding cut


def expanded(generator: Generator, prompt: str, pictures: Sequence[Path]) -> list[int]:
    """The prompt's ids with each image pad expanded to its image's merged patches, as Qwen2_5_VLProcessor does."""
    vision = generator.models["target"].vision
    assert vision is not None
    return vision.expand(generator.tokenizer.encode(prompt), vision.encode(list(pictures)))


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_greedy_equals_transformers_on_images_of_every_size_and_aspect_ratio(
    qwen_vl: QwenVL, images: Path, size: tuple[int, int]
) -> None:
    generator = Generator({"target": qwen_vl.onnx}, "greedy", threads=1)
    pictures = [picture(images, size)]

    result = generator.generate(PROMPT, images=pictures, max_new_tokens=NEW)

    assert [list(result.tokens)] == transformers_generate(qwen_vl, expanded(generator, PROMPT, pictures), pictures)


def test_greedy_equals_transformers_with_two_images_in_one_prompt(qwen_vl: QwenVL, images: Path) -> None:
    generator = Generator({"target": qwen_vl.onnx}, "greedy", threads=1)
    pictures = [picture(images, (200, 90)), picture(images, (56, 84), seed=2)]

    result = generator.generate(TWO, images=pictures, max_new_tokens=NEW)

    assert [list(result.tokens)] == transformers_generate(qwen_vl, expanded(generator, TWO, pictures), pictures)


def test_a_prompt_without_images_equals_transformers(qwen_vl: QwenVL) -> None:
    import torch

    generator = Generator({"target": qwen_vl.onnx}, "greedy", threads=1)
    ids = generator.tokenizer.encode("USER: say something ASSISTANT:")

    result = generator.generate("USER: say something ASSISTANT:", max_new_tokens=NEW)

    with torch.no_grad():
        out = reference(qwen_vl.hf).generate(
            input_ids=torch.tensor([ids]),
            max_new_tokens=NEW,
            do_sample=False,
            eos_token_id=EOS_TOKEN_ID,
            pad_token_id=PAD_TOKEN_ID,
        )
    expected = out[0, len(ids) :].tolist()
    assert list(result.tokens) == expected[: expected.index(EOS_TOKEN_ID) + 1] if EOS_TOKEN_ID in expected else expected


def prefilled(qwen: QwenVL, pictures: Sequence[Path]) -> tuple[Any, list[int]]:
    """A target row holding the prompt with ``pictures``, and the prompt's expanded ids."""
    generator = Generator({"target": qwen.onnx}, "greedy", threads=1)
    model = generator.models["target"]
    assert model.vision is not None
    features = model.vision.encode(list(pictures))
    ids = model.vision.expand(generator.tokenizer.encode(PROMPT), features)
    row = Row("target", model)
    row.attach_images(features)
    row.forward(ids)
    return row, ids


@pytest.fixture(scope="module")
def text_only(qwen_vl: QwenVL, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builder's export of the same model without exclude_embeds: its text model alone (model.type
    qwen2_5_vl_text), which takes token ids and M-RoPE position_ids."""
    from decoctl.testing.vlm import run_builder

    root = tmp_path_factory.mktemp("qwen-text")
    out = root / "onnx"
    out.mkdir()
    run_builder(qwen_vl.hf, root, out, exclude_embeds=False)
    shutil.copy(qwen_vl.onnx / "tokenizer.json", out)
    shutil.copy(qwen_vl.onnx / "tokenizer_config.json", out)
    return out


def test_the_text_model_alone_runs_greedy_and_beam_equal_to_transformers(qwen_vl: QwenVL, text_only: Path) -> None:
    import torch

    greedy = Generator({"target": text_only}, "greedy", threads=1)
    beam = Generator({"target": text_only}, "beam", options={"num_beams": 3, "num_return_sequences": 2}, threads=1)
    prompt = "USER: say something ASSISTANT:"
    ids = greedy.tokenizer.encode(prompt)

    got = [list(greedy.generate(prompt, max_new_tokens=NEW).tokens)]
    got += [list(c.tokens) for c in beam.generate(prompt, max_new_tokens=NEW).completions]

    expected = []
    for options in ({}, {"num_beams": 3, "num_return_sequences": 2}):
        with torch.no_grad():
            out = reference(qwen_vl.hf).generate(
                input_ids=torch.tensor([ids]),
                max_new_tokens=NEW,
                do_sample=False,
                eos_token_id=EOS_TOKEN_ID,
                pad_token_id=PAD_TOKEN_ID,
                **options,
            )
        rows = [row[len(ids) :].tolist() for row in out]
        expected += [row[: row.index(EOS_TOKEN_ID) + 1] if EOS_TOKEN_ID in row else row for row in rows]
    assert got == expected


def test_the_rows_rotary_delta_is_transformers_rope_delta(qwen_vl: QwenVL, images: Path) -> None:
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor

    pictures = [picture(images, (200, 90))]
    row, ids = prefilled(qwen_vl, pictures)

    processed = AutoImageProcessor.from_pretrained(qwen_vl.onnx, backend="pil")(
        [Image.open(p) for p in pictures], return_tensors="pt"
    )
    input_ids = torch.tensor([ids])
    _, deltas = reference(qwen_vl.hf).model.get_rope_index(
        input_ids, (input_ids == qwen_vl.image_token).int(), image_grid_thw=processed.image_grid_thw
    )
    delta = row.runner.next_position() - row.length
    assert delta == int(deltas[0, 0])
    assert delta < 0  # 6 x 3 image tokens span max(6, 3) positions


def test_a_rewind_and_a_multi_token_forward_give_the_steps_logits(qwen_vl: QwenVL, images: Path) -> None:
    row, ids = prefilled(qwen_vl, [picture(images, (90, 200))])
    tokens = [17, 42, 99, 5]
    stepped = [np.array(row.forward([t])[0]) for t in tokens]

    row.rewind(len(ids) + 1)
    again = np.array(row.forward(tokens[1:]))

    np.testing.assert_allclose(again, np.stack(stepped[1:]), rtol=0, atol=1e-5)


def test_a_batched_step_gives_rows_of_different_images_their_own_logits(qwen_vl: QwenVL, images: Path) -> None:
    model = Generator({"target": qwen_vl.onnx}, "greedy", threads=1).models["target"]
    vision = model.vision
    assert vision is not None
    tokenizer = Generator({"target": qwen_vl.onnx}, "greedy", threads=1).tokenizer
    prompts = []
    for pictures in ([picture(images, (200, 90))], [picture(images, (90, 200)), picture(images, (30, 41))]):
        features = vision.encode(pictures)
        prompts.append((features, vision.expand(tokenizer.encode(PROMPT if len(pictures) == 1 else TWO), features)))
    rows = Rows("target", model, capacity=2, max_length=256)
    rows[0].attach_images(prompts[0][0])
    rows[0].forward(prompts[0][1])
    other = rows.fork(0)
    rows[other].rewind(0)
    rows[other].attach_images(prompts[1][0])
    rows[other].forward(prompts[1][1])
    alone = []
    for features, ids in prompts:
        row = Row("target", model)
        row.attach_images(features)
        row.forward(ids)
        alone.append(row)
    steps = [[17, 42], [99, 5], [3, 3]]

    for fed in steps:
        logits = np.array(rows.step(fed))
        for index, (token, row) in enumerate(zip(fed, alone, strict=True)):
            np.testing.assert_allclose(logits[index], np.array(row.forward([token]))[-1], rtol=0, atol=1e-4)

    assert rows[0].runner.next_position() - rows[0].length != rows[other].runner.next_position() - rows[other].length


def test_beam_search_equals_transformers_beam_search(qwen_vl: QwenVL, images: Path) -> None:
    options = {"num_beams": 3, "num_return_sequences": 2}
    generator = Generator({"target": qwen_vl.onnx}, "beam", options=options, threads=1)
    pictures = [picture(images, (200, 90))]

    result = generator.generate(PROMPT, images=pictures, max_new_tokens=NEW)

    expected = transformers_generate(
        qwen_vl, expanded(generator, PROMPT, pictures), pictures, num_beams=3, num_return_sequences=2
    )
    assert [list(c.tokens) for c in result.completions] == expected


@pytest.mark.parametrize(
    ("controller", "options", "generator_options"),
    [
        ("speculative", {"drafter": "prompt-lookup"}, {}),
        ("greedy", {}, {"prefill_chunk": 5}),  # chunks that cut through the images' tokens
    ],
)
def test_prompt_lookup_and_chunked_prefill_give_greedys_tokens(
    qwen_vl: QwenVL, images: Path, controller: str, options: dict[str, Any], generator_options: dict[str, Any]
) -> None:
    registry = PluginRegistry()
    pictures = [picture(images, (200, 90)), picture(images, (56, 84), seed=2)]
    greedy = Generator({"target": qwen_vl.onnx}, "greedy", registry=registry, threads=1)
    other = Generator(
        {"target": qwen_vl.onnx}, controller, options=options, registry=registry, threads=1, **generator_options
    )

    expected = greedy.generate(TWO, images=pictures, max_new_tokens=NEW)
    result = other.generate(TWO, images=pictures, max_new_tokens=NEW)

    assert result.tokens == expected.tokens


def test_two_images_with_nothing_between_them_are_refused(qwen_vl: QwenVL, images: Path) -> None:
    pictures = [picture(images, (56, 56)), picture(images, (56, 56), seed=2)]
    prompt = "USER: <|vision_start|><|image_pad|><|image_pad|><|vision_end|> ASSISTANT:"

    with pytest.raises(ConfigError, match=r"images 0 and 1 stand next to each other"):
        decoctl.generate(prompt, model=qwen_vl.onnx, images=pictures, max_new_tokens=2, threads=1)


def retyped(qwen_vl: QwenVL, folder: Path, model_type: str) -> Path:
    copy = folder / model_type
    shutil.copytree(qwen_vl.onnx, copy)
    config_path = copy / "genai_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["model"]["type"] = model_type
    config_path.write_text(json.dumps(config), encoding="utf-8")
    return copy


def test_a_vision_language_type_decoctl_does_not_run_is_refused_by_name(qwen_vl: QwenVL, tmp_path: Path) -> None:
    folder = retyped(qwen_vl, tmp_path, "qwen3_vl")

    with pytest.raises(ModelLoadError, match=r"model.type 'qwen3_vl' is a vision-language type decoctl does not run"):
        Generator({"target": folder}, "greedy", threads=1)


def test_a_type_whose_positions_the_decoder_does_not_take_is_refused(qwen_vl: QwenVL, tmp_path: Path) -> None:
    folder = retyped(qwen_vl, tmp_path, "llava")

    with pytest.raises(ModelLoadError, match=r"model.type 'llava' but .* is three position\(s\) a token"):
        Generator({"target": folder}, "greedy", threads=1)


def test_a_vision_section_that_names_no_host_inputs_is_refused_naming_them() -> None:
    section = {  # onnxruntime-genai's own Qwen2.5-VL vision section: the graph takes the grid
        "patch_size": 14,
        "spatial_merge_size": 2,
        "window_size": 112,
        "inputs": {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"},
    }

    with pytest.raises(ModelLoadError, match=r"lacks rotary_positions, window_index, .*takes image_grid_thw"):
        QwenVision.from_section(section, "genai_config.json")
